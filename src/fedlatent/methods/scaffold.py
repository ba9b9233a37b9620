"""SCAFFOLD (Karimireddy et al. 2020), option II control variates.

After each local step w ← w − lr·(c − c_i); after K steps c_i⁺ = c_i − c + (w_global − w_i)/(K·lr);
the server adds (1/N)·Σ(c_i⁺ − c_i) to c. Controls start at zero (a popular benchmark release
starts them from a random model's weights). c_i is client state; c is server state.
"""
from __future__ import annotations

from typing import Any

import torch

from fedlatent.methods.parts import ClientRound, MethodSpec, Part, Tensors, Upload
from fedlatent.methods.registry import register_part, register_preset

C, CI = "scaffold.c.", "scaffold.ci."


class Scaffold(Part):
    name = "scaffold"
    needs_global_params = True

    def begin(self, rc: ClientRound) -> None:
        """Keep each trainable parameter's correction c − c_i in the client's scratch."""
        rc.scratch[self.name] = {n: rc.payload.get(C + n, torch.zeros_like(p)).to(p.device)
                                 - rc.state.get(CI + n, torch.zeros_like(p)).to(p.device)
                                 for n, p in rc.model.named_parameters() if p.requires_grad}

    def lockstep_drift(self, rcs: list[ClientRound], trainable: list[str]) -> Tensors:
        """w ← w − lr·(c − c_i) after each step: the clients' corrections from their scratch, stacked."""
        return {n: torch.stack([rc.scratch[self.name][n] for rc in rcs]) for n in trainable}

    @torch.no_grad()
    def finish(self, rc: ClientRound) -> Tensors:
        deltas = {}
        for name, p in rc.model.named_parameters():
            if not p.requires_grad:
                continue
            c = rc.payload.get(C + name, torch.zeros_like(p)).cpu()
            ci = rc.state.get(CI + name, torch.zeros_like(p)).cpu()
            ci_new = ci - c + (rc.global_params[name].cpu() - p.cpu()) / (max(rc.steps, 1) * rc.lr)
            deltas[name] = ci_new - ci
            rc.state[CI + name] = ci_new
        return deltas

    def payload(self, server_state: Tensors) -> Tensors:
        return {k: v for k, v in server_state.items() if k.startswith(C)}

    def server_update(self, uploads: list[Upload], server_state: Tensors, num_clients: int) -> None:
        for name in uploads[0].extras.get(self.name, {}):
            total = sum(u.extras[self.name][name] for u in uploads)
            server_state[C + name] = server_state.get(C + name, torch.zeros_like(total)) + total / num_clients


@register_part("scaffold")
def scaffold_part(opts: dict[str, Any]) -> Part:
    """SCAFFOLD control-variate correction."""
    return Scaffold()


@register_preset("scaffold")
def scaffold(opts: dict[str, Any]) -> MethodSpec:
    """SCAFFOLD: drift correction with client and server control variates (zero init)."""
    return MethodSpec("scaffold", parts=[Scaffold()])
