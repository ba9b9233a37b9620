"""Does ``torch.compile`` of the stacked training step's forward pay on a device? The vectorized
round of ``fedlatent bench --throughput`` (the paper-width CNN, 10 clients, crop + flip, one local
epoch) eager against the same round with the stacked clients' forward (``federated.trainer.forward.stacked_forward``:
the model's stacked forward, or its forward under ``vmap``) compiled — a measurement, not a switch:
fedlatent has no compiled stacked step, and gets one only where this shows it pays.

Compile time is the first compiled round's wall time less an eager round's; then eager and compiled
rounds alternate (``timing.bracketed``: each compiled round over the eager rounds right before and
after it). ``benchmarks/gpu_lease.sh`` runs it once per lease folder (``OUT/compile_stacked.txt|json``).

    python benchmarks/compile_stacked.py --device cuda --json out.json
    python benchmarks/compile_stacked.py --samples 8 --reps 1 --backend aot_eager     # the plumbing, on a CPU
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable

import torch

from fedlatent.experiment.tooling import throughput as tp
from fedlatent.experiment.tooling.timing import BASELINE, bracketed, dump, machine, median, quartiles, table
from fedlatent.federated.trainer import forms, frozen

USERS = (forms, frozen)  # the trainer's modules that build stacked forwards


class CompiledRounds:
    """The vectorized rounds with the stacked forward compiled by ``backend`` while a round plays."""

    def __init__(self, rounds: tp.FedlatentRounds, backend: str) -> None:
        self.rounds, self.backend = rounds, backend
        self.compiled: dict[int, Callable] = {}  # by the eager forward's code: compiled once, reused
        self.eager = forms.stacked_forward

    def _stacked(self, *args: Any) -> Callable:
        forward = self.eager(*args)
        key = id(forward.__code__)
        if key not in self.compiled:
            self.compiled[key] = torch.compile(forward, backend=self.backend)
        return self.compiled[key]

    def __call__(self) -> None:
        for module in USERS:
            module.stacked_forward = self._stacked  # type: ignore[assignment]
        try:
            self.rounds()
        finally:
            for module in USERS:
                module.stacked_forward = self.eager  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="auto", choices=tp.PRECISIONS)
    parser.add_argument("--samples", type=int, default=0, help="training images per client (0: bench's default)")
    parser.add_argument("--reps", type=int, default=0, help="timed rounds per side (0: bench's default)")
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    samples, reps = args.samples or tp.defaults(args.device)[0], args.reps or tp.defaults(args.device)[1]
    config = tp.run_config(args.device, args.precision)
    fed = tp.federation(*tp.random_images(tp.CLIENTS, samples, config.seed), tp.CLIENTS)
    eager = tp.FedlatentRounds(config, fed)
    compiled = CompiledRounds(tp.FedlatentRounds(config, fed), args.backend)
    eager()  # warm: the eager side's first round
    first = {}
    for name, side in (("eager", eager), ("compiled", compiled)):
        start = time.perf_counter()
        try:
            side()
        except Exception as exc:  # a backend that cannot compile here is a result, not a crash
            print(f"torch.compile ({args.backend}) of the stacked step failed: {type(exc).__name__}: {exc}".splitlines()[0])
            dump(args.json, {"machine": machine(args.device), "failed": f"{type(exc).__name__}: {exc}"})
            return 0
        first[name] = time.perf_counter() - start
    times = bracketed(eager, {"compiled": compiled}, reps, ("wall",),
                      progress=lambda msg: print(f"  {msg}", file=sys.stderr, flush=True))
    eager_s, compiled_s = median(times[BASELINE]["wall_abs"]), median(times["compiled"]["wall_abs"])
    ratio = median(times["compiled"]["wall"])
    lo, hi = quartiles(times["compiled"]["wall"])
    compile_s = first["compiled"] - first["eager"]
    saved = eager_s - compiled_s
    print(f"torch {torch.__version__}, {args.device}, precision {args.precision}, {tp.CLIENTS} clients × {samples} "
          f"images, batch {min(tp.BATCH, samples)}, one epoch a round, wall seconds, medians of {reps}\n" + table(
              ["stacked forward", "compile s", "round s", "compiled / eager", "IQR", "break-even rounds"],
              [["eager", "", eager_s, 1.0, "", ""],
               [f"compiled ({args.backend})", compile_s, compiled_s, ratio, f"{lo:.2f}-{hi:.2f}",
                f"{compile_s / saved:.0f}" if saved > 0 else "never"]]))
    dump(args.json, {"machine": machine(args.device), "samples_per_client": samples, "reps": reps,
                     "backend": args.backend, "precision": args.precision, "compile_s": compile_s,
                     "seconds": {"eager": times[BASELINE]["wall_abs"], "compiled": times["compiled"]["wall_abs"]},
                     "ratio": times["compiled"]["wall"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
