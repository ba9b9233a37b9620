"""Paired differences against a baseline row, from a sweep's results.csv: for each setting and
method, (method − baseline) in percentage points per seed, their mean ± sample std, how many
seeds favour the method and the verdict on the claim that the method moves the metric in
``--direction`` (``fedlatent.analysis.compare.paired_verdict``, the rule of every results file).
Cells of one seed share the data subset and partition, so the paired difference removes the
spread that the data draw adds to both rows.

    python results/paired_differences.py runs/reproduce/feduv_supp_table2-cpu --baseline fedavg
    python results/paired_differences.py SWEEP --baseline ditto --metric personalized_accuracy
    python results/paired_differences.py SWEEP --baseline fedavg --metric diag_significant --scale 1
    python results/paired_differences.py SWEEP --baseline ditto --direction -1   # the claim: below ditto
"""
from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict
from pathlib import Path

from fedlatent.analysis.compare import paired_verdict


def paired(rows: list[dict[str, str]], baseline: str, metric: str, scale: float,
           method_axis: str = "method") -> list[tuple[str, str, list[float]]]:
    """(setting, method, per-seed differences) for every non-baseline method with the baseline's seeds."""
    settings = [k for k in rows[0] if k not in (method_axis, "seed", "run", "status") and not _is_result(k, rows)]
    values: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r.get(metric) not in (None, ""):
            values[(" ".join(r[k] for k in settings), r[method_axis])][r["seed"]] = float(r[metric]) * scale
    out = []
    for (setting, method), by_seed in values.items():
        base = values.get((setting, baseline), {})
        seeds = sorted(set(by_seed) & set(base))
        if method != baseline and seeds:
            out.append((setting, method, [by_seed[s] - base[s] for s in seeds]))
    return out


def _is_result(key: str, rows: list[dict[str, str]]) -> bool:
    """Whether a results.csv column is a measured value rather than an axis (axes come first)."""
    return list(rows[0]).index(key) >= list(rows[0]).index("status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sweep", type=Path, help="a sweep folder holding results.csv")
    parser.add_argument("--baseline", default="fedavg", help="the method label to subtract")
    parser.add_argument("--metric", default="accuracy", help="a results.csv column")
    parser.add_argument("--scale", type=float, default=100.0, help="multiply values by this (100: points)")
    parser.add_argument("--direction", type=int, choices=(1, -1), default=1,
                        help="the claimed sign of (method − baseline): 1 above, -1 below")
    args = parser.parse_args()
    rows = list(csv.DictReader((args.sweep / "results.csv").open()))
    claim = "above" if args.direction > 0 else "below"
    print(f"| setting | method − {args.baseline} ({args.metric}) | per seed | mean ± std | seeds {claim} | "
          f"verdict: {claim} {args.baseline} |")
    print("|---|---|---|---|---|---|")
    for setting, method, diffs in paired(rows, args.baseline, args.metric, args.scale):
        spread = f" ± {statistics.stdev(diffs):.2f}" if len(diffs) > 1 else ""
        print(f"| {setting} | {method} | {', '.join(f'{d:+.2f}' for d in diffs)} | "
              f"{statistics.mean(diffs):+.2f}{spread} | {sum(args.direction * d > 0 for d in diffs)}/{len(diffs)} | "
              f"{paired_verdict(diffs, args.direction)} |")


if __name__ == "__main__":
    main()
