"""The run driver: a round's server side and the end of a run, written once for every backend.

A backend supplies its clients through the :class:`Run` interface — train these clients; gather
their statistics for a calibration; their validation accuracies; the global test split's scores;
their personalised reports; the clients that never train, evaluated as new clients —
whether they train in this process (``backends.simulation``, ``backends.vectorized``: their
trainer) or answer Flower messages (``backends.flower.server_app``). Everything else is here:
planning a round and closing it (``federated.round``), the clients' new states kept, the
calibration when due, the evaluation every ``eval.every`` rounds and the diagnostics (:func:`play_round`);
the round loop with its metrics lines and checkpoints (:func:`play_rounds`), the resume
(:func:`restore`, :func:`metrics_upto`); and the final evaluation (:func:`finish`). So every backend gives the same numbers for the same clients' replies.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch

from fedlatent.analysis import classifier_cost
from fedlatent.config import RunConfig, holdout_count
from fedlatent.data.holdout import holdout_ids
from fedlatent.data.types import GlobalData
from fedlatent.federated.accounting import SampleAccountant
from fedlatent.federated.calibrate import apply_statistics, head_keys
from fedlatent.federated.client_states import ClientStates
from fedlatent.federated import sampled
from fedlatent.federated.trainer.schedule import trained_samples
from fedlatent.federated.failures import ClientFailure
from fedlatent.federated.evaluation import Tally
from fedlatent.federated.personal import combine_new, combine_reports
from fedlatent.federated.randomness import Randomness
from fedlatent.federated.round import (ClientTask, calibration_due, clients_per_round, close_round, nbytes, plan_round,
                                      round_lr, sample_clients)
from fedlatent.federated.server import Server
from fedlatent.federated.state import Checkpoints, has_checkpoint, load_checkpoint
from fedlatent.methods.parts import MethodSpec, Tensors, Upload
from fedlatent.models.base import FedModel
from fedlatent.seeding import CALIBRATION, derive_seed


class Run(Protocol):
    """A run as the driver drives it: the server, every client's state (what is checkpointed), the
    global model and test set the server evaluates, and the backend's clients."""

    config: RunConfig
    spec: MethodSpec
    server: Server
    client_states: list[Tensors] | ClientStates  # a store within a budget (train.client_state_memory) or a list
    diagnostics: Any  # ``federated.diagnostics.Diagnostics`` or Flower's, or None
    tells_each_drop: bool  # a warning line for each client the failure policy leaves out, as it happens
    sample_accountant: SampleAccountant | None  # sample-level DP-SGD's accountant, when its steps are noised

    @property
    def federation(self) -> GlobalData:
        """Its global test set and classes (the clients' data may live elsewhere)."""

    @property
    def train_sizes(self) -> list[int]: ...

    @property
    def model(self) -> FedModel: ...

    @property
    def device(self) -> torch.device: ...

    def train(self, tasks: list[ClientTask]) -> tuple[list[Upload | ClientFailure], dict[int, Tensors]]:
        """The selected clients' local updates: their outcomes, and the new states of those that sent one."""

    def statistics(self, state: Tensors) -> dict[int, Tensors]:
        """Every reachable client's calibration statistics of the global ``state``, by client id."""

    def test(self, state: Tensors, clients: list[int] | None = None) -> dict[str, float]:
        """The global ``state``'s scores on the global test split (:func:`~fedlatent.federated.evaluation.scores`;
        none without one), the model holding ``state``; ``clients``: an evaluation's sample, whose
        test splits stand for the global one where it is theirs together (with ``accuracy_se``)."""

    def validation(self, state: Tensors, clients: list[int] | None = None) -> dict[int, float]:
        """The global ``state``'s accuracy on each client's validation split, by client id (none without);
        ``clients``: those ids only (an evaluation's sample, :mod:`fedlatent.federated.sampled`), None: all."""

    def reports(self, state: Tensors, clients: list[int] | None = None) -> list[dict[str, Any]]:
        """Each client's personalised report from the final global ``state`` (none without a local test
        split); ``clients``: those ids only, None: all."""

    def new_clients(self, state: Tensors, personal: bool,
                    clients: list[int] | None = None) -> tuple[dict[int, Tally], list[dict[str, Any]]]:
        """The clients that never train (``data.holdout_clients``), by their ids (after the training clients'): the global ``state``'s
        tally on each one's test split and, with ``personal``, each one's report under its program's
        new-client rule (:func:`~fedlatent.federated.personal.new_client_reports`); the model left holding ``state``.
        ``clients``: the held-out clients at those positions among them only, None: all."""

    def warn(self, message: str) -> None: ...


def play_round(s: Run, rnd: int) -> dict[str, Any]:
    """One communication round; returns its metrics line. A client the failure policy drops keeps
    the state it had before the round."""
    cfg = s.config
    started = time.perf_counter()
    tasks = plan_round(s.server, cfg, rnd, s.train_sizes)
    codec_fields = s.server.codec.round_metrics(s.server.state)  # as the round starts: its clip norm
    outcomes, states = s.train(tasks) if tasks else ([], {})  # Poisson sampling may select no client
    result = close_round(s.server, cfg, rnd, tasks, outcomes)
    if s.tells_each_drop:
        for failure in result.dropped:
            s.warn(f"round {rnd + 1}: client {failure.client} left out: {failure.detail}")
    for upload in result.uploads:
        if upload.client_id in states:
            s.client_states[upload.client_id] = states[upload.client_id]
    due = calibration_due(s.spec, rnd)
    if due:
        s.server.global_state, result.metrics["bytes_calibration_up"] = calibrated(s, s.server.global_state, rnd)
    line: dict[str, Any] = {"round": rnd + 1, "lr": round_lr(cfg.train, rnd), **result.metrics, **codec_fields}
    epsilon = s.server.codec.epsilon(rnd + 1, calibrations_in(s.spec, rnd + 1))
    if epsilon is not None:  # DP-FedAvg: the privacy spent by the rounds (and calibrations) so far, at privacy.delta
        line["privacy_epsilon"] = epsilon
    if s.sample_accountant is not None:  # sample-level DP-SGD: the worst client's, at privacy.delta
        line["sample_level_epsilon"] = s.sample_accountant.epsilon(rnd + 1)
    if s.spec.count_flops:
        line.update(classifier_round(s, result.uploads, due))
    if (rnd + 1) % cfg.eval.every == 0 or rnd + 1 == cfg.train.rounds:
        line.update(evaluate_global(s, clients=sampled.round_clients(cfg, rnd, len(s.train_sizes))))
        line.update({k: v for k, v in evaluate_new(s, s.server.global_state, personal=False, rnd=rnd).items()
                     if k != "new_clients"})
    line["time_round_s"] = time.perf_counter() - started
    if s.diagnostics is not None and s.diagnostics.due(rnd + 1):
        s.diagnostics.record(rnd + 1, s.model, s.server.global_state, result.uploads)
    return line


def evaluate_global(s: Run, state: Tensors | None = None, clients: list[int] | None = None) -> dict[str, float]:
    """The global model on the global test set, and the mean of the clients' validation accuracies
    (in client-id order); ``clients``: a sample of the clients (:mod:`fedlatent.federated.sampled`),
    whose mean comes with its standard error (``val_accuracy_se``) and size (``val_clients``)."""
    state = s.server.global_state if state is None else state
    s.model.load_state_dict(state)
    out = {f"test_{k}": v for k, v in (s.test(state) if clients is None else s.test(state, clients)).items()}
    values = s.validation(state) if clients is None else s.validation(state, clients)
    if values:
        out["val_accuracy"] = float(np.mean([values[cid] for cid in sorted(values)]))
        if clients is not None:
            out["val_accuracy_se"] = sampled.mean_se(list(values.values()), len(s.train_sizes))
            out["val_clients"] = len(values)
    return out


def evaluate_new(s: Run, state: Tensors, personal: bool = True, rnd: int | None = None) -> dict[str, Any]:
    """The clients that never train (``data.holdout_clients``) on the global ``state`` and, with
    ``personal`` unless ``eval.personalized = "never"``, on their program's new-client rule
    (:func:`~fedlatent.federated.personal.combine_new`); nothing without clients held out. A round's
    evaluation takes the global model alone: the rule trains on every new client's split, which
    the final evaluation does once, as the trained clients' personalised reports. Round ``rnd``'s
    (None: the final evaluation) takes the held-out clients :mod:`fedlatent.federated.sampled` samples."""
    if not s.config.data.holdout_clients:
        return {}
    cfg = s.config
    count = holdout_count(cfg.data.holdout_clients, int(cfg.data.num_clients))  # fixed where clients are held out
    which = sampled.final_clients(cfg, count, held_out=True) if rnd is None else \
        sampled.round_clients(cfg, rnd, count, held_out=True)
    personal = personal and cfg.eval.personalized != "never"
    tallies, rows = s.new_clients(state, personal) if which is None else s.new_clients(state, personal, which)
    out = combine_new(tallies, rows)
    if which is not None and tallies:  # a sample of the held-out clients: its estimates' standard errors
        ordered = [tallies[c] for c in sorted(tallies)]
        out["new_client_accuracy_se"] = sampled.ratio_se([int(t.correct.sum()) for t in ordered],
                                                         [int(t.count.sum()) for t in ordered], count)
        if rows:
            out["new_client_personal_mean_se"] = sampled.mean_se([r["accuracy"] for r in rows], count)
        out["new_client_sampled"] = len(tallies)
    return out


def calibrations_in(spec: MethodSpec, rounds: int) -> int:
    """How many calibrations the first ``rounds`` rounds make (periodic FFC), the final one not counted."""
    return sum(calibration_due(spec, rnd) for rnd in range(rounds))


def calibrated(s: Run, state: Tensors, release: int) -> tuple[Tensors, int]:
    """``state`` with its head calibrated from the clients' statistics, combined in client-id order
    (their sums through the run's update codec; ``release``: the round after which it is made,
    ``train.rounds`` for the final one, which the codec's noise is drawn for),
    and the bytes of those statistics (what the clients upload for it: SphereFed's Table 1 "once" row)."""
    stats = s.statistics(state)
    missing = sorted(set(range(len(s.train_sizes))) - set(stats))
    if missing:
        s.warn(f"calibration without client(s) {missing} (no statistics came back)")
    generator = torch.Generator().manual_seed(derive_seed(s.config.seed, CALIBRATION))
    return (apply_statistics(state, [stats[cid] for cid in sorted(stats)], s.spec.calibration, *head_keys(s.model),
                             generator, s.server.codec, release), sum(nbytes(st) for st in stats.values()))


def classifier_round(s: Run, uploads: list[Upload], calibrates: bool) -> dict[str, int]:
    """The classifier's own cost in a round, counted as SphereFed's Table 1 counts it
    (:mod:`fedlatent.analysis.classifier_cost`): ``classifier_bytes``, summed over the clients, and
    ``classifier_flops`` of a learned head's training on the ``uploads``' samples and its average,
    and of the calibration when ``calibrates``: ``W`` alone (no bias) in 32 bits, as the paper."""
    classes, features = s.model.classifier.weight.shape
    train = s.config.train
    sent = flops = 0
    if not s.spec.head.fixed and uploads:
        samples = sum(trained_samples(u.num_samples, u.steps, train.batch_size, train.drop_last) for u in uploads)
        sent = len(uploads) * classifier_cost.head_traffic(features, classes)
        flops = classifier_cost.head_training(features, classes, samples, len(uploads))
    if calibrates:
        cal, clients = s.spec.calibration, len(s.train_sizes)
        once = classifier_cost.calibration(cal.kind, features, classes, sum(s.train_sizes), clients,
                                           virtual_per_class=cal.virtual_per_class, epochs=cal.epochs)
        sent += clients * once.bytes_per_client
        flops += once.flops
    return {"classifier_bytes": sent, "classifier_flops": flops}


def sample_accountant(config: RunConfig, sizes: list[int],
                      randomness: Randomness | None = None) -> SampleAccountant | None:
    """The accountant of the run's sample-level DP-SGD (``privacy.sample_noise_multiplier`` > 0) for
    clients of training-set ``sizes`` (the census: every backend's, Flower's from its nodes), selected
    as the run selects them (by ``randomness`` where given: a secret selection's); None without noise.
    The driver's, so that every backend reports the same ε."""
    privacy, train = config.privacy, config.train
    if privacy.sample_noise_multiplier == 0:
        return None
    return SampleAccountant(sizes, train.batch_size, train.local_epochs, train.local_steps,
                            privacy.sample_noise_multiplier, privacy.delta,
                            lambda rnd: sample_clients(config.seed, rnd, len(sizes), train.participation)
                            if randomness is None else
                            randomness.sample(rnd, len(sizes), train.participation, train.client_sampling,
                                              clients_per_round(len(sizes), train.participation)))


def finish(s: Run, last: dict[str, Any] | None = None) -> dict[str, Any]:
    """The final evaluation: the global model (after calibration when the method has one, and the ε
    after it under DP), the clients' personalised reports and the new clients' (:func:`evaluate_new`,
    with their rows, ids and partition ids); the model is left holding the final weights. ``last``: the
    metrics line of the round played last in this process; when it is the final round's, its
    evaluation is of the same global model (a round's calibration comes before its evaluation)
    and is reused rather than computed again."""
    final: dict[str, Any] = {}
    which = sampled.final_clients(s.config, len(s.train_sizes))
    reuse = which is None and last is not None and last["round"] == s.config.train.rounds and \
        "val_clients" not in last  # the last round evaluated every client too
    before = _evaluation(last) if reuse and last is not None else evaluate_global(s, clients=which)
    state = s.server.global_state
    if s.spec.calibration.declared.calibrates:
        rounds = s.config.train.rounds
        state, final["bytes_calibration_up"] = calibrated(s, state, rounds)
        epsilon = s.server.codec.epsilon(rounds, calibrations_in(s.spec, rounds) + 1)
        if epsilon is not None:  # the final calibration's release counted: the run's ε, for summary.json
            final["privacy_epsilon"] = epsilon
        final.update({f"uncalibrated_{k.removeprefix('test_')}": v for k, v in before.items()})
        before = evaluate_global(s, state, clients=which)
    if s.spec.count_flops:  # the final calibration's share of SphereFed Table 1's columns
        once = classifier_round(s, [], s.spec.calibration.declared.calibrates)
        final.update({f"classifier_calibration_{k.removeprefix('classifier_')}": v for k, v in once.items()},
                     classifier_clients=len(s.train_sizes))
    final.update({k.removeprefix("test_"): v for k, v in before.items()})
    if s.config.eval.personalized != "never":
        rows = s.reports(state) if which is None else s.reports(state, which)
        if rows:
            final.update(combine_reports(rows))
            if which is not None:  # a sample of the clients: its mean's standard error
                final["personalized_accuracy_se"] = sampled.mean_se([r["accuracy"] for r in rows], len(s.train_sizes))
    new = evaluate_new(s, state)
    if new:  # where the evaluated ones sit in the partition (fedlatent partition's rows)
        new["new_client_partition_ids"] = new_partition_ids(s.config, len(s.train_sizes))
    final.update(new)
    s.model.load_state_dict(state)
    return final


def new_partition_ids(config: RunConfig, training: int) -> list[int]:
    """The partition ids of the held-out clients the final evaluation takes (all of them, or those
    ``eval.final_clients`` samples, in their order), ``training`` clients left to train: drawn over
    the whole partition, as the build drew them."""
    count = holdout_count(config.data.holdout_clients, int(config.data.num_clients))
    ids = holdout_ids(config, training + count)
    which = sampled.final_clients(config, count, held_out=True)
    return ids if which is None else [ids[i] for i in which]


def _evaluation(line: dict[str, Any]) -> dict[str, float]:
    """What :func:`evaluate_global` put in a metrics line: the ``test_*`` values and ``val_accuracy``
    (with its standard error and sample size when sampled)."""
    return {k: v for k, v in line.items() if k.startswith("test_") or k in ("val_accuracy", "val_accuracy_se",
                                                                             "val_clients")}


def play_rounds(s: Run, rounds: range, out: Path, play: Callable[[int], dict[str, Any]],
                finish: Callable[[dict[str, Any] | None], dict[str, Any]], *, since: float,
                progress: Callable[[dict[str, Any]], None] | None = None,
                rounds_start: Callable[[], None] | None = None) -> dict[str, Any]:
    """The round loop: ``play`` each round (:func:`play_round`, as the backend calls it), its metrics
    line appended to ``out/metrics.jsonl`` with the seconds elapsed since ``since`` (a
    ``perf_counter`` value; a resumed run's earlier seconds taken off it), the state checkpointed
    (paced by :class:`~fedlatent.federated.state.Checkpoints`: files written while the next round
    trains, the last completed round's on disk however the loop is left), ``progress`` told; then
    ``finish`` (:func:`finish`) told the last line played (None when no round was), whose result is
    returned. ``rounds_start`` is told when the loop starts: the end of the run's set-up (data, model,
    the process's one-off imports)."""
    if rounds_start:
        rounds_start()
    line: dict[str, Any] | None = None
    with Checkpoints(out / "checkpoints") as checkpoints, (out / "metrics.jsonl").open("a") as sink:
        for rnd in rounds:
            line = play(rnd)
            line["time_elapsed_s"] = time.perf_counter() - since
            sink.write(json.dumps(line) + "\n")
            sink.flush()
            checkpoints.save(global_state=s.server.global_state, server_state=s.server.state,
                             client_states=s.client_states,
                             info={"round": rnd + 1, "elapsed_s": time.perf_counter() - since},
                             last=rnd + 1 == rounds.stop, changed=line["clients"])
            if progress:
                progress(line)
        return finish(line)


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


def restore(s: Run, ckpt: Path, num_clients: int, warn: Callable[[str], None]) -> tuple[int, float]:
    """Load the newest intact checkpoint under ``ckpt`` into ``s`` (its server's global and server
    state, its clients' states); return the round it ends and the wall seconds spent before it —
    (0, 0.0) when the run has no checkpoint yet, or none intact (``warn`` is told in one line):
    ``s`` then keeps the initial state, which the seed fixes, so the run starts again and ends
    as the uninterrupted run."""
    if not has_checkpoint(ckpt):
        return 0, 0.0
    loaded = load_checkpoint(ckpt, num_clients, warn,
                             into=s.client_states if isinstance(s.client_states, ClientStates) else None)
    if loaded is None:
        warn(f"--resume: no intact checkpoint under {ckpt}; starting again from the initial state (round 0)")
        return 0, 0.0
    s.server.global_state, s.server.state, s.client_states, info = loaded
    if s.server.randomness is not None:  # a secret run goes on with the key its checkpoint kept
        s.server.randomness.bind(s.server.state)
    return info["round"], info["elapsed_s"]
