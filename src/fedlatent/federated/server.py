"""The server role every backend shares: aggregation, the server optimiser, the parts' server state.

FedAvg weights clients by sample count over every parameter and buffer (BatchNorm statistics
too), except the layers partial personalisation leaves with the clients (FedRep, LG-FedAvg). A
part that ``owns_aggregation`` (FedNova, FedDyn) replaces the mean; either takes its weighted sums
through the run's update codec (``federated.codec``: the plain one is the weighted mean itself).
The server optimiser then acts on the pseudo-gradient Δ = aggregate − w_old of the trainable
parameters (FedOpt, Reddi et al. 2021); plain SGD with η = 1 takes the aggregate as it is, which
is FedAvg.
"""
from __future__ import annotations

import torch

from fedlatent.config import ServerConfig
from fedlatent.federated.codec import UpdateCodec
from fedlatent.federated.randomness import Randomness
from fedlatent.methods.parts import MethodSpec, Tensors, Upload

OPT = "server_opt."  # server-state prefix of the optimiser's buffers


def server_step(kind: str, old: Tensors, new: Tensors, names: list[str], state: Tensors, cfg: ServerConfig,
                lr: float) -> Tensors:
    """Apply the server optimiser to the pseudo-gradient Δ = new − old of ``names``.

    momentum: m = βm + Δ (Hsu et al. 2019) or m = βm + (1−β)Δ ('ema', the FedDecorr release);
    w = w_old + η·m. adam / adagrad / yogi: Reddi et al. 2021, Algorithm 2, with τ, β1, β2.
    """
    if kind == "sgd" and lr == 1.0:
        return new
    out = dict(new)
    for name in names:
        delta = new[name] - old[name]
        if kind == "sgd":
            step = delta
        elif kind == "momentum":
            m = state.get(f"{OPT}m.{name}", torch.zeros_like(delta))
            m = cfg.momentum * m + (delta if cfg.momentum_form == "hsu" else (1 - cfg.momentum) * delta)
            state[f"{OPT}m.{name}"] = m
            step = m
        else:
            m = state.get(f"{OPT}m.{name}", torch.zeros_like(delta))
            v = state.get(f"{OPT}v.{name}", torch.full_like(delta, cfg.tau ** 2))
            m = cfg.beta1 * m + (1 - cfg.beta1) * delta
            d2 = delta * delta
            if kind == "adam":
                v = cfg.beta2 * v + (1 - cfg.beta2) * d2
            elif kind == "adagrad":
                v = v + d2
            elif kind == "yogi":
                v = v - (1 - cfg.beta2) * d2 * torch.sign(v - d2)
            else:
                raise ValueError(f"unknown server optimiser {kind!r}")
            state[f"{OPT}m.{name}"], state[f"{OPT}v.{name}"] = m, v
            step = m / (v.sqrt() + cfg.tau)
        out[name] = old[name] + lr * step
    return out


def resolve_server(cfg: ServerConfig, spec: MethodSpec) -> tuple[str, float]:
    """The optimiser and learning rate in force: 'auto' takes the method's choice; lr −1 means
    1.0 for sgd/momentum, 0.1 for adagrad and 0.01 for adam/yogi (Reddi et al.'s typical ranges;
    Adagrad's accumulated v makes its steps about 10× smaller than Adam's at the same η)."""
    kind = spec.server_optimizer if cfg.optimizer == "auto" else cfg.optimizer
    lr = cfg.lr if cfg.lr > 0 else {"sgd": 1.0, "momentum": 1.0, "adagrad": 0.1}.get(kind, 0.01)
    return kind, lr


def untransmitted_keys(spec: MethodSpec, parameters: list[str], trainable: list[str],
                  keys: list[str]) -> tuple[list[str], list[str]]:
    """The state keys that never travel, as the server and every client see them: the parameters
    frozen at init (a fixed head) and the layers each client keeps to itself (FedRep, LG-FedAvg,
    which stay at their initial global values on the server)."""
    return [k for k in parameters if k not in set(trainable)], spec.personalization.local_keys(parameters, keys)


class Server:
    """Holds the global model's state and the server state; turns uploads into the next model."""

    def __init__(self, spec: MethodSpec, global_state: Tensors, parameters: list[str], trainable: list[str],
                 cfg: ServerConfig, num_clients: int, codec: UpdateCodec | None = None,
                 randomness: Randomness | None = None) -> None:
        self.spec = spec
        self.frozen, self.local = untransmitted_keys(spec, parameters, trainable, list(global_state))
        self.codec = codec or UpdateCodec()
        self.global_state = global_state
        self.trainable = trainable
        self.cfg = cfg
        self.num_clients = num_clients
        self.state: Tensors = {}
        # the privacy noise's and the selection's source (None: the run seed's); a secret key is server state
        self.randomness = randomness
        if randomness is not None:
            randomness.bind(self.state)
        self.kind, self.lr = resolve_server(cfg, spec)

    def untransmitted(self) -> set[str]:
        """State keys that never travel: the fixed head and the clients' own layers."""
        return set(self.frozen + self.local)

    def payload(self) -> dict[str, Tensors]:
        """What each part, and the update codec (under ``"codec"``: adaptive clipping's clip norm),
        sends down with the global model."""
        return {**{part.name: part.payload(self.state) for part in self.spec.all_parts()},
                "codec": self.codec.payload(self.state)}

    def aggregate(self, uploads: list[Upload], rnd: int = 0) -> None:
        """One server round (round ``rnd``, 0-based: the codec's noise draws): aggregate, apply the
        server optimiser, update the parts' and the codec's state."""
        old = self.global_state
        aggregator = self.spec.aggregator
        combine = self.codec.round_combine(rnd, old, self.untransmitted(), self.state)
        if aggregator is not None:
            new = aggregator.aggregate(old, uploads, self.state, set(self.trainable), self.num_clients, combine)
        else:
            new = combine(uploads, None, None)
        for key in self.frozen + self.local:  # a fixed head and the clients' own layers are not aggregated
            new[key] = old[key]
        new = server_step(self.kind, old, new, self.trainable, self.state, self.cfg, self.lr)
        for part in self.spec.all_parts():
            part.server_update(uploads, self.state, self.num_clients)
        self.codec.server_update(rnd, uploads, self.state)
        self.global_state = new

