"""The run's figures are drawn beside the training (a forked child) or in-process, and every
requested figure is on disk when the worker closes, whichever way it was drawn."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedlatent.experiment import figures

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
