"""Accuracy against ε (results/privacy_epsilon.md): the per-run numbers of the two privacy sweeps,
their tables, verdict records and figure.

    python results/privacy_epsilon.py collect digits runs/privacy_epsilon_digits     # → privacy_epsilon/digits.csv
    python results/privacy_epsilon.py collect cifar10 runs/privacy_epsilon_cifar10   # → privacy_epsilon/cifar10.csv
    python results/privacy_epsilon.py render     # the tables and verdicts to paste, privacy_epsilon_paired.csv, privacy_epsilon/accuracy_epsilon.png

``collect`` reads each finished run of a sweep: its labels and accuracies (``results.csv``), the
final ε (``summary.json``'s ``privacy_epsilon``: the rounds and, for SphereFed, the FFC release) and
the rounds' ε alone (the last ``metrics.jsonl`` line's, what the model before FFC spent).
``render`` builds everything else from those committed files, so that
``tests/test_results_privacy_epsilon.py`` can check the markdown against them.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path

from fedlatent.analysis.compare import paired_verdict

HERE = Path(__file__).resolve().parent / "privacy_epsilon"
DATASETS = {"digits": "digits", "cifar10": "CIFAR-10"}
METHODS = {"fedavg": "FedAvg", "fedavg-lr0.5": "FedAvg, lr 0.5", "feduv": "FedUV",
           "spherefed+ffc": "SphereFed + FFC"}
COLUMNS = ("method", "sigma", "seed", "epsilon", "epsilon_rounds", "accuracy", "uncalibrated_accuracy")
# the claims judged (results/README.md's rule), each on per-seed differences in points:
# (claim, data set, σ label, (method, metric), (baseline method, metric))
CLAIMS = (
    ("FedUV above FedAvg at σ = 1 on digits", "digits", "1",
     ("feduv", "accuracy"), ("fedavg", "accuracy")),
    ("SphereFed + FFC above FedAvg at σ = 1 on digits", "digits", "1",
     ("spherefed+ffc", "accuracy"), ("fedavg", "accuracy")),
    ("Private FFC lifts the SphereFed-trained model at σ = 1 on digits", "digits", "1",
     ("spherefed+ffc", "accuracy"), ("spherefed+ffc", "uncalibrated_accuracy")),
    ("SphereFed's model before FFC above FedAvg at its learning rate (0.5) at σ = 1 on digits", "digits", "1",
     ("spherefed+ffc", "uncalibrated_accuracy"), ("fedavg-lr0.5", "accuracy")),
    ("FedUV above FedAvg at σ = 1 on CIFAR-10", "cifar10", "1",
     ("feduv", "accuracy"), ("fedavg", "accuracy")),
    ("SphereFed + FFC above FedAvg at σ = 1 on CIFAR-10", "cifar10", "1",
     ("spherefed+ffc", "accuracy"), ("fedavg", "accuracy")),
    ("Private FFC lifts the SphereFed-trained model at σ = 1 on CIFAR-10", "cifar10", "1",
     ("spherefed+ffc", "accuracy"), ("spherefed+ffc", "uncalibrated_accuracy")),
)

Row = dict[str, str]


def collect(sweep: Path) -> list[Row]:
    """One row per finished run of ``sweep``, in its ``results.csv`` order (see the module docstring)."""
    rows = []
    for run in csv.DictReader((sweep / "results.csv").open()):
        if not run.get("accuracy"):  # not finished (or stopped by the failure policy)
            continue
        folder = sweep / run["run"]
        summary = json.loads((folder / "summary.json").read_text())
        last = json.loads((folder / "metrics.jsonl").read_text().splitlines()[-1])
        rows.append({"method": run["method"], "sigma": run["sigma"], "seed": run["seed"],
                     "epsilon": _number(summary.get("privacy_epsilon")),
                     "epsilon_rounds": _number(last.get("privacy_epsilon")),
                     "accuracy": _number(float(run["accuracy"])),
                     "uncalibrated_accuracy": _number(float(run["uncalibrated_accuracy"]))
                     if run.get("uncalibrated_accuracy") else ""})
    return rows


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def load(name: str) -> list[Row]:
    """The committed per-run numbers of data set ``name`` (``privacy_epsilon/<name>.csv``)."""
    return list(csv.DictReader((HERE / f"{name}.csv").open()))


def _sigma_key(label: str) -> tuple[int, float]:
    """The plain run first, then σ ascending."""
    return (0, 0.0) if label == "plain" else (1, float(label))


def cells(rows: list[Row]) -> dict[tuple[str, str], list[Row]]:
    """Runs grouped by (method, σ label), methods in :data:`METHODS` order, σ ascending."""
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in rows:
        groups[(row["method"], row["sigma"])].append(row)
    return dict(sorted(groups.items(), key=lambda kv: (list(METHODS).index(kv[0][0]), _sigma_key(kv[0][1]))))


def _mean_std(values: list[float], scale: float = 100.0) -> str:
    if not values:
        return "–"
    mean = statistics.mean(values) * scale
    return f"{mean:.1f} ± {statistics.stdev(values) * scale:.1f}" if len(values) > 1 else f"{mean:.1f}"


def _epsilon(values: list[str]) -> str:
    """ε of a cell (one value: it depends on σ, the sampling and the rounds, not on the seed)."""
    found = sorted({f"{float(v):.1f}" for v in values if v})
    return " / ".join(found) if found else "–"


def _sigma(label: str) -> str:
    return {"plain": "plain (no clip)", "0": "0 (clipped)"}.get(label, label)


def table(rows: list[Row]) -> str:
    """The markdown table of one data set: ε and accuracy (%, mean ± std over seeds) per method and σ."""
    lines = ["| method | σ | seeds | ε (δ = 10⁻⁵) | accuracy (%) | before FFC (%) | ε before FFC |",
             "|---|---|---|---|---|---|---|"]
    for (method, sigma), runs in cells(rows).items():
        before = [float(r["uncalibrated_accuracy"]) for r in runs if r["uncalibrated_accuracy"]]
        lines.append(f"| {METHODS[method]} | {_sigma(sigma)} | {len(runs)} | {_epsilon([r['epsilon'] for r in runs])} | "
                     f"{_mean_std([float(r['accuracy']) for r in runs])} | {_mean_std(before)} | "
                     f"{_epsilon([r['epsilon_rounds'] for r in runs]) if before else '–'} |")
    return "\n".join(lines)


def paired(rows: list[Row], sigma: str, side: tuple[str, str], base: tuple[str, str]) -> list[tuple[int, float, float]]:
    """Per seed both have, ascending: (seed, side, base) in percent at σ label ``sigma``."""
    def by_seed(method: str, metric: str) -> dict[int, float]:
        return {int(r["seed"]): 100 * float(r[metric]) for r in rows
                if r["method"] == method and r["sigma"] == sigma and r[metric]}
    ours, theirs = by_seed(*side), by_seed(*base)
    return [(s, ours[s], theirs[s]) for s in sorted(set(ours) & set(theirs))]


def differences(rows: list[Row], sigma: str, side: tuple[str, str], base: tuple[str, str]) -> list[float]:
    """Per-seed (side − base) in points at σ label ``sigma``, over the seeds both have, ascending."""
    return [round(ours - theirs, 2) for _, ours, theirs in paired(rows, sigma, side, base)]


RAW = "privacy_epsilon_paired.csv"  # beside the results file: the raw numbers of each verdict


def paired_csv() -> str:
    """The verdicts' raw numbers (format: results/README.md): per claim and seed, the difference and
    the two accuracies (%) it is the difference of."""
    lines = ["claim,seed,difference,method_value,baseline_value"]
    for claim, name, sigma, side, base in CLAIMS:
        lines += [f'"{claim}",{seed},{round(ours - theirs, 2):.2f},{ours:.4f},{theirs:.4f}'
                  for seed, ours, theirs in paired(load(name), sigma, side, base)]
    return "\n".join(lines) + "\n"


def verdict_block(budget: str) -> str:
    """The ``# verdicts`` toml block of the results file (format: results/README.md), from the CSVs."""
    lines = ["```toml", "# verdicts: per-seed differences (points) from results/privacy_epsilon/*.csv, "
             "written by results/privacy_epsilon.py render", f'budget = "{budget}"', f'raw = "{RAW}"']
    for claim, name, sigma, side, base in CLAIMS:
        diffs = differences(load(name), sigma, side, base)
        lines += ["", "[[verdict]]", f'claim = "{claim}"', "direction = 1", f'verdict = "{paired_verdict(diffs, 1)}"']
    return "\n".join(lines + ["```"])


BUDGET = ("client-level DP-FedAvg with adaptive clipping, 100 IID clients, 20 a round, 20 rounds, "
          "δ = 10⁻⁵, 3 seeds; CIFAR-10: an MLP, 300 training images per class")


def figure(path: Path) -> Path:
    """Accuracy against ε, one panel per data set: a line per method through σ > 0 (mean ± std over
    seeds), SphereFed's model before FFC dashed at the rounds' ε, and each method's clipped run
    without noise (σ = 0) as a dotted level."""
    from fedlatent.analysis.plots import fixed_margins, new_figure, save
    from fedlatent.analysis.study_plots import method_styles

    styles = method_styles([m.removesuffix("+ffc") for m in METHODS])  # a method's own hue, not a variant's
    fig = new_figure(11.0, 4.0)
    fixed_margins(fig, left=0.7, right=2.7, bottom=0.6, top=0.6, wspace=0.15)
    axes = fig.subplots(1, len(DATASETS), sharey=True)
    for ax, (name, title) in zip(axes, DATASETS.items()):
        groups = cells(load(name))
        for method, label in METHODS.items():
            colour = styles[method.removesuffix("+ffc")][0]
            private = [(s, runs) for (m, s), runs in groups.items() if m == method and s not in ("plain", "0")]
            for metric, eps, style, text in (("accuracy", "epsilon", "-", label),
                                             ("uncalibrated_accuracy", "epsilon_rounds", "--", f"{label}: before FFC")):
                points = [(float(runs[0][eps]), [100 * float(r[metric]) for r in runs]) for _, runs in private
                          if runs[0][metric]]
                if not points:
                    continue
                x = [p[0] for p in points]
                ax.errorbar(x, [statistics.mean(v) for _, v in points],
                            yerr=[statistics.stdev(v) if len(v) > 1 else 0.0 for _, v in points],
                            color=colour, linestyle=style, marker="o", markersize=3.5, capsize=2, label=text)
            clipped = groups.get((method, "0"))
            if clipped:
                ax.axhline(100 * statistics.mean(float(r["accuracy"]) for r in clipped), color=colour,
                           linestyle=":", linewidth=1.0, label=f"{label}: σ = 0 (clipped, no noise)")
        ax.set_xscale("log")
        ax.set_xlabel("ε at δ = 10⁻⁵ (client level)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("test accuracy (%)")
    handles, labels = axes[0].get_legend_handles_labels()  # digits holds every line
    axes[-1].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    fig.suptitle("Accuracy against ε: DP-FedAvg with adaptive clipping, 100 clients, 20 a round, 20 rounds",
                 fontsize=10)
    return save(fig, path)


def render() -> str:
    """Each data set's table, then the verdict block, as the markdown file holds them."""
    return "\n\n".join([*(f"{title}:\n\n{table(load(name))}" for name, title in DATASETS.items()),
                        verdict_block(BUDGET)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    take = sub.add_parser("collect", help="a sweep's per-run numbers into privacy_epsilon/<name>.csv")
    take.add_argument("name", choices=list(DATASETS))
    take.add_argument("sweep", type=Path)
    sub.add_parser("render", help="print the tables and verdicts; draw privacy_epsilon/accuracy_epsilon.png")
    args = parser.parse_args()
    if args.command == "collect":
        HERE.mkdir(exist_ok=True)
        with (HERE / f"{args.name}.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(collect(args.sweep))
    else:
        print(render())
        (HERE.parent / RAW).write_text(paired_csv())
        figure(HERE / "accuracy_epsilon.png")


if __name__ == "__main__":
    main()
