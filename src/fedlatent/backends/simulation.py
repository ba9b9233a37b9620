"""The embedded backend (default): one process, clients trained in turn, state on the CPU.

The backend owns the round loop and drives the round's two halves (``federated.round``): the
server half plans the round (sampling, payload, learning rate) and closes it (failure policy,
aggregation, server step); between them this backend's trainer runs the selected clients' local
updates (``federated.client``) in turn. It plays every client, so it keeps every client's state in
its own store (``Setup.client_states``, checkpointed with the server's), which the server half
never reads. Then it evaluates and writes metrics and a checkpoint (at most one a second, see
``federated.state.Checkpoints``). Every random choice is derived
from (seed, round, client), never from a global RNG reseeded in the loop, so a run killed after
round r and resumed gives exactly the numbers of the uninterrupted run. Clients that raise or diverge are handled by ``federated.failures``.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch

from fedlatent.config import RunConfig
from fedlatent.data.types import Federation, Split
from fedlatent.errors import ConfigError
from fedlatent.federated import calibrate
from fedlatent.federated.client import LocalSettings, Workspace, local_update, state_to_cpu, workspace_for
from fedlatent.federated.diagnostics import Diagnostics
from fedlatent.federated.evaluation import client_validation, evaluate
from fedlatent.federated.failures import ClientFailure, error_detail
from fedlatent.federated.personal import client_report, combine_reports
from fedlatent.federated.round import (ClientTask, calibration_due, checked_all, client_generators, client_round, close_round,
                                       local_settings, nbytes, plan_round, round_lr)
from fedlatent.federated.round import sample_clients as sample_clients  # the embedded backend's sampling
from fedlatent.federated.server import Server
from fedlatent.federated.state import Checkpoints, has_checkpoint, load_checkpoint, write_atomically
from fedlatent.methods.head import apply_head
from fedlatent.methods.parts import ClientRound, MethodSpec, Tensors, Upload, trainable_names
from fedlatent.models import FedModel, build_model
from fedlatent.seeding import CALIBRATION, FINETUNE, HEAD_INIT, MODEL_INIT, derive_seed


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
    client_states: list[Tensors]
    device: torch.device
    trainer: Trainer = train_in_turn
    metrics: list[dict[str, Any]] = field(default_factory=list)
    diagnostics: Diagnostics | None = None
    train_sizes: list[int] = field(init=False)  # the census of training-set sizes, taken once

    def __post_init__(self) -> None:
        self.train_sizes = [len(c.train) for c in self.federation.clients]


def make_model(config: RunConfig, federation: Federation, spec: MethodSpec) -> FedModel:
    """The initial global model: seeded construction, then the method's head policy."""
    torch.manual_seed(derive_seed(config.seed, MODEL_INIT))
    model = build_model(config.model, federation.input_shape, federation.num_classes, federation.name)
    apply_head(model, spec.head, torch.Generator().manual_seed(derive_seed(config.seed, HEAD_INIT)))
    return model


def setup(config: RunConfig, federation: Federation, spec: MethodSpec, trainer: Trainer = train_in_turn) -> Setup:
    # torch imports torch._dynamo (~1 s, once per process) when the first optimiser is built: pay
    # it here, so that it does not count as the first round's local-training time
    device = torch.device(config.train.device)
    model, server = initial_server(config, federation, spec)
    ws = workspace_for(model, spec, config.train.compile)
    return Setup(config, federation, spec, ws, server, [{} for _ in federation.clients], device, trainer)


def initial_server(config: RunConfig, federation: Federation, spec: MethodSpec) -> tuple[FedModel, Server]:
    """The run's model on its device and the server holding its initial weights (both backends'
    start; torch's one-off optimiser import first, so that it is not counted in round 1)."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    model = make_model(config, federation, spec).to(config.train.device)
    server = Server(spec, state_to_cpu(model), [n for n, _ in model.named_parameters()], trainable_names(model),
                    config.server, len(federation.clients))
    return model, server


def settings(s: Setup, lr: float, epochs: int) -> LocalSettings:
    return local_settings(s.config.train, lr, epochs, s.federation.augment, s.federation.num_classes, s.device)


def calibrated(s: Setup, state: Tensors) -> tuple[Tensors, int]:
    """``state`` with its head calibrated from every client's statistics (in client-id order), and
    the bytes of those statistics (what the clients upload for it: SphereFed's Table 1 "once" row)."""
    cal, model = s.spec.calibration, s.workspace.model
    stats = [calibrate.client_statistics(model, state, c.train, cal, s.config.eval.batch_size, s.device)
             for c in s.federation.clients]
    generator = torch.Generator().manual_seed(derive_seed(s.config.seed, CALIBRATION))
    return (calibrate.apply_statistics(state, stats, cal, *calibrate.head_keys(model), generator),
            sum(nbytes(st) for st in stats))


def train_clients(s: Setup, tasks: list[ClientTask]) -> tuple[list[Upload | ClientFailure], dict[int, Tensors]]:
    """The client half of every task, on this backend's trainer: the outcomes (each client's own
    non-finite check applied) and the selected clients' new states by id, the store untouched. A
    ConfigError passes through: a key the clients cannot satisfy is the user's error, not theirs."""
    cfg, fed = s.config, s.federation
    selected = [t.client_id for t in tasks]
    local = settings(s, tasks[0].lr, cfg.train.local_epochs)
    rcs = [client_round(t, s.client_states[t.client_id], s.train_sizes[t.client_id], s.workspace.model,
                        local.momentum, cfg.seed) for t in tasks]
    generators = client_generators(cfg.seed, tasks[0].round, selected)
    try:
        outcomes = s.trainer(s.workspace, tasks[0].global_state, [fed.clients[cid].train for cid in selected],
                             s.spec, rcs, local, generators)
    except ConfigError:
        raise
    except Exception as exc:  # a trainer of clients together (lockstep) fails for all of them
        outcomes = [ClientFailure(cid, "error", f"{error_detail(exc)} (clients {selected} trained together)", exc)
                    for cid in selected]
    states = {rc.client_id: rc.state for rc in rcs}
    return checked_all(outcomes, states), states


def run_round(s: Setup, rnd: int) -> dict[str, Any]:
    """One communication round; returns its metrics line. A client dropped by the failure policy
    keeps the state it had before the round."""
    cfg = s.config
    started = time.perf_counter()
    tasks = plan_round(s.server, cfg, rnd, s.train_sizes)
    outcomes, states = train_clients(s, tasks)
    result = close_round(s.server, cfg, rnd, tasks, outcomes, replies_checked=True)
    for upload in result.uploads:
        s.client_states[upload.client_id] = states[upload.client_id]
    if calibration_due(s.spec, rnd):
        s.server.global_state, sent = calibrated(s, s.server.global_state)
        result.metrics["bytes_calibration_up"] = sent
    line: dict[str, Any] = {"round": rnd + 1, "lr": tasks[0].lr, **result.metrics}
    if (rnd + 1) % cfg.eval.every == 0 or rnd + 1 == cfg.train.rounds:
        line.update(evaluate_global(s))
    line["time_round_s"] = time.perf_counter() - started
    if s.diagnostics is not None and s.diagnostics.due(rnd + 1):
        s.diagnostics.record(rnd + 1, s.workspace.model, s.server.global_state, result.uploads)
    return line


def global_model(s: Setup, state: Tensors | None = None) -> FedModel:
    model = s.workspace.model
    model.load_state_dict(s.server.global_state if state is None else state)
    return model


def evaluate_global(s: Setup, state: Tensors | None = None) -> dict[str, float]:
    """Global model on the global test set and the mean over clients of their validation accuracies."""
    fed, out = s.federation, {}
    state = s.server.global_state if state is None else state
    model = global_model(s, state)
    if fed.test is not None:
        out.update({f"test_{k}": v for k, v in evaluate(model, fed.test, fed.num_classes,
                                                          s.config.eval.batch_size, s.device).items()})
    vals = [client_validation(model, state, c.val, fed.num_classes, s.config.eval.batch_size, s.device)
            for c in fed.clients]
    if any(v is not None for v in vals):
        out["val_accuracy"] = float(np.mean([v for v in vals if v is not None]))
    return out


def _warn(message: str) -> None:
    print(f"fedlatent: warning: {message}", file=sys.stderr)


def metrics_upto(path: Path, last_round: int) -> list[str]:
    """The lines of ``metrics.jsonl`` for rounds 1..``last_round``; reading stops at a torn line
    (a run killed while writing it)."""
    kept = []
    for line in path.read_text().splitlines() if last_round and path.exists() else []:
        try:
            record = json.loads(line)
        except ValueError:
            break
        if record["round"] <= last_round:
            kept.append(line)
    return kept


def restore(s: Played, ckpt: Path, num_clients: int, warn: Callable[[str], None]) -> tuple[int, float]:
    """Load the newest intact checkpoint under ``ckpt`` into ``s`` (its server's global and server
    state, its clients' states); return the round it ends and the wall seconds spent before it —
    (0, 0.0) when the run has no checkpoint yet, or none intact (``warn`` is told in one line):
    ``s`` then keeps the initial state, which the seed fixes, so the run starts again and ends
    as the uninterrupted run. (A run shorter than CHECKPOINT_SECONDS keeps one checkpoint only.)"""
    if not has_checkpoint(ckpt):
        return 0, 0.0
    loaded = load_checkpoint(ckpt, num_clients, warn)
    if loaded is None:
        warn(f"--resume: no intact checkpoint under {ckpt}; starting again from the initial state (round 0)")
        return 0, 0.0
    s.server.global_state, s.server.state, s.client_states, info = loaded
    return info["round"], info["elapsed_s"]


def run(config: RunConfig, federation: Federation, spec: MethodSpec, out: Path, *, resume: bool = False,
        progress: Callable[[dict[str, Any]], None] | None = None,
        trainer: Trainer = train_in_turn, warn: Callable[[str], None] = _warn) -> tuple[dict[str, Any], float]:
    """Train for ``config.train.rounds`` rounds, writing metrics and checkpoints under ``out``;
    return the final evaluation (global, calibrated and personalised) and the run's wall seconds
    (including the part before a resume). A resume starts from the newest intact checkpoint, else
    from the initial state (``warn`` is told of each damaged one skipped); the failure policy may raise
    :class:`~fedlatent.federated.failures.RunStopped`, the last good round's checkpoint kept. The
    checkpoints are paced by :class:`~fedlatent.federated.state.Checkpoints`; the last completed
    round's is on disk when this returns or raises."""
    clock = time.perf_counter()
    torch.set_num_threads(config.train.threads)
    s = setup(config, federation, spec, trainer)
    ckpt = out / "checkpoints"
    start, before = restore(s, ckpt, len(federation.clients), warn) if resume else (0, 0.0)
    if config.diagnostics.which:
        s.diagnostics = Diagnostics(config, federation, out / "diagnostics.jsonl", s.device)
        s.diagnostics.start(start)
    metrics_path = out / "metrics.jsonl"
    write_atomically(metrics_path, "".join(line + "\n" for line in metrics_upto(metrics_path, start)))
    final = play_rounds(s, range(start, config.train.rounds), out, lambda rnd: run_round(s, rnd),
                        lambda: finish(s), since=clock - before, progress=progress)
    return final, before + time.perf_counter() - clock


class Played(Protocol):
    """What a run's loop checkpoints: the server and every client's state (the embedded
    backends' :class:`Setup`, Flower's ``ServerRun``)."""

    server: Server
    client_states: list[Tensors]


def play_rounds(s: Played, rounds: range, out: Path, play: Callable[[int], dict[str, Any]],
                finish: Callable[[], dict[str, Any]], *, since: float,
                progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The round loop of every backend: ``play`` each round (its metrics line), append the line
    to ``out/metrics.jsonl`` with the seconds elapsed since ``since`` (a ``perf_counter`` value;
    a resumed run's earlier seconds taken off it), checkpoint the state (paced by
    :class:`~fedlatent.federated.state.Checkpoints`: files written while the next round trains,
    the last completed round's on disk however the loop is left) and tell ``progress``; then
    ``finish`` (the final evaluation), whose result is returned."""
    with Checkpoints(out / "checkpoints") as checkpoints, (out / "metrics.jsonl").open("a") as sink:
        for rnd in rounds:
            line = play(rnd)
            line["time_elapsed_s"] = time.perf_counter() - since
            sink.write(json.dumps(line) + "\n")
            sink.flush()
            checkpoints.save(global_state=s.server.global_state, server_state=s.server.state,
                             client_states=s.client_states,
                             info={"round": rnd + 1, "elapsed_s": time.perf_counter() - since},
                             last=rnd + 1 == rounds.stop)
            if progress:
                progress(line)
        return finish()


def finish(s: Setup) -> dict[str, Any]:
    """Final evaluation: the global model, after calibration when the method has one, and per client."""
    final: dict[str, Any] = {}
    before = evaluate_global(s)
    state = s.server.global_state
    if s.spec.calibration.kind != "none":
        state, final["bytes_calibration_up"] = calibrated(s, state)
        final.update({f"uncalibrated_{k.removeprefix('test_')}": v for k, v in before.items()})
        before = evaluate_global(s, state)
    final.update({k.removeprefix("test_"): v for k, v in before.items()})
    cfg = s.config
    if cfg.eval.personalized != "never":
        local = settings(s, round_lr(cfg.train, cfg.train.rounds - 1), s.spec.personalization.epochs)
        rows = [client_report(s.workspace, s.spec, cid, client, s.client_states[cid], state,
                              num_classes=s.federation.num_classes, batch_size=cfg.eval.batch_size, device=s.device,
                              settings=local, generator=torch.Generator().manual_seed(derive_seed(cfg.seed, FINETUNE, cid)))
                for cid, client in enumerate(s.federation.clients)]
        final.update(combine_reports([row for row in rows if row is not None]))
    global_model(s, state)
    return final
