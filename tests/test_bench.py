"""``fedlatent bench``: the bare-loop floor does the simulation backend's work, the timing ratios are
what they claim, the CIFAR-shaped Dirichlet arrays, and the command's table and JSON."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import fedlatent
from fedlatent.backends import simulation
from fedlatent.cli import main
from fedlatent.data.federation import build_federation
from fedlatent.experiment.tooling import bench, timing
from fedlatent.methods import resolve
from fedlatent.models import build_model

ROOT = Path(__file__).resolve().parents[1]


def test_the_floor_is_the_simulation_backends_fedavg_round() -> None:
    """Same initial weights, batches and sampled clients: the hand-written round ends on the global
    model the simulation backend's round ends on."""
    config = fedlatent.load_config(None, ['data.dataset="digits"', "data.num_clients=6", "train.participation=0.5",
                                          'backend="simulation"', "train.lr=0.05", "train.momentum=0.9"])
    fed = build_federation(config.data, config.data_seed)
    s = simulation.setup(config, fed, resolve(config.algorithm, config.terms))
    initial = {k: v.clone() for k, v in s.server.global_state.items()}
    simulation.run_round(s, 1)
    model = build_model(config.model, fed.input_shape, fed.num_classes, fed.name)
    chosen = simulation.sample_clients(config.seed, 1, 6, 0.5)
    assert len(chosen) == 3
    plain = bench.plain_round(model, initial, fed, config, 1, chosen)
    assert max(float((plain[k] - s.server.global_state[k]).abs().max()) for k in plain) < 1e-6
    other = bench.plain_round(model, initial, fed, config, 1, [c for c in range(6) if c not in chosen])
    assert max(float((other[k] - s.server.global_state[k]).abs().max()) for k in other) > 1e-3


def test_bracketed_divides_each_side_by_the_mean_of_the_runs_around_it() -> None:
    ticks = iter([1.0, 3.0, 2.0, 5.0, 4.0])  # B f B g B with a fake clock: wall = returned value

    def side() -> dict[str, float]:
        return {"t": next(ticks)}

    out = timing.bracketed(side, {"f": side, "g": side}, reps=1, keys=("t",), warmup=0)
    assert out["f"]["t"] == [3.0 / 1.5] and out["g"]["t"] == [5.0 / 3.0]
    assert out["f"]["t_abs"] == [3.0] and out[timing.BASELINE]["t_abs"] == [1.0, 2.0, 4.0]


def test_cifar_shaped_dirichlet_arrays_split_a_pool_with_label_skew(tmp_path) -> None:
    path = bench.cifar_shaped_npz(tmp_path / "a.npz", clients=5, samples=40, alpha=0.1, test=3)
    arrays = np.load(path)
    sizes = [len(arrays[f"client{i}_train_y"]) for i in range(5)]
    assert sum(sizes) == 200 and min(sizes) >= 2 and arrays["client0_train_x"].shape[1:] == (3, 32, 32)
    assert arrays["client4_test_x"].shape == (3, 3, 32, 32)
    # Dirichlet 0.1: most clients hold few classes; an even split would hold all ten
    classes = [len(np.unique(arrays[f"client{i}_train_y"])) for i in range(5)]
    assert np.median(classes) <= 5
    even = np.load(bench.cifar_shaped_npz(tmp_path / "b.npz", clients=2, samples=7))
    assert [len(even[f"client{i}_train_y"]) for i in range(2)] == [7, 7]


def test_bad_workload_letters_are_refused(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "--workloads", "ax"])
    assert info.value.code == 2 and "--workloads" in capsys.readouterr().err


def test_a_json_path_in_a_missing_folder_is_refused_before_timing(tmp_path, capsys) -> None:
    assert main(["bench", "--quick", "--json", str(tmp_path / "missing" / "bench.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--json" in err and "missing" in err


def test_an_unusable_device_is_refused_before_timing(capsys) -> None:
    assert main(["bench", "--quick", "--device", "gpu0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device gpu0" in err and "not a torch device" in err


def test_every_workload_trains_on_the_device_asked_for(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # configs/ and the shared Synthetic file: (d) too, where the data file is present
    lines: list[str] = []
    loads = bench.workloads(True, tmp_path, lines.append, device="cuda:3")
    assert [w.name for w in loads] == ["a", "b", "c", "d"][:len(loads)] and len(loads) >= 3
    assert {w.config.train.device for w in loads} == {"cuda:3"}
    assert bench.workloads(True, tmp_path, lines.append)[0].config.train.device == "cpu"


@pytest.mark.slow
def test_bench_quick_prints_every_side_and_writes_the_raw_timings(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # no configs/ here: (d) is skipped with a line
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--reps", "1", "--workloads", "acd", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert "(d) skipped" in captured.err
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in captured.out.splitlines()
            if line.startswith("| (")]
    assert [r[:2] for r in rows] == [[w, s] for w in ("(a)", "(c)") for s in ("bare loop", "simulation", "vectorized")]
    for r in rows:
        assert float(r[2]) > 0 and float(r[3]) > 0
    assert all(r[3] == "1.000" for r in rows if r[1] == "bare loop")
    raw = json.loads(out.read_text())
    assert set(raw["workloads"]) == {"a", "c"} and raw["machine"]["threads"] == torch.get_num_threads()
    times = raw["workloads"]["a"]["times"]
    assert len(times["bare loop"]["wall_abs"]) == 3 and len(times["simulation"]["wall_abs"]) == 1
    ratio = times["vectorized"]["wall"][0]
    assert ratio == pytest.approx(float(rows[2][3]), abs=1e-3)


@pytest.mark.long  # two minutes on two cores; test_bench_quick_prints_every_side_... runs the bench in CI
@pytest.mark.skipif(not bench.flower_installed(), reason="the flower extra is not installed")
def test_flowers_simulation_engine_is_a_column_of_workload_a_when_installed(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    out, lines = tmp_path / "bench.json", []
    text = bench.bench(quick=True, reps=1, only="a", json_path=str(out), echo=lines.append, flower=True)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| (")]
    assert [r[1] for r in rows] == ["bare loop", "simulation", "vectorized", "flower"]
    flower_row = rows[3]
    raw = json.loads(out.read_text())["workloads"]["a"]["times"]
    assert len(raw["flower"]["wall_abs"]) == 1 and raw["flower"]["wall_abs"][0] > 0
    printed = flower_row[2]  # to the table's precision, which shrinks as the seconds grow (148.7 on a loaded machine)
    decimals = len(printed.partition(".")[2])
    assert float(printed) == pytest.approx(raw["flower"]["wall_abs"][0], abs=0.5 * 10 ** -decimals + 1e-9)
    # the floor: 3 runs around the alternating sides (1 warm-up not counted) + 2 around Flower's run
    assert len(raw["bare loop"]["wall_abs"]) == 5
    assert "flower: one run per workload" in text


@pytest.mark.skipif(not bench.flower_installed(), reason="the flower extra is not installed")
def test_quick_leaves_flower_out_with_a_line(monkeypatch) -> None:
    lines: list[str] = []
    monkeypatch.setattr(bench, "workloads", lambda quick, scratch, echo, device: [])
    bench.bench(quick=True, echo=lines.append)
    assert lines == ["flower: left out of --quick (its start-up alone is ~20 s a run)"]
