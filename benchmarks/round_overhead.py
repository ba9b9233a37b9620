"""Overhead of the simulation backend over a plain PyTorch loop, for one FedAvg round.

The simulator side is ``simulation.setup`` + ``simulation.run_round`` (evaluation disabled). The
plain side is what one would write by hand for the same round in the same process: the same
model (built by ``fedlatent.models.build_model`` from the same initial weights), the same client
data, the same batch order (``federated.client.batches`` with the generator seeded as the
simulator seeds it), a fresh SGD per client, the global state loaded per client, and the
sample-weighted average at the end. Both sides are repeated in alternation and their medians
compared; the ratio simulator/plain is the overhead (goal: <= 1.05). The two sides must also
produce the same global model, which is checked.

Timing: one repetition runs ``P S P A P`` (P = plain round, S = simulator round, A = a second
plain round measured like S, the order of S and A alternating): each ratio divides a round by
the mean of the plain rounds right before and after it, so a change of load on a shared machine
cancels out, and the A/A column shows the noise floor (it should read 1.00). A deterministic
census (ATen operators dispatched and matmul/conv FLOPs per round) complements the timings.

    python benchmarks/round_overhead.py --quick
    python benchmarks/round_overhead.py                # full: 10 clients, more repetitions
    python benchmarks/round_overhead.py --profile      # cProfile of both sides, top functions
"""
from __future__ import annotations

import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
from fedlatent.backends import simulation  # noqa: E402
from fedlatent.experiment.tooling.bench import plain_round  # noqa: E402
from fedlatent.federated.trainer.schedule import batches  # noqa: E402
from fedlatent.methods import resolve  # noqa: E402
from fedlatent.models import build_model  # noqa: E402

ROUND = 0
DEFAULT_REPS = {True: {"mlp": 10, "cnn": 3}, False: {"mlp": 60, "cnn": 12}}


class Pair:
    """The two sides of one workload, each a function that times one round from the same start."""

    def __init__(self, workload: C.Workload) -> None:
        self.config = workload.config()
        self.federation = C.federation_for(self.config)
        self.spec = resolve(self.config.algorithm, self.config.terms)
        first = simulation.setup(self.config, self.federation, self.spec)
        self.initial = {k: v.clone() for k, v in first.server.global_state.items()}
        self.sim_state: dict[str, torch.Tensor] = {}
        self.plain_state: dict[str, torch.Tensor] = {}

    # simulator -------------------------------------------------------------------------------
    def simulator(self) -> dict[str, float]:
        clock, out = C.Clock(), {}
        s = simulation.setup(self.config, self.federation, self.spec)
        clock.lap("setup", out)
        simulation.run_round(s, ROUND)
        clock.lap("round", out)
        self.sim_state = s.server.global_state
        return out

    # plain PyTorch ---------------------------------------------------------------------------
    def plain(self) -> dict[str, float]:
        cfg, fed = self.config, self.federation
        clock, out = C.Clock(), {}
        model = build_model(cfg.model, fed.input_shape, fed.num_classes, fed.name)
        model.load_state_dict(self.initial)
        clock.lap("setup", out)
        self.plain_state = plain_round(model, self.initial, fed, cfg, ROUND)
        clock.lap("round", out)
        return out


def census(pair: Pair) -> dict[str, dict[str, int]]:
    """Operators and FLOPs of one round on each side (setup excluded)."""
    cfg, fed = pair.config, pair.federation
    s = simulation.setup(cfg, fed, pair.spec)
    model = build_model(cfg.model, fed.input_shape, fed.num_classes, fed.name)
    return {"simulator": C.op_census(lambda: simulation.run_round(s, ROUND)),
            "plain": C.op_census(lambda: plain_round(model, pair.initial, fed, cfg, ROUND))}


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def profile(pair: Pair, rounds: int, top: int) -> str:
    """cProfile of ``rounds`` rounds of each side, top functions by own time and cumulative time."""
    out = io.StringIO()
    for name, fn in (("simulator", pair.simulator), ("plain", pair.plain)):
        fn()  # warm: the first optimiser of a process imports torch._dynamo (seconds, once)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(rounds):
            fn()
        prof.disable()
        for key in ("tottime", "cumulative"):
            out.write(f"\n---- {name}: {rounds} rounds, sorted by {key} ----\n")
            stats = pstats.Stats(prof, stream=out)
            stats.strip_dirs().sort_stats(key).print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = C.base_parser(__doc__.split("\n")[0])
    parser.add_argument("--profile", action="store_true", help="print a cProfile of both sides")
    parser.add_argument("--profile-rounds", type=int, default=5)
    parser.add_argument("--profile-top", type=int, default=25)
    args = parser.parse_args(argv)
    C.set_threads(args.threads)
    loads = C.workloads(args.quick, args.batch_size, args.clients or None, args.samples or None)
    rows, ops, results = [], [], {"machine": C.machine(), "argv": sys.argv[1:], "workloads": {}}
    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, each side bracketed by plain rounds, medians")
    for name in args.models.split(","):
        reps = args.reps or DEFAULT_REPS[args.quick][name]
        pair = Pair(loads[name])
        if args.profile:
            print(profile(pair, args.profile_rounds, args.profile_top))
        keys = ("round", "round_cpu", "wall", "wall_cpu")
        times = C.bracketed(pair.plain, {"simulator": pair.simulator, "plain (A/A)": pair.plain}, reps, keys,
                            warmup=2)
        diff = max_difference(pair.sim_state, pair.plain_state)
        sim, aa, plain = times["simulator"], times["plain (A/A)"], times[C.BASELINE]
        t = pair.config.train
        steps = t.local_epochs * sum(len(batches(len(c.train), t.batch_size, t.drop_last,
                                                 torch.Generator().manual_seed(0))) for c in pair.federation.clients)
        counts = census(pair)
        entry = {"label": loads[name].label, "reps": reps, "steps_per_round": steps,
                 "max_abs_weight_difference": diff, "census": counts, "times": times}
        ops.append([name, steps, counts["simulator"]["ops"] / steps, counts["plain"]["ops"] / steps,
                    counts["simulator"]["ops"] / counts["plain"]["ops"],
                    counts["simulator"]["flops"] / counts["plain"]["flops"]])
        for what, label in (("round", "run_round"), ("wall", "setup+run_round")):
            for clock in ("", "_cpu"):
                key = what + clock
                lo, hi = C.quartiles(sim[key])
                aa_lo, aa_hi = C.quartiles(aa[key])
                sim_ms, plain_ms = 1e3 * C.median(sim[key + "_abs"]), 1e3 * C.median(plain[key + "_abs"])
                entry[f"ratio_{key}"] = C.median(sim[key])
                entry[f"aa_ratio_{key}"] = C.median(aa[key])
                rows.append([name, label, "cpu" if clock else "wall", reps, steps, sim_ms, plain_ms,
                             C.median(sim[key]), f"{lo:.3f}-{hi:.3f}", C.median(aa[key]), f"{aa_lo:.3f}-{aa_hi:.3f}"])
        results["workloads"][name] = entry
        print(f"{name}: {loads[name].label}; same global model: max |w_sim - w_plain| = {diff:.1e}")
    print(C.table(["model", "timed", "clock", "reps", "steps", "sim ms", "plain ms", "sim / plain", "IQR",
                   "A/A plain / plain", "A/A IQR"], rows))
    print("\nDeterministic census of one round (ATen operators dispatched, FLOPs of matmuls/convolutions):")
    print(C.table(["model", "steps", "ops/step sim", "ops/step plain", "ops sim/plain", "FLOPs sim/plain"], ops))
    C.dump(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
