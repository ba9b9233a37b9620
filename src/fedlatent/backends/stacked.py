"""Several runs trained as one lockstep stack: the cells of a study that share the model, the
method's shape and the local settings (seeds, Dirichlet α at the same number of clients, the
method's coefficients) train their clients together, each run keeping its own server, clients'
states, metrics, checkpoints and folder.

Each run is an ordinary embedded run (``experiment.runner.single.run`` on the simulation or vectorized
backend) played in a thread of its own, whose trainer is :meth:`Cohort.trainer`: a round's client
half waits until every run of the cohort still training has asked for its own, then one call of
the lockstep trainer (:func:`fedlatent.federated.trainer.lockstep_runs`) trains them all — each
client from its own run's global state, on its own data, with its own seeded generator and its own
run's coefficients (:mod:`fedlatent.methods.coefficients`) — and every
run gets its clients' outcomes back. The rest of a round (aggregation, evaluation, checkpoints) is
each run's own. A client's numbers are those of its run trained alone up to floating-point rounding
(``tests/test_stacked.py`` pins them equal in float64); runs with dropout draw other masks, as the
vectorized backend does.

The runs set up one after another — a run starts building its data and model when the previous one
has asked for its first round or ended — because that phase uses process-wide random state (the
model's seeded construction, the Dirichlet partition's NumPy seed); training itself draws only from
each client's own generator.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from fedlatent.data.types import Split
from fedlatent.errors import ConfigError
from fedlatent.federated.client import LocalSettings, Workspace
from fedlatent.federated.failures import ClientFailure, error_detail
from fedlatent.federated.trainer import lockstep_runs
from fedlatent.methods.coefficients import method_shape
from fedlatent.methods.parts import ClientRound, MethodSpec, Tensors, Upload

Outcomes = list[Upload | ClientFailure]


class Stopped(BaseException):
    """The cohort was stopped (Ctrl-C): a waiting run ends at once, as an interrupted run does (not a
    client failure, which the failure policy might step over)."""


@dataclass
class _Request:
    """One run's client half of a round, waiting to be trained with the others'."""

    ws: Workspace
    global_state: Tensors
    datas: list[Split]
    spec: MethodSpec
    rcs: list[ClientRound]
    settings: LocalSettings
    generators: list[torch.Generator]
    result: Outcomes | BaseException | None = None


def same_settings(a: LocalSettings, b: LocalSettings) -> bool:
    """Whether two runs' local settings train alike (the same rule, rate, schedule and augmentation)."""
    def equal(x: Any, y: Any) -> bool:
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            return bool(np.array_equal(x, y))
        if hasattr(x, "__dataclass_fields__") and type(x) is type(y):
            return all(equal(getattr(x, f.name), getattr(y, f.name)) for f in fields(x))
        return bool(x == y)
    return equal(a, b)


class Cohort:
    """The meeting point of ``size`` runs' client halves (see the module's docstring). Each run's
    thread is started by :meth:`play`; a run that ends — finished, stopped or failed — leaves the
    cohort, so that the others no longer wait for it."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("a cohort holds at least one run")
        self.training = size          # runs that may still ask for a round
        self.pending: list[_Request] = []
        self.lock = threading.Condition()
        self.aborted: BaseException | None = None
        self._started = threading.Event()  # the run setting up has asked for its first round, or ended

    def trainer(self, ws: Workspace, global_state: Tensors, datas: list[Split], spec: MethodSpec,
                rcs: list[ClientRound], settings: LocalSettings, generators: list[torch.Generator]) -> Outcomes:
        """A run's trainer (``backends.simulation.Trainer``): its clients' outcomes, trained in one
        lockstep stack with the clients every other run of the cohort asks for at the same time."""
        request = _Request(ws, global_state, datas, spec, rcs, settings, generators)
        with self.lock:
            self.pending.append(request)
            self._started.set()
            if len(self.pending) >= self.training:
                self._train_pending()
            while request.result is None:
                if self.aborted is not None:
                    raise Stopped("the stacked runs were stopped") from self.aborted
                self.lock.wait()
        if isinstance(request.result, BaseException):
            raise request.result
        return request.result

    def _train_pending(self) -> None:
        """Train every waiting request (the lock held: the other runs wait for their rounds anyway),
        grouped by local settings (runs resumed at different rounds may differ in learning rate)
        and by the shape of their methods (runs may differ in coefficients alone)."""
        requests, self.pending = self.pending, []
        groups: list[list[_Request]] = []
        for request in requests:
            group = next((g for g in groups if same_settings(g[0].settings, request.settings)
                          and method_shape(g[0].spec) == method_shape(request.spec)), None)
            if group is None:
                groups.append([request])
            else:
                group.append(request)
        for group in groups:
            _train_group(group)
        self.lock.notify_all()

    def leave(self) -> None:
        """A run ends: the others stop waiting for it (and train what waits, if it was the last)."""
        with self.lock:
            self.training -= 1
            self._started.set()
            if self.pending and len(self.pending) >= self.training:
                self._train_pending()

    def abort(self, reason: BaseException) -> None:
        """Stop every waiting run (Ctrl-C in the thread that started them)."""
        with self.lock:
            self.aborted = reason
            self.lock.notify_all()

    def play(self, runs: Sequence[Callable[[], Any]]) -> list[Any]:
        """Run each of ``runs`` (a run with :meth:`trainer` as its trainer) in a thread, one setting up
        after the other, all training together; return each one's result or the exception it raised."""
        results: list[Any] = [None] * len(runs)
        threads = []
        for i, run in enumerate(runs):
            self._started = threading.Event()
            thread = threading.Thread(target=self._member, args=(run, results, i), name=f"stacked-run-{i}",
                                      daemon=True)
            threads.append(thread)
            thread.start()
            self._started.wait()  # its set-up done: it waits for its first round, or has ended
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.5)  # a timed join: Ctrl-C reaches this thread
        except BaseException as stop:
            self.abort(stop)
            raise
        return results

    def _member(self, run: Callable[[], Any], results: list[Any], i: int) -> None:
        try:
            results[i] = run()
        except BaseException as err:  # noqa: BLE001 - the run's own outcome, told to its caller
            results[i] = err
        finally:
            self.leave()


def _train_group(group: list[_Request]) -> None:
    """One lockstep call for the clients of ``group``'s runs; each request's result is its clients'
    outcomes, or the error (a ConfigError as such: the user's to correct; any other error fails the
    clients of every run in the call, as a lockstep round fails all its clients)."""
    first = group[0]
    starts = [r.global_state for r in group for _ in r.rcs]
    try:
        uploads = lockstep_runs(first.ws, starts, [d for r in group for d in r.datas],
                                [r.spec for r in group for _ in r.rcs], [rc for r in group for rc in r.rcs], first.settings,
                                [g for r in group for g in r.generators])
    except ConfigError as err:
        for request in group:
            request.result = err
        return
    except Exception as err:  # noqa: BLE001 - every client of the call fails with it
        for request in group:
            ids = [rc.client_id for rc in request.rcs]
            request.result = [ClientFailure(cid, "error", f"{error_detail(err)} (stacked with other runs)", err)
                              for cid in ids]
        return
    at = 0
    for request in group:
        request.result = list(uploads[at:at + len(request.rcs)])
        at += len(request.rcs)
