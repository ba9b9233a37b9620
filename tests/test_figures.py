"""The run's figures are drawn beside the training (a forked child) or in-process, and every
requested figure is on disk when the worker closes, whichever way it was drawn."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedlatent import load_config
from fedlatent.analysis import render
from fedlatent.experiment import figures, single

DIGITS = Path(__file__).resolve().parents[1] / "configs" / "digits_fedavg.toml"

PNG = b"\x89PNG\r\n\x1a\n"


def _run_files(run_dir: Path) -> Path:
    run_dir.mkdir()
    (run_dir / "partition.json").write_text(json.dumps({"counts": [[5, 0, 1], [0, 7, 2]]}))
    lines = [{"round": r, "train_loss": 1.0 / r, **({"test_accuracy": 0.1 * r} if r % 2 == 0 else {})}
             for r in range(1, 7)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run_dir


def _draw_both(worker: figures.FigureWorker) -> None:
    worker.draw("partition", title="two clients")
    worker.draw("curves")
    worker.close()


@pytest.mark.parametrize("background", [True, False], ids=["child", "in-process"])
def test_every_requested_figure_is_on_disk_after_close(tmp_path, background: bool) -> None:
    run_dir = _run_files(tmp_path / "run")
    worker = figures.FigureWorker(run_dir, background=background)
    assert (worker.child_pid != 0) == background
    _draw_both(worker)
    for name in ("partition.png", "curves.png"):
        assert (run_dir / "plots" / name).read_bytes()[:8] == PNG


def test_a_failed_child_is_replaced_by_drawing_in_process(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(figures, "_serve", lambda run_dir, read_end: 1)  # the child draws nothing, fails
    run_dir = _run_files(tmp_path / "run")
    _draw_both(figures.FigureWorker(run_dir))
    assert (run_dir / "plots" / "partition.png").exists() and (run_dir / "plots" / "curves.png").exists()
    assert "drawing the figures in-process" in capsys.readouterr().err


def test_an_unknown_figure_is_refused(tmp_path) -> None:
    worker = figures.FigureWorker(_run_files(tmp_path / "run"), background=False)
    worker.draw("spectrum")
    with pytest.raises(ValueError, match="unknown figure 'spectrum'"):
        worker.close()


def test_prepared_curves_redrawn_after_more_rounds_equal_a_fresh_drawing(tmp_path) -> None:
    """The child's prepared learning curves (built and drawn with the first rounds, then updated)
    save the same PNG, byte for byte, as curves drawn from scratch, a round without a loss included."""
    run_dir = _run_files(tmp_path / "run")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")
    renderer = render.Renderer(run_dir)
    renderer.prepare_curves()
    missing = {**json.loads(lines[4]), "train_loss": None}
    (run_dir / "metrics.jsonl").write_text("\n".join([*lines[:4], json.dumps(missing), lines[5]]) + "\n")
    prepared = renderer.draw("curves", {}).read_bytes()
    assert prepared[:8] == PNG
    assert render.draw(run_dir, "curves", {}).read_bytes() == prepared


def test_a_run_asks_for_the_curves_once_as_soon_as_its_last_line_is_written(tmp_path, monkeypatch) -> None:
    asked: list[tuple[str, int, bool]] = []

    class Recorder:
        def __init__(self, run_dir, **_) -> None:
            self.run_dir = run_dir

        def draw(self, figure, **_) -> None:
            metrics = self.run_dir / "metrics.jsonl"
            lines = len(metrics.read_text().splitlines()) if metrics.exists() else 0
            asked.append((figure, lines, (self.run_dir / "summary.json").exists()))

        def close(self) -> None:
            pass

    monkeypatch.setattr(single, "FigureWorker", Recorder)
    config = load_config(DIGITS, ["train.rounds=3", "data.num_clients=3", 'backend="simulation"'])
    single.run(config, tmp_path / "run", echo=None)
    assert asked == [("partition", 0, False), ("curves", 3, False)]
    asked.clear()  # a resumed run with nothing left to train still draws them, once
    single.run(config, tmp_path / "run", echo=None, resume=True)
    assert asked == [("partition", 3, True), ("curves", 3, True)]


def test_curves_prepared_while_a_line_is_being_written_leave_the_torn_line_out(tmp_path) -> None:
    """The child prepares the curves while the run trains: a metrics line caught half-written is
    not read (it failed the child with a JSONDecodeError before), and the finished file draws whole."""
    run_dir = _run_files(tmp_path / "run")
    whole = (run_dir / "metrics.jsonl").read_text()
    cut = whole.rfind("\n", 0, len(whole) - 1) + 10  # nine characters into the last line
    (run_dir / "metrics.jsonl").write_text(whole[:cut])
    renderer = render.Renderer(run_dir)
    renderer.prepare_curves()
    (run_dir / "metrics.jsonl").write_text(whole)
    assert renderer.draw("curves", {}).read_bytes() == render.draw(run_dir, "curves", {}).read_bytes()
