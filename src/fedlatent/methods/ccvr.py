"""CCVR (Luo et al. 2021): after FedAvg training, pool per-class Gaussians of z from the clients,
sample virtual features and retrain the classifier with cross-entropy. Combine with another base
through ``algorithm.calibration = "ccvr"`` on that preset."""
from __future__ import annotations

from typing import Any

from fedlatent.methods.parts import Calibration, MethodSpec
from fedlatent.methods.registry import register_preset


@register_preset("ccvr", virtual_per_class=100, ccvr_epochs=5, ccvr_lr=0.01)
def ccvr(opts: dict[str, Any]) -> MethodSpec:
    """CCVR: FedAvg, then classifier calibration with virtual representations (M_c = 100 per class)."""
    return MethodSpec("ccvr", calibration=Calibration(kind="ccvr", virtual_per_class=opts["virtual_per_class"],
                                                      epochs=opts["ccvr_epochs"], lr=opts["ccvr_lr"]))
