"""pFedMe (T. Dinh, Tran & Nguyen 2020, "Personalized Federated Learning with Moreau Envelopes",
NeurIPS, Algorithm 1).

Each client's local model w is trained on the Moreau envelope F(w) = min_θ f(θ) + (λ/2)‖θ − w‖² of
its loss: on every batch ξ of a local step,

- θ ← θ − ν [∇f(θ; ξ) + λ(θ − w)], ``inner_steps`` = K times: gradient descent at the personal rate
  ν (``personal_lr``) on the inner problem h(θ; w, ξ), from the θ of the previous step (from the
  round's global weights at the first; as the release warm-starts it);
- w ← w − η λ (w − θ): the envelope's gradient λ(w − θ̂(w)) at the round's rate η (``train.lr``), a
  plain step: the run's update rule must be plain SGD (``train.momentum = 0``, ``train.weight_decay = 0``;
  refused otherwise, :attr:`~fedlatent.methods.program.ClientProgram.plain_update`).

The server takes w̄ ← (1 − β) w̄ + β Σ_k p_k w_k: the server's SGD step on the pseudo-gradient at
rate β = ``server.lr`` (1, FedAvg's mean, by default). θ is the client's personal model: its
parameters are kept in its state (``personal.*``) and it is evaluated on them with the global
model's buffers. f is the copy's objective (the task loss and the method's terms, read at θ);
θ's forward shares w's BatchNorm statistics.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from fedlatent.errors import ConfigError
from fedlatent.methods.inner import gradients, per_client_dot
from fedlatent.methods.parts import ClientRound, MethodSpec
from fedlatent.methods.program import (GLOBAL, PERSONAL, ClientProgram, Step, Tensors, Tune, prefixed,
                                       register_program)
from fedlatent.methods.registry import register_preset


def constant(weights: Mapping[str, Tensor]) -> Callable[[Mapping[str, Tensor]], Mapping[str, Tensor]]:
    """The forward's weights ``weights`` whatever the step's (θ's objective)."""
    return lambda _: weights


@register_program("pfedme")
class PFedMeProgram(ClientProgram):
    """The local model trained on its Moreau envelope, the personal model θ solving the inner problem
    by K gradient steps per batch; each client evaluated on its θ (pFedMe)."""

    personalizes = True
    inner_gradients = True
    plain_update = True  # Algorithm 1's w-step is plain gradient descent

    def __init__(self, lam: float, inner_steps: int, personal_lr: float) -> None:
        super().__init__()
        self.lam, self.inner_steps, self.personal_lr = lam, inner_steps, personal_lr

    @property
    def passes(self) -> float:
        """θ's K forward and backward passes; w's step reads no batch."""
        return float(self.inner_steps)

    def begin(self, rcs: list[ClientRound], device: Any) -> Tensors:
        """The clients' θ (a leading client axis, in the trainer's order): the round's start weights
        of the trained parameters."""
        names = [n for n, p in rcs[0].model.named_parameters() if p.requires_grad]
        return {n: torch.stack([rc.global_params[n] for rc in rcs]).to(device) for n in names}

    def step(self, st: Step) -> None:
        """K inner steps of θ on the batch from the local model w before the step, then w's step
        towards θ; both inside w's objective, so that w's rows are the ones the step trains."""
        theta = {n: st.rows(t) for n, t in st.data.items()}

        def envelope(params: Mapping[str, Tensor]) -> Tensor:
            nonlocal theta
            w = dict(params)  # one view each (one client's weights come as views with a client axis)
            fixed = {n: w[n].detach() for n in theta}
            for k in range(self.inner_steps):  # the last step's loss is the one recorded
                leaves = {n: t.detach().requires_grad_(True) for n, t in theta.items()}
                at_theta = {**w, **leaves}  # θ's parameters, w's buffers
                loss = st.objective(GLOBAL, constant(at_theta), recorded=k == self.inner_steps - 1)(w)
                g = gradients(loss, leaves)
                theta = {n: t.detach() - self.personal_lr * (g[n] + self.lam * (t.detach() - fixed[n]))
                         for n, t in leaves.items()}
            diff = {n: w[n] - theta[n] for n in theta}
            return 0.5 * self.lam * per_client_dot(diff, diff)  # its gradient: λ(w − θ)
        st.train(GLOBAL, envelope)
        for n, t in theta.items():
            st.put(st.data[n], t)

    def finish(self, rc: ClientRound, row: int, data: Any) -> None:
        rc.state.update({PERSONAL + n: t[row].detach().to("cpu", copy=True) for n, t in data.items()})

    def evaluated(self, parameters: list[str], client_state: Tensors, global_state: Tensors,
                  tune: Tune | None) -> Tensors:
        """θ's parameters with the global model's other entries (the global model where it has no θ yet)."""
        return {**global_state, **prefixed(client_state, PERSONAL)}

    new_client_rule = ("θ trained from the global model on its training split by plain steps at personal_lr on "
                       "f(θ) + (λ/2)‖θ − w̄‖², the inner problem h(θ; w̄) with the final w̄")

    def adapted_new(self, parameters: list[str], global_state: Tensors, tune: Tune) -> Tensors:
        """A new client's θ: its personal problem solved from w̄ for the evaluation's epochs."""
        return tune(global_state, "all", self.lam, lr=self.personal_lr, plain=True)


@register_preset("pfedme", lam=15.0, inner_steps=5, personal_lr=0.09)
def pfedme(opts: dict[str, Any]) -> MethodSpec:
    """pFedMe: the local model on its Moreau envelope (λ = 15), θ by K = 5 steps at 0.09 per batch; β = server.lr."""
    if opts["inner_steps"] < 1:
        raise ConfigError(f"algorithm.inner_steps = {opts['inner_steps']}: must be >= 1 (K gradient steps on θ)")
    if opts["lam"] <= 0:
        raise ConfigError(f"algorithm.lam = {opts['lam']}: must be > 0 (λ = 0 leaves the local model unmoved)")
    return MethodSpec("pfedme", personalization=PFedMeProgram(opts["lam"], opts["inner_steps"], opts["personal_lr"]))
