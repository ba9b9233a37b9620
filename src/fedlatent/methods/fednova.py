"""FedNova (Wang et al. 2020): normalised averaging that removes the objective inconsistency of
unequal local step counts.

a_i = τ_i for plain SGD, or (τ − ρ(1−ρ^τ)/(1−ρ))/(1−ρ) with momentum ρ; d_i = (w_g − w_i)/a_i;
w_g ← w_g − (Σ p_i a_i)·Σ p_i d_i with p_i = n_i/n over the round's participants. Buffers
(BatchNorm statistics) take the sample-weighted mean.
"""
from __future__ import annotations

import math
from typing import Any

from fedlatent.methods.aggregation import split_mean
from fedlatent.methods.parts import Combine, MethodSpec, Part, Tensors, Upload
from fedlatent.methods.registry import register_part, register_preset


def normalising_factor(steps: int, momentum: float) -> float:
    """a_i: the client's effective number of steps (FedNova, Sec. 4 and Appendix for momentum)."""
    if momentum == 0.0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho ** steps) / (1 - rho)) / (1 - rho)


class FedNova(Part):
    name = "fednova"
    owns_aggregation = True

    def aggregate(self, global_state: Tensors, uploads: list[Upload], server_state: Tensors,
                  trainable: set[str], num_clients: int, combine: Combine | None = None) -> Tensors:
        """w − τ_eff · Σ_i p_i (w − w_i) / a_i for the trainable tensors (the module's formula),
        computed as w − τ_eff · (Σ_i c_i · w − Σ_i c_i w_i) with c_i = p_i / a_i, the last sum one
        :func:`weighted_mean` with those coefficients (through ``combine``, the update codec's);
        the rest (buffers) the sample-weighted mean."""
        total = float(sum(u.num_samples for u in uploads))
        shares = [u.num_samples / total for u in uploads]
        factors = [normalising_factor(u.steps, u.momentum) for u in uploads]
        tau_eff = sum(p * a for p, a in zip(shares, factors))
        # a client without a step (a = 0) makes the model non-finite, as (w − w_i)/0 would
        coeffs = [p / a if a else math.inf for p, a in zip(shares, factors)]
        rows = split_mean(uploads, trainable, coeffs, combine)
        pull = sum(coeffs)
        for name in (n for n in rows if n in trainable):
            w = global_state[name]
            rows[name] = w - tau_eff * (pull * w - rows[name])
        return rows


@register_part("fednova")
def fednova_part(opts: dict[str, Any]) -> Part:
    """FedNova normalised averaging."""
    return FedNova()


@register_preset("fednova")
def fednova(opts: dict[str, Any]) -> MethodSpec:
    """FedNova: normalised averaging (plain SGD or momentum)."""
    return MethodSpec("fednova", parts=[FedNova()])
