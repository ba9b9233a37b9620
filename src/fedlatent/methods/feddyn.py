"""FedDyn (Acar et al. 2021), in the formulation of the authors' release.

Client k: weight w_k = n_k·K/Σn, α_k = α/w_k; loss += α_k⟨θ, λ_k − θ_srv⟩ and weight decay
+= α_k (the (α_k/2)‖θ‖² term); after training λ_k += θ_k − θ_srv. Server: θ_srv = mean of the
participating θ_k + mean over *all* clients of λ_k (kept incrementally as h). Buffers
(BatchNorm statistics) take the sample-weighted mean.

As α → 0 the client term vanishes but the server correction (mean of λ_k) does not: it is
independent of α in the paper (θ = avg − h/α with h ∝ α) and the release alike, so FedDyn does
not reduce to FedAvg. fedlatent sends and evaluates θ_srv; the release also reports the plain
average of the participants.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fedlatent.methods.aggregation import split_mean
from fedlatent.methods.parts import ClientRound, Combine, LockstepContext, MethodSpec, Part, Tensors, Upload
from fedlatent.methods.registry import register_part, register_preset

LAM, H = "feddyn.lambda.", "feddyn.h."


class FedDyn(Part):
    name = "feddyn"
    term_reads_batch = False  # ⟨θ, λ − θ_srv⟩: the weights alone
    needs_global_params = True
    owns_aggregation = True
    coefficients = ("alpha",)  # read by begin alone: each client's α_k

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha

    def begin(self, rc: ClientRound) -> None:
        """α_k as extra weight decay; α_k and the linear coefficient λ_k − θ_srv in the scratch."""
        client_weight = rc.num_samples * rc.num_clients / rc.total_samples
        alpha_k = self.alpha / client_weight
        rc.extra_weight_decay = alpha_k
        linear = {n: (rc.state.get(LAM + n, torch.zeros_like(p.cpu())).to(p.device) - rc.global_params[n])
                  for n, p in rc.model.named_parameters() if p.requires_grad}
        rc.scratch[self.name] = (alpha_k, linear)

    def lockstep_loss(self, ctx: LockstepContext) -> Tensor:
        """α_k⟨θ_k, λ_k − θ_srv⟩ per client, each client's α_k and coefficients stacked."""
        scratch = [rc.scratch[self.name] for rc in ctx.rcs]
        like = ctx.params[next(iter(scratch[0][1]))]  # the weights alone: no output read (sample-level DP-SGD has none)
        alphas = torch.tensor([alpha_k for alpha_k, _ in scratch], dtype=like.dtype, device=like.device)
        return alphas * sum((ctx.params[n] * torch.stack([linear[n] for _, linear in scratch])).flatten(1).sum(1)
                            for n in scratch[0][1])

    @torch.no_grad()
    def finish(self, rc: ClientRound) -> Tensors:
        deltas = {}
        params = dict(rc.model.named_parameters())
        for name in rc.scratch[self.name][1]:
            delta = (params[name] - rc.global_params[name]).cpu()
            rc.state[LAM + name] = rc.state.get(LAM + name, torch.zeros_like(delta)) + delta
            deltas[name] = delta
        return deltas

    def aggregate(self, global_state: Tensors, uploads: list[Upload], server_state: Tensors,
                  trainable: set[str], num_clients: int, combine: Combine | None = None) -> Tensors:
        out = split_mean(uploads, trainable, [1 / len(uploads)] * len(uploads), combine)  # the plain mean
        for name in (n for n in out if n in trainable):
            h = server_state.get(H + name, torch.zeros_like(global_state[name]))
            h = h + torch.stack([u.extras[self.name][name] for u in uploads]).sum(0) / num_clients
            server_state[H + name] = h
            out[name] = out[name] + h
        return out


@register_part("feddyn", alpha=0.01)
def feddyn_part(opts: dict[str, Any]) -> Part:
    """FedDyn dynamic regulariser and server state (α)."""
    return FedDyn(opts["alpha"])


@register_preset("feddyn", alpha=0.01)
def feddyn(opts: dict[str, Any]) -> MethodSpec:
    """FedDyn: dynamic regulariser (α = 0.01), the release's server update."""
    return MethodSpec("feddyn", parts=[FedDyn(opts["alpha"])])
