"""Per-round cost of local training for each method, relative to FedAvg in the same invocation.

Every method gets its own ``simulation.setup`` on the same federation and configuration (only
``algorithm.name`` differs), one untimed warm-up round (so MOON has its previous local models and
Ditto its personal ones), then rounds are timed in repetitions. One repetition runs a round of
every method, in an order rotated from one repetition to the next, each bracketed by a round of
a separate FedAvg baseline run right before and right after it (B m1 B m2 B ... B), so every
ratio compares rounds seconds apart. Reported per method: ``time_train_s`` of the round's
metrics line (wall seconds of the clients' local updates) and the CPU seconds of the whole
``run_round`` (local training + aggregation), each as the median over repetitions of the ratio
to the bracketing FedAvg rounds. The ``fedavg`` row is a second FedAvg run measured like the
others: its ratio shows the noise floor (it should read 1.00).

    python benchmarks/method_cost.py --quick
    python benchmarks/method_cost.py                       # full: 10 clients
    python benchmarks/method_cost.py --methods fedavg,feduv,feddecorr --models cnn

Reference figures (FedUV paper, CNN on 32x32 images): FedProx +4 %, MOON +42 % over FedAvg.
Goals here: FedUV and FedDecorr <= 1.05, SphereFed <= 1.00.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
from fedlatent.backends import simulation  # noqa: E402
from fedlatent.methods import PRESETS, resolve  # noqa: E402

METHODS = ["fedavg", "fedprox", "moon", "scaffold", "feddyn", "fednova", "fedavgm", "fedproto", "freeze",
           "feduv", "feddecorr", "spherefed", "ditto", "ditto_mkmmd"]
GOALS = {"feduv": "<= 1.05", "feddecorr": "<= 1.05", "spherefed": "<= 1.00"}
PAPER = {"fedprox": "1.04", "moon": "1.42"}  # FedUV paper, overhead over FedAvg (CNN, 32x32)
DEFAULT_REPS = {True: {"mlp": 5, "cnn": 3}, False: {"mlp": 30, "cnn": 8}}


class MethodRun:
    """One method's setup, advanced one round per call."""

    def __init__(self, workload: C.Workload, method: str, federation) -> None:
        self.config = workload.config([f"algorithm.name={method}"])
        self.spec = resolve(self.config.algorithm, self.config.terms)
        self.setup = simulation.setup(self.config, federation, self.spec)
        self.round = 0

    def __call__(self) -> dict[str, float]:
        clock, out = C.Clock(), {}
        line = simulation.run_round(self.setup, self.round)
        clock.lap("round", out)
        self.round += 1
        out["train"] = line["time_train_s"]
        return out


def main(argv: list[str] | None = None) -> int:
    parser = C.base_parser(__doc__.split("\n")[0])
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="comma-separated presets (fedavg is always included; unregistered ones are skipped)")
    args = parser.parse_args(argv)
    C.set_threads(args.threads)
    wanted = ["fedavg"] + [m for m in args.methods.split(",") if m and m != "fedavg"]
    skipped = [m for m in wanted if m not in PRESETS]
    methods = [m for m in wanted if m in PRESETS]
    if skipped:
        print(f"skipped (not registered in fedlatent.methods.PRESETS): {', '.join(skipped)}")
    loads = C.workloads(args.quick, args.batch_size, args.clients or None, args.samples or None)
    results = {"machine": C.machine(), "argv": sys.argv[1:], "skipped": skipped, "workloads": {}}
    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, each method bracketed by FedAvg rounds, medians")
    tables = []
    for name in args.models.split(","):
        workload = loads[name]
        reps = args.reps or DEFAULT_REPS[args.quick][name]
        federation = C.federation_for(workload.config())
        baseline = MethodRun(workload, "fedavg", federation)
        runs = {m: MethodRun(workload, m, federation) for m in methods}
        ratios = C.bracketed(baseline, runs, reps, ("train", "round_cpu"), warmup=1,
                             progress=lambda msg: print(f"  {name}: {msg}", file=sys.stderr, flush=True))
        counts = {m: C.op_census(runs[m]) for m in methods}  # one more round each, untimed
        rows, entry = [], {"label": workload.label, "reps": reps, "methods": ratios, "census": counts}
        for m in methods:
            r = ratios[m]
            lo, hi = C.quartiles(r["train"])
            cpu_lo, cpu_hi = C.quartiles(r["round_cpu"])
            rows.append([m + (" (A/A check)" if m == "fedavg" else ""), 1e3 * C.median(r["train_abs"]),
                         C.median(r["train"]), f"{lo:.2f}-{hi:.2f}", 1e3 * C.median(r["round_cpu_abs"]),
                         C.median(r["round_cpu"]), f"{cpu_lo:.2f}-{cpu_hi:.2f}",
                         counts[m]["ops"] / counts["fedavg"]["ops"], counts[m]["flops"] / counts["fedavg"]["flops"], GOALS.get(m, ""), PAPER.get(m, "")])
        results["workloads"][name] = entry
        tables.append(f"{name}: {workload.label}, {reps} repetitions, threads={torch.get_num_threads()}\n" + C.table(
            ["method", "train ms (wall)", "train / fedavg", "IQR", "round ms (cpu)", "round cpu / fedavg", "IQR",
             "ops / fedavg", "FLOPs / fedavg", "goal", "paper"], rows))
        print(tables[-1], flush=True)
    C.dump(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
