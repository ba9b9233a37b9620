"""What ``train.precision`` costs or saves per round: bf16 and fp16 local training against fp32 on
the same device, in the same process, for each embedded backend.

Each side is one round (``simulation.run_round``, no evaluation) of a workload of
``_common.workloads`` (the digits MLP, the small CNN on CIFAR-shaped arrays) at one precision;
the fp32 round is the baseline bracketing each 16-bit round (``timing.bracketed``), so each ratio
compares rounds seconds apart. Reported: the median ratio of wall time (CPU time on the CPU, where
the machine may be shared; on a GPU the wall time after ``torch.cuda.synchronize``).

    python benchmarks/precision.py --quick
    python benchmarks/precision.py --device cuda --models cnn --clients 10 --samples 500
"""
from __future__ import annotations

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

SIDES = ("bf16", "fp16")


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
            base = C.round_caller(loads[model], backend, args.device, ['train.precision="fp32"'])
            sides = {a: C.round_caller(loads[model], backend, args.device, [f'train.precision="{a}"']) for a in SIDES}
            out = C.bracketed(base, sides, reps, (key,))
            results[f"{model}/{backend}"] = out
            rows.append([model, backend, f"{C.median(out[C.BASELINE][key + '_abs']):.3f}",
                         *(f"{C.median(out[a][key]):.2f}" for a in SIDES)])
    print(C.machine(args.device))
    print(C.table(["model", "backend", f"fp32 round s ({key})", "bf16 / fp32", "fp16 / fp32"], rows))
    C.dump(args.json, {"machine": C.machine(args.device), "results": results})


if __name__ == "__main__":
    main()
