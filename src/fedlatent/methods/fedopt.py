"""Server optimisers on the pseudo-gradient as presets: FedAvgM (Hsu et al. 2019) and FedAdam,
FedAdagrad, FedYogi (Reddi et al. 2021). Their hyperparameters sit in ``[server]`` (lr, momentum,
momentum_form, beta1, beta2, tau); see ``federated/server.py`` for the update rules."""
from __future__ import annotations

from typing import Any

from fedlatent.methods.parts import MethodSpec
from fedlatent.methods.registry import register_preset


def _preset(name: str, optimizer: str, doc: str) -> None:
    def build(opts: dict[str, Any]) -> MethodSpec:
        return MethodSpec(name, server_optimizer=optimizer)
    build.__doc__ = doc
    register_preset(name)(build)


_preset("fedavgm", "momentum", "FedAvgM: server momentum (server.momentum 0.9, server.lr 1; 'ema' form optional).")
_preset("fedadam", "adam", "FedAdam: server Adam (server.lr 0.01, β1 0.9, β2 0.99, τ 1e-3).")
_preset("fedadagrad", "adagrad", "FedAdagrad: server Adagrad (server.lr 0.1, τ 1e-3).")
_preset("fedyogi", "yogi", "FedYogi: server Yogi (server.lr 0.01, β1 0.9, β2 0.99, τ 1e-3).")
