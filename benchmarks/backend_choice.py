"""Per method: a round on the vectorized backend relative to one on the simulation backend, and
whether ``backend = "auto"`` picks the faster of the two.

For each method preset the vectorized backend accepts (``lockstep.unsupported`` finds nothing), one
simulation run and one vectorized run of the same configuration (only the trainer differs) are set
up on the same federation, each gets one untimed warm-up round, then their rounds alternate
``S V S V ... S`` and each vectorized round is divided by the mean of the simulation rounds right
before and right after it (``timing.bracketed``). Reported: the median and interquartile range of
that ratio in process CPU time (and in wall time), per round (local training and aggregation,
no evaluation), and auto's choice (``backends.auto.choose``) with "yes" when it is the side the
median favours. The census (ATen operators of one round, forward, backward and optimiser) shows
the per-operator overhead lockstep removes.

Settings: the digits MLP with 10 IID clients (``mlp10``) and with 100 clients at 50 %
participation (``mlp100``; ``--clients N`` changes the 10); the small CNN on CIFAR-shaped arrays (``cnn``, a few methods only:
auto keeps convolutions on simulation on a CPU).

    python benchmarks/backend_choice.py --quick      # fedavg, moon, ditto_mkmmd; 3/2/1 repetitions
    python benchmarks/backend_choice.py --settings mlp10,mlp100
    python benchmarks/backend_choice.py --settings cnn --cnn-methods fedavg,moon
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
from fedlatent.backends import auto, simulation  # noqa: E402
from fedlatent.federated.trainer import unsupported  # noqa: E402
from fedlatent.methods import PRESETS, resolve  # noqa: E402

DEFAULT_REPS = {True: {"mlp10": 3, "mlp100": 2, "cnn": 1}, False: {"mlp10": 20, "mlp100": 8, "cnn": 4}}
QUICK_METHODS = "fedavg,moon,ditto_mkmmd"


class BackendRun:
    """One method on one backend, advanced one round per call; returns the round's timings."""

    def __init__(self, workload: C.Workload, extra: list[str], method: str, federation, backend: str) -> None:
        self.config = workload.config([*extra, f"algorithm.name={method}"])
        self.spec = resolve(self.config.algorithm, self.config.terms)
        self.setup = simulation.setup(self.config, federation, self.spec, trainer=C.TRAINERS[backend])
        self.round = 0

    def __call__(self) -> dict[str, float]:
        clock, out = C.Clock(), {}
        simulation.run_round(self.setup, self.round)
        clock.lap("round", out)
        self.round += 1
        return out


def settings(quick: bool, batch_size: int, clients: int) -> dict[str, tuple[C.Workload, list[str]]]:
    """Setting name -> (workload, extra overrides); ``--quick`` only shortens the CNN's data."""
    loads = C.workloads(quick, batch_size, clients=clients)
    return {"mlp10": (loads["mlp"], []),
            "mlp100": (loads["mlp"], ["data.num_clients=100", "train.participation=0.5"]),
            "cnn": (loads["cnn"], [])}


def main(argv: list[str] | None = None) -> int:
    parser = C.base_parser(__doc__.split("\n")[0])
    parser.add_argument("--settings", default="mlp10,mlp100,cnn", help="comma-separated subset of: mlp10, mlp100, cnn")
    parser.add_argument("--methods", default="", help="comma-separated presets for the MLP settings (default: all; --quick: " + QUICK_METHODS + ")")
    parser.add_argument("--cnn-methods", default="fedavg,moon", help="comma-separated presets for the CNN setting")
    args = parser.parse_args(argv)
    C.set_threads(args.threads)
    table_of = settings(args.quick, args.batch_size, args.clients or 10)
    results = {"machine": C.machine(), "argv": sys.argv[1:], "settings": {}}
    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, "
          "vectorized round / bracketing simulation rounds, medians")
    for name in args.settings.split(","):
        workload, extra = table_of[name]
        wanted = (args.cnn_methods if name == "cnn" else args.methods or (QUICK_METHODS if args.quick else "")).split(",")
        methods = [m for m in (wanted if wanted != [""] else sorted(PRESETS)) if m in PRESETS]
        reps = args.reps or DEFAULT_REPS[args.quick][name]
        federation = C.federation_for(workload.config(extra))
        label = workload.label if not extra else "digits MLP 64-128-10, 100 clients iid, 50 % participation"
        rows, entry = [], {"label": label, "reps": reps, "methods": {}}
        for method in methods:
            sim = BackendRun(workload, extra, method, federation, "simulation")
            refused = unsupported(sim.spec)
            if refused:
                print(f"  {name} {method}: not vectorized ({refused})", file=sys.stderr)
                continue
            vec = BackendRun(workload, extra, method, federation, "vectorized")
            ratios = C.bracketed(sim, {"vectorized": vec}, reps, ("round_cpu", "round"), warmup=1)
            census = {"simulation": C.op_census(sim)["ops"], "vectorized": C.op_census(vec)["ops"]}
            r, base = ratios["vectorized"], ratios[C.BASELINE]
            choice, why = auto.choose(sim.config, federation, sim.spec)
            faster = "vectorized" if C.median(r["round_cpu"]) < 1 else "simulation"
            lo, hi = C.quartiles(r["round_cpu"])
            rows.append([method, 1e3 * C.median(base["round_cpu_abs"]), 1e3 * C.median(r["round_cpu_abs"]),
                         C.median(r["round_cpu"]), f"{lo:.2f}-{hi:.2f}", C.median(r["round"]),
                         census["vectorized"] / census["simulation"], choice, "yes" if choice == faster else "NO"])
            entry["methods"][method] = {"ratios": r, "simulation": base, "census": census, "auto": [choice, why],
                                        "faster": faster}
            print(f"  {name} {method}: {rows[-1][3]:.3f}", file=sys.stderr, flush=True)
        results["settings"][name] = entry
        print(f"{name}: {label}, {reps} repetitions, threads={torch.get_num_threads()}\n" + C.table(
            ["method", "sim ms (cpu)", "vec ms (cpu)", "vec / sim (cpu)", "IQR", "vec / sim (wall)",
             "ops vec / sim", "auto picks", "faster?"], rows), flush=True)
    C.dump(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
