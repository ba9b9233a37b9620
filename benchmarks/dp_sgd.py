"""What sample-level DP-SGD costs per local step: a round with per-sample gradients, clipping and
noise (``privacy.sample_clip_norm``, ``sample_noise_multiplier``, Poisson batches) against the plain
round of the same workload, in the same process, on each embedded backend.

Each side is one round (``simulation.run_round``, no evaluation) of a workload of
``_common.workloads``; the plain round is the baseline bracketing each private round
(``timing.bracketed``), so each ratio compares rounds seconds apart. Both sides take the same
number of local steps a round (an epoch: ⌈n_k / b⌉ batches, Poisson or shuffled; the digits
clients' last shuffled batch is never a single sample), so the round ratio is the per-step ratio.
Sides: ``clip`` (per-sample gradients and clipping, shuffled batches, no noise) and ``dp`` (clipping,
noise σ = 1, Poisson batches). Reported: the median ratio of process CPU time (wall time on a GPU,
after ``torch.cuda.synchronize``).

    python benchmarks/dp_sgd.py --quick --models mlp
    python benchmarks/dp_sgd.py --models mlp --reps 20
"""
from __future__ import annotations

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

SIDES = {"clip": ["privacy.sample_clip_norm=1.0"],
         "dp": ["privacy.sample_clip_norm=1.0", "privacy.sample_noise_multiplier=1.0", "privacy.batch_sampling=poisson"]}


def main() -> None:
    parser = C.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--backends", default="simulation,vectorized", help="comma-separated embedded backends")
    args = parser.parse_args()
    C.set_threads(args.threads)
    reps = args.reps or (3 if args.quick else 10)
    key = "wall_cpu" if args.device == "cpu" else "wall"
    loads = C.workloads(args.quick, args.batch_size, args.clients or None, args.samples or None)
    rows, results = [], {}
    for model in args.models.split(","):
        for backend in args.backends.split(","):
            base = C.round_caller(loads[model], backend, args.device, [])
            sides = {name: C.round_caller(loads[model], backend, args.device, extra) for name, extra in SIDES.items()}
            out = C.bracketed(base, sides, reps, (key,))
            results[f"{model}/{backend}"] = out
            rows.append([model, backend, f"{C.median(out[C.BASELINE][key + '_abs']):.3f}",
                         *(f"{C.median(out[name][key]):.2f}" for name in SIDES)])
    print(C.machine(args.device))
    print(C.table(["model", "backend", f"plain round s ({key})", "clip / plain", "dp / plain"], rows))
    C.dump(args.json, {"machine": C.machine(args.device), "results": results})


if __name__ == "__main__":
    main()
