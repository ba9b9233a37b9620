"""Issue 10's timing: the release-faithful Ditto + MK-MMD run (β every 20 steps on 51 batches) on the
shared Synthetic file, beside FedAvg on the same data, backend and settings in the same invocation.

Each (backend, method) pair is one whole run of ``configs/ditto/release_<method>.toml`` through
``fedlatent.experiment.run`` (15 rounds, 8 clients × 3200 samples, batch 10, 5 local epochs),
one after another. Reported: the run's wall time, its median round time relative to FedAvg's median
round on the same backend, and the share of the run spent re-optimising β
(``personal_beta_seconds`` summed over clients). Goal (issue 10): the Ditto + MK-MMD run under 300 s
on 2 CPU cores.

    .venv/bin/python benchmarks/ditto_release.py                        # vectorized, ~6 min
    .venv/bin/python benchmarks/ditto_release.py --backends vectorized simulation   # + ~12 min
    .venv/bin/python benchmarks/ditto_release.py --quick                # 1 round, 1 epoch
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import fedlatent
from fedlatent import experiment

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("fedavg", "ditto_mkmmd")


def one_run(method: str, backend: str, overrides: list[str], out: Path) -> dict:
    config = fedlatent.load_config(ROOT / "configs" / "ditto" / f"release_{method}.toml",
                                   [f'backend="{backend}"', *overrides])
    config.data.path = str(ROOT / config.data.path) if not Path(config.data.path).is_absolute() else config.data.path
    summary = experiment.run(config, out, echo=None)
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    beta = sum(l.get("personal_beta_seconds", 0.0) * len(l["clients"]) for l in lines)
    return {"method": method, "backend": backend, "wall_s": summary["wall_seconds"],
            "round_s": statistics.median(l["time_round_s"] for l in lines), "rounds": len(lines),
            "beta_s": beta, "personalized_accuracy": summary["final"].get("personalized_accuracy"),
            "majority_baseline": summary["final"].get("majority_baseline_accuracy")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=["vectorized"], choices=["vectorized", "simulation"])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads, every run alike")
    parser.add_argument("--quick", action="store_true", help="1 round of 1 local epoch")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args()
    overrides = [f"train.threads={args.threads}"] + (["train.rounds=1", "train.local_epochs=1"] if args.quick else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="fedlatent-ditto-bench-") as tmp:
        for backend in args.backends:
            for method in METHODS:
                rows.append(one_run(method, backend, overrides, Path(tmp) / f"{backend}-{method}"))
                print(f"done: {backend} {method} {rows[-1]['wall_s']:.1f} s", flush=True)
    fedavg_round = {r["backend"]: r["round_s"] for r in rows if r["method"] == "fedavg"}
    print("\n| backend | method | rounds | wall s | median round s | round / FedAvg | β share | personal acc | majority |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['method']} | {r['rounds']} | {r['wall_s']:.1f} | {r['round_s']:.2f} | "
              f"{r['round_s'] / fedavg_round[r['backend']]:.2f} | {r['beta_s'] / r['wall_s']:.0%} | "
              f"{r['personalized_accuracy']:.4f} | {r['majority_baseline']:.4f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
