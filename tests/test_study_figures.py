"""``fedlatent report``'s figures are read, not decoded: one panel per setting, one colour per
method and one line style per added term the same in every panel, the legend outside the data,
and the same at 64 cells. Checked on the figure's structure, not its pixels."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedlatent.analysis.study_plots import band_figure, method_styles, split_term
from fedlatent.experiment.studies.report import method_axis, report

TABLE1_METHODS = ["fedavg", "fedavg+decorr", "fedprox", "fedprox+decorr", "fedavgm", "fedavgm+decorr", "moon",
                  "moon+decorr"]


def _sweep(root: Path, settings: list[str], methods: list[str], seeds: int = 2, rounds: int = 4) -> Path:
    """A sweep directory as ``fedlatent sweep`` leaves it (manifest and metrics), without training."""
    rng = np.random.default_rng(0)
    runs = []
    for setting in settings:
        for method in methods:
            for seed in range(seeds):
                name = f"setting-{setting}_method-{method}_seed-{seed}"
                (root / name).mkdir(parents=True)
                lines = [{"round": r, "train_loss": 2.0 / r, "test_accuracy": float(rng.uniform(0.1, 0.9))}
                         for r in range(1, rounds + 1)]
                (root / name / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
                clients = [{"client": c, "accuracy": float(a), "majority_baseline": 0.4}
                           for c, a in enumerate(rng.uniform(0.2, 1.0, 10))]
                (root / name / "summary.json").write_text(json.dumps({"final": {"personalized_accuracy": 0.6,
                                                                                "per_client": clients}}))
                runs.append({"run": name, "labels": {"setting": setting, "method": method, "seed": str(seed)}})
    (root / "sweep.json").write_text(json.dumps({"title": "t", "axes": ["setting", "method", "seed"], "runs": runs}))
    return root


def _panels(settings: list[str], methods: list[str]) -> dict[str, dict[str, list]]:
    rounds = [1, 2, 3]
    return {s: {m: [(rounds, [0.1, 0.2 + i / 100, 0.3]), (rounds, [0.2, 0.3, 0.4])] for i, m in enumerate(methods)}
            for s in settings}


def _curve_styles(ax) -> dict[str, tuple]:
    return {line.get_label(): (tuple(line.get_color()), line.get_linestyle()) for line in ax.get_lines()}


def _bbox(fig, artist):
    return artist.get_window_extent(fig.canvas.get_renderer())


def test_two_settings_draw_two_panels_with_a_colour_per_method_and_the_legend_outside() -> None:
    fig = band_figure(_panels(["alpha=0.05", "alpha=inf"], TABLE1_METHODS), "accuracy", "Accuracy")
    fig.canvas.draw()
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["alpha=0.05", "alpha=inf"]
    first, second = (_curve_styles(ax) for ax in panels)
    assert first == second and set(first) == set(TABLE1_METHODS)          # the same style in every panel
    assert len({colour for colour, _ in first.values()}) == len(TABLE1_METHODS)  # a colour per method
    assert {first[m][1] for m in TABLE1_METHODS if "+" not in m} == {"-"}       # a line style per term
    assert {first[m][1] for m in TABLE1_METHODS if "+" in m} == {"--"}
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == TABLE1_METHODS
    box = _bbox(fig, legend)
    assert all(box.x0 >= _bbox(fig, ax).x1 for ax in panels)                 # right of every panel
    assert box.x1 <= fig.bbox.x1                                            # and on the canvas


def test_a_method_and_its_added_term_share_a_hue_family() -> None:
    assert split_term("fedavg+decorr") == ("fedavg", "+decorr") and split_term("moon") == ("moon", "")
    styles = method_styles(["fedavg", "fedavg+decorr", "fedavg+uv", "moon"])
    assert [s[1] for s in styles.values()] == ["-", "--", ":", "-"]
    assert styles["fedavg+decorr"][0] == styles["fedavg+uv"][0] != styles["fedavg"][0]


@pytest.mark.parametrize("count", [12, 30])
def test_many_methods_keep_a_colour_each(count: int) -> None:
    styles = method_styles([f"m{i}" for i in range(count)])
    assert len({colour for colour, _ in styles.values()}) == count


def test_64_cells_in_8_panels_stay_on_the_canvas_with_the_legend_right_of_them() -> None:
    settings = [f"setting={s}" for s in ("c10-a0.05", "c10-a0.1", "c10-a0.5", "c10-iid", "c100-a0.05", "c100-a0.1",
                                         "c100-a0.5", "c100-iid")]
    fig = band_figure(_panels(settings, TABLE1_METHODS), "accuracy", "Accuracy")
    fig.canvas.draw()
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 8 and all(len(ax.get_lines()) == 8 for ax in panels)
    legend = _bbox(fig, fig.legends[0])
    assert all(legend.x0 >= _bbox(fig, ax).x1 for ax in panels)
    assert all(fig.bbox.contains(*_bbox(fig, ax).p0) and fig.bbox.contains(*_bbox(fig, ax).p1) for ax in panels)


@pytest.mark.parametrize("count, grid", [(4, (2, 2)), (5, (2, 3)), (8, (3, 3))])
def test_panels_wrap_in_rows_as_even_as_they_come_each_column_with_its_round_axis(count: int, grid: tuple) -> None:
    """At most three panels side by side (a laptop's browser shows the figure at a readable size);
    the lowest panel of every column, above an empty slot too, names its x-axis."""
    fig = band_figure(_panels([f"s{i}" for i in range(count)], ["fedavg"]), "accuracy", "Accuracy")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert panels[0].get_subplotspec().get_gridspec().get_geometry() == grid
    labelled = [ax for ax in panels if ax.get_xlabel() and ax.xaxis.get_tick_params()["labelbottom"]]
    assert len(labelled) == grid[1]


def test_report_on_a_16_cell_2_setting_study_facets_by_the_setting(tmp_path: Path, monkeypatch) -> None:
    from fedlatent.analysis import study_plots
    drawn = []
    real = study_plots.band_figure
    monkeypatch.setattr(study_plots, "band_figure", lambda *a, **k: drawn.append(real(*a, **k)) or drawn[-1])
    sweep = _sweep(tmp_path / "sweep", ["cifar10-a0.05", "cifar10-iid"], TABLE1_METHODS)
    names = {p.name for p in report([sweep], tmp_path / "report")}
    assert {"accuracy.png", "loss.png"} <= names
    accuracy = drawn[0]
    assert [ax.get_title() for ax in accuracy.axes if ax.get_visible()] == ["setting=cifar10-a0.05",
                                                                           "setting=cifar10-iid"]
    assert "n = 2" in accuracy._suptitle.get_text()


def test_the_method_axis() -> None:
    assert method_axis(["setting", "method", "seed"]) == "method"
    assert method_axis(["data.alpha", "algorithm.name", "seed"]) == "algorithm.name"
    assert method_axis(["data.alpha", "seed"]) == "data.alpha"
    assert method_axis(["seed"]) is None


def test_per_client_boxes_are_faceted_by_setting_in_the_methods_colours() -> None:
    from fedlatent.analysis.study_plots import per_client_figure
    settings = [f"setting={i}" for i in range(8)]
    panels = {s: {m: ([0.2, 0.5, 0.9], [0.4]) for m in TABLE1_METHODS} for s in settings}
    fig = per_client_figure(panels)
    fig.canvas.draw()
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == settings
    styles = method_styles(TABLE1_METHODS)
    for ax in shown:
        assert [t.get_text() for t in ax.get_xticklabels()] == TABLE1_METHODS
        faces = [tuple(p.get_facecolor()[:3]) for p in ax.patches]
        assert faces == [tuple(styles[m][0][:3]) for m in TABLE1_METHODS]
    assert all(fig.bbox.contains(*_bbox(fig, ax).p0) and fig.bbox.contains(*_bbox(fig, ax).p1) for ax in shown)
    assert fig.get_figwidth() <= 17                                        # wraps rather than growing wide
