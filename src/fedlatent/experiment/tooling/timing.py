"""Timing on a shared machine: clocks, sides run in alternation, ratios to a baseline run right
before and after each, and plain tables. Used by ``fedlatent bench`` and the scripts in
``benchmarks/``.

A single timing means little when other work shares the cores, so every measurement here is a
ratio of runs seconds apart (:func:`bracketed`): a change of load between repetitions cancels out.
"""
from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

Timings = dict[str, float]
Side = Callable[[], "Timings | None"]
BASELINE = "__baseline__"


def machine(device: str = "cpu") -> dict[str, Any]:
    """What the figures were taken on (for the JSON beside them); ``device``: the torch device the
    runs trained on, named with its model when it is a CUDA device."""
    from fedlatent.experiment.runner.single import fedlatent_version
    named = torch.device(device)
    return {"torch": torch.__version__, "fedlatent": fedlatent_version(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
            "processor": platform.processor() or platform.machine(),
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "device": device if named.type != "cuda" else f"{device} ({torch.cuda.get_device_name(named)})"}


class Clock:
    """Wall time (``perf_counter``) and CPU time of the process (``process_time``, all threads).

    On a machine shared with other work the wall time includes the time the process waited for a
    core; the CPU time does not, so with one thread it is the steadier measure of work done."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def lap(self, name: str, into: Timings) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        into[name], into[name + "_cpu"] = wall - self.wall, cpu - self.cpu
        self.wall, self.cpu = wall, cpu


def timed(fn: Side) -> Timings:
    """``wall`` and ``wall_cpu`` of ``fn()``, plus whatever timings ``fn`` returns itself."""
    gc.collect()
    clock, out = Clock(), {}
    extra = fn() or {}
    clock.lap("wall", out)
    return {**out, **extra}


def bracketed(baseline: Side, fns: dict[str, Side], reps: int, keys: tuple[str, ...], warmup: int = 1,
              progress: Callable[[str], None] | None = None) -> dict[str, dict[str, list[float]]]:
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

    def base() -> Timings:
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


def median(values: list[float]) -> float:
    return statistics.median(values)


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


def dump(path: str | Path | None, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON to ``path`` (nothing when None)."""
    if path:
        Path(path).write_text(json.dumps(payload, indent=1))
        print(f"wrote {path}")
