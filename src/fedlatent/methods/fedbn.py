"""FedBN (Li, Jiang, Zhang, Kamp & Dou 2021, "FedBN: Federated Learning on Non-IID Features via Local
Batch Normalization", ICLR, Algorithm 1).

Each client keeps its BatchNorm layers — their affine parameters (γ, β) and running statistics
(mean, variance, the count of batches tracked) — to itself (``local.*`` in its state); every other
entry is trained and averaged as in FedAvg. A client trains all its layers every round for
``train.local_epochs`` and is evaluated with its own BatchNorm layers on the global ones. A
BatchNorm layer is a module whose state holds running statistics (``running_mean``): GroupNorm
keeps none, and a model without BatchNorm trains exactly as FedAvg. The global model's BatchNorm
layers stay at their initialisation: read ``personalized_accuracy``.
"""
from __future__ import annotations

from typing import Any

from fedlatent.methods.partial import Partial, layer_of
from fedlatent.methods.parts import MethodSpec
from fedlatent.methods.registry import register_preset


def batchnorm_keys(parameters: list[str], keys: list[str]) -> list[str]:
    """The entries of the modules that keep running statistics (BatchNorm layers): weight, bias,
    running_mean, running_var, num_batches_tracked."""
    norms = {layer_of(k) for k in keys if k.endswith(".running_mean")}
    return [k for k in keys if layer_of(k) in norms]


@register_preset("fedbn")
def fedbn(opts: dict[str, Any]) -> MethodSpec:
    """FedBN: BatchNorm parameters and statistics kept by each client, every other entry averaged."""
    return MethodSpec("fedbn", personalization=Partial(batchnorm_keys))
