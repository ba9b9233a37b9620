"""Figures of the runs' ``diagnostics.jsonl``: FedDecorr's spectra (Figs. 2-3), FedUV's classifier
singular values (Fig. 1), alignment, uniformity, per-class accuracy, t-SNE (FedUV Fig. 4) and the
FedUV supplement's data figures.

Runs are grouped by a label (method, partition and any other configuration key that differs
between the runs, seeds excepted); a group's curve is the mean over its runs with a ±1 std band.
"""
from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedlatent.analysis.plots import new_figure, partition_heatmap

# configuration keys never used to tell runs apart (seeds, resources, the diagnostics themselves)
_IGNORED = ("seed", "data.seed", "train.threads", "train.device", "eval.")
_FLOOR = 1e-10  # bottom of a log axis: smaller values (numerical zeros: dead ReLU units, rank > N - 1) sit there


@dataclass
class RunRecords:
    """One run's diagnostics with what labels it."""

    path: Path
    records: list[dict[str, Any]]
    config: dict[str, Any]
    method: str
    label: str = ""

    def of(self, model: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["model"] == model]

    def clients(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["model"].startswith("client")]

    @property
    def seed(self) -> int:
        return int(self.config.get("seed", 0))


def _flat(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in table.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def load_run(run_dir: Path) -> RunRecords:
    """Read ``diagnostics.jsonl``, ``config.toml`` and ``summary.json`` (either may be missing)."""
    lines = (run_dir / "diagnostics.jsonl").read_text().splitlines()
    config = tomllib.loads((run_dir / "config.toml").read_text()) if (run_dir / "config.toml").exists() else {}
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    method = summary.get("method") or config.get("algorithm", {}).get("name", run_dir.name)
    return RunRecords(run_dir, [json.loads(l) for l in lines if l.strip()], config, method)


def _partition(config: dict[str, Any]) -> str:
    data = config.get("data", {})
    part = data.get("partition", "?")
    if part == "dirichlet":
        return f"dirichlet α={data.get('alpha')}"
    if part == "shards":
        return f"shards C'={data.get('classes_per_client')}"
    return part


def label_runs(runs: list[RunRecords]) -> None:
    """Set each run's label: method, partition, then every other key whose value differs between runs."""
    flats = [_flat({k: v for k, v in r.config.items() if k != "terms"}) for r in runs]
    shown = {"algorithm.name", "data.partition", "data.alpha", "data.classes_per_client"}
    keys = sorted({k for f in flats for k in f} - shown)
    varying = [k for k in keys if not k.startswith(_IGNORED) and not k.startswith("diagnostics.")
               and len({json.dumps(f.get(k)) for f in flats}) > 1]
    for run, flat in zip(runs, flats):
        extra = ", ".join(f"{k.split('.')[-1]}={flat[k]}" for k in varying if flat.get(k) is not None)  # a key a run lacks says nothing
        terms = "+".join(t.get("name", "?") for t in run.config.get("terms", []))
        run.label = ", ".join(p for p in (run.method + (f"+{terms}" if terms else ""), _partition(run.config), extra) if p)


def _groups(runs: list[RunRecords]) -> dict[str, list[RunRecords]]:
    groups: dict[str, list[RunRecords]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    return groups


def _band(ax, x: np.ndarray, rows: list[np.ndarray], label: str, log: bool = False, **style) -> None:
    """Mean of ``rows`` (equal lengths) with a ±1 std band when there are several."""
    arr = np.vstack(rows)
    mean, std = arr.mean(0), arr.std(0)
    n = f" (n={len(rows)})" if len(rows) > 1 else ""
    line, = ax.plot(x, np.maximum(mean, _FLOOR) if log else mean, label=label + n, **style)
    if len(rows) > 1:
        low, high = mean - std, mean + std
        if log:
            low, high = np.maximum(low, _FLOOR), np.maximum(high, _FLOOR)
        ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2)


def _over_rounds(ax, groups: dict[str, list[RunRecords]], key: str, model: str = "global") -> bool:
    """A per-round scalar of ``model`` for each group (rounds every run of the group has)."""
    drawn = False
    for label, runs in groups.items():
        series = [{r["round"]: r[key] for r in run.of(model) if r.get(key) is not None} for run in runs]
        rounds = sorted(set.intersection(*(set(s) for s in series))) if series else []
        if rounds:
            _band(ax, np.array(rounds), [np.array([s[t] for t in rounds], dtype=float) for s in series], label,
                  marker=".")
            drawn = True
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return drawn


def _last(run: RunRecords, key: str, model: str = "global") -> dict[str, Any] | None:
    rows = [r for r in run.of(model) if r.get(key) is not None]
    return rows[-1] if rows else None


def _subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], **options):
    """A new Agg figure and its axes (pyplot's ``subplots`` without pyplot's figure registry)."""
    fig = new_figure(*figsize)
    return fig, fig.subplots(nrows, ncols, **options)


def _save(fig, ax_list, path: Path, title: str) -> Path:
    for ax in ax_list:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def plot_spectrum(groups: dict[str, list[RunRecords]], path: Path) -> Path | None:
    """Normalised covariance spectrum of z at the last round: global model, and local models."""
    has_local = any(run.clients() for runs in groups.values() for run in runs)
    fig, axes = _subplots(1, 2 if has_local else 1, figsize=(11 if has_local else 6, 4), squeeze=False)
    drawn, threshold = False, None
    for label, runs in groups.items():
        lasts = [last for last in (_last(run, "normalized_spectrum") for run in runs) if last]
        rows = [np.array(last["normalized_spectrum"]) for last in lasts]
        if rows:  # the threshold of the first run that has a spectrum (a group's first may have none)
            threshold = lasts[0].get("threshold")
            _band(axes[0, 0], np.arange(1, len(rows[0]) + 1), rows, label, log=True)
            drawn = True
        if has_local:
            local = []
            for run in runs:
                clients = [r for r in run.clients() if r.get("normalized_spectrum")]
                last = max((r["round"] for r in clients), default=None)
                local += [np.array(r["normalized_spectrum"]) for r in clients if r["round"] == last]
            if local:
                _band(axes[0, 1], np.arange(1, len(local[0]) + 1), local, label, log=True)
    if not drawn:
        return None
    titles = ["global model", "local models (mean over clients)"]
    for i, ax in enumerate(axes[0]):
        ax.set_yscale("log")
        ax.set_ylim(bottom=_FLOOR / 2)
        ax.set_xlabel("singular value index k (descending)")
        ax.set_ylabel("σ_k / σ_1 of cov(z) (log scale, unitless)")
        ax.set_title(titles[i], fontsize=9)
        if threshold:
            ax.axhline(threshold, color="grey", ls="--", lw=1, label=f"threshold τ={threshold:g}")
    return _save(fig, axes[0], path, "Dimensional collapse: normalised spectrum of the covariance of z (last round)")


def plot_significant(groups: dict[str, list[RunRecords]], path: Path) -> Path | None:
    """Significant singular values and effective rank over rounds (global model)."""
    fig, (left, right) = _subplots(1, 2, figsize=(11, 4))
    if not _over_rounds(left, groups, "significant"):
        return None
    _over_rounds(right, groups, "effective_rank")
    some = next(_last(r, "significant") for rs in groups.values() for r in rs if _last(r, "significant"))
    left.set_ylabel(f"count of σ_k/σ_1 > {some.get('threshold', 0):g}")
    right.set_ylabel("effective rank exp(H(σ/Σσ)) (dimensions)")
    for ax in (left, right):
        ax.set_xlabel("communication round")
    return _save(fig, [left, right], path, "Dimensional collapse of the global model's z over rounds")


def plot_classifier(groups: dict[str, list[RunRecords]], path: Path) -> Path | None:
    """Singular values of the global classifier's weights at the last round (FedUV Fig. 1)."""
    fig, ax = _subplots(figsize=(6, 4))
    drawn = False
    for label, runs in groups.items():
        rows = [np.array(_last(r, "classifier_singular_values")["classifier_singular_values"]) for r in runs
                if _last(r, "classifier_singular_values")]
        if rows:
            _band(ax, np.arange(1, len(rows[0]) + 1), rows, label, marker="o", ms=3)
            drawn = True
    if not drawn:
        return None
    ax.set_xlabel("singular value index k (descending)")
    ax.set_ylabel("singular value of W (weight units)")
    return _save(fig, [ax], path, "Classifier-weight singular values (global model, last round)")


def plot_alignment(groups: dict[str, list[RunRecords]], path: Path) -> Path | None:
    """Cross-client alignment of classifier rows over rounds."""
    fig, (left, right) = _subplots(1, 2, figsize=(11, 4))
    if not _over_rounds(left, groups, "alignment_cosine"):
        return None
    _over_rounds(right, groups, "alignment_norm_difference")
    left.set_ylabel("mean cosine of a class's rows (unitless)")
    right.set_ylabel("mean |‖w_a,c‖ − ‖w_b,c‖| (weight units)")
    for ax in (left, right):
        ax.set_xlabel("communication round")
    return _save(fig, [left, right], path, "Alignment of local classifiers' rows between client pairs")


def plot_uniformity(groups: dict[str, list[RunRecords]], path: Path) -> Path | None:
    """Hyperspherical uniformity of the global model's z over rounds."""
    fig, ax = _subplots(figsize=(6, 4))
    if not _over_rounds(ax, groups, "uniformity"):
        return None
    ax.set_xlabel("communication round")
    ax.set_ylabel("log mean exp(−t‖ẑ_i−ẑ_j‖²) (nats; lower = more uniform)")
    return _save(fig, [ax], path, "Hyperspherical uniformity of z (global model)")


def plot_per_class(groups: dict[str, list[RunRecords]], path: Path) -> Path | None:
    """Per-class accuracy of the global model at the last round, one bar per group and class."""
    rows = {label: [np.array(_last(r, "per_class_accuracy")["per_class_accuracy"], dtype=float) for r in runs
                    if _last(r, "per_class_accuracy")] for label, runs in groups.items()}
    rows = {k: v for k, v in rows.items() if v}
    if not rows:
        return None
    classes = len(next(iter(rows.values()))[0])
    fig, ax = _subplots(figsize=(max(6, 0.6 * classes * max(1, len(rows) / 2)), 4))
    width = 0.8 / len(rows)
    for i, (label, arrs) in enumerate(rows.items()):
        arr = np.vstack(arrs)
        ax.bar(np.arange(classes) + i * width - 0.4 + width / 2, np.nanmean(arr, 0), width,
               yerr=np.nanstd(arr, 0) if len(arrs) > 1 else None, label=label + (f" (n={len(arrs)})" if len(arrs) > 1 else ""))
    ax.set_xticks(np.arange(classes))
    ax.set_xlabel("class")
    ax.set_ylabel("accuracy on the class's samples (fraction)")
    ax.set_ylim(0, 1.05)
    return _save(fig, [ax], path, "Per-class accuracy (global model, last round)")


def plot_tsne(runs: list[RunRecords], path: Path, max_panels: int = 6) -> Path | None:
    """t-SNE of one class's features from several clients, one panel per run (last round)."""
    shown = [(run, _last(run, "tsne")) for run in runs]
    shown = [(run, rec) for run, rec in shown if rec and rec["tsne"]["xy"]][:max_panels]
    if not shown:
        return None
    cols = min(3, len(shown))
    rowsn = -(-len(shown) // cols)
    fig, axes = _subplots(rowsn, cols, figsize=(4.2 * cols, 3.8 * rowsn), squeeze=False)
    for ax in axes.flat[len(shown):]:
        ax.axis("off")
    for ax, (run, rec) in zip(axes.flat, shown):
        t = rec["tsne"]
        xy, client = np.array(t["xy"]), np.array(t["client"])
        for cid in sorted(set(client.tolist())):
            pts = xy[client == cid]
            source = t.get("model_of_client", {}).get(str(cid), "global")
            ax.scatter(pts[:, 0], pts[:, 1], s=10, label=f"client {cid} ({source} model)")
        ax.set_title(f"{run.label}, seed {run.seed}\nclass {t['class']}, round {rec['round']}", fontsize=8)
        ax.set_xlabel("t-SNE dimension 1 (arbitrary units)")
        ax.set_ylabel("t-SNE dimension 2 (arbitrary units)")
    return _save(fig, [ax for ax, _ in zip(axes.flat, shown)], path, "t-SNE of one class's features, coloured by client")


def plot_data(run: RunRecords, folder: Path, stem: str) -> list[Path]:
    """The FedUV supplement's data figures of one run: label heatmap and mean-input histograms."""
    rec = next(iter(run.of("data")), None)
    if rec is None:
        return []
    paths = [partition_heatmap(np.array(rec["label_counts"]), folder / f"{stem}_labels.png",
                               f"{run.label}: training samples per client and class")]
    hist = rec["mean_value_histogram"]
    edges, counts = np.array(hist["edges"]), np.array(hist["counts"])
    cols = min(5, len(counts))
    rowsn = -(-len(counts) // cols)
    fig, axes = _subplots(rowsn, cols, figsize=(2.6 * cols, 2.2 * rowsn + 0.6), squeeze=False, sharex=True)
    for ax in axes.flat[len(counts):]:
        ax.axis("off")
    for cid, (ax, c) in enumerate(zip(axes.flat, counts)):
        ax.bar(edges[:-1], c, width=np.diff(edges), align="edge", color=f"C{cid % 10}", label=f"client {cid}")
        ax.legend(fontsize=6, handlelength=1)
        ax.tick_params(labelsize=6)
    for ax in axes[-1]:
        ax.set_xlabel("mean input value of a sample", fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("samples (count)", fontsize=7)
    fig.suptitle(f"{run.label}: per-client histogram of each sample's mean input value", fontsize=9)
    fig.tight_layout()
    fig.savefig(folder / f"{stem}_mean_values.png", dpi=120)
    return paths + [folder / f"{stem}_mean_values.png"]


def plot_diagnostics(run_dirs: list[Path], out: Path) -> list[Path]:
    """Write the diagnostics' PNGs of the runs in ``run_dirs`` (those with a ``diagnostics.jsonl``)
    into ``out``; return the files written."""
    runs = [load_run(Path(d)) for d in run_dirs if (Path(d) / "diagnostics.jsonl").exists()]
    if not runs:
        return []
    label_runs(runs)
    groups = _groups(runs)
    out.mkdir(parents=True, exist_ok=True)
    written = [plot_spectrum(groups, out / "diag_spectrum.png"),
               plot_significant(groups, out / "diag_significant.png"),
               plot_classifier(groups, out / "diag_classifier_sv.png"),
               plot_alignment(groups, out / "diag_alignment.png"),
               plot_uniformity(groups, out / "diag_uniformity.png"),
               plot_per_class(groups, out / "diag_per_class.png"),
               plot_tsne(runs, out / "diag_tsne.png")]
    for i, runs_of_group in enumerate(groups.values()):
        stem = "diag_data" if len(groups) == 1 else f"diag_data_{i}"
        written += plot_data(runs_of_group[0], out, stem)
    return [p for p in written if p is not None]
