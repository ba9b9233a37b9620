"""The command line: exit codes, one-line errors, the run and partition commands."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from fedlatent.cli import main

FAST = ["--set", "train.rounds=2", "--no-progress"]


def _console_script() -> str:
    beside = Path(sys.executable).parent / "fedlatent"
    found = str(beside) if beside.exists() else shutil.which("fedlatent")
    if not found:
        pytest.skip("the fedlatent console script is not installed")
    return found


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fedlatent: error:"), err
    assert "Traceback" not in err
    return lines[0]


def test_run_exits_0_and_prints_the_result_table(digits_config: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["run", str(digits_config), *FAST, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert "fedavg on digits" in printed
    rows = {line.split()[0]: line.split()[1] for line in printed.splitlines()
            if len(line.split()) == 2 and line.split()[0] in ("accuracy", "balanced_accuracy", "rounds_completed")}
    assert float(rows["accuracy"]) == pytest.approx(summary["final"]["accuracy"], abs=5e-5)
    assert float(rows["balanced_accuracy"]) == pytest.approx(summary["final"]["balanced_accuracy"], abs=5e-5)
    assert rows["rounds_completed"] == "2"
    assert summary["rounds_completed"] == 2
    assert summary["personalized"] is False                                       # FedAvg: the global model
    assert ("personalized_accuracy" in printed) == ("does not personalise" in printed)
    assert "loss" in rows or any(line.split()[:1] == ["loss"] for line in printed.splitlines())  # summary.json's key
    # the partition table was printed too: 10 clients and a total of the 1437 training samples
    assert any(line.split()[:1] == ["total"] and line.split()[-1] == "1437" for line in printed.splitlines())


def test_out_holding_a_run_needs_resume(digits_config: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    args = ["run", str(digits_config), "--set", "train.rounds=1", "--no-progress", "--out", str(out)]
    assert main(args) == 0
    before = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(args) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "--resume" in line
    assert (out / "metrics.jsonl").read_text() == before        # nothing overwritten
    assert main(args + ["--resume"]) == 0


def test_runs_of_different_settings_get_default_folders_of_their_own(digits_config: Path, tmp_path: Path, capsys,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The default folder ends in a digest of the settings: a changed setting runs beside the first
    run; the same configuration names the same folder, so --resume finds it (and, the run being
    complete, leaves it as it is)."""
    monkeypatch.chdir(tmp_path)
    args = ["run", str(digits_config), "--set", "train.rounds=1", "--no-progress", "--no-figures"]
    assert main(args) == 0
    assert main([*args, "--set", "train.lr=0.1"]) == 0
    folders = sorted((tmp_path / "runs").iterdir())
    assert len(folders) == 2 and all(f.name.startswith("digits-iid-fedavg-seed0-") for f in folders)
    assert all((f / "summary.json").is_file() for f in folders)
    capsys.readouterr()
    assert main(args) == 2                                       # the same configuration: its own folder
    assert "--resume" in _one_error_line(capsys.readouterr().err)
    assert main([*args, "--resume"]) == 0
    assert "already complete: 1 rounds" in capsys.readouterr().out


def test_resume_of_a_complete_run_leaves_it_untouched(digits_config: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    args = ["run", str(digits_config), "--set", "train.rounds=1", "--no-figures", "--out", str(out)]
    assert main([*args, "--no-progress"]) == 0
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(out.rglob("*")) if p.is_file()}
    capsys.readouterr()
    assert main([*args, "--resume", "--progress"]) == 0
    captured = capsys.readouterr()
    assert f"already complete: 1 rounds; summary at {out / 'summary.json'}" in captured.out
    assert "round" not in captured.err                         # no progress bar: nothing to train
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(out.rglob("*")) if p.is_file()} == before


def test_resume_with_another_configuration_names_every_key_that_differs(digits_config: Path, tmp_path: Path,
                                                                         capsys) -> None:
    out = tmp_path / "run"
    args = ["run", str(digits_config), "--no-progress", "--no-figures", "--out", str(out)]
    assert main([*args, "--set", "train.rounds=1"]) == 0
    capsys.readouterr()
    assert main([*args, "--set", "train.rounds=2", "--set", "train.lr=0.1", "--set", 'data.partition="shards"',
                 "--resume"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.endswith(f"differs from the one in {out / 'config.toml'}: "
                         'data.partition "iid" → "shards", train.rounds 1 → 2, train.lr 0.05 → 0.1'
                         " (only a larger train.rounds may differ: it extends the run)"), line


def test_resume_with_more_rounds_extends_a_finished_run_as_if_it_had_run_them(digits_config: Path, tmp_path: Path,
                                                                             capsys) -> None:
    """A finished 1-round run resumed with ``train.rounds = 2`` trains round 2 from its checkpoint,
    says so, and ends where a 2-round run from the start ends (a constant learning rate: nothing
    depends on the rounds); fewer rounds are refused, naming the key."""
    out, fresh = tmp_path / "run", tmp_path / "fresh"
    args = ["run", str(digits_config), "--no-progress", "--no-figures"]
    assert main([*args, "--set", "train.rounds=1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main([*args, "--set", "train.rounds=2", "--out", str(out), "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "note: extending the run from 1 to 2 rounds (train.rounds; every other key as it started)" in printed
    assert main([*args, "--set", "train.rounds=2", "--out", str(fresh)]) == 0
    extended, whole = (json.loads((d / "summary.json").read_text()) for d in (out, fresh))
    assert extended["rounds_completed"] == 2 and extended["final"] == whole["final"]
    assert (out / "metrics.jsonl").read_text().count("\n") == (fresh / "metrics.jsonl").read_text().count("\n")
    capsys.readouterr()
    assert main([*args, "--set", "train.rounds=1", "--out", str(out), "--resume"]) == 2
    assert "train.rounds = 1: fewer than the 2 rounds" in _one_error_line(capsys.readouterr().err)


def test_from_python_a_refusal_speaks_of_the_arguments_not_the_flags(digits_config: Path, tmp_path: Path) -> None:
    from fedlatent import load_config, run
    from fedlatent.errors import ConfigError
    config = load_config(str(digits_config), ["train.rounds=1"])
    with pytest.raises(ConfigError, match=r"^out .*: resume=True found no run there \(no config.toml\); start it "
                                          r"without resume=True$"):
        run(config, tmp_path / "nothing", resume=True)
    assert main(["run", str(digits_config), "--out", str(tmp_path / "nothing"), "--resume"]) == 2  # the CLI: flags


@pytest.mark.parametrize("overrides,key", [
    (["train.epochs=3"], "train.epochs"),
    (["data.alpha=0"], "data.alpha"),
    (["data.num_clients=0"], "data.num_clients"),                   # no magic 0: "auto" or a count
    (["algorithm.name=fedprox", "algorithm.mux=0.1"], "algorithm.mux"),
    (["algorithm.name=nosuch"], "algorithm.name"),
])
def test_bad_config_exits_2_with_one_line(digits_config: Path, tmp_path: Path, capsys,
                                          overrides: list[str], key: str) -> None:
    sets = [a for o in overrides for a in ("--set", o)]
    out = tmp_path / "run"
    assert main(["run", str(digits_config), *sets, "--no-progress", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert key in _one_error_line(captured.err)
    assert not out.exists()


def test_missing_config_file_exits_2(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nope.toml"
    assert main(["run", str(missing), "--no-progress", "--out", str(tmp_path / "run")]) == 2
    assert "nope.toml" in _one_error_line(capsys.readouterr().err)
    assert main(["partition", str(missing)]) == 2
    assert "nope.toml" in _one_error_line(capsys.readouterr().err)


def test_bad_data_file_exits_2(digits_config: Path, tmp_path: Path, capsys) -> None:
    path = tmp_path / "fed.npz"
    np.savez(path, client0_train_x=np.zeros((3, 2)), client0_train_y=np.zeros(3))   # float labels
    code = main(["run", str(digits_config), "--set", "data.dataset=arrays", "--set", "data.partition=given",
                 "--set", f"data.path={path}", *FAST, "--out", str(tmp_path / "run")])
    assert code == 2
    assert "client0_train_y" in _one_error_line(capsys.readouterr().err)


def test_partition_prints_the_table_and_writes_the_plot(digits_config: Path, tmp_path: Path, capsys) -> None:
    png = tmp_path / "figs" / "partition.png"
    code = main(["partition", str(digits_config), "--set", "data.partition=dirichlet", "--set", "data.alpha=0.1",
                 "--set", "data.num_clients=5", "--plot", str(png)])
    assert code == 0
    printed = capsys.readouterr().out.splitlines()
    header = printed[0].split()
    assert header == ["client\\class"] + [str(c) for c in range(10)] + ["total"]  # both axes named
    body = [line.split() for line in printed[2:] if line.split() and line.split()[0].isdigit()]
    assert [int(r[0]) for r in body] == list(range(5))
    assert all(int(r[-1]) == sum(int(v) for v in r[1:-1]) for r in body)        # row totals
    totals = next(line.split() for line in printed if line.split()[:1] == ["total"])
    assert int(totals[-1]) == 1437
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image
    assert matplotlib.image.imread(png).ndim == 3


def test_partition_shows_the_held_out_clients_in_their_rows(digits_config: Path, capsys) -> None:
    """``fedlatent partition`` prints the whole partition, the clients ``data.holdout_clients`` holds
    out in their rows (where a run's ``new_client_partition_ids`` point), even without their test splits."""
    tables = []
    for held in ("0", "2"):
        assert main(["partition", str(digits_config), "--set", "data.num_clients=6", "--set",
                     f"data.holdout_clients={held}", "--full"]) == 0
        tables.append(capsys.readouterr().out)
    rows = [line.split()[0] for line in tables[1].splitlines() if line.split() and line.split()[0].isdigit()]
    assert tables[1] == tables[0] and rows == [str(c) for c in range(6)]


def test_argument_errors_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["fly"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        main(["run"])
    assert info.value.code == 2


@pytest.mark.parametrize("command", [[], ["run"], ["check"], ["partition"], ["sweep"], ["report"], ["reproduce"],
                                     ["bench"], ["cache"], ["methods"], ["config"]])
def test_help_shows_no_markup(command: list[str], capsys) -> None:
    """argparse prints help strings as they are: no reStructuredText/Markdown backticks."""
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    assert info.value.code == 0
    shown = capsys.readouterr().out
    assert "usage: fedlatent" in shown and "`" not in shown


def test_methods_and_config_listings(capsys) -> None:
    assert main(["methods"]) == 0
    assert "fedprox" in capsys.readouterr().out
    assert main(["config"]) == 0
    listing = capsys.readouterr().out
    assert "[train]" in listing and "participation" in listing


def test_config_listing_is_toml_that_loads_as_the_defaults(capsys, tmp_path: Path) -> None:
    """`fedlatent config` prints TOML (no Python literals): read back by load_config, the defaults."""
    from fedlatent.config import load_config, to_dict
    assert main(["config"]) == 0
    listed = tmp_path / "listed.toml"
    listed.write_text(capsys.readouterr().out)
    assert tomllib.loads(listed.read_text())["data"]["normalize"] is True
    assert to_dict(load_config(listed)) == to_dict(load_config(None))


def test_each_block_of_the_methods_listing_is_toml(capsys) -> None:
    """Every preset's [algorithm] block and every part's [[terms]] block of `fedlatent methods`
    loads with tomllib and holds exactly its name and keys at their defaults."""
    from fedlatent.methods.registry import COMMON_KEYS, PARTS, PRESETS, resolved_keys
    assert main(["methods"]) == 0
    tables = [tomllib.loads(block) for block in capsys.readouterr().out.strip().split("\n\n")]
    presets = {t["algorithm"]["name"]: t["algorithm"] for t in tables if "name" in t.get("algorithm", {})}
    parts = {t["terms"][0]["name"]: t["terms"][0] for t in tables if "terms" in t}
    assert presets == {n: {"name": n, **e.defaults} for n, e in PRESETS.items()}
    assert parts == {n: {"name": n, **e.defaults} for n, e in PARTS.items()}
    assert [t["algorithm"] for t in tables if "algorithm" in t and "name" not in t["algorithm"]] == [COMMON_KEYS]
    for table in presets.values():
        assert resolved_keys(table)["name"] == table["name"]  # a block is a valid [algorithm] as printed


def test_a_run_logged_to_a_file_writes_plain_progress_lines(digits_config: Path, tmp_path: Path) -> None:
    """stdout and stderr to a file (not a terminal): no progress bar's carriage-return frames, one
    plain line every tenth of the rounds (here every round of 3) instead."""
    log = tmp_path / "log.txt"
    src = str(Path(__file__).resolve().parents[1] / "src")
    with log.open("w") as sink:
        done = subprocess.run([sys.executable, "-m", "fedlatent.cli", "run", str(digits_config), "--set", "train.rounds=3",
                               "--no-figures", "--out", str(tmp_path / "run")], stdout=sink, stderr=sink,
                              env={**_env(), "PYTHONPATH": src}, timeout=300)
    text = log.read_text()
    assert done.returncode == 0, text
    assert "\r" not in text
    assert [line.split(",")[0] for line in text.splitlines() if ": round " in line] == \
        [f"fedavg on digits: round {r}/3" for r in (1, 2, 3)]


def _env() -> dict[str, str]:
    return {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def test_console_script_fails_cleanly_on_a_bad_key(digits_config: Path, tmp_path: Path) -> None:
    """One real process of the installed ``fedlatent`` script: exit 2, one stderr line, nothing else."""
    script = _console_script()
    bad = subprocess.run([script, "run", str(digits_config), "--set", "train.rounds=-1", "--no-progress",
                          "--out", str(tmp_path / "bad")], capture_output=True, text=True, env=_env(), timeout=120)
    assert bad.returncode == 2
    assert "train.rounds" in _one_error_line(bad.stderr)
    assert bad.stdout == ""
    assert not (tmp_path / "bad").exists()


def test_run_help_gives_the_default_folder_with_its_digest(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = "".join(capsys.readouterr().out.split())  # argparse wraps the line at its hyphens
    assert "runs/<dataset>-<partition>-<algorithm>-seed<seed>-<digest>" in text
