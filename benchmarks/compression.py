"""What top-k compression with error feedback (``[compression] kind = "topk"``) saves and costs: the
bytes the clients upload in a round and the final test accuracy of FedAvg on digits
(``configs/digits_fedavg.toml``: 10 clients, MLP, 20 rounds, simulation backend), plain against
top-k at two fractions, with and without error feedback, over a few seeds, IID or Dirichlet(0.5).
Not a timing: the bytes are what ``bytes_up`` counts in each metrics line, the accuracy the run's
``summary.json``; nothing here asserts a figure.

    python benchmarks/compression.py --seeds 0 1
    python benchmarks/compression.py --seeds 0 1 --partition dirichlet
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import fedlatent

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_fedavg.toml"
CASES = {"plain": [],
         "top-k 10 %, error feedback": ['compression.kind="topk"', "compression.fraction=0.1"],
         "top-k 1 %, error feedback": ['compression.kind="topk"', "compression.fraction=0.01"],
         "top-k 1 %, no error feedback": ['compression.kind="topk"', "compression.fraction=0.01",
                                          "compression.error_feedback=false"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--partition", choices=("iid", "dirichlet"), default="iid")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    data = ['data.partition="dirichlet"', "data.alpha=0.5"] if args.partition == "dirichlet" else []
    print("| codec | bytes up a round | / plain | final accuracy % (per seed) | vs plain (points) |")
    print("|---|---|---|---|---|")
    base: tuple[float, int] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        for label, extra in CASES.items():
            accuracies, sent = [], 0
            for seed in args.seeds:
                out = Path(tmp) / f"{len(accuracies)}-{label}"
                config = fedlatent.load_config(CONFIG, [f"seed={seed}", 'backend="simulation"',
                                                        f"train.rounds={args.rounds}", *data, *extra])
                summary = fedlatent.run(config, out)
                accuracies.append(summary["final"]["accuracy"])
                sent = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["bytes_up"]
            accuracy = statistics.mean(accuracies)
            base = base or (accuracy, sent)
            per_seed = ", ".join(f"{100 * a:.1f}" for a in accuracies)
            print(f"| {label} | {sent:,} | {sent / base[1]:.3f} | {100 * accuracy:.1f} ({per_seed}) | "
                  f"{100 * (accuracy - base[0]):+.1f} |")


if __name__ == "__main__":
    main()
