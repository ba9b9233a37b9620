"""The client programs (``methods.program``): every preset's program registered and listed, the new
personalised presets (FedPer, FedBN, APFL, Per-FedAvg, pFedMe, FedALA) on digits on the simulation and vectorized
backends, and a backend refusing a program it cannot run before any run folder exists."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fedlatent
from fedlatent.backends import simulation
from fedlatent.cli import main
from fedlatent.data.federation import build_federation
from fedlatent.federated.trainer import lockstep_update
from fedlatent.methods import PRESETS, resolve
from fedlatent.methods.parts import MethodSpec
from fedlatent.methods.program import GLOBAL, PROGRAMS, ClientProgram, ModelCopy
from fedlatent.methods.registry import Entry
from tests.stacked_runs import run_on_each_backend

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "digits_fedavg.toml"
NEW = ("apfl", "fedala", "fedbn", "fedper", "perfedavg", "pfedme")
STATELESS = ("fedbn", "perfedavg")  # nothing of a client's own on the MLP


def _digits(name: str, *overrides: str):
    """4 Dirichlet clients of digits (unequal sizes: short last batches), a small MLP, 2 rounds."""
    return fedlatent.load_config(CONFIG, [
        "seed=2", 'data.partition="dirichlet"', "data.alpha=0.5", "data.num_clients=4",
        "data.local_test_fraction=0.2", "model.hidden=[16]", "train.rounds=2", "train.batch_size=16",
        "train.threads=1", f'algorithm.name="{name}"', *overrides])


def _setup(config, trainer):
    fed = build_federation(config.data, config.data_seed)
    return simulation.setup(config, fed, resolve(config.algorithm, config.terms), trainer)


def test_every_preset_names_a_registered_program_and_the_listing_shows_it(capsys) -> None:
    kinds = {name: resolve({"name": name}).personalization.kind for name in PRESETS}
    assert set(kinds.values()) <= set(PROGRAMS)
    assert {kinds[n] for n in NEW} == {"partial", "apfl", "fedala", "perfedavg", "pfedme"} and kinds["ditto"] == "ditto"
    assert kinds["fedbabu"] == "finetune" and kinds["fedavg"] == "none"
    assert main(["methods"]) == 0
    listing = capsys.readouterr().out
    for name in NEW:
        assert f'name = "{name}"' in listing
    for kind in PROGRAMS:
        assert f"#   {kind}: " in listing
    assert "# client program: apfl" in listing and "personal_layers = 1" in listing and "adapt_alpha = true" in listing
    assert "# client program: perfedavg" in listing and 'variant = "fo"' in listing and "split_batch = true" in listing
    assert "# client program: pfedme" in listing and "lam = 15.0" in listing and "inner_steps = 5" in listing
    assert "# client program: fedala" in listing and "rand_percent = 80" in listing and "ala_layers = 1" in listing


@pytest.mark.parametrize("name", NEW)
def test_new_preset_trains_alike_on_the_simulation_and_vectorized_backends(name: str) -> None:
    """The same global weights (``run_on_each_backend``) and the same client states (own layers,
    APFL's personal model and α, pFedMe's θ, FedALA's local model and W, learned in round 2) in turn
    and in lockstep (Per-FedAvg's batch halves: sliced in turn, picked by row weights in a padded
    stacked step)."""
    alone = run_on_each_backend(_digits(name), _setup, {"simulation": simulation.train_in_turn,
                                                        "vectorized": lockstep_update})
    states = [s.client_states for s in alone.values()]
    if name in STATELESS:  # FedBN: the MLP has no BatchNorm; Per-FedAvg keeps nothing
        assert not any(states[0])
    else:
        assert all(states[0])
    for ref, got in zip(*states):
        assert sorted(ref) == sorted(got)
        for k, v in ref.items():
            torch.testing.assert_close(got[k], v, atol=2e-5, rtol=1e-4, msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["simulation", "vectorized"])
@pytest.mark.parametrize("name", NEW)
def test_new_preset_runs_on_digits_end_to_end(tmp_path: Path, name: str, backend: str) -> None:
    plain = ["train.momentum=0", "train.weight_decay=0"] if name in ("perfedavg", "pfedme") else []  # their papers' step
    summary = fedlatent.run(_digits(name, f'backend="{backend}"', *plain), tmp_path / "run")
    assert summary["rounds_completed"] == 2 and summary["backend"] == backend
    assert len(summary["final"]["per_client"]) == 4  # each client evaluated on its own model


class _OneAtATime(ClientProgram):
    """A program whose personal copy cannot be stacked on the client axis."""

    def __init__(self) -> None:
        super().__init__()
        self.copies = (ModelCopy(GLOBAL), ModelCopy("personal", kept=True, stacked=False))


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_program_the_vectorized_backend_cannot_stack_is_refused_in_one_line_before_any_folder(
        command: str, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(PRESETS, "one_at_a_time",
                        Entry({}, lambda opts: MethodSpec("one_at_a_time", personalization=_OneAtATime()), "test"))
    out = tmp_path / "run"
    sets = ["--set", 'algorithm.name="one_at_a_time"', "--set", 'backend="vectorized"']
    args = [command, str(CONFIG), *sets, *(["--no-progress", "--out", str(out)] if command == "run" else ["--no-data"])]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and not out.exists()
    assert "copy 'personal' trains one client at a time" in err and "backend = 'vectorized'" in err
