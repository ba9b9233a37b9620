"""100 clients of the small CNN on CIFAR-shaped tensors on one accelerator: training samples per
second of fedlatent's rounds, on the simulation and the vectorized backend, against a centralised
training loop of the same model and batch size on the same device (issue 18).

Workload: ``fedlatent bench``'s random CIFAR-shaped arrays (3×32×32 float32), ``--clients`` (100)
clients of ``--samples`` (500) images each, 50,000 in all as in CIFAR-10's training set; the small
CNN (FedUV's release widths), batch 32, SGD lr 0.01 momentum 0.9, one local epoch, every client
every round, no evaluation. A fedlatent side is ``simulation.run_round`` with the backend's
trainer; its first round is a warm-up (CUDA context, cuDNN's algorithm search), then ``--rounds``
rounds are timed one by one. The centralised loop trains the same model on the 50,000 images
pooled, one epoch per repetition, in batches of 32: once with the batches indexed on the host and
moved to the device one at a time (what the backends do) and once with the pool already on the
device. Every clock read follows ``torch.cuda.synchronize``. Reported: samples/s (median over the
timed rounds or epochs) and each side's ratio to the centralised loop with host batches.

    python benchmarks/gpu_clients.py                     # on cuda when torch sees one
    python benchmarks/gpu_clients.py --device cpu --clients 4 --samples 64 --rounds 1   # a smoke run
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
from fedlatent.backends import auto, simulation  # noqa: E402
from fedlatent.config import RunConfig, load_config  # noqa: E402
from fedlatent.methods import resolve  # noqa: E402
from fedlatent.models import build_model  # noqa: E402

CENTRAL_HOST, CENTRAL_DEVICE = "centralised, host batches", "centralised, data on device"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def config_for(npz: Path, device: str, batch_size: int, method: str) -> RunConfig:
    return load_config(None, ['data.dataset="arrays"', f'data.path="{npz}"', 'data.partition="given"',
                              'model.arch="cnn"', f"train.batch_size={batch_size}", "train.lr=0.01",
                              "train.momentum=0.9", f'train.device="{device}"', f"algorithm.name={method}",
                              *C.NO_EVAL])


def backend_rates(config: RunConfig, federation, backend: str, rounds: int) -> list[float]:
    """Samples/s of each timed round of ``backend`` (after one warm-up round)."""
    device = torch.device(config.train.device)
    setup = simulation.setup(config, federation, resolve(config.algorithm, config.terms), trainer=C.TRAINERS[backend])
    samples = sum(len(c.train) for c in federation.clients) * config.train.local_epochs
    rates = []
    for rnd in range(rounds + 1):
        sync(device)
        started = time.perf_counter()
        simulation.run_round(setup, rnd)
        sync(device)
        if rnd:
            rates.append(samples / (time.perf_counter() - started))
    return rates


def central_rates(config: RunConfig, federation, resident: bool, epochs: int) -> list[float]:
    """Samples/s of each timed epoch (after one warm-up epoch) of the centralised loop over the pooled
    training images; ``resident``: the pool is moved to the device once, before the clock starts."""
    device = torch.device(config.train.device)
    x = torch.cat([c.train.x for c in federation.clients])
    y = torch.cat([c.train.y for c in federation.clients])
    if resident:
        x, y = x.to(device), y.to(device)
    model = build_model(config.model, federation.input_shape, federation.num_classes, federation.name).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=config.train.lr, momentum=config.train.momentum)
    generator = torch.Generator().manual_seed(config.seed)
    batch, rates = config.train.batch_size, []
    model.train()
    for epoch in range(epochs + 1):
        sync(device)
        started = time.perf_counter()
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), batch):
            idx = order[start:start + batch]
            xb, yb = (x[idx.to(device)], y[idx.to(device)]) if resident else (x[idx].to(device), y[idx].to(device))
            loss = F.cross_entropy(model(xb).logits, yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        sync(device)
        if epoch:
            rates.append(len(y) / (time.perf_counter() - started))
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--samples", type=int, default=500, help="training images per client")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (and epochs of the centralised loop)")
    parser.add_argument("--methods", default="fedavg", help="comma-separated presets timed on both backends")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--json", help="also write the raw rates as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.backends.cudnn.benchmark = False  # the library's default; the same for every side
    with tempfile.TemporaryDirectory(prefix="fedlatent-gpu-") as tmp:
        npz = C.cifar_shaped_npz(Path(tmp) / "cifar_shaped.npz", args.clients, args.samples)
        methods = args.methods.split(",")
        config = config_for(npz, args.device, args.batch_size, methods[0])
        federation = C.federation_for(config)
        sides: dict[str, Callable[[], list[float]]] = {
            CENTRAL_HOST: lambda: central_rates(config, federation, False, args.rounds),
            CENTRAL_DEVICE: lambda: central_rates(config, federation, True, args.rounds)}
        for method in methods:
            cfg = config_for(npz, args.device, args.batch_size, method)
            for backend in C.TRAINERS:
                sides[f"{method}, {backend}"] = lambda cfg=cfg, backend=backend: backend_rates(cfg, federation, backend,
                                                                                             args.rounds)
        rates = {}
        for name, side in sides.items():
            rates[name] = side()
            print(f"  {name}: {', '.join(f'{r:,.0f}' for r in rates[name])} samples/s", file=sys.stderr, flush=True)
        floor = C.median(rates[CENTRAL_HOST])
        rows = [[name, C.median(r), C.median(r) / floor] for name, r in rates.items()]
        choice, why = auto.choose(config, federation, resolve(config.algorithm, config.terms))
    device = torch.device(args.device)
    named = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{args.clients} clients x {args.samples} CIFAR-shaped images, small CNN, batch {args.batch_size}, "
          f"on {named}; medians of {args.rounds} timed rounds / epochs\n"
          + C.table(["side", "samples/s", "÷ centralised (host batches)"], rows)
          + f"\nbackend = 'auto' picks {choice} ({why})")
    C.dump(args.json, {"machine": C.machine(args.device), "argv": sys.argv[1:], "rates": rates,
                       "auto": [choice, why]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
