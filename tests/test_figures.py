"""The run's figures are drawn beside the training (a forked child) or in-process, and every
requested figure is on disk when the worker closes, whichever way it was drawn."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedlatent import cli, load_config
from fedlatent.analysis import plots, render
from fedlatent.experiment.runner import figures, single

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
    assert (worker.process is not None) == background
    _draw_both(worker)
    for name in ("partition.png", "curves.png"):
        assert (run_dir / "plots" / name).read_bytes()[:8] == PNG


def test_a_failed_child_is_replaced_by_drawing_in_process(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(figures, "_serve", lambda requests, replies: 1)  # draws nothing, fails
    monkeypatch.setattr(figures, "_process", None)  # a figure process forked with it
    run_dir = _run_files(tmp_path / "run")
    _draw_both(figures.FigureWorker(run_dir))
    assert (run_dir / "plots" / "partition.png").exists() and (run_dir / "plots" / "curves.png").exists()
    assert "drawing the figures in-process" in capsys.readouterr().err


def test_an_unknown_figure_is_refused(tmp_path) -> None:
    worker = figures.FigureWorker(_run_files(tmp_path / "run"), background=False)
    worker.draw("spectrum")
    with pytest.raises(ValueError, match="unknown figure 'spectrum'"):
        worker.close()


def _pixels(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGBA"))


def _full_draw(metrics: list[dict], rounds: int, path: Path) -> np.ndarray:
    """The curves of ``metrics`` drawn the ordinary way: a new figure saved by ``savefig``, which
    draws every artist, the animated lines included."""
    fresh = plots.LearningCurves(rounds)
    fresh.update(metrics)
    return _pixels(plots.save(fresh.fig, path))


def _counting_full_draws(curves: plots.LearningCurves, monkeypatch) -> list[int]:
    calls: list[int] = []
    draw = curves.fig.canvas.draw
    monkeypatch.setattr(curves.fig.canvas, "draw", lambda: (calls.append(1), draw())[1])
    return calls


def test_curves_blitted_after_more_rounds_have_the_pixels_of_a_full_draw(tmp_path, monkeypatch) -> None:
    """Rounds inside the axes' limits are blitted onto the kept background (no full draw), a round
    without a loss included, and the PNG has the pixels of the same data drawn from scratch."""
    lines = [{"round": 1, "train_loss": 2.0, "test_accuracy": 0.3}, {"round": 2, "train_loss": 0.9},
             {"round": 3, "train_loss": 1.2, "test_accuracy": 0.8}]
    curves = plots.LearningCurves(rounds=10)
    curves.update(lines)
    curves.save(tmp_path / "first.png")
    limits = [(ax.get_xlim(), ax.get_ylim()) for ax in curves.axes]
    full_draws = _counting_full_draws(curves, monkeypatch)
    more = [*lines, {"round": 4, "train_loss": None, "test_accuracy": 0.5}, {"round": 5, "train_loss": 1.5},
            {"round": 6, "train_loss": 1.0, "test_accuracy": 0.7}]
    curves.update(more)
    blitted = _pixels(curves.save(tmp_path / "blitted.png"))
    assert full_draws == [] and [(ax.get_xlim(), ax.get_ylim()) for ax in curves.axes] == limits
    assert np.array_equal(blitted, _full_draw(more, 10, tmp_path / "full.png"))
    assert not np.array_equal(blitted, _pixels(tmp_path / "first.png"))  # the new points are drawn


def test_curves_whose_limits_change_are_drawn_in_full_with_the_pixels_of_a_full_draw(tmp_path, monkeypatch) -> None:
    lines = [{"round": 1, "train_loss": 2.0, "test_accuracy": 0.3}, {"round": 2, "train_loss": 1.8, "test_accuracy": 0.4}]
    curves = plots.LearningCurves(rounds=5)
    curves.update(lines)
    curves.save(tmp_path / "first.png")
    loss_limits = curves.axes[1].get_ylim()
    full_draws = _counting_full_draws(curves, monkeypatch)
    more = [*lines, {"round": 3, "train_loss": 3.5, "test_accuracy": 0.9}]  # above the loss axis
    curves.update(more)
    drawn = _pixels(curves.save(tmp_path / "drawn.png"))
    assert full_draws == [1] and curves.axes[1].get_ylim()[1] > loss_limits[1]
    assert np.array_equal(drawn, _full_draw(more, 5, tmp_path / "full.png"))


def test_curves_span_the_planned_rounds_accuracy_0_to_1_and_the_loss_from_0_to_a_tick() -> None:
    curves = plots.LearningCurves(rounds=20)
    curves.update([{"round": 1, "train_loss": 1.234, "test_accuracy": 0.412},
                   {"round": 2, "train_loss": 0.987, "test_accuracy": 0.633}])
    for ax in curves.axes:
        low, high = ax.get_xlim()
        assert low < 1 and high > 20  # all 20 rounds fit from the first one
    accuracy, loss = (ax.get_ylim() for ax in curves.axes)
    assert accuracy[0] < 0 and accuracy[1] > 1
    assert loss[0] == 0 and loss[1] >= 1.234 and loss[1] in curves.axes[1].yaxis.get_major_locator()()
    curves.update([{"round": r, "train_loss": 1.2 - 0.05 * r, "test_accuracy": 0.4 + 0.02 * r} for r in range(1, 21)])
    assert [ax.get_ylim() for ax in curves.axes] == [accuracy, loss]  # a run that improves keeps its axes
    longer = plots.LearningCurves(rounds=2)  # a resumed run's file may hold more rounds than planned
    longer.update([{"round": r, "train_loss": 1.0} for r in (1, 2, 3)])
    assert longer.axes[1].get_xlim()[1] > 3


def test_a_child_kept_current_round_by_round_writes_the_curves_of_the_whole_file(tmp_path) -> None:
    """The run asks for the curves after every metrics line; the child's last PNG has the pixels
    of the finished file drawn from scratch, and no partial file is left behind."""
    run_dir = _run_files(tmp_path / "run")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "metrics.jsonl").write_text("")
    worker = figures.FigureWorker(run_dir)
    worker.draw("partition", title="two clients")
    with (run_dir / "metrics.jsonl").open("a") as sink:
        for line in lines:
            sink.write(line)
            sink.flush()
            worker.draw("curves", rounds=8)
    worker.close()
    metrics = [json.loads(line) for line in lines]
    assert np.array_equal(_pixels(run_dir / "plots" / "curves.png"), _full_draw(metrics, 8, tmp_path / "full.png"))
    assert sorted(p.name for p in (run_dir / "plots").iterdir()) == ["curves.png", "partition.png"]


def _serve(tmp_path: Path, messages: list[dict]) -> str:
    """``figures._serve`` in this process, over ``messages`` sent at once; its answers."""
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    os.write(requests_write, "".join(json.dumps(m) + "\n" for m in messages).encode())
    os.close(requests_write)
    assert figures._serve(requests_read, replies_write) == 0
    with os.fdopen(replies_read) as replies:
        return replies.read()


def test_the_process_draws_requests_that_queued_meanwhile_once(tmp_path, monkeypatch) -> None:
    drawn: list[tuple] = []
    monkeypatch.setattr(render.Renderer, "draw", lambda self, figure, options: drawn.append((figure, options)))
    monkeypatch.setattr(render.Renderer, "keep_curves", lambda self, options: drawn.append(("curves", options)) or False)
    monkeypatch.setattr(render.Renderer, "write_curves", lambda self: drawn.append(("curves.png", self.run_dir)))
    requests = [("partition", {"title": "t"}), *[("curves", {"rounds": 9})] * 5, ("diagnostics", {})]
    messages = [{"figure": f, "options": o} for f, o in requests]
    answers = _serve(tmp_path, [{"run": str(tmp_path / "a"), "id": 1}, *messages, {"end": 1},
                                {"run": str(tmp_path / "b"), "id": 2}, messages[1], {"end": 2}])
    assert drawn == [("partition", {"title": "t"}), ("curves", {"rounds": 9}), ("diagnostics", {}),
                     ("curves.png", tmp_path / "a"), ("curves", {"rounds": 9}), ("curves.png", tmp_path / "b")]
    assert answers == "drawn 1\ndrawn 2\n"


def test_distinct_keeps_each_request_of_a_run_once_where_it_first_came() -> None:
    a, b, c = {"figure": "curves", "options": {"rounds": 3}}, {"figure": "partition", "options": {}}, \
        {"figure": "curves", "options": {"rounds": 4}}
    end, run = {"end": 1}, {"run": "next", "id": 2}
    assert figures.distinct([a, b, dict(a), c, b, end, run, a, a, end]) == [a, b, c, end, run, a, end]


def test_the_heatmap_without_cell_text_is_capped_and_shows_every_client(tmp_path) -> None:
    """100 clients × 10 classes (no cell text): at most 6 in tall, not 36.5 in; every other client
    holds samples, and a column through the heatmap crosses one dark band for each of them."""
    counts = np.zeros((100, 10), dtype=int)
    counts[::2] = 50
    pixels = _pixels(plots.partition_heatmap(counts, tmp_path / "many.png"))
    assert pixels.shape[0] <= plots.PLAIN_HEATMAP_INCHES[1] * plots.DPI
    red, green, blue = pixels[:, 150, :3].astype(int).T  # 150 px: inside the heatmap, left of the colorbar
    dark = (red + green + blue < 300) & (blue - red > 60)  # dark blue: not the black spines, nor white
    assert np.count_nonzero(dark[1:] & ~dark[:-1]) == 50
    few = _pixels(plots.partition_heatmap(np.full((20, 10), 3), tmp_path / "few.png"))  # 200 cells: with text
    assert few.shape[0] == round((0.35 * 20 + 1.5) * plots.DPI)


def test_a_partial_png_never_replaces_a_whole_one(tmp_path, monkeypatch) -> None:
    """The curves are rewritten every round: a write that fails midway leaves the last whole PNG."""
    fig = plots.new_figure(2, 2)
    fig.canvas.draw()
    whole = plots.write_png(fig, tmp_path / "curves.png").read_bytes()

    write_bytes = Path.write_bytes

    def failing(self, data):
        write_bytes(self, data[:8])
        raise OSError("disk full")
    monkeypatch.setattr(Path, "write_bytes", failing)
    with pytest.raises(OSError, match="disk full"):
        plots.write_png(fig, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes() == whole


@pytest.mark.parametrize("step,lines", [(1.0, (1, 2, 3)), (0.0, (1, 3))], ids=["always-due", "never-due"])
def test_a_run_asks_for_the_curves_when_due_and_after_its_last_line(tmp_path, monkeypatch, step, lines) -> None:
    """With a clock that moves CURVES_SECONDS or more between lines, after every line (as
    before pacing); with one that stands still, after the first and the last line only."""
    asked: list[tuple[str, int, bool, dict]] = []
    ticks = iter(range(1000))
    monkeypatch.setattr(figures, "now", lambda: step * next(ticks))

    class Recorder:
        def __init__(self, run_dir, **_) -> None:
            self.run_dir = run_dir

        def draw(self, figure, **options) -> None:
            metrics = self.run_dir / "metrics.jsonl"
            lines = len(metrics.read_text().splitlines()) if metrics.exists() else 0
            asked.append((figure, lines, (self.run_dir / "summary.json").exists(), options.get("rounds")))

        def close(self) -> None:
            pass

    monkeypatch.setattr(single, "FigureWorker", Recorder)
    config = load_config(DIGITS, ["train.rounds=3", "data.num_clients=3", 'backend="simulation"'])
    single.run(config, tmp_path / "run", echo=None)
    assert asked == [("partition", 0, False, None), *[("curves", n, False, 3) for n in lines]]
    asked.clear()  # a completed run resumed is left as it is: nothing drawn again
    single.run(config, tmp_path / "run", echo=None, resume=True)
    assert asked == []


def test_a_run_without_figures_writes_everything_else(tmp_path) -> None:
    config = load_config(DIGITS, ["train.rounds=2", "data.num_clients=3", 'backend="simulation"'])
    with_figures = single.run(config, tmp_path / "with", echo=None)
    without = single.run(config, tmp_path / "without", echo=None, figures=False)
    assert sorted(p.name for p in (tmp_path / "with" / "plots").iterdir()) == ["curves.png", "partition.png"]
    assert not (tmp_path / "without" / "plots").exists()
    assert {p.name for p in (tmp_path / "with").iterdir()} - {p.name for p in (tmp_path / "without").iterdir()} == {"plots"}
    assert without["final"] == with_figures["final"]


def test_the_cli_runs_without_figures(tmp_path, capsys) -> None:
    assert cli.main(["run", str(DIGITS), "--no-progress", "--no-figures", "--out", str(tmp_path / "run"),
                     "--set", "train.rounds=1", "--set", "data.num_clients=3"]) == 0
    assert (tmp_path / "run" / "summary.json").is_file() and not (tmp_path / "run" / "plots").exists()


def test_curves_drawn_while_a_line_is_being_written_leave_the_torn_line_out(tmp_path) -> None:
    """The child draws the curves while the run trains: a metrics line caught half-written is not
    read (it failed the child with a JSONDecodeError before), and the finished file draws whole."""
    run_dir = _run_files(tmp_path / "run")
    whole = (run_dir / "metrics.jsonl").read_text()
    cut = whole.rfind("\n", 0, len(whole) - 1) + 10  # nine characters into the last line
    (run_dir / "metrics.jsonl").write_text(whole[:cut])
    renderer = render.Renderer(run_dir)
    renderer.draw("curves", {"rounds": 6})
    (run_dir / "metrics.jsonl").write_text(whole)
    drawn = _pixels(renderer.draw("curves", {"rounds": 6}))
    metrics = [json.loads(line) for line in whole.splitlines()]
    assert np.array_equal(drawn, _full_draw(metrics, 6, tmp_path / "full.png"))


def test_a_run_drawn_on_an_earlier_runs_curves_has_the_pixels_of_a_full_draw(tmp_path, monkeypatch) -> None:
    """A renderer given the curves of an earlier run with the same rounds and limits blits the
    new run's lines onto their background (no full draw), with the pixels of a fresh drawing; the
    earlier run's points are gone."""
    first = _run_files(tmp_path / "first")
    earlier = render.Renderer(first)
    earlier.draw("curves", {"rounds": 6})
    second = _run_files(tmp_path / "second")
    metrics = [{**m, "test_accuracy": 1.5 * m["test_accuracy"]} if "test_accuracy" in m else m
               for m in map(json.loads, (second / "metrics.jsonl").read_text().splitlines())]
    (second / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    renderer = render.Renderer(second, earlier.curves)
    full_draws = _counting_full_draws(earlier.curves, monkeypatch)
    drawn = _pixels(renderer.draw("curves", {"rounds": 6}))
    assert renderer.curves is earlier.curves and full_draws == []
    assert np.array_equal(drawn, _full_draw(metrics, 6, tmp_path / "full.png"))
    assert not np.array_equal(drawn, _pixels(first / "plots" / "curves.png"))
    other = render.Renderer(second, earlier.curves)
    other.draw("curves", {"rounds": 9})  # other planned rounds: curves of their own
    assert other.curves is not earlier.curves


def test_a_sweep_without_figures_runs_its_cells_without_them(tmp_path, capsys) -> None:
    study = tmp_path / "study.toml"
    study.write_text(f'base = "{DIGITS}"\nset = {{"train.rounds" = 1, "data.num_clients" = 3}}\n[grid]\nseed = [0, 1]\n')
    assert cli.main(["sweep", str(study), "--out", str(tmp_path / "sweep"), "--no-figures"]) == 0
    cells = [p for p in (tmp_path / "sweep").iterdir() if p.is_dir()]
    assert len(cells) == 2 and all((c / "summary.json").is_file() and not (c / "plots").exists() for c in cells)


def test_the_process_writes_the_curves_once_complete_and_at_the_end_of_a_run(tmp_path, monkeypatch) -> None:
    """Curves not yet at the planned last round stay on the canvas (no PNG each round); the PNG is
    written as soon as they are complete, without waiting for the run's end, or at its end."""
    events: list[str] = []
    kept, written = threading.Event(), threading.Event()
    monkeypatch.setattr(render.Renderer, "keep_curves",
                        lambda self, options: (events.append("keep"), kept.set(), options["complete"])[-1])
    monkeypatch.setattr(render.Renderer, "write_curves", lambda self: (events.append("write"), written.set()))

    def serve(batches: list[bool]) -> None:
        requests_read, requests_write = os.pipe()
        replies_read, replies_write = os.pipe()

        def feed() -> None:
            os.write(requests_write, (json.dumps({"run": str(tmp_path), "id": 1}) + "\n").encode())
            for complete in batches:
                kept.clear()
                os.write(requests_write, (json.dumps({"figure": "curves", "options": {"complete": complete}}) + "\n").encode())
                kept.wait(10)
            if batches[-1]:
                events.append("written before the end" if written.wait(10) else "not written")
            os.write(requests_write, b'{"end": 1}\n')
            os.close(requests_write)
        feeder = threading.Thread(target=feed)
        feeder.start()
        assert figures._serve(requests_read, replies_write) == 0
        feeder.join()
        os.close(replies_read)

    serve([False, True])
    assert events == ["keep", "keep", "write", "written before the end"]
    events.clear()
    serve([False])
    assert events == ["keep", "write"]


def test_later_runs_of_a_process_share_one_figure_process(tmp_path) -> None:
    """Two runs in a row: one fork, each run's figures in its own folder with its own data (no
    request of the first drawn into the second), on disk when each worker closes."""
    first = figures.FigureWorker(_run_files(tmp_path / "one"))
    process = first.process
    _draw_both(first)
    second_dir = _run_files(tmp_path / "two")
    (second_dir / "metrics.jsonl").write_text(json.dumps({"round": 1, "train_loss": 3.0}) + "\n")
    second = figures.FigureWorker(second_dir)
    assert second.process is process is figures._process
    second.draw("curves", rounds=4)
    second.close()
    assert np.array_equal(_pixels(second_dir / "plots" / "curves.png"),
                          _full_draw([{"round": 1, "train_loss": 3.0}], 4, tmp_path / "full.png"))
    assert not (second_dir / "plots" / "partition.png").exists()
    assert (tmp_path / "one" / "plots" / "curves.png").is_file()


def test_a_run_forks_the_figure_process_before_it_loads_its_data(tmp_path, monkeypatch) -> None:
    """The figure process keeps this process' memory as it was when forked: forked after the data
    were loaded, it would hold a first run's data set for the rest of the process."""
    monkeypatch.setattr(figures, "_process", None)
    forked_before_loading = []
    prepare = single.prepare

    def recording_prepare(config):
        forked_before_loading.append(figures._process is not None)
        return prepare(config)
    monkeypatch.setattr(single, "prepare", recording_prepare)
    single.run(load_config(None, ["train.rounds=1", "data.num_clients=3"]), tmp_path / "run", echo=None)
    assert forked_before_loading == [True]
    assert (tmp_path / "run" / "plots" / "curves.png").is_file()


def test_a_figure_process_that_died_between_runs_is_replaced(tmp_path, capsys) -> None:
    _draw_both(figures.FigureWorker(_run_files(tmp_path / "one")))
    dead = figures.shared_process()
    os.kill(dead.pid, signal.SIGKILL)
    os.waitpid(dead.pid, 0)  # reaped: the next run sees it gone
    worker = figures.FigureWorker(_run_files(tmp_path / "two"))
    assert worker.process is not dead and worker.process.pid != dead.pid
    _draw_both(worker)
    assert (tmp_path / "two" / "plots" / "curves.png").is_file()
    assert "failed" not in capsys.readouterr().err


def test_the_figure_process_ends_when_its_parent_dies(tmp_path) -> None:
    """The parent is killed mid-run (no close): the figure process reads the end of its input and exits."""
    script = (f"import os, sys; sys.path.insert(0, {str(Path(figures.__file__).parents[3])!r})\n"
              "from fedlatent.experiment.runner import figures\n"
              f"worker = figures.FigureWorker(__import__('pathlib').Path({str(_run_files(tmp_path / 'run'))!r}))\n"
              "print(worker.process.pid, flush=True)\n"
              "os.kill(os.getpid(), 9)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 20
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_an_answer_left_unread_by_an_interrupted_run_is_not_taken_for_the_next_runs(tmp_path) -> None:
    """A run whose wait was interrupted leaves its answer in the pipe; the next run waits for its own."""
    first = figures.FigureWorker(_run_files(tmp_path / "one"))
    first.process.send({"end": first.run})  # answered, never read: as if the wait was interrupted
    second_dir = _run_files(tmp_path / "two")
    second = figures.FigureWorker(second_dir)
    second.draw("partition", title="two clients")
    second.close()
    assert (second_dir / "plots" / "partition.png").read_bytes()[:8] == PNG


class _Requests:
    """A figure worker that records the figures asked for."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, dict]] = []

    def draw(self, figure: str, **options) -> None:
        self.asked.append((figure, options))


def test_curves_are_asked_for_at_most_every_interval_and_for_the_last_round() -> None:
    clock, requests = [0.0], _Requests()
    pacing = figures.CurvesPacing(requests, rounds=9, interval=0.5, clock=lambda: clock[0])
    asked = []
    for rnd, at in {1: 0.25, 2: 0.5, 3: 0.625, 4: 0.75, 5: 1.0, 6: 1.125, 7: 1.25, 8: 3.0, 9: 3.125}.items():
        clock[0] = at
        before = len(requests.asked)
        pacing.line(rnd)
        asked += [rnd] * (len(requests.asked) - before)
    # 1: the first line; 4: 0.5 s after round 1's request; 7: 0.5 s after round 4's; 8: long
    # after; 9: the last round
    assert asked == [1, 4, 7, 8, 9] and requests.asked == [("curves", {"rounds": 9})] * 5
    pacing.finish(9)  # the newest line is shown already
    assert len(requests.asked) == 5
    assert figures.CurvesPacing(requests, rounds=9).interval == figures.CURVES_SECONDS == 0.5


def test_a_run_ending_before_its_last_round_asks_for_its_newest_line_once() -> None:
    clock, requests = [0.0], _Requests()
    pacing = figures.CurvesPacing(requests, rounds=9, clock=lambda: clock[0])
    for rnd in (1, 2, 3):
        pacing.line(rnd)
    assert requests.asked == [("curves", {"rounds": 9})]  # the first line's; the clock never made another due
    pacing.finish(pacing.newest)
    pacing.finish(3)
    assert requests.asked == [("curves", {"rounds": 9})] * 2
    figures.CurvesPacing(requests, rounds=9).finish(0)  # a run without any metrics line: nothing to draw
    assert len(requests.asked) == 2


def _count_curves(monkeypatch) -> list[dict]:
    asked: list[dict] = []
    real = figures.FigureWorker.draw

    def draw(self, figure, **options):
        if figure == "curves":
            asked.append(options)
        return real(self, figure, **options)

    monkeypatch.setattr(figures.FigureWorker, "draw", draw)
    monkeypatch.setattr(figures, "now", lambda: 0.0)  # a run shorter than CURVES_SECONDS
    return asked


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("background", [True, False], ids=["child", "in-process"])
def test_a_short_run_asks_for_its_curves_twice_and_they_show_every_round(tmp_path, monkeypatch, background) -> None:
    asked = _count_curves(monkeypatch)
    config = load_config(DIGITS, ["train.rounds=4", "data.num_clients=3", 'backend="simulation"'])
    out = tmp_path / "run"
    single.run(config, out, echo=None, figures_in_background=background)
    assert asked == [{"rounds": 4}] * 2  # after the first and the last round
    metrics = _metrics(out)
    assert [m["round"] for m in metrics] == [1, 2, 3, 4]
    assert np.array_equal(_pixels(out / "plots" / "curves.png"), _full_draw(metrics, 4, tmp_path / "full.png"))


def test_a_stopped_run_asks_for_its_curves_when_it_stops_and_they_show_its_rounds(tmp_path, monkeypatch) -> None:
    from fedlatent.backends import simulation
    from fedlatent.errors import RunStopped

    asked = _count_curves(monkeypatch)
    real_round = simulation.run_round

    def stopping(s, rnd):
        if rnd == 2:
            raise RunStopped("round 3: stopped by the test", 2)
        return real_round(s, rnd)

    monkeypatch.setattr(simulation, "run_round", stopping)
    config = load_config(DIGITS, ["train.rounds=4", "data.num_clients=3", 'backend="simulation"'])
    out = tmp_path / "run"
    with pytest.raises(RunStopped):
        single.run(config, out, echo=None)
    assert asked == [{"rounds": 4}] * 2  # after the first round and when the run stopped
    metrics = _metrics(out)
    assert [m["round"] for m in metrics] == [1, 2]
    assert np.array_equal(_pixels(out / "plots" / "curves.png"), _full_draw(metrics, 4, tmp_path / "full.png"))


def test_a_heatmap_drawn_before_is_written_from_its_png(tmp_path, monkeypatch) -> None:
    """The same counts and title again (a sweep's runs of one partition): the same bytes, without a
    new drawing; other counts or another title are drawn."""
    counts = np.arange(12).reshape(4, 3)
    first = plots.partition_heatmap(counts, tmp_path / "a.png", "t").read_bytes()

    def no_drawing(*args, **kwargs):
        raise AssertionError("drawn again")

    monkeypatch.setattr(plots, "new_figure", no_drawing)
    assert plots.partition_heatmap(counts.copy(), tmp_path / "b" / "partition.png", "t").read_bytes() == first
    with pytest.raises(AssertionError, match="drawn again"):
        plots.partition_heatmap(counts + 1, tmp_path / "c.png", "t")
    with pytest.raises(AssertionError, match="drawn again"):
        plots.partition_heatmap(counts, tmp_path / "d.png", "another title")
