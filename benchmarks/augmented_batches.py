"""Augmented lockstep batches: planned at round start and applied to the whole stack, against
streamed client by client.

The cnn workload's setting (the small CNN, 10 clients × 200 CIFAR-shaped images, batch 32, one
epoch) with the images held as random uint8 (``data.compact.Images``, standardised per batch) and
crop + flip on. Two sides, the lockstep trainer's batches:

- **streamed** (the baseline, and its A/A copy): each client's batches drawn, gathered,
  standardised and augmented one client at a time, then stacked (``trainer.batches._stream``);
- **planned**: each client's round drawn at its start, one gather of all members' rows from the
  pool, crop + flip as one indexing op over the stack (``trainer.batches.Batches``).

Measured twice: a whole vectorized round (``simulation.run_round``), and the batches alone (every
step's ``take`` and ``stacked`` of a round, no training). Ratios to the streamed side run right
before and after (``timing.bracketed``); < 1 is faster.

    python benchmarks/augmented_batches.py [--quick] [--reps N] [--device cuda] [--json PATH]
"""
from __future__ import annotations

import dataclasses
import sys
from contextlib import contextmanager
from collections.abc import Iterator
from unittest import mock

import torch

import _common as C
from fedlatent.backends import simulation
from fedlatent.data import augment
from fedlatent.data.augment import Augmentation
from fedlatent.data.compact import Images
from fedlatent.data.types import Federation, Split
from fedlatent.federated.trainer.schedule import planned_steps
from fedlatent.federated.trainer.batches import Batches as _Batches, step_groups as _step_groups
from fedlatent.federated.round import client_generators
from fedlatent.methods import resolve

MEAN, STD = [0.49, 0.48, 0.45], [0.25, 0.24, 0.26]


def uint8_federation(config) -> Federation:
    """The workload's federation with each client's images replaced by random uint8 ones, held
    compactly, and crop + flip on."""
    fed = C.federation_for(config)
    gen = torch.Generator().manual_seed(0)
    for client in fed.clients:
        raw = torch.randint(0, 256, (len(client.train), 3, 32, 32), dtype=torch.uint8, generator=gen)
        client.train = Split(Images(raw, MEAN, STD), client.train.y)
    return dataclasses.replace(fed, augment=Augmentation(crop_flip=True))


@contextmanager
def streamed(on: bool) -> Iterator[None]:
    """The lockstep trainer's batches streamed client by client while ``on``."""
    if not on:
        yield
        return
    with mock.patch.object(augment, "pooled", lambda _: False):
        yield


def batches_only(s: simulation.Setup, rnd: int) -> None:
    """Every step's batches of one round of all clients, as the trainer takes them (no training)."""
    datas = [c.train for c in s.federation.clients]
    local = simulation.settings(s, s.config.train.lr, s.config.train.local_epochs)
    sizes = [len(d) for d in datas]
    draws = _Batches(s.workspace, datas, sizes, local, client_generators(s.config.seed, rnd, list(range(len(datas)))))
    total = [planned_steps(n, local) for n in sizes]
    steps, active = [0] * len(sizes), [c for c in range(len(sizes)) if total[c]]
    while active:
        taken = draws.take(active)
        for c in active:
            steps[c] += 1
        batch_sizes = {c: draws.size(taken[c]) for c in active}
        for members in _step_groups(active, batch_sizes, False):  # the CNN has BatchNorm: groups by size
            x, _ = draws.stacked(taken, members, max(batch_sizes[c] for c in members))
        active = [c for c in active if steps[c] < total[c]]
    if x.is_cuda:
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    parser = C.base_parser(__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="the training device (default cpu)")
    args = parser.parse_args(argv)
    C.set_threads(args.threads)
    work = C.workloads(args.quick, args.batch_size, args.clients or None, args.samples or None)["cnn"]
    config = work.config([f'train.device="{args.device}"', "backend=vectorized"])
    fed = uint8_federation(config)
    spec = resolve(config.algorithm, config.terms)
    setups = {name: simulation.setup(config, fed, spec, C.TRAINERS["vectorized"]) for name in ("base", "planned", "aa")}
    reps = args.reps or (3 if args.quick else 9)
    counter = iter(range(10**9))

    def side(name: str, stream: bool, what: str):
        def run() -> None:
            with streamed(stream):
                rnd = next(counter)
                if what == "round":
                    simulation.run_round(setups[name], rnd)
                else:
                    batches_only(setups[name], rnd)
        return run

    results = {}
    for what in ("round", "batches"):
        results[what] = C.bracketed(side("base", True, what),
                                    {"planned": side("planned", False, what), "streamed (A/A)": side("aa", True, what)},
                                    reps, ("wall", "wall_cpu"),
                                    progress=lambda m: print(f"  {what} {m}", file=sys.stderr, flush=True))
    rows = []
    for what, res in results.items():
        base = C.median(res[C.BASELINE]["wall_abs"])
        for name in ("planned", "streamed (A/A)"):
            lo, hi = C.quartiles(res[name]["wall"])
            rows.append([what, name, f"{C.median(res[name]['wall']):.3f}", f"{lo:.3f}-{hi:.3f}",
                         f"{C.median(res[name]['wall_cpu']):.3f}", f"{base * 1e3:.0f}"])
    print(f"{work.label}, uint8 images, crop + flip, vectorized, {args.device}, {reps} repetitions")
    print(C.table(["measured", "side", "÷ streamed (wall)", "IQR", "÷ streamed (CPU)", "streamed ms"], rows))
    C.dump(args.json, {"machine": C.machine(args.device), "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
