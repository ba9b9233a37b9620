"""The embedded backend (default): one process, clients trained in turn, state on the CPU.

:class:`Setup` is the run as the run driver (``federated.driver``) drives it: the driver plans and
closes each round (sampling, payload, failure policy, aggregation, server step), evaluates, writes
metrics and checkpoints (at most one a second, see ``federated.state.Checkpoints``) and ends the
run; between a round's halves this backend's trainer runs the selected clients' local updates
(``federated.client``) in turn — or all at once (``federated.trainer``, the vectorized backend).
It plays every client, so it keeps every client's state in its own store (``Setup.client_states``,
checkpointed with the server's; with ``train.client_state_memory`` a
:class:`~fedlatent.federated.client_states.ClientStates` within that budget), which the server half never reads. Every random choice is derived
from (seed, round, client), never from a global RNG reseeded in the loop, so a run killed after
round r and resumed gives exactly the numbers of the uninterrupted run. Clients that raise or
diverge are handled by ``federated.failures``.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from fedlatent.config import PrivacyConfig, RunConfig, memory_budget
from fedlatent.data.clients import sizes_of
from fedlatent.data.types import Federation, GlobalData, Split
from fedlatent.errors import ConfigError
from fedlatent.federated import calibrate, devices, driver
from fedlatent.federated.accounting import SampleAccountant
from fedlatent.federated.client_states import FOLDER as STORE_FOLDER, ClientStates
from fedlatent.federated.client import LocalSettings, Workspace, state_to_cpu, workspace_for
from fedlatent.federated.trainer import local_update
from fedlatent.federated.diagnostics import Diagnostics
from fedlatent.federated.evaluation import Tally, client_validation, evaluate
from fedlatent.federated.sampled import correct_per_client, ratio_se
from fedlatent.federated.failures import ClientFailure, error_detail
from fedlatent.federated.personal import client_report, new_client_reports
from fedlatent.federated.codec import server_codec
from fedlatent.federated.round import (ClientTask, checked_all, client_generators, client_round, clients_per_round,
                                       encoded, local_settings, round_lr, stream_seed)
from fedlatent.federated.round import sample_clients as sample_clients  # the embedded backend's sampling
from fedlatent.federated.randomness import Randomness
from fedlatent.federated.server import Server
from fedlatent.federated.state import write_atomically
from fedlatent.methods.head import apply_head
from fedlatent.methods.parts import ClientRound, MethodSpec, Tensors, Upload, trainable_names
from fedlatent.models import FedModel, build_model
from fedlatent.seeding import FINETUNE, HEAD_INIT, MODEL_INIT, derive_seed


def train_in_turn(ws: Workspace, global_state: Tensors, datas: list[Split], spec: MethodSpec,
                  rcs: list[ClientRound], settings: LocalSettings,
                  generators: list[torch.Generator]) -> list[Upload | ClientFailure]:
    """This backend's trainer: the selected clients' local updates one after another (what
    ``round.client_update`` does for one client); a client that raises becomes a
    :class:`ClientFailure` (the failure policy decides what follows), except for a ConfigError:
    the user's to correct (exit 2), whatever the policy."""
    outcomes: list[Upload | ClientFailure] = []
    for data, rc, generator in zip(datas, rcs, generators):
        try:
            outcomes.append(local_update(ws, global_state, data, spec, rc, settings, generator))
        except ConfigError:
            raise
        except Exception as exc:  # any error of one client's update is that client's failure
            outcomes.append(ClientFailure(rc.client_id, "error", error_detail(exc), exc))
    return outcomes


Trainer = Callable[[Workspace, Tensors, list[Split], MethodSpec, list[ClientRound], LocalSettings,
                    list[torch.Generator]], list[Upload | ClientFailure]]


@dataclass
class Setup:
    """Everything built once per run; ``trainer`` runs the selected clients' local updates;
    ``client_states`` is the store of every client's state (this backend plays all clients)."""

    config: RunConfig
    federation: Federation
    spec: MethodSpec
    workspace: Workspace
    server: Server
    client_states: list[Tensors] | ClientStates  # ClientStates: within train.client_state_memory
    device: torch.device
    trainer: Trainer = train_in_turn
    metrics: list[dict[str, Any]] = field(default_factory=list)
    diagnostics: Diagnostics | None = None
    warn: Callable[[str], None] = field(default=lambda message: _warn(message))
    train_sizes: list[int] = field(init=False)  # the census of training-set sizes, taken once
    sample_accountant: SampleAccountant | None = field(init=False)  # sample-level DP-SGD's ε, when noised
    tells_each_drop = False  # the run's end counts the dropped clients in one line

    def __post_init__(self) -> None:
        self.train_sizes = [int(n) for n in sizes_of(self.federation.clients)[:, 0]]  # no client built
        self.sample_accountant = driver.sample_accountant(self.config, self.train_sizes, self.server.randomness)

    # the clients as the run driver (federated.driver) asks for them: all in this process
    @property
    def model(self) -> FedModel:
        return self.workspace.model

    def train(self, tasks: list[ClientTask]) -> tuple[list[Upload | ClientFailure], dict[int, Tensors]]:
        """The client half of every task, on this backend's trainer: the outcomes (each client's own
        non-finite check applied, then the run's update codec: the server's, both sides being in
        this process) and the selected clients' new states by id, the store untouched. A
        ConfigError passes through: a key the clients cannot satisfy is the user's error, not theirs."""
        cfg, fed = self.config, self.federation
        selected = [t.client_id for t in tasks]
        local = settings(self, tasks[0].lr, cfg.train.local_epochs, cfg.privacy)
        rcs = [client_round(t, self.client_states[t.client_id], self.train_sizes[t.client_id], self.workspace.model,
                            local.momentum) for t in tasks]
        generators = client_generators([t.seed for t in tasks], tasks[0].round, selected)
        try:
            outcomes = self.trainer(self.workspace, tasks[0].global_state, [fed.clients[cid].train for cid in selected],
                                    self.spec, rcs, local, generators)
        except ConfigError:
            raise
        except Exception as exc:  # a trainer of clients together (lockstep) fails for all of them
            outcomes = [ClientFailure(cid, "error", f"{error_detail(exc)} (clients {selected} trained together)", exc)
                        for cid in selected]
        states = {rc.client_id: rc.state for rc in rcs}
        return encoded(self.server.codec, checked_all(outcomes, states), tasks[0],
                       self.server.untransmitted(), states), states

    def statistics(self, state: Tensors) -> dict[int, Tensors]:
        return {cid: calibrate.client_statistics(self.model, state, c.train, self.spec.calibration,
                                                 self.config.eval.batch_size, self.device, self.server.codec)
                for cid, c in enumerate(self.federation.clients)}

    def validation(self, state: Tensors, clients: list[int] | None = None) -> dict[int, float]:
        fed, batch = self.federation, self.config.eval.batch_size
        if clients is not None:  # an evaluation's sample: their validation splits in one pass
            chosen = {cid: val for cid in clients if (val := fed.clients[cid].val) is not None and len(val)}
            self.model.load_state_dict(state)
            correct, sizes = correct_per_client(self.model, list(chosen.values()), batch, self.device)
            return {cid: c / n for cid, c, n in zip(chosen, correct, sizes)}
        values = {cid: client_validation(self.model, state, c.val, fed.num_classes, batch, self.device)
                  for cid, c in enumerate(fed.clients)}
        return {cid: v for cid, v in values.items() if v is not None}

    def test(self, state: Tensors, clients: list[int] | None = None) -> dict[str, float]:
        fed = self.federation
        if clients is not None and fed.test_of_clients:  # the global test split is theirs: a sample of it
            splits = [t for t in (fed.clients[cid].test for cid in clients) if t is not None and len(t)]
            batch = self.config.eval.batch_size
            correct, sizes = correct_per_client(self.model, splits, batch, self.device)
            return {**evaluate(self.model, Split.concat(splits), fed.num_classes, batch, self.device),
                    "accuracy_se": ratio_se(correct, sizes, len(fed.clients))}
        return {} if fed.test is None else evaluate(self.model, fed.test, fed.num_classes, self.config.eval.batch_size,
                                                    self.device)

    def reports(self, state: Tensors, clients: list[int] | None = None) -> list[dict[str, Any]]:
        cfg, fed = self.config, self.federation
        local = settings(self, round_lr(cfg.train, cfg.train.rounds - 1), self.spec.personalization.epochs)
        rows = [client_report(self.workspace, self.spec, cid, fed.clients[cid], self.client_states[cid], state,
                              num_classes=fed.num_classes, batch_size=cfg.eval.batch_size,
                              device=self.device, settings=local,
                              generator=torch.Generator().manual_seed(derive_seed(self.client_seed(cid), FINETUNE, cid)))
                for cid in (range(len(fed.clients)) if clients is None else clients)]
        return [row for row in rows if row is not None]

    def new_clients(self, state: Tensors, personal: bool,
                    clients: list[int] | None = None) -> tuple[dict[int, Tally], list[dict[str, Any]]]:
        cfg, new = self.config, self.federation.new_clients
        local = settings(self, round_lr(cfg.train, cfg.train.rounds - 1), self.spec.personalization.epochs)
        if clients is not None:  # the held-out clients at those positions among them
            ids = sorted(new)
            new = {ids[i]: new[ids[i]] for i in clients}
        return new_client_reports(self.workspace, self.spec, new, state,
                                  num_classes=self.federation.num_classes, batch_size=cfg.eval.batch_size,
                                  device=self.device, settings=local, seeds={cid: self.client_seed(cid) for cid in new},
                                  personal=personal)

    def client_seed(self, cid: int) -> int:
        """Client ``cid``'s stream seed (:func:`~fedlatent.federated.round.stream_seed`; a held-out one's too)."""
        return stream_seed(self.server, self.config, cid)


def init_seeds(seed: int) -> tuple[int, int]:
    """The seeds of the initial model's construction and of its head, from the run ``seed``."""
    return derive_seed(seed, MODEL_INIT), derive_seed(seed, HEAD_INIT)


def make_model(config: RunConfig, federation: GlobalData, spec: MethodSpec,
               seeds: tuple[int, int] | None = None) -> FedModel:
    """The initial global model: seeded construction, then the method's head policy; ``seeds``: their
    seeds (:func:`init_seeds`) where the configuration holds no run seed (a Flower SuperNode's)."""
    model_seed, head_seed = init_seeds(config.seed) if seeds is None else seeds
    torch.manual_seed(model_seed)
    model = build_model(config.model, federation.input_shape, federation.num_classes, federation.name)
    apply_head(model, spec.head, torch.Generator().manual_seed(head_seed))
    return model


def setup(config: RunConfig, federation: Federation, spec: MethodSpec, trainer: Trainer = train_in_turn) -> Setup:
    # torch imports torch._dynamo (~1 s, once per process) when the first optimiser is built: pay
    # it here, so that it does not count as the first round's local-training time
    device = torch.device(config.train.device)
    model, server = initial_server(config, federation, spec, len(federation.clients))
    ws = workspace_for(model, spec, config.train.compile)
    return Setup(config, federation, spec, ws, server, [{} for _ in range(len(federation.clients))], device, trainer)


def initial_server(config: RunConfig, federation: GlobalData, spec: MethodSpec,
                   num_clients: int) -> tuple[FedModel, Server]:
    """The run's model on its device (in that device's layout, :func:`fedlatent.federated.devices.prepare`)
    and the server of ``num_clients`` clients holding its initial weights, with the run's update
    codec (every backend's start; torch's one-off optimiser import first, so that it is not counted
    in round 1)."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    model = devices.prepare(make_model(config, federation, spec), config.train.device)
    randomness = Randomness.of(config.privacy, config.backend, config.seed)
    server = Server(spec, state_to_cpu(model), [n for n, _ in model.named_parameters()], trainable_names(model),
                    config.server, num_clients,
                    server_codec(config.privacy, randomness, num_clients,
                                 clients_per_round(num_clients, config.train.participation), config.compression,
                                 config.train.min_clients,
                                 config.train.participation if config.train.client_sampling == "poisson" else None),
                    randomness)
    return model, server


def settings(s: Setup, lr: float, epochs: int, privacy: PrivacyConfig | None = None) -> LocalSettings:
    """The local settings of a round at ``lr``; ``privacy``: the run's sample-level DP-SGD (the
    rounds' training; the evaluation's fine-tuning has none)."""
    return local_settings(s.config.train, lr, epochs, s.federation.augment, s.federation.num_classes, s.device,
                          privacy)


# the rounds and the end of a run, as the run driver plays them for every backend
run_round = driver.play_round
finish = driver.finish
evaluate_global = driver.evaluate_global
calibrated = driver.calibrated


def _warn(message: str) -> None:
    print(f"fedlatent: warning: {message}", file=sys.stderr)


def run(config: RunConfig, federation: Federation, spec: MethodSpec, out: Path, *, resume: bool = False,
        progress: Callable[[dict[str, Any]], None] | None = None,
        trainer: Trainer = train_in_turn, warn: Callable[[str], None] = _warn,
        rounds_start: Callable[[], None] | None = None) -> tuple[dict[str, Any], float]:
    """Train for ``config.train.rounds`` rounds, writing metrics and checkpoints under ``out``;
    return the final evaluation (global, calibrated and personalised) and the run's wall seconds
    (including the part before a resume). A resume starts from the newest intact checkpoint, else
    from the initial state (``warn`` is told of each damaged one skipped); the failure policy may raise
    :class:`~fedlatent.federated.failures.RunStopped`, the last good round's checkpoint kept. The
    checkpoints are paced by :class:`~fedlatent.federated.state.Checkpoints`; the last completed
    round's is on disk when this returns or raises. ``rounds_start``: told when the rounds start."""
    clock = time.perf_counter()
    torch.set_num_threads(config.train.threads)
    s = setup(config, federation, spec, trainer)
    s.warn = warn
    budget = memory_budget(config.train.client_state_memory)
    if budget is not None:  # the clients' states within the budget, the rest in files under the run folder
        s.client_states = ClientStates(len(federation.clients), budget, out / STORE_FOLDER)
    try:
        ckpt = out / "checkpoints"
        start, before = driver.restore(s, ckpt, len(federation.clients), warn) if resume else (0, 0.0)
        if config.diagnostics.which:
            s.diagnostics = Diagnostics(config, federation, out / "diagnostics.jsonl", s.device, s.client_seed)
            s.diagnostics.start(start)
        metrics_path = out / "metrics.jsonl"
        write_atomically(metrics_path, "".join(line + "\n" for line in driver.metrics_upto(metrics_path, start)))
        final = driver.play_rounds(s, range(start, config.train.rounds), out, lambda rnd: run_round(s, rnd),
                                   lambda last: finish(s, last), since=clock - before, progress=progress,
                                   rounds_start=rounds_start)
    finally:
        if isinstance(s.client_states, ClientStates):  # scratch: the checkpoints hold the states
            s.client_states.close()
    return final, before + time.perf_counter() - clock
