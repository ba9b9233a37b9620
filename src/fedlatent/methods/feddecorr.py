"""FedDecorr (Shi et al. 2023): penalise the correlation matrix of z against dimensional collapse.

The paper writes L = (1/d²)‖K‖_F² ('paper'); the authors' release, which produced the paper's
tables, computes a loss ≈ N·d/(d−1) times larger ('official'), and its β = 0.1 / 0.05 was tuned on
that scale. The default is therefore 'official': β = 0.1 means the published strength. With
'paper' semantics β = 0.1 is about N times weaker (64× at batch 64) and trains almost like FedAvg;
choose it only with a β rescaled accordingly. Reads z from the forward pass: no extra cost. Stack
it on any base: ``[[terms]] name = "decorrelation"``.
"""
from __future__ import annotations

from typing import Any

from torch import Tensor

from fedlatent.errors import ConfigError
from fedlatent.losses.decorrelation import decorrelation
from fedlatent.methods.parts import MethodSpec, Part, TermContext
from fedlatent.methods.registry import register_part, register_preset


class Decorrelation(Part):
    name = "decorrelation"
    output_only = True

    def __init__(self, beta: float, semantics: str) -> None:
        if semantics not in ("paper", "official"):
            raise ConfigError(f"algorithm.semantics = {semantics!r}: allowed values are paper, official")
        self.weight, self.semantics = beta, semantics

    def loss(self, ctx: TermContext) -> Tensor:
        return decorrelation(ctx.out.z, semantics=self.semantics)


@register_part("decorrelation", beta=0.1, semantics="official")
def decorrelation_part(opts: dict[str, Any]) -> Part:
    """FedDecorr correlation penalty β·L_decorr of z."""
    return Decorrelation(opts["beta"], opts["semantics"])


@register_preset("feddecorr", beta=0.1, semantics="official")
def feddecorr(opts: dict[str, Any]) -> MethodSpec:
    """FedDecorr: FedAvg + β·decorrelation (β = 0.1 at the release's scale, as in the tables)."""
    return MethodSpec("feddecorr", parts=[Decorrelation(opts["beta"], opts["semantics"])])
