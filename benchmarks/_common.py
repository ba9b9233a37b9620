"""Shared pieces of the benchmark scripts: workloads, thread settings, interleaved timing, tables.

Only fedlatent's public pieces are used (``load_config``, ``build_federation``,
``methods.resolve``, ``backends.simulation``); nothing of the library is copied here.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import fedlatent
from fedlatent.config import RunConfig, load_config
from fedlatent.data.federation import build_federation
from fedlatent.data.types import Federation

# A run long enough that run_round never reaches its last round (which always evaluates), and
# eval.every large: no evaluation inside the timed rounds.
NO_EVAL = ["train.rounds=100000", "eval.every=100000"]


@dataclass
class Workload:
    """One benchmark setting: a name, the configuration overrides and the federation."""

    name: str
    label: str
    overrides: list[str]

    def config(self, extra: list[str] = ()) -> RunConfig:
        return load_config(None, [*self.overrides, *NO_EVAL, *extra])


def cifar_shaped_npz(path: Path, clients: int, samples: int, classes: int = 10, seed: int = 0) -> Path:
    """Random CIFAR-shaped client arrays (3×32×32 float32, labels 0..classes-1) for ``data.dataset = "arrays"``."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for i in range(clients):
        arrays[f"client{i}_train_x"] = rng.standard_normal((samples, 3, 32, 32), dtype=np.float32)
        arrays[f"client{i}_train_y"] = rng.integers(0, classes, samples).astype(np.int64)
    np.savez(path, **arrays)
    return path


_TMP = tempfile.TemporaryDirectory(prefix="fedlatent-bench-")


def workloads(quick: bool, batch_size: int, clients: int | None = None, samples: int | None = None,
              local_epochs: int = 1) -> dict[str, Workload]:
    """The two settings every benchmark runs: the digits MLP and the small CNN on CIFAR-shaped data."""
    n_clients = clients or (4 if quick else 10)
    n_samples = samples or (100 if quick else 200)
    npz = cifar_shaped_npz(Path(_TMP.name) / f"cifar_shaped_{n_clients}x{n_samples}.npz", n_clients, n_samples)
    common = [f"train.batch_size={batch_size}", f"train.local_epochs={local_epochs}", "train.lr=0.01"]
    return {
        "mlp": Workload("mlp", f"digits MLP 64-128-10, {n_clients} clients iid",
                        ["data.dataset=digits", "data.partition=iid", f"data.num_clients={n_clients}",
                         "model.arch=mlp", *common]),
        "cnn": Workload("cnn", f"small CNN (FedUV, release widths), {n_clients}x{n_samples} 3x32x32 random",
                        ["data.dataset=arrays", f"data.path={npz}", "data.partition=given", "model.arch=cnn",
                         *common]),
    }


def federation_for(config: RunConfig) -> Federation:
    return build_federation(config.data, config.data_seed)


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="a short run (fewer clients and repetitions)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads, the same for every side (default 1)")
    parser.add_argument("--models", default="mlp,cnn", help="comma-separated subset of: mlp, cnn")
    parser.add_argument("--reps", type=int, default=0, help="timed repetitions (0 = the script's default)")
    parser.add_argument("--batch-size", type=int, default=32, help="local mini-batch size (default 32)")
    parser.add_argument("--clients", type=int, default=0, help="clients (0 = 4 quick, 10 full)")
    parser.add_argument("--samples", type=int, default=0,
                        help="samples per client of the CIFAR-shaped data (0 = 100 quick, 200 full)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return parser


def set_threads(n: int) -> None:
    torch.set_num_threads(n)


def machine() -> dict[str, Any]:
    return {"torch": torch.__version__, "fedlatent": fedlatent.__version__, "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
            "processor": platform.processor() or platform.machine()}


class Clock:
    """Wall time (``perf_counter``) and CPU time of the process (``process_time``, all threads).

    On a machine shared with other work the wall time includes the time the process waited for a
    core; the CPU time does not, so with one thread it is the steadier measure of work done."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def lap(self, name: str, into: dict[str, float]) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        into[name], into[name + "_cpu"] = wall - self.wall, cpu - self.cpu
        self.wall, self.cpu = wall, cpu


def timed(fn: Callable[[], dict[str, float] | None]) -> dict[str, float]:
    """``wall`` and ``wall_cpu`` of ``fn()``, plus whatever timings ``fn`` returns itself."""
    gc.collect()
    clock, out = Clock(), {}
    extra = fn() or {}
    clock.lap("wall", out)
    return {**out, **extra}


def interleaved(fns: dict[str, Callable[[], dict[str, float] | None]], reps: int, warmup: int = 1,
                progress: Callable[[str], None] | None = None) -> dict[str, list[dict[str, float]]]:
    """Run every function once per repetition, in an order rotated each repetition (so no side
    always runs first or right after another), after ``warmup`` untimed repetitions."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    out: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for rep in range(reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            out[name].append(timed(fns[name]))
        if progress:
            progress(f"rep {rep + 1}/{reps}")
    return out


BASELINE = "__baseline__"


def bracketed(baseline: Callable[[], dict[str, float] | None],
              fns: dict[str, Callable[[], dict[str, float] | None]], reps: int, keys: tuple[str, ...],
              warmup: int = 1, progress: Callable[[str], None] | None = None) -> dict[str, dict[str, list[float]]]:
    """Ratios of each function to a baseline run right before and right after it.

    One repetition runs ``B f1 B f2 B ... fk B`` (the order of the f's rotated each repetition)
    and records, per f and key, ``t_f / mean(t_B before, t_B after)``: each ratio compares runs
    seconds apart, so a change of load on a shared machine between repetitions cancels out.
    Returns ``{name: {key: [ratio per repetition], key + "_abs": [t_f per repetition]}}`` and,
    under ``BASELINE``, ``{key + "_abs": [t_B per run]}``.
    """
    names = list(fns)
    for _ in range(warmup):
        baseline()
        for name in names:
            fns[name]()
    out: dict[str, dict[str, list[float]]] = {n: {k: [] for k in (*keys, *(k + "_abs" for k in keys))}
                                              for n in names}
    out[BASELINE] = {k + "_abs": [] for k in keys}

    def base() -> dict[str, float]:
        t = timed(baseline)
        for k in keys:
            out[BASELINE][k + "_abs"].append(t[k])
        return t

    for rep in range(reps):
        shift = rep % len(names)
        before = base()
        for name in names[shift:] + names[:shift]:
            t = timed(fns[name])
            after = base()
            for k in keys:
                out[name][k].append(t[k] / (0.5 * (before[k] + after[k])))
                out[name][k + "_abs"].append(t[k])
            before = after
        if progress:
            progress(f"rep {rep + 1}/{reps}")
    return out


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.count += 1
        return func(*args, **(kwargs or {}))


def op_census(fn: Callable[[], Any]) -> dict[str, int]:
    """Deterministic cost figures of ``fn()``: the number of ATen operators dispatched (forward,
    backward and optimiser alike: on small models each costs microseconds of fixed overhead) and
    the FLOPs of the matmuls and convolutions (``torch.utils.flop_counter``). Unlike timings they
    do not depend on the load of the machine."""
    counter = _OpCounter()
    with FlopCounterMode(display=False) as flops, counter:
        fn()
    return {"ops": counter.count, "flops": int(flops.get_total_flops())}


def median(values: list[float]) -> float:
    return statistics.median(values)


def paired_ratios(num: list[float], den: list[float]) -> list[float]:
    return [a / b for a, b in zip(num, den)]


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A plain fixed-width table (also valid Markdown)."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                      *(line(r) for r in cells[1:])])


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def dump(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(payload, indent=1))
        print(f"wrote {path}")
