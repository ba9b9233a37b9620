"""FedPer (Arivazhagan, Aggarwal, Singh & Choudhary 2019, "Federated Learning with Personalization
Layers", arXiv:1912.00818, Algorithm 1).

The model is a base, shared and averaged as in FedAvg, and K_P personalisation layers on top of it,
kept by each client (``local.*`` in its state). Every round the client trains base and
personalisation layers together, from the global base and its own personalisation layers, for
``train.local_epochs``; the server averages the base only. ``personal_layers`` = K_P counts layers
(modules owning parameters: linear, convolution, normalisation) from the output: 1, the default,
keeps the classifier; 0 shares every layer, which is FedAvg. The global model's personalisation
layers stay at their initialisation, so the run's global-test accuracy is not meaningful; its
personalised accuracy (each client's layers on the global base) is.
"""
from __future__ import annotations

from functools import partial
from typing import Any

from fedlatent.methods.partial import Partial, layer_of, layers
from fedlatent.methods.parts import MethodSpec
from fedlatent.methods.registry import register_preset


def personal_keys(personal_layers: int, parameters: list[str], keys: list[str]) -> list[str]:
    """The entries of the last ``personal_layers`` layers in forward order (parameters and buffers alike)."""
    ordered = layers(parameters)
    own = set(ordered[len(ordered) - personal_layers:]) if personal_layers else set()
    return [k for k in keys if layer_of(k) in own]


@register_preset("fedper", personal_layers=1)
def fedper(opts: dict[str, Any]) -> MethodSpec:
    """FedPer: the base averaged, the last ``personal_layers`` layers kept by each client, trained together."""
    return MethodSpec("fedper", personalization=Partial(partial(personal_keys, opts["personal_layers"])))
