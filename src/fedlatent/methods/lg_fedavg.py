"""LG-FedAvg (Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov & Morency 2020, "Think
Locally, Act Globally: Federated Learning with Local and Global Representations", Algorithm 1).

The classifier-side layers are global (averaged); the layers before them, the local
representation, stay with each client (``local.*`` in its state). Every round all layers train
together for ``train.local_epochs``. A layer is a module owning parameters (a linear or
convolutional layer, a normalisation layer), in forward order (encoder, projector, classifier);
``global_layers = k`` makes
the last k global. The default k = 1 shares the classifier only (the release's
``num_layers_keep`` also counts from the output and is set per data set, e.g. higher for its
MNIST MLP: set it in the config); k at least the model's layer count shares every layer, which is
FedAvg. The global model's representation layers stay at their initialisation, so the run's
global-test accuracy is not meaningful; its personalised accuracy (each client's
representation with the global layers) is. The paper starts from a FedAvg-trained model
(``load_fed``); here every layer starts from the run's initialisation.
"""
from __future__ import annotations

from functools import partial
from typing import Any

from fedlatent.errors import ConfigError
from fedlatent.methods.partial import Partial, layer_of, layers
from fedlatent.methods.parts import MethodSpec
from fedlatent.methods.registry import register_preset


def local_keys(global_layers: int, parameters: list[str], keys: list[str]) -> list[str]:
    """The entries of every layer but the last ``global_layers`` in forward order (parameters and
    buffers alike)."""
    shared = set(layers(parameters)[-global_layers:])
    return [k for k in keys if layer_of(k) not in shared]


@register_preset("lg_fedavg", global_layers=1)
def lg_fedavg(opts: dict[str, Any]) -> MethodSpec:
    """LG-FedAvg: the last ``global_layers`` layers averaged, the representation kept per client."""
    k = opts["global_layers"]
    if k < 1:
        raise ConfigError(f"algorithm.global_layers = {k}: must be >= 1 (the classifier at least)")
    return MethodSpec("lg_fedavg", personalization=Partial(partial(local_keys, k)))
