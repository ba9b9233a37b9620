"""The command line: ``fedlatent run | check | sweep | report | reproduce | bench | partition | cache | methods | config``.

Exit codes: 0 success, 2 invalid input (one line on stderr, no traceback), 1 anything else (a
run stopped by the failure policy: one line naming the round, the client and the quantity).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fedlatent.errors import RunStopped, UserInputError

CLUSTER_HELP = ("run each cell (or stack) as a Ray task: ray (a Ray instance started on this machine), ray:auto (the "
                "running cluster) or ray:HOST:PORT; the study folder must be on storage every node shares (docs/cluster.md)")
RESOURCES_HELP = "what each cell asks of a node under --cluster (default: cpus=train.threads, gpus=1 on cuda)"
STACK_HELP = ("cells that differ only in seeds or partition train as one lockstep stack: auto (on a CUDA device, "
              "as many as fit its memory; none on a CPU), off, or at most N cells a stack")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedlatent", description="Federated learning on heterogeneous clients. "
                                     "Exit codes: 0 success, 2 invalid input (one line), 1 anything else.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train one configuration and print its result table")
    run.add_argument("config", help="TOML run configuration")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                     help="override one key (repeatable), e.g. --set train.rounds=5")
    run.add_argument("--out", help="run directory (default runs/<dataset>-<partition>-<algorithm>-seed<seed>-<digest>, "
                     "the digest six hex digits of the resolved settings' SHA-256: one folder per configuration)")
    run.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    shown = run.add_mutually_exclusive_group()
    shown.add_argument("--progress", action="store_true",
                       help="a progress bar even where stderr is not a terminal (default: the bar on a terminal, "
                       "else a plain line every tenth of the rounds)")
    shown.add_argument("--no-progress", action="store_true", help="neither the bar nor the lines")
    run.add_argument("--no-figures", action="store_true",
                     help="draw no figures (plots/): the run's other files are the same")
    check = sub.add_parser("check", help="validate a configuration or a spec as run and sweep do before training "
                           "(the data's labels and counts read, no folder made) and print its resolved settings")
    check.add_argument("target", help="a TOML configuration, a study file, or a spec name (fedlatent reproduce --list)")
    check.add_argument("--tier", choices=("full", "quick", "cpu"), default="full",
                       help="a spec's or study's version to check (default: full)")
    check.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override one key (in every cell of a spec), repeatable")
    check.add_argument("--no-data", action="store_true",
                       help="skip the checks that read the data (a spec's settings where its data are not)")
    part = sub.add_parser("partition", help="print the partition table of a configuration")
    part.add_argument("config")
    part.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    part.add_argument("--plot", metavar="PNG", help="save a client × class heatmap to this file")
    part.add_argument("--full", action="store_true",
                      help="every client's row (without it: a summary beyond 20 clients)")
    sweep = sub.add_parser("sweep", help="run every cell of a study file (resumable) and tabulate")
    sweep.add_argument("study", help="TOML study file: a base config and a grid")
    sweep.add_argument("--jobs", type=_positive, default=1, help="runs at once, in worker processes")
    sweep.add_argument("--stack", default="auto", metavar="auto|off|N", help=STACK_HELP)
    sweep.add_argument("--cluster", metavar="ray[:ADDRESS]", help=CLUSTER_HELP)
    sweep.add_argument("--cell-resources", metavar="cpus=N,gpus=N,memory=NGiB", help=RESOURCES_HELP)
    sweep.add_argument("--out", help="sweep directory (default runs/<study file name>)")
    sweep.add_argument("--no-figures", action="store_true",
                       help="the runs draw no figures of their own (fedlatent report draws the study's)")
    report = sub.add_parser("report", help="tables and plots over run or sweep directories")
    report.add_argument("dirs", nargs="+", help="run or sweep directories")
    report.add_argument("--out", help="where the tables and plots go (default: the first directory's report/)")
    repro = sub.add_parser("reproduce", help="run a paper table's spec and put the published numbers beside ours")
    repro.add_argument("name", nargs="?", help="spec name (see --list)")
    repro.add_argument("--list", action="store_true", help="list the specs and which rows can run")
    repro.add_argument("--quick", action="store_true", help="the reduced version on offline data (minutes on a "
                       "CPU); the same as --tier quick")
    repro.add_argument("--tier", choices=("full", "quick", "cpu"), default="full",
                       help="full: the paper's setting; quick: offline data, minutes; cpu: the paper's real data "
                       "(under --data-root) at a budget two CPU cores finish in about 30 minutes")
    repro.add_argument("--data-root", help="data.root of every run (e.g. the extracted cifar10-jpeg folder)")
    repro.add_argument("--only", action="append", default=[], metavar="AXIS=LABEL[,LABEL]",
                       help="run only the cells with these labels (repeatable), e.g. --only method=fedavg,feduv")
    repro.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override one key in every run (repeatable), e.g. --set train.device='\"cuda\"'")
    repro.add_argument("--jobs", type=_positive, default=1, help="runs at once, in worker processes")
    repro.add_argument("--stack", default="auto", metavar="auto|off|N", help=STACK_HELP)
    repro.add_argument("--cluster", metavar="ray[:ADDRESS]", help=CLUSTER_HELP)
    repro.add_argument("--cell-resources", metavar="cpus=N,gpus=N,memory=NGiB", help=RESOURCES_HELP)
    repro.add_argument("--out", help="sweep directory (default runs/reproduce/<name>[-<tier>])")
    bench = sub.add_parser("bench", help="time whole runs on each backend against a bare PyTorch loop")
    bench.add_argument("--quick", action="store_true", help="fewer rounds and repetitions (about a minute)")
    bench.add_argument("--json", metavar="PATH", help="also write the raw timings as JSON")
    bench.add_argument("--reps", type=_positive, help="timed repetitions of every workload (default: per workload)")
    bench.add_argument("--workloads", type=_letters, help="a subset of the letters abcd (default all)")
    bench.add_argument("--threads", type=_positive, default=1, help="torch intra-op threads (default 1)")
    bench.add_argument("--device", default="cpu", help="torch device every run trains on (default cpu; e.g. cuda)")
    bench.add_argument("--throughput", action="store_true",
                       help="instead of the workloads: training samples/s and TFLOP/s of the paper-width FedUV CNN, "
                       "10 clients in lockstep, beside a bare centralised loop written for speed")
    bench.add_argument("--samples", type=_positive,
                       help="--throughput: training images per client (default 5000 on an accelerator, 32 on a CPU)")
    bench.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"),
                       help="--throughput: train.precision of fedlatent's side and the bare loop's autocast "
                       "(default auto: bf16 on CUDA with bf16, fp32 elsewhere)")
    cache = sub.add_parser("cache", help="list (or --clear) the decoded-image cache")
    cache.add_argument("--clear", action="store_true", help="delete every entry")
    sub.add_parser("methods", help="list the method presets and parts with their keys")
    sub.add_parser("config", help="list every configuration key with its default")
    return parser


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _letters(text: str) -> str:
    if not text or set(text) - set("abcd"):
        raise argparse.ArgumentTypeError(f"expected letters of 'abcd', got {text!r}")
    return text


def _run(args: argparse.Namespace) -> None:
    from fedlatent.config import load_config
    config = load_config(args.config, args.overrides)  # before any data is read or folder made: bad input fails fast
    from fedlatent.analysis.tables import summary_table
    from fedlatent.experiment import default_out, run
    out = Path(args.out) if args.out else default_out(config)
    from fedlatent.experiment.runner.folders import CLI_TERMS, TERMS
    shown: bool | str = "bar" if args.progress else False if args.no_progress else "auto"
    terms = TERMS.set(CLI_TERMS)  # refusals name --out and --resume
    try:
        summary = run(config, out, resume=args.resume, progress=shown, figures=not args.no_figures)
    finally:
        TERMS.reset(terms)
    print(f"\n{summary['method']} on {summary['dataset']} ({out}):")
    print(summary_table(summary))
    _privacy_lines(summary)
    dropped = summary.get("clients_dropped", [])
    if dropped:
        rounds = sorted({d["round"] for d in dropped})
        print(f"fedlatent: warning: {len(dropped)} client update(s) dropped by the failure policy in "
              f"{len(rounds)} of {summary['rounds_completed']} rounds (summary.json: clients_dropped)",
              file=sys.stderr)


def _privacy_lines(summary: dict) -> None:
    """A private run's notes on stderr: for whom its ε holds (a seeded run) and an ε too large to mean anything."""
    from fedlatent.experiment.runner.privacy_report import terminal_lines
    for line in terminal_lines(summary):
        print(line, file=sys.stderr)


def _check(args: argparse.Namespace) -> None:
    from fedlatent.experiment.studies.check import check
    print(check(args.target, tier=args.tier, overrides=args.overrides, data=not args.no_data))


def _partition(args: argparse.Namespace) -> None:
    from fedlatent.analysis.plots import partition_heatmap
    from fedlatent.analysis.tables import partition_overview, partition_table
    import dataclasses
    from fedlatent.config import load_config
    from fedlatent.data.federation import build_federation, counts_table
    config = load_config(args.config, args.overrides)
    whole = dataclasses.replace(config.data, holdout_clients=0.0)  # the partition's rows, held-out clients' included
    counts = counts_table(build_federation(whole, config.data_seed))
    print(partition_table(counts) if args.full else partition_overview(counts, full="add --full"))
    if args.plot:
        print(f"saved {partition_heatmap(counts, Path(args.plot))}")


def _cluster(args: argparse.Namespace):  # -> Cluster | None (Ray imported only with --cluster)
    """``--cluster`` and ``--cell-resources`` (docs/cluster.md); the cluster is joined when the study is admitted."""
    if not args.cluster:
        if args.cell_resources:
            raise UserInputError("--cell-resources belongs to --cluster")
        return None
    from fedlatent.experiment.studies.cluster import Cluster
    return Cluster(args.cluster, args.cell_resources)


def _sweep(args: argparse.Namespace) -> None:
    from fedlatent.experiment.studies.study import load_study  # validates every cell before any run starts
    study = load_study(args.study)
    from fedlatent.experiment.studies.stacking import parse_stack
    from fedlatent.experiment.studies.sweep import run_sweep
    out = Path(args.out) if args.out else Path("runs") / Path(args.study).stem
    run_sweep(study, out, jobs=args.jobs, figures=not args.no_figures, stack=parse_stack(args.stack),
              cluster=_cluster(args))
    print(f"\n{(out / 'results.md').read_text()}\n(all runs: {out / 'results.csv'})")


def _report(args: argparse.Namespace) -> None:
    from fedlatent.experiment.studies.report import report
    out = Path(args.out) if args.out else Path(args.dirs[0]) / "report"
    for path in report([Path(d) for d in args.dirs], out):
        print(f"wrote {path}")


def _reproduce(args: argparse.Namespace) -> None:
    from fedlatent.experiment.studies import reproduce
    from fedlatent.experiment.studies.stacking import parse_stack
    if args.list or not args.name:
        print(reproduce.listing())
        return
    tier = "quick" if args.quick else args.tier
    if args.quick and args.tier not in ("full", "quick"):
        raise UserInputError(f"reproduce: --quick and --tier {args.tier} name two tiers; give one")
    out = Path(args.out) if args.out else Path("runs") / "reproduce" / (args.name + ("" if tier == "full" else f"-{tier}"))
    print(reproduce.reproduce(args.name, out, tier=tier, jobs=args.jobs, stack=parse_stack(args.stack),
                              data_root=args.data_root, cluster=_cluster(args),
                              only=reproduce.parse_only(args.only), overrides=args.overrides))


def _bench(args: argparse.Namespace) -> None:
    import torch

    from fedlatent.experiment.tooling import timing
    from fedlatent.experiment.tooling.bench import bench
    from fedlatent.federated import devices
    if args.json and not Path(args.json).resolve().parent.is_dir():  # found now, not after minutes of timing
        raise UserInputError(f"--json {args.json}: its folder does not exist")
    reason = devices.refusal(args.device)
    if reason:
        raise UserInputError(f"--device {args.device}: {reason}")
    echo = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    torch.set_num_threads(args.threads)
    if args.throughput:
        if args.workloads or args.quick:
            raise UserInputError("--throughput times its own workload: leave out --workloads and --quick")
        from fedlatent.experiment.tooling import throughput
        result = throughput.measure(device=args.device, samples=args.samples, reps=args.reps,
                                    precision=args.precision or "auto", progress=lambda line: echo(f"    {line}"))
        timing.dump(args.json, result)
        print(throughput.table(result))
        return
    if args.samples or args.precision:
        raise UserInputError("--samples and --precision belong to --throughput")
    print(bench(quick=args.quick, reps=args.reps, only=args.workloads or "abcd", json_path=args.json,
                device=args.device, echo=echo))


def _cache(args: argparse.Namespace) -> None:
    from fedlatent.data import cache
    root = cache.cache_root()
    if root is None:
        print("the decoded-image cache is off (FEDLATENT_CACHE_DIR=off)")
        return
    if args.clear:
        print(f"deleted {cache.clear()} decoded data set(s) from {root / 'decoded'}")
        return
    found = cache.entries()
    for path, size in found:
        print(f"{size / 2**20:9.1f} MiB  {path.name}")
    print(f"{len(found)} decoded data set(s) in {root / 'decoded'} (FEDLATENT_CACHE_DIR moves it; "
          f"fedlatent cache --clear deletes them)")


STUDY_COMMANDS = {"sweep": _sweep, "report": _report, "reproduce": _reproduce, "bench": _bench, "cache": _cache,
                  "check": _check}


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            _run(args)
        elif args.command in STUDY_COMMANDS:
            STUDY_COMMANDS[args.command](args)
        elif args.command == "partition":
            _partition(args)
        elif args.command == "methods":
            from fedlatent.methods import catalogue
            print(catalogue())
        elif args.command == "config":
            from fedlatent.config import describe
            print(describe())
    except UserInputError as err:
        print(f"fedlatent: error: {err}", file=sys.stderr)
        return 2
    except RunStopped as stop:
        print(f"fedlatent: run stopped: {stop}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fedlatent: interrupted; continue with --resume", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
