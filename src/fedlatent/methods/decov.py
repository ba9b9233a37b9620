"""DeCov and Structured-DeCov as loss terms on z: the covariance-based decorrelation baselines
FedDecorr compares with (Shi et al., ICLR 2023, App. C.2, Table 6: FedAvg + each, TinyImageNet).

The paper does not give their coefficients; β defaults to 0.1, FedDecorr's. Both read z from the
forward pass (no extra cost). Stack on any base: ``[[terms]] name = "decov"`` or
``name = "structured_decov"`` (with ``groups``), or run the presets of the same names (FedAvg + the term).
"""
from __future__ import annotations

from typing import Any

from torch import Tensor

from fedlatent.errors import ConfigError
from fedlatent.losses.decov import decov, structured_decov
from fedlatent.methods.parts import MethodSpec, Part, TermContext
from fedlatent.methods.registry import register_part, register_preset
from fedlatent.models.base import FedModel


class DeCov(Part):
    name = "decov"
    output_only = True

    def __init__(self, beta: float) -> None:
        self.weight = beta

    def loss(self, ctx: TermContext) -> Tensor:
        return decov(ctx.out.z)


class StructuredDeCov(Part):
    name = "structured_decov"
    output_only = True

    def __init__(self, beta: float, groups: int) -> None:
        if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
            raise ConfigError(f"algorithm.groups = {groups!r}: expected an integer ≥ 1")
        self.weight, self.groups = beta, groups

    def check_model(self, model: FedModel) -> None:
        if self.groups > model.z_dim:
            raise ConfigError(f"algorithm.groups = {self.groups} exceeds the {model.z_dim} dimensions of z")

    def loss(self, ctx: TermContext) -> Tensor:
        return structured_decov(ctx.out.z, self.groups)


@register_part("decov", beta=0.1)
def decov_part(opts: dict[str, Any]) -> Part:
    """DeCov penalty β·½(‖C‖_F² − ‖diag C‖²) on the covariance of z (Cogswell et al. 2016)."""
    return DeCov(opts["beta"])


@register_part("structured_decov", beta=0.1, groups=4)
def structured_decov_part(opts: dict[str, Any]) -> Part:
    """Structured-DeCov: β·the covariances of z across ``groups`` unit groups (Xiong et al. 2016)."""
    return StructuredDeCov(opts["beta"], opts["groups"])


@register_preset("decov", beta=0.1)
def decov_preset(opts: dict[str, Any]) -> MethodSpec:
    """FedAvg + DeCov (FedDecorr's Table 6)."""
    return MethodSpec("decov", parts=[DeCov(opts["beta"])])


@register_preset("structured_decov", beta=0.1, groups=4)
def structured_decov_preset(opts: dict[str, Any]) -> MethodSpec:
    """FedAvg + Structured-DeCov (FedDecorr's Table 6)."""
    return MethodSpec("structured_decov", parts=[StructuredDeCov(opts["beta"], opts["groups"])])
