"""FedAvg (McMahan et al. 2017): local SGD, sample-weighted mean of all parameters and buffers."""
from __future__ import annotations

from typing import Any

from fedlatent.methods.parts import MethodSpec
from fedlatent.methods.registry import register_preset


@register_preset("fedavg")
def fedavg(opts: dict[str, Any]) -> MethodSpec:
    """FedAvg: no extra term; weighted mean; server SGD with η = 1."""
    return MethodSpec("fedavg")
