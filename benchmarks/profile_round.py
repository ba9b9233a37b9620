"""Where a lockstep round's time goes on a device, beside the bare loop's epoch: the workload of
``fedlatent bench --throughput`` (the paper-width FedUV CNN, 10 clients, crop + flip, one local
epoch) under ``torch.profiler``, after one warm-up of each side — so that a lease that misses the
0.8× goal (issue 57) brings back the reason in figures from the same machine.

Per side: wall seconds; the operators with the most self time on the device (CUDA kernels'
time; on a CPU, self CPU time) with their calls; kernel launches; the device's busy time (the union
of its kernels' intervals) and the rest of the wall time, the host-side gaps in which the device
waited for Python, the allocator or a synchronisation. ``benchmarks/gpu_lease.sh`` runs it once per
lease folder (``OUT/profile_round.txt|json``).

    python benchmarks/profile_round.py --device cuda --json out.json
    python benchmarks/profile_round.py --samples 2            # the plumbing, on a CPU
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile

from fedlatent.experiment.tooling import throughput as tp
from fedlatent.experiment.tooling.timing import dump, machine, table
from fedlatent.federated import precision as precisions
from fedlatent.methods import resolve


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``intervals`` (start, end), in their unit."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def summary(prof: Any, wall: float, on_device: bool, top: int) -> dict[str, Any]:
    """What one profiled call shows: wall seconds, kernel launches, the device's busy seconds and the
    ``top`` operators by self time on the device (on a CPU: self CPU time)."""
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = busy_seconds([(e.time_range.start, e.time_range.end) for e in kernels]) / 1e6  # µs → s
    key = "self_device_time_total" if on_device else "self_cpu_time_total"
    averages = sorted(prof.key_averages(), key=lambda a: getattr(a, key, 0.0), reverse=True)[:top]
    return {"wall_s": wall, "kernel_launches": len(kernels), "device_busy_s": busy if on_device else None,
            "host_gap_s": max(wall - busy, 0.0) if on_device else None,
            "top": [{"name": a.key, "calls": a.count, "self_ms": getattr(a, key, 0.0) / 1e3} for a in averages]}


def profiled(side: Callable[[], Any], device: torch.device, top: int) -> dict[str, Any]:
    """``side`` once to warm, then once under the profiler."""
    side()
    tp.sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        side()
        tp.sync(device)
        wall = time.perf_counter() - start
    return summary(prof, wall, device.type == "cuda", top)


def report(result: dict[str, Any]) -> str:
    """The two sides' figures, then each side's top operators."""
    lines = [f"torch {torch.__version__}, {result['machine']}, precision {result['precision']}, {tp.CLIENTS} clients x "
             f"{result['samples_per_client']} images, one profiled pass each after a warm-up"]
    rows = []
    for name, side in result["sides"].items():
        gap = side["host_gap_s"]
        rows.append([name, side["wall_s"], side["kernel_launches"], side["device_busy_s"] if gap is not None else "-",
                     f"{gap / side['wall_s']:.0%}" if gap is not None and side["wall_s"] > 0 else "-"])
    lines.append(table(["side", "wall s", "kernel launches", "device busy s", "host-side gaps"], rows))
    for name, side in result["sides"].items():
        lines.append(f"\n{name}: top operators by self time on the {'device' if result['on_device'] else 'CPU'}")
        lines.append(table(["operator", "calls", "self ms"], [[t["name"][:70], t["calls"], t["self_ms"]] for t in side["top"]]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="auto", choices=tp.PRECISIONS)
    parser.add_argument("--samples", type=int, default=0, help="training images per client (0: bench's default)")
    parser.add_argument("--top", type=int, default=15, help="operators listed per side")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    samples = args.samples or tp.defaults(args.device)[0]
    config = tp.run_config(args.device, args.precision)
    images, labels = tp.random_images(tp.CLIENTS, samples, config.seed)
    fed = tp.federation(images, labels, tp.CLIENTS)
    resolved = precisions.resolve(args.precision, args.device)
    model = tp.simulation.make_model(config, fed, resolve(config.algorithm, config.terms))
    bare = tp.BareLoop(model, images, labels, batch=tp.CLIENTS * min(tp.BATCH, samples), precision=resolved,
                       device=device, seed=config.seed)
    sides = {tp.FEDLATENT: tp.FedlatentRounds(config, fed), tp.BARE: bare}
    result = {"machine": machine(args.device), "precision": resolved, "samples_per_client": samples,
              "on_device": device.type == "cuda", "sides": {n: profiled(s, device, args.top) for n, s in sides.items()}}
    print(report(result))
    dump(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
