"""Issue 10's tables: Ditto and its feature-drift constraints on Synthetic data, beside the
majority-class baseline. Runs the repository's configs through the CLI (two at a time on two
cores, one torch thread each) and writes a markdown file.

    .venv/bin/python results/ditto_tables.py release  --out results/ditto_release.md
    .venv/bin/python results/ditto_tables.py paper    --seeds 0 1 2 --out results/ditto_paper.md

Runs already finished under runs/ditto-tables/ are reused, so the script can be stopped and
restarted. Each finished run's backend and ``final`` summary (accuracies, per-client figures; no
weights) is also recorded in results/ditto_runs/NAME.json, committed, so the tables can be rebuilt
with ``--report-only`` in a fresh clone. Rows run on the vectorized backend (rows finished before
it existed ran on the simulation backend; each table says which). The long runs stay out of CI (a 15-round run is 1-5
minutes on 2 CPU cores, MMD-D 15-45 minutes).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs" / "ditto-tables"
RECORDS = ROOT / "results" / "ditto_runs"
FEDLATENT = [sys.executable, "-m", "fedlatent.cli"]

RELEASE = ["fedavg", "ditto", "ditto_cosine", "ditto_mkmmd", "ditto_mmdd"]
PAPER = ["fedavg", "ditto", "ditto_cosine", "ditto_mkmmd_every1", "ditto_mkmmd_every20", "ditto_mmdd",
         "cosine_alone", "mkmmd_alone_every1", "mkmmd_alone_every20", "mmdd_alone"]
PUBLISHED = {  # METHODS.md: mean personal accuracy over clients, 3 seeds
    "00": {"fedavg": 84.73, "ditto": 89.13, "ditto_cosine": 89.19, "ditto_mmdd": 89.46,
           "ditto_mkmmd_every1": 89.18, "ditto_mkmmd_every20": 89.26, "cosine_alone": 89.98,
           "mmdd_alone": 90.24, "mkmmd_alone_every1": 91.42, "mkmmd_alone_every20": 90.07},
    "05": {"fedavg": 85.46, "ditto": 85.53, "ditto_cosine": 87.78, "ditto_mmdd": 89.70,
           "ditto_mkmmd_every1": 88.15, "ditto_mkmmd_every20": 88.10, "cosine_alone": 90.20,
           "mmdd_alone": 91.27, "mkmmd_alone_every1": 91.14, "mkmmd_alone_every20": 90.26},
}
# the release's rows again with standard logits and the paper's (0.5,0.5) hyperparameters
STANDARD = {"fedavg": ["train.lr=0.01"], "ditto": ["train.lr=0.01", "algorithm.lam=0.1"],
            "ditto_cosine": ["train.lr=0.01", "algorithm.mu=1.0"],
            "ditto_mkmmd": ["train.lr=0.01", "algorithm.mu=1.0"],
            "ditto_mmdd": ["train.lr=0.01", "algorithm.mu=1.0"]}


def backend_for(out: Path) -> str:
    """The vectorized backend (the same numbers as simulation up to float32 rounding, several times
    faster); a partial run resumes on the backend it started with."""
    return backend_of(out) if (out / "config.toml").exists() else "vectorized"


def run(job: tuple[str, str, list[str]]) -> None:
    name, config, overrides = job
    out = RUNS / name
    if record(name) is not None:
        return
    resume = ["--resume"] if (out / "checkpoints").exists() else []
    cmd = FEDLATENT + ["run", config, "--no-progress", "--out", str(out), *resume,
                       "--set", f'backend="{backend_for(out)}"']
    for o in overrides:
        cmd += ["--set", o]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    record(name)


def record(name: str) -> dict | None:
    """The finished run ``name``'s {"backend", "final"}: from results/ditto_runs/, else taken from
    its run directory and written there; None while it has not finished."""
    path = RECORDS / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    out = RUNS / name
    if not (out / "summary.json").exists():
        return None
    entry = {"backend": backend_of(out), "final": json.loads((out / "summary.json").read_text())["final"]}
    RECORDS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry, indent=1) + "\n")
    return entry


def backend_of(out: Path) -> str:
    """The backend a run used (its resolved config.toml)."""
    return tomllib.loads((out / "config.toml").read_text()).get("backend", "simulation")


def release_jobs() -> list[tuple[str, str, list[str]]]:
    jobs = [(f"release-{m}", f"configs/ditto/release_{m}.toml", []) for m in RELEASE]
    jobs += [(f"standard-{m}", f"configs/ditto/release_{m}.toml", ["model.softmax_output=false", *STANDARD[m]])
             for m in RELEASE]
    return jobs


def paper_jobs(seeds: list[int], settings: list[str]) -> list[tuple[str, str, list[str]]]:
    return [(f"paper{s}-{m}-seed{seed}", f"configs/ditto/paper_synthetic{s}_{m}.toml", [f"seed={seed}"])
            for s in settings for m in PAPER for seed in seeds]


def per_client_table(names: list[tuple[str, str]]) -> str:
    """Per-client personal accuracy of the finished runs among (label, run name) beside each client's majority rate."""
    rows = [(label, r) for label, name in names if (r := record(name)) is not None]
    if not rows:
        return "(not run yet)"
    first = rows[0][1]["final"]["per_client"]
    lines = ["| client | majority rate | " + " | ".join(n for n, _ in rows) + " |",
             "|---|---|" + "---|" * len(rows),
             "| backend | | " + " | ".join(r["backend"] for _, r in rows) + " |"]
    base = {c["client"]: c["majority_baseline"] for c in first}
    accs = {n: {c["client"]: c["accuracy"] for c in r["final"]["per_client"]} for n, r in rows}
    for c in base:
        lines.append(f"| {c} | {base[c]:.3f} | " + " | ".join(f"{accs[n][c]:.3f}" for n, _ in rows) + " |")
    lines.append("| mean | {:.3f} | ".format(statistics.mean(base.values()))
                 + " | ".join(f"{r['final']['personalized_accuracy']:.3f}" for _, r in rows) + " |")
    return "\n".join(lines)


def paper_table(seeds: list[int], settings: list[str]) -> str:
    lines = ["| setting | method | personal acc. (mean ± std over seeds) | published | majority baseline | seeds | backend |",
             "|---|---|---|---|---|---|---|"]
    for s in settings:
        for m in PAPER:
            finished = [r for seed in seeds if (r := record(f"paper{s}-{m}-seed{seed}")) is not None]
            done = [r["final"] for r in finished]
            if not done:
                continue
            backends = "/".join(sorted({r["backend"] for r in finished}))
            acc = [100 * f["personalized_accuracy"] for f in done]
            base = [100 * f["majority_baseline_accuracy"] for f in done]
            spread = f" ± {statistics.stdev(acc):.2f}" if len(acc) > 1 else ""
            lines.append(f"| ({s[0]}.{s[1]}, {s[0]}.{s[1]}) | {m} | {statistics.mean(acc):.2f}{spread} | {PUBLISHED[s][m]:.2f} | "
                         f"{statistics.mean(base):.2f} | {len(done)} | {backends} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("which", choices=["release", "paper"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--settings", nargs="+", default=["00", "05"], choices=["00", "05"])
    parser.add_argument("--methods", nargs="+", choices=PAPER, help="restrict the paper rows to these")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--report-only", action="store_true", help="tabulate the finished runs, start none")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.methods:
        PAPER[:] = [m for m in PAPER if m in args.methods]
    jobs = release_jobs() if args.which == "release" else paper_jobs(args.seeds, args.settings)
    if not args.report_only:
        with ThreadPoolExecutor(args.workers) as pool:
            list(pool.map(run, jobs))
    if args.which == "release":
        text = ("## Release-faithful (double softmax, lr 1e-3, λ 0.01, μ 0.1) on the shared data file\n\n"
                + per_client_table([(m, f"release-{m}") for m in RELEASE])
                + "\n\n## Same rows, standard logits and the paper's (0.5,0.5) hyperparameters\n\n"
                + per_client_table([(m, f"standard-{m}") for m in RELEASE]) + "\n")
    else:
        text = "## fedlatent's own Synthetic generator, paper hyperparameters\n\n" + paper_table(
            args.seeds, args.settings) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
