"""Several runs in one lockstep stack (``backends.stacked``, ``experiment.studies.stacking``): each run's
rounds equal the run trained alone — in float64 to 1e-9 — and a stacked sweep gives each cell its
own folder and the numbers of the unstacked sweep, also when killed and resumed."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from fedlatent.backends import simulation, stacked
from fedlatent.backends.stacked import Cohort
from fedlatent.config import load_config
from fedlatent.data.federation import build_federation
from fedlatent.errors import UserInputError
from fedlatent.experiment.studies.stacking import parse_stack, stack_key, stacks
from fedlatent.experiment.studies.study import load_study
from fedlatent.experiment.studies.sweep import run_sweep
from fedlatent.federated.trainer import lockstep_update
from fedlatent.methods import resolve
from fedlatent.methods.coefficients import RowCoefficients, method_shape

from tests.conftest import in_float64
from tests.methods.test_ditto import small_config

ROOT = Path(__file__).resolve().parents[1]


def _setup(config, trainer):
    fed = in_float64(build_federation(config.data, config.data_seed))
    return simulation.setup(config, fed, resolve(config.algorithm, config.terms), trainer)


def _play(s) -> list[dict]:
    return [simulation.run_round(s, rnd) for rnd in range(s.config.train.rounds)]


class _SecondAsksFirst(Cohort):
    """A cohort whose lockstep calls take the waiting runs in the reverse of the order they asked:
    as if the other run's thread had come first (which one does is thread timing)."""

    def _train_pending(self) -> None:
        self.pending.reverse()
        super()._train_pending()


def _float64_rounds(configs, stacked: bool, cohort_type: type[Cohort] = Cohort):
    """Each config's setup and round lines, the runs stacked (a thread each, in a ``cohort_type``)
    or each alone, in float64."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        if not stacked:
            setups = [_setup(c, lockstep_update) for c in configs]
            return setups, [_play(s) for s in setups]
        cohort = cohort_type(len(configs))
        setups: list = [None] * len(configs)

        def member(i: int):
            def go():
                setups[i] = _setup(configs[i], cohort.trainer)
                return _play(setups[i])
            return go
        lines = cohort.play([member(i) for i in range(len(configs))])
        for result in lines:
            if isinstance(result, BaseException):
                raise result
        return setups, lines
    finally:
        torch.set_default_dtype(before)


def _assert_equal_runs(configs) -> None:
    alone, alone_lines = _float64_rounds(configs, stacked=False)
    stacked, stacked_lines = _float64_rounds(configs, stacked=True)
    for a, b, la, lb in zip(alone, stacked, alone_lines, stacked_lines):
        for k, v in a.server.global_state.items():
            torch.testing.assert_close(b.server.global_state[k], v, atol=1e-9, rtol=1e-9, msg=k)
        assert sorted(a.server.state) == sorted(b.server.state)
        for k, v in a.server.state.items():  # SCAFFOLD's c, FedDyn's h, a server optimiser's slots
            torch.testing.assert_close(b.server.state[k], v, atol=1e-9, rtol=1e-9, msg=k)
        for sa, sb in zip(a.client_states, b.client_states):
            assert sorted(sa) == sorted(sb)
            for k, v in sa.items():
                torch.testing.assert_close(sb[k], v, atol=1e-9, rtol=1e-9, msg=k)
        for line_a, line_b in zip(la, lb):
            assert line_a["clients"] == line_b["clients"]
            for key in ("train_loss", "test_accuracy", "test_loss", "personal_loss"):
                if key in line_a:
                    assert line_b[key] == pytest.approx(line_a[key], abs=1e-9), key


def test_three_seeds_and_two_partitions_stacked_equal_each_alone(digits_config: Path) -> None:
    base = load_config(digits_config, ["train.rounds=2", "model.hidden=[16]", "data.num_clients=4",
                                       'data.partition="dirichlet"', "train.participation=0.5"])
    configs = [dataclasses.replace(base, seed=seed, data=dataclasses.replace(base.data, alpha=alpha))
               for seed, alpha in ((0, 0.1), (1, 0.1), (2, 1.0))]
    _assert_equal_runs(configs)


def test_ditto_runs_stacked_pull_each_client_towards_its_own_run(digits_config: Path) -> None:
    """Ditto's personal model is pulled towards the client's own run's global model, not the first run's."""
    base = small_config()
    configs = [dataclasses.replace(base, seed=seed) for seed in (0, 3)]
    _assert_equal_runs(configs)


def test_a_run_ending_early_stops_no_other(digits_config: Path) -> None:
    """Runs of different lengths: the longer one trains on alone after the shorter one leaves."""
    base = load_config(digits_config, ["model.hidden=[16]", "data.num_clients=3"])
    configs = [dataclasses.replace(base, seed=0, train=dataclasses.replace(base.train, rounds=1)),
               dataclasses.replace(base, seed=1, train=dataclasses.replace(base.train, rounds=3))]
    _, lines = _float64_rounds(configs, stacked=True)
    assert [len(x) for x in lines] == [1, 3]


def test_an_error_in_one_run_reaches_its_caller_and_frees_the_others() -> None:
    cohort = Cohort(2)
    release = threading.Event()

    def broken():
        raise ValueError("no data")

    def waits():
        release.set()
        return "done"
    assert [str(r) if isinstance(r, BaseException) else r for r in cohort.play([broken, waits])] == ["no data", "done"]
    assert release.is_set()


def test_which_cells_stack(digits_config: Path) -> None:
    base = load_config(digits_config, ['data.partition="dirichlet"'])
    configs = {"a": base, "b": dataclasses.replace(base, seed=4),
               "c": dataclasses.replace(base, data=dataclasses.replace(base.data, alpha=0.05)),
               "lr": dataclasses.replace(base, train=dataclasses.replace(base.train, lr=0.5)),
               "flower": dataclasses.replace(base, backend="flower")}
    assert stack_key(configs["flower"]) is None
    assert stacks(configs, 3) == [["a", "b", "c"], ["lr"], ["flower"]]
    assert stacks(configs, 2) == [["a", "b"], ["c"], ["lr"], ["flower"]]
    assert stacks(configs, "off") == [[n] for n in configs]
    assert stacks(configs, "auto") == [[n] for n in configs]  # on a CPU: none
    assert parse_stack("4") == 4 and parse_stack("auto") == "auto"
    for bad in ("0", "two", "-1"):
        with pytest.raises(UserInputError, match="--stack"):
            parse_stack(bad)


STUDY = """
title = "seeds and alphas"
base = "{base}"
set = {{"train.rounds" = {rounds}, "data.partition" = "dirichlet", "model.hidden" = [16], "data.num_clients" = 4}}

[grid]
"data.alpha" = [0.1, 1.0]
seed = [0, 1]
"""


def _study(tmp_path: Path, digits_config: Path, rounds: int = 2) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(STUDY.format(base=digits_config, rounds=rounds))
    return path


def _metrics(folder: Path) -> dict[str, list[dict]]:
    return {p.parent.name: [json.loads(x) for x in p.read_text().splitlines()] for p in sorted(folder.glob("*/metrics.jsonl"))}


def test_a_stacked_sweep_gives_each_cell_its_folder_and_its_numbers(tmp_path: Path, digits_config: Path) -> None:
    study = _study(tmp_path, digits_config)
    alone = run_sweep(load_study(study), tmp_path / "alone", echo=None, stack="off")
    stacked = run_sweep(load_study(study), tmp_path / "stacked", echo=None, stack=4)
    assert [r["run"] for r in stacked] == [r["run"] for r in alone] and all(r["status"] == "ran" for r in stacked)
    for r_alone, r_stacked in zip(alone, stacked):
        assert r_stacked["accuracy"] == pytest.approx(r_alone["accuracy"], abs=2e-3)
        assert r_stacked["loss"] == pytest.approx(r_alone["loss"], rel=1e-4)
    for name, lines in _metrics(tmp_path / "alone").items():
        got = _metrics(tmp_path / "stacked")[name]
        assert [x["clients"] for x in got] == [x["clients"] for x in lines]
        assert [x["train_loss"] for x in got] == pytest.approx([x["train_loss"] for x in lines], rel=1e-5)
        assert (tmp_path / "stacked" / name / "config.toml").read_text() == \
            (tmp_path / "alone" / name / "config.toml").read_text()


@pytest.mark.slow
def test_a_killed_stacked_sweep_resumes_to_the_same_results(tmp_path: Path, digits_config: Path) -> None:
    study = _study(tmp_path, digits_config, rounds=8)
    whole = run_sweep(load_study(study), tmp_path / "whole", echo=None, stack=4)
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "fedlatent.cli", "sweep", str(study), "--out", str(out), "--stack", "4"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not any(len(lines) >= 3 for lines in _metrics(out).values()):
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert not list(out.glob("*/summary.json"))  # killed in the middle of the stack's rounds
    subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    again = run_sweep(load_study(study), out, echo=None, stack=4)  # every cell finished: read back
    assert [r["status"] for r in again] == ["skipped"] * 4
    # the resumed cells may continue from different rounds, so other clients share their lockstep
    # calls than in the uninterrupted sweep: equal up to float32 rounding
    for r_again, r_whole in zip(again, whole):
        assert r_again["run"] == r_whole["run"]
        assert r_again["accuracy"] == pytest.approx(r_whole["accuracy"], abs=2e-3)
        assert r_again["loss"] == pytest.approx(r_whole["loss"], rel=1e-4)


PART_STATE = {"ditto": [], "ditto_cosine": [], "moon": [], "fedproto": [], "feduv": [], "feddecorr": [], "spherefed": [],
              "scaffold": [], "feddyn": [], "perfedavg": [], "pfedme": [], "fedala": []}


@pytest.mark.parametrize("method", sorted(PART_STATE))
def test_runs_of_parts_with_state_stacked_equal_each_alone_whichever_asks_first(digits_config: Path,
                                                                                method: str) -> None:
    """Methods whose parts keep state across steps or rounds (Ditto's, MOON's previous models,
    FedProto's prototypes, FedUV, FedDecorr, SphereFed), whose programs take inner steps or keep
    state (Per-FedAvg, pFedMe's θ, FedALA's local model and W, learned at the round's start from the
    clients' own seeds) or read the trained weights off ``rc.model``
    when they finish (SCAFFOLD's c_i, FedDyn's λ_k and upload): one lockstep call trains every stacked
    run's clients with the first request's parts and model, so that state must be each client's own
    and the model the stack's — each run stacked equals it alone, whichever thread asks first. MK-MMD and MMD-D are not here: at a first
    round's first step their β and kernels are fitted to the rounding difference between a run's
    frozen-model forward alone and in a stack (the two models' weights are equal there)."""
    base = load_config(digits_config, ["train.rounds=2", "model.hidden=[16]", "data.num_clients=4",
                                       "train.local_steps=3", f"algorithm.name={method}",
                                       *(f"algorithm.{kv}" for kv in PART_STATE[method])])
    configs = [dataclasses.replace(base, seed=seed) for seed in (0, 1)]
    _assert_equal_runs(configs)
    first, _ = _float64_rounds(configs, stacked=True)
    second, _ = _float64_rounds(configs, stacked=True, cohort_type=_SecondAsksFirst)
    for a, b in zip(first, second):
        for x, y in ((a.server.global_state, b.server.global_state), (a.server.state, b.server.state),
                     *zip(a.client_states, b.client_states)):
            assert sorted(x) == sorted(y) and all(torch.equal(x[k], y[k]) for k in x)


COEFFICIENTS = {"fedprox": ["mu=0.01", "mu=0.1"], "feddecorr": ["beta=0.05", "beta=0.1"],
                "ditto": ["lam=0.01", "lam=0.1"], "feduv": ["mu=0.5", "mu=0.2"], "feddyn": ["alpha=0.01", "alpha=0.1"],
                "ditto_cosine": ["mu=1.0", "mu=0.3"], "moon": ["mu=1.0", "mu=5.0"]}


@pytest.mark.parametrize("method", sorted(COEFFICIENTS))
def test_cells_differing_in_a_coefficient_train_in_one_call_and_equal_each_alone(digits_config: Path, method: str,
                                                                                  monkeypatch) -> None:
    """A term's coefficient per client row (FedProx's μ, FedDecorr's β, FedUV's μ, FedDyn's α in its
    clients' α_k, Ditto's λ in the update's chain, a Ditto constraint's μ): the cells share every
    lockstep call, and each equals itself alone in float64; FedUV's λ differs too (−1: C/4, and 1)."""
    calls: list[int] = []
    real = stacked.lockstep_runs

    def counting(ws, starts, datas, specs, *rest):
        calls.append(len({id(spec) for spec in specs}))
        return real(ws, starts, datas, specs, *rest)
    monkeypatch.setattr(stacked, "lockstep_runs", counting)
    base = load_config(digits_config, ["train.rounds=2", "model.hidden=[16]", "data.num_clients=4",
                                       "train.local_steps=3", f"algorithm.name={method}"])
    configs = [load_config(digits_config, ["train.rounds=2", "model.hidden=[16]", "data.num_clients=4",
                                           "train.local_steps=3", f"algorithm.name={method}", f"algorithm.{value}",
                                           *(["algorithm.lam=1.0"] * (method == "feduv" and i == 1))])
               for i, value in enumerate(COEFFICIENTS[method])]
    assert configs[0].algorithm != configs[1].algorithm and stack_key(configs[0]) == stack_key(configs[1]) \
        and stack_key(base) is not None
    _assert_equal_runs(configs)
    assert calls and set(calls) == {2}  # every call held both runs' clients
    alone, _ = _float64_rounds(configs, stacked=False)
    first, second = ([a.server.global_state, *a.client_states] for a in alone)
    assert any(not torch.equal(x[k], y[k]) for x, y in zip(first, second) for k in x)  # the coefficient mattered


def test_cells_stack_across_coefficients_but_not_across_methods_or_models(digits_config: Path) -> None:
    base = load_config(digits_config, ['algorithm.name="fedprox"'])

    def cell(*overrides: str):
        return load_config(digits_config, ['algorithm.name="fedprox"', *overrides])
    configs = {"mu0.01": base, "mu0.1": cell("algorithm.mu=0.1"), "seed1-mu1": cell("algorithm.mu=1.0", "seed=1"),
               "fedavg": cell('algorithm.name="fedavg"'), "wider": cell("model.hidden=[32]"),
               "decorr0.1": cell('algorithm.name="feddecorr"'),
               "decorr0.05": cell('algorithm.name="feddecorr"', "algorithm.beta=0.05"),
               "decorr-paper": cell('algorithm.name="feddecorr"', 'algorithm.semantics="paper"'),
               "feduv": cell('algorithm.name="feduv"'), "feduv-no-uniformity": cell('algorithm.name="feduv"', "algorithm.mu=0.0"),
               "feduv-mu0.2": cell('algorithm.name="feduv"', "algorithm.mu=0.2", "algorithm.lam=1.0")}
    assert stacks(configs, 8) == [["mu0.01", "mu0.1", "seed1-mu1"], ["fedavg"], ["wider"], ["decorr0.1", "decorr0.05"],
                                  ["decorr-paper"], ["feduv", "feduv-mu0.2"], ["feduv-no-uniformity"]]


def test_a_method_shape_leaves_out_the_coefficients_alone() -> None:
    def shape(name: str, **keys):
        return method_shape(resolve({"name": name, **keys}))
    assert shape("fedprox", mu=0.1) == shape("fedprox", mu=0.5) != shape("fedavg")
    assert shape("moon", mu=5.0) == shape("moon") != shape("moon", tau=1.0)
    assert shape("ditto_mkmmd", lam=0.1, mu=1.0) == shape("ditto_mkmmd") != shape("ditto_mkmmd", beta_every=1)
    assert shape("feddyn", alpha=0.1) == shape("feddyn")
    assert shape("fedprox") != method_shape(resolve({"name": "fedprox"}, [{"name": "decorrelation"}]))


def test_a_stack_of_equal_coefficients_keeps_the_plain_numbers() -> None:
    """Rows that agree read the parts themselves (the arithmetic of a run alone); rows that differ
    read copies holding their own values, the runs' parts untouched."""
    specs = [resolve({"name": "feduv", "mu": mu}) for mu in (0.5, 0.5, 0.2)]
    rows = RowCoefficients([specs[0], specs[1], specs[2], specs[2]], torch.device("cpu"))
    assert rows.parts([0, 1]) == specs[0].parts and rows.parts([2, 3]) == specs[2].parts
    mixed = rows.parts([1, 2])
    assert torch.equal(mixed[0].weight, torch.tensor([0.5, 0.2])) and mixed[1] is specs[1].parts[1]
    assert specs[1].parts[0].weight == 0.5 and rows.pull("personal") == 0.0
    ditto = RowCoefficients([resolve({"name": "ditto", "lam": lam}) for lam in (0.1, 0.3)], torch.device("cpu"))
    assert torch.equal(ditto.pull("personal"), torch.tensor([0.1, 0.3]))
