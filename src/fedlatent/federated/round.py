"""One round at a message boundary: the server half and the client half every backend drives.

The server half plans a round (:func:`plan_round`: sampling seeded by (seed, round), the parts'
payload, the round's learning rate) as one :class:`ClientTask` per selected client, and closes it
(:func:`close_round`) from the replies: outcomes sorted by client id, so reply order cannot change
the numbers, the failure policy, aggregation and server step, the non-finite check of the new
global model and the metrics line's fields. The client half (:func:`client_update`) turns a task,
the client's own state and its own data into an upload and the client's new state. Between the
two halves travel only the task and the reply: the server never reads a client's state or data,
a client knows nothing federation-wide but what its task says (``total_samples`` comes from a
census of training-set sizes the clients report at start-up).

The client half ends with the update codec (:func:`encoded`, ``federated.codec``): each upload, once
the client has checked it, becomes the message the server combines.

The embedded backends call both halves in one process and keep every client's state in their own
store; a Flower backend calls them on either side of its messages.
"""
from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import numpy as np
import torch

from fedlatent.config import PrivacyConfig, RunConfig, TrainConfig
from fedlatent.data.augment import Augmentation
from fedlatent.data.types import Split
from fedlatent.federated.client import LocalSettings, Workspace
from fedlatent.federated.bound import enforce_bound
from fedlatent.federated.codec import ClipCodec, UpdateCodec
from fedlatent.federated.codec_chain import CODED_BYTES
from fedlatent.federated.trainer import local_update
from fedlatent.federated import precision
from fedlatent.federated.failures import (ClientFailure, RunStopped, all_finite, first_nonfinite, losses_finite,
                                         nonfinite_quantity, screen, upload_tensors)
from fedlatent.federated.server import Server
from fedlatent.methods.parts import ClientRound, MethodSpec, Tensors, Upload
from fedlatent.models.base import FedModel
from fedlatent.seeding import CLIENT_SAMPLING, LOCAL_TRAINING, derive_seed, derive_seeds


@dataclass
class ClientTask:
    """Everything one client learns from the server for one round."""

    client_id: int
    round: int               # 0-based
    global_state: Tensors
    payload: Tensors         # flat, keys prefixed per part
    lr: float
    num_clients: int
    total_samples: int       # Σ training samples over all clients, from the start-up census
    seed: int                # the client's stream seed, which its own draws derive from (stream_seed)


@dataclass
class RoundResult:
    """What the server half makes of a round's replies: the uploads aggregated, the clients
    dropped by the failure policy, and the metrics line's fields."""

    uploads: list[Upload]
    dropped: list[ClientFailure]
    metrics: dict[str, Any]


def round_lr(cfg: TrainConfig, rnd: int) -> float:
    """The learning rate of round ``rnd`` (0-based): constant, cosine-annealed over the rounds, or
    multi-step (× lr_gamma from each milestone on, like torch's MultiStepLR stepped once a round)."""
    if cfg.lr_schedule == "cosine":
        return cfg.lr_min + 0.5 * (cfg.lr - cfg.lr_min) * (1 + math.cos(math.pi * rnd / cfg.rounds))
    if cfg.lr_schedule == "multistep":
        milestones = cfg.lr_milestones or range(cfg.lr_step, cfg.rounds, cfg.lr_step)
        return cfg.lr * cfg.lr_gamma ** sum(rnd >= m for m in milestones)
    return cfg.lr


def clients_per_round(num_clients: int, participation: float) -> int:
    """How many of ``num_clients`` clients a round samples at participation ρ: ⌊ρ·n⌋, at least 1 —
    the seed papers' ``int(n * ρ)`` (MOON / NIID-Bench lineage, FedDecorr's release), so 10 clients
    at 0.15 give 1 and at 0.35 give 3. The product is nudged up by 1e-9 before the floor, so that a
    float product just under a whole number (0.29 × 100 = 28.999…) counts as that number (29)."""
    return min(num_clients, max(1, math.floor(participation * num_clients + 1e-9)))


def stream_seed(server: Server, config: RunConfig, cid: int) -> int:
    """Client ``cid``'s stream seed (:meth:`~fedlatent.federated.randomness.Randomness.client_seed`):
    the run seed in a seeded run (and for a server built without randomness), a secret of the
    server's key in a secret one."""
    return config.seed if server.randomness is None else server.randomness.client_seed(cid)


def sample_clients(seed: int, rnd: int, num_clients: int, participation: float) -> list[int]:
    """:func:`clients_per_round` distinct clients, seeded by (seed, round), in id order."""
    m = clients_per_round(num_clients, participation)
    if m >= num_clients:
        return list(range(num_clients))
    rng = np.random.default_rng(derive_seed(seed, CLIENT_SAMPLING, rnd))
    return sorted(int(c) for c in rng.choice(num_clients, m, replace=False))


def nbytes(state: Tensors) -> int:
    return sum(t.nbytes for t in state.values())


T = TypeVar("T")
HEAD = "classifier."  # state-key prefix of the classifier (FedModel.classifier)


def traffic(state: Tensors, untransmitted: set[str]) -> tuple[int, int]:
    """Bytes of ``state`` the algorithm needs to send, and the classifier's share of them: every entry but
    the ``untransmitted`` ones — a head fixed at init (each side builds it from the run's seed) and
    the layers clients keep to themselves (FedRep, LG-FedAvg). SphereFed's Table 1 counts the
    classifier's communication this way: a learned head travels every round, a fixed one never.
    The Flower backend's messages leave these entries out too (an FFC-calibrated fixed head,
    changed since init, travels there; the embedded count does not include it)."""
    sent = head = 0
    for key, value in state.items():
        if key not in untransmitted:
            sent += value.nbytes
            head += value.nbytes if key.startswith(HEAD) else 0
    return sent, head


def _once_each(states: list[Tensors], count: Callable[[Tensors], T]) -> list[T]:
    """``count`` of each of ``states``, computed once per dict (a round's tasks share the global
    state and the payload)."""
    memo: dict[int, T] = {}
    for state in states:
        if id(state) not in memo:
            memo[id(state)] = count(state)
    return [memo[id(state)] for state in states]


def local_settings(train: TrainConfig, lr: float, epochs: int, augment: Augmentation | bool, num_classes: int,
                   device: torch.device, privacy: PrivacyConfig | None = None) -> LocalSettings:
    """The local optimiser and loop settings of a round at learning rate ``lr``; ``privacy``: the
    run's sample-level DP-SGD (None: none, as for the evaluation's fine-tuning)."""
    dp = privacy or PrivacyConfig()
    return LocalSettings(epochs, train.batch_size, lr, train.momentum, train.weight_decay, train.drop_last, augment,
                         num_classes, device, optimizer=train.optimizer, steps=train.local_steps,
                         keep_optimizer=train.optimizer_state == "kept",
                         # sample-level DP-SGD's per-sample gradients run in float32 ("auto" included)
                         precision="fp32" if math.isfinite(dp.sample_clip_norm) else precision.resolve(train.precision,
                                                                                                       device),
                         sample_clip_norm=dp.sample_clip_norm, sample_noise_multiplier=dp.sample_noise_multiplier,
                         poisson=dp.batch_sampling == "poisson", secret_noise=dp.randomness == "secret")


# server half -------------------------------------------------------------------------------------
def plan_round(server: Server, config: RunConfig, rnd: int, train_sizes: list[int]) -> list[ClientTask]:
    """Round ``rnd``'s (0-based) tasks, in client-id order; ``train_sizes`` is the census of the
    clients' training-set sizes."""
    n, t = len(train_sizes), config.train
    selected = server.randomness.sample(rnd, n, t.participation, t.client_sampling, clients_per_round(n, t.participation)) \
        if server.randomness is not None else sample_clients(config.seed, rnd, n, t.participation)
    payload = {k: v for part_payload in server.payload().values() for k, v in part_payload.items()}
    lr, total = round_lr(config.train, rnd), sum(train_sizes)
    return [ClientTask(cid, rnd, server.global_state, payload, lr, len(train_sizes), total,
                       stream_seed(server, config, cid)) for cid in selected]


def server_bound(server: Server, config: RunConfig, tasks: list[ClientTask],
                 uploads: list[Upload]) -> tuple[list[Upload], list[ClientFailure], int | None]:
    """Under a clipping codec (``privacy.clip_norm`` finite, no secure aggregation: the server sees
    each update), each update held to the round's clip norm by ``privacy.over_bound``
    (:func:`~fedlatent.federated.bound.enforce_bound`); returns the uploads kept, those dropped and
    how many were over (None: nothing checked, no clip bound promised)."""
    if not isinstance(server.codec, ClipCodec) or not uploads or not tasks:
        return uploads, [], None
    bound = server.codec.clip_norm_of(server.state)
    return enforce_bound(uploads, tasks[0].global_state, server.untransmitted(), bound, config.privacy.over_bound)


def _client_of(outcome: Upload | ClientFailure) -> int:
    return outcome.client_id if isinstance(outcome, Upload) else outcome.client


def close_round(server: Server, config: RunConfig, rnd: int, tasks: list[ClientTask],
                outcomes: list[Upload | ClientFailure]) -> RoundResult:
    """Screen every reply (non-finite: the failure policy, on every backend — the server never
    trusts a client's own check) and, where the codec clips, hold each update to the clip bound
    (:func:`server_bound`); aggregate what is kept and take the server step; raise
    :class:`RunStopped` when the new global model is not finite."""
    uploads, dropped = screen(rnd, sorted(outcomes, key=_client_of), config.train)
    uploads, over_bound, over = server_bound(server, config, tasks, uploads)
    dropped += over_bound
    if uploads:  # none left (every client dropped, train.min_clients = 0): the global model stays
        server.aggregate(uploads, rnd)
    bad = first_nonfinite(server.global_state)
    if bad is not None:
        raise RunStopped(f"round {rnd + 1}: the aggregated global model's {bad} is not finite "
                         f"(clients {[u.client_id for u in uploads]})", rnd)
    metrics: dict[str, Any] = {
        "clients": [u.client_id for u in uploads],
        "train_loss": float(np.mean([u.metrics["train_loss"] for u in uploads])) if uploads else None,
    }
    if not (config.privacy.noise_multiplier > 0 or config.privacy.sample_noise_multiplier > 0):
        metrics["client_train_loss"] = [u.metrics["train_loss"] for u in uploads]  # under DP: a release outside ε
    untransmitted = server.untransmitted()
    down = _once_each([t.global_state for t in tasks], lambda state: traffic(state, untransmitted))
    up = [(int(u.metrics[CODED_BYTES]), 0) if CODED_BYTES in u.metrics else traffic(u.state, untransmitted)
          for u in uploads]  # a message a codec link made smaller (top-k) counts as it travels
    metrics["bytes_down"] = sum(d for d, _ in down) + sum(_once_each([t.payload for t in tasks], nbytes))
    metrics["bytes_up"] = sum(d for d, _ in up) + sum(nbytes(e) for u in uploads for e in u.extras.values())
    metrics["bytes_head_down"] = sum(h for _, h in down)
    metrics["bytes_head_up"] = sum(h for _, h in up)
    if dropped:
        metrics["dropped"] = [failure.record() for failure in dropped]
    if over is not None:  # the server's check of the clip bound: the updates over C this round
        metrics["privacy_over_bound"] = over
    for key in sorted({k for u in uploads for k in u.metrics if k.startswith(("term_", "personal_"))}):
        metrics[key] = float(np.mean([u.metrics[key] for u in uploads if key in u.metrics]))
    metrics["time_train_s"] = sum(u.metrics["train_seconds"] for u in uploads)
    return RoundResult(uploads, dropped, metrics)


# client half -------------------------------------------------------------------------------------
def client_round(task: ClientTask, state: Tensors, num_samples: int, model: FedModel, momentum: float) -> ClientRound:
    """The parts' view of ``task`` for a client with ``num_samples`` training samples, on a copy
    of its ``state`` (parts replace entries, never mutate them: the caller's dict stays as it was);
    the parts' draws derive from the task's stream seed."""
    return ClientRound(task.client_id, model, {}, dict(state), dict(task.payload), task.lr, num_samples,
                       task.num_clients, task.total_samples, momentum, seed=task.seed, round=task.round)


def calibration_due(spec: MethodSpec, rnd: int) -> bool:
    """Whether the head is calibrated after round ``rnd`` (0-based) as well as at the end
    (``algorithm.calibration_every``, periodic FFC)."""
    cal = spec.calibration
    return cal.declared.periodic and bool(cal.every) and (rnd + 1) % cal.every == 0


def client_generator(seed: int, task: ClientTask) -> torch.Generator:
    """The generator of a client's local training in a round: (seed, round, client)."""
    return torch.Generator().manual_seed(derive_seed(seed, LOCAL_TRAINING, task.round, task.client_id))


def client_generators(seeds: int | Sequence[int], rnd: int, client_ids: list[int]) -> list[torch.Generator]:
    """:func:`client_generator` of each of ``client_ids`` in round ``rnd`` (0-based) from ``seeds``
    (one stream seed for all, as in a seeded run, or each client's own), their seeds hashed together
    (:func:`~fedlatent.seeding.derive_seeds`) where they share the stream seed."""
    each = [seeds] * len(client_ids) if isinstance(seeds, int) else list(seeds)
    if len(set(each)) > 1:  # each client's own stream seed (a secret run): one hash apiece
        return [torch.Generator().manual_seed(derive_seed(seed, LOCAL_TRAINING, rnd, cid))
                for seed, cid in zip(each, client_ids, strict=True)]
    return [torch.Generator().manual_seed(s) for s in derive_seeds(*each[:1], LOCAL_TRAINING, rnd, last=client_ids)]


def client_update(ws: Workspace, spec: MethodSpec, task: ClientTask, data: Split, state: Tensors,
                  settings: LocalSettings) -> tuple[Upload, Tensors]:
    """The client half: train from the task's global weights on this client's ``data`` with its
    ``state``, every draw from the task's stream seed; return the upload and the client's new state
    (``state`` is not mutated). Raises on a client error."""
    rc = client_round(task, state, len(data), ws.model, settings.momentum)
    upload = local_update(ws, task.global_state, data, spec, rc, settings, client_generator(task.seed, task))
    return upload, rc.state


def checked(upload: Upload, new_state: Tensors, *, tensors_finite: bool = False) -> Upload | ClientFailure:
    """The client's own check before it replies: a non-finite loss, weight, extra or new state
    makes its reply a failure (the server cannot see the state). ``tensors_finite``: a backend
    that plays many clients has checked all their tensors at once (:func:`checked_all`)."""
    quantity = nonfinite_quantity(upload, new_state, tensors_finite=tensors_finite)
    return upload if quantity is None else ClientFailure(upload.client_id, "nonfinite", f"non-finite {quantity}")



def checked_all(outcomes: list[Upload | ClientFailure], states: dict[int, Tensors]) -> list[Upload | ClientFailure]:
    """:func:`checked` for every upload of clients played in one process (``states``: their new
    states by id), their tensors and losses checked together first
    (:func:`~fedlatent.federated.failures.all_finite`, :func:`~fedlatent.federated.failures.losses_finite`)."""
    uploads = [o for o in outcomes if isinstance(o, Upload)]
    finite = all_finite(t for u in uploads for t in (*upload_tensors(u), states[u.client_id]))
    if finite and losses_finite(uploads):  # the common case: every reply stands as it is
        return outcomes
    return [checked(o, states[o.client_id], tensors_finite=finite) if isinstance(o, Upload) else o
            for o in outcomes]


def encoded(codec: UpdateCodec, outcomes: list[Upload | ClientFailure], task: ClientTask,
            withheld: Collection[str], states: dict[int, Tensors] | None = None) -> list[Upload | ClientFailure]:
    """The client half's last step, after its own check (:func:`checked`, :func:`checked_all`):
    each upload as the message it travels as (:meth:`UpdateCodec.encode` from the round's global
    state and payload, as ``task`` holds them; ``withheld``: the entries that never travel,
    :meth:`Server.untransmitted`; ``states``: the clients' new states by id, where the codec's links
    keep their per-client state)."""
    states = states or {}
    return [codec.encode(o, task.global_state, withheld, task.payload, states.get(o.client_id), task.round)
            if isinstance(o, Upload) else o for o in outcomes]
