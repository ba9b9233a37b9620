"""A whole ``fedlatent.run`` against a bare PyTorch loop doing the same training, end to end.

The workload is the peers' digits one (``configs/digits_fedavg.toml``: MLP 64-128-10, 10 IID
clients, 20 rounds, evaluation on the test set every round), on the simulation backend
(``fedlatent bench`` times both backends). The bare side is what one would write
by hand in the same process: the same initial weights and batch order, 20 FedAvg rounds
(``fedlatent.experiment.tooling.bench.plain_round``), test accuracy after each. The fedlatent side is
``fedlatent.run`` into a fresh folder: partition table, metrics, checkpoints, summary and both
figures, which a forked child draws beside the training. A second side draws them in-process,
to show what that child saves, and a third draws none (``run(..., figures=False)``, the CLI's
``--no-figures``), so that the figures' share of the run is a measured row; A/A is a second bare
loop (the noise floor). Ratios are wall time
over the mean of the bare loops right before and after each side (``fedlatent.experiment.tooling.timing.bracketed``); wall
time, because the figure child's CPU time is not the run's process time.

    python benchmarks/run_overhead.py --quick        # ~30 s
    python benchmarks/run_overhead.py                # 20 repetitions, ~1.5 min
    python benchmarks/run_overhead.py --profile      # + cProfile of one warm fedlatent.run
"""
from __future__ import annotations

import cProfile
import io
import pstats
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
import fedlatent  # noqa: E402
from fedlatent.backends import simulation  # noqa: E402
from fedlatent.experiment.tooling.bench import plain_round  # noqa: E402
from fedlatent.experiment.runner.single import run as run_experiment  # noqa: E402
from fedlatent.methods import resolve  # noqa: E402
from fedlatent.models import build_model  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_fedavg.toml"


def main() -> None:
    parser = C.base_parser(__doc__.split("\n")[0])
    parser.add_argument("--profile", action="store_true",
                        help="also print a cProfile of one warm fedlatent.run (figures in the background)")
    parser.add_argument("--profile-top", type=int, default=30)
    args = parser.parse_args()
    C.set_threads(args.threads)
    reps = args.reps or (5 if args.quick else 20)
    config = fedlatent.load_config(CONFIG, ['backend="simulation"'])  # the per-round goal is simulation's
    fed = C.federation_for(config)
    initial = simulation.setup(config, fed, resolve(config.algorithm, config.terms)).server.global_state
    model = build_model(config.model, fed.input_shape, fed.num_classes, fed.name)
    scratch = Path(tempfile.mkdtemp(prefix="fedlatent-run-overhead-"))

    def bare() -> None:
        state = initial
        for rnd in range(config.train.rounds):
            state = plain_round(model, state, fed, config, rnd)
            model.load_state_dict(state)
            model.eval()
            with torch.no_grad():
                (model(fed.test.x).logits.argmax(1) == fed.test.y).float().mean().item()

    def fedlatent_run(**figures: bool):
        def side() -> None:
            out = scratch / "run"
            shutil.rmtree(out, ignore_errors=True)
            run_experiment(config, out, echo=None, **figures)
        return side

    results = C.bracketed(bare, {"fedlatent.run": fedlatent_run(),
                                 "fedlatent.run, figures in-process": fedlatent_run(figures_in_background=False),
                                 "fedlatent.run, no figures": fedlatent_run(figures=False),
                                 "A/A (bare loop)": bare}, reps, ("wall",),
                          progress=lambda line: print(line, file=sys.stderr))
    base = results.pop(C.BASELINE)["wall_abs"]
    rows = [["bare loop", f"{C.median(base):.3f}", "1.000", "", ""]]
    for name, r in results.items():
        lo, hi = C.quartiles(r["wall"])
        rows.append([name, f"{C.median(r['wall_abs']):.3f}", f"{C.median(r['wall']):.3f}",
                     f"{min(r['wall']):.3f}", f"{lo:.3f}-{hi:.3f}"])
    print(f"digits workload, {config.train.rounds} rounds, {reps} repetitions, {args.threads} thread(s)")
    print(C.table(["side", "median wall s", "median ratio", "min ratio", "IQR"], rows))
    C.dump(args.json, {"machine": C.machine(), "reps": reps, "results": results, "baseline": base})
    if args.profile:
        print(profile(fedlatent_run(), args.profile_top))
    shutil.rmtree(scratch, ignore_errors=True)


def profile(side, top: int) -> str:
    """cProfile of one warm call of ``side`` (the run's own thread: the checkpoint writer's and the
    figure child's work show only as waits), top functions by cumulative and own time."""
    side()
    prof = cProfile.Profile()
    prof.enable()
    side()
    prof.disable()
    out = io.StringIO()
    for key in ("cumulative", "tottime"):
        out.write(f"\n---- fedlatent.run, sorted by {key} ----\n")
        pstats.Stats(prof, stream=out).strip_dirs().sort_stats(key).print_stats(top)
    return out.getvalue()


if __name__ == "__main__":
    main()
