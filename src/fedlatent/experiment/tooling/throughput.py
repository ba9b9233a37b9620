"""``fedlatent bench --throughput``: training samples/s of fedlatent's lockstep clients beside a bare
centralised PyTorch loop written for speed, on one device, with the FLOP/s each side achieves (issue 41).

The workload is the FedUV CNN at the paper's widths (64/128/256, ``model.width = "paper"``) on 10
clients of CIFAR-10 shape: random uint8 3×32×32 images in fedlatent's compact
:class:`~fedlatent.data.compact.Images` form, 10 classes, crop + flip, batch 128 per client, SGD
(lr 0.01, momentum 0.9, weight decay 1e-5), one local epoch a round. fedlatent's side is the
vectorized backend's round (``simulation.run_round`` with the lockstep trainer: planning,
training, aggregation; no evaluation). The bare loop (:class:`BareLoop`) trains the same model on
the same images pooled, one epoch per timing, at the same total batch (10 × 128 = 1280): the
images on the device as uint8, crop + flip on the device, channels_last and autocast to bf16 (or
fp16) on CUDA when the precision resolves to it, fp32 contiguous on a CPU, torch's SGD with
momentum. The sides alternate (:func:`~fedlatent.experiment.tooling.timing.bracketed`, one warm-up of each
first: CUDA context, cuDNN, allocator), every timing ends on ``torch.cuda.synchronize``. FLOP per
sample is :func:`fedlatent.models.flops.per_sample_flops` (forward + backward, convolutions and
matrix products), so TFLOP/s = samples/s × FLOP/sample.
"""
from __future__ import annotations

from typing import Any, Callable, cast

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

from fedlatent.backends import simulation, vectorized
from fedlatent.config import RunConfig, load_config
from fedlatent.data.augment import Augmentation
from fedlatent.data.compact import Images, uint8_channel_stats
from fedlatent.data.types import ClientData, Federation, Split
from fedlatent.experiment.tooling import timing
from fedlatent.federated import precision as precisions
from fedlatent.methods import resolve
from fedlatent.models import FedModel
from fedlatent.models.flops import per_sample_flops

CLIENTS, CLASSES, BATCH, SHAPE = 10, 10, 128, (3, 32, 32)
LR, MOMENTUM, WEIGHT_DECAY = 0.01, 0.9, 1e-5
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
FEDLATENT, BARE = "fedlatent (vectorized)", "bare loop"


def defaults(device: str) -> tuple[int, int]:
    """(training images per client, timed repetitions): CIFAR-10's 50,000 over 10 clients and 5
    repetitions on an accelerator; 32 and 2 on a CPU, where the paper-width CNN trains ~25 samples/s
    on one core (about a minute and a half in all)."""
    return (32, 2) if torch.device(device).type == "cpu" else (5000, 5)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a clock read means nothing before it on CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_images(clients: int, samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``clients × samples`` uniform random uint8 images of :data:`SHAPE` and labels in 0..9."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (clients * samples, *SHAPE), dtype=np.uint8),
            rng.integers(0, CLASSES, clients * samples).astype(np.int64))


def federation(images: np.ndarray, labels: np.ndarray, clients: int) -> Federation:
    """The images split evenly over ``clients``, compact (uint8 until the batch), crop + flip on."""
    mean, std = uint8_channel_stats([images])
    x, y = torch.from_numpy(images), torch.from_numpy(labels)
    parts = np.array_split(np.arange(len(y)), clients)
    pool = Split(Images(x, mean, std), y)
    return Federation([ClientData(pool.subset(p)) for p in parts], None, CLASSES, SHAPE, "cifar-shaped",
                      Augmentation(crop_flip=True, mean=mean.reshape(-1, 1, 1), std=std.reshape(-1, 1, 1)))


def run_config(device: str, precision: str) -> RunConfig:
    """FedAvg on the paper-width CNN, trained on ``device``; no evaluation within the timed rounds;
    in ``precision`` (``train.precision``)."""
    keys = ['model.arch="cnn"', 'model.width="paper"', f"train.batch_size={BATCH}", f"train.lr={LR}",
            f"train.momentum={MOMENTUM}", f"train.weight_decay={WEIGHT_DECAY}", f'train.device="{device}"',
            'backend="vectorized"', "train.rounds=100000", "eval.every=100000"]
    return load_config(None, [*keys, f'train.precision="{precision}"'])


class FedlatentRounds:
    """fedlatent's side: each call plays the next round of the vectorized backend (every client,
    one local epoch) and waits for the device."""

    def __init__(self, config: RunConfig, fed: Federation) -> None:
        trainer = cast(simulation.Trainer, vectorized.trainer)  # its list[Upload] is a list of Upload | ClientFailure
        self.setup = simulation.setup(config, fed, resolve(config.algorithm, config.terms), trainer=trainer)
        self.round = 0

    def __call__(self) -> None:
        simulation.run_round(self.setup, self.round)
        self.round += 1
        sync(self.setup.device)


def crop_flip(x: Tensor, generator: torch.Generator, padding: int = 4) -> Tensor:
    """Random crop of a ``padding``-zero-padded N×C×H×W batch and a left-right flip of half the
    samples, as one gather drawn on the batch's device (the flip reverses the crop's columns)."""
    n, c, h, w = x.shape
    span = 2 * padding + 1
    top = torch.randint(0, span, (n, 1, 1, 1), device=x.device, generator=generator)
    left = torch.randint(0, span, (n, 1, 1, 1), device=x.device, generator=generator)
    flip = torch.rand((n, 1, 1, 1), device=x.device, generator=generator) < 0.5
    across = torch.arange(w, device=x.device)
    rows = top + torch.arange(h, device=x.device).view(1, 1, h, 1)
    cols = left + torch.where(flip, across.flip(0), across)  # N×1×1×W
    batch = torch.arange(n, device=x.device).view(n, 1, 1, 1)
    chan = torch.arange(c, device=x.device).view(1, c, 1, 1)
    return F.pad(x, (padding,) * 4)[batch, chan, rows, cols]


class BareLoop:
    """The floor: centralised training written for speed. The uint8 images and labels live on the
    device; each step takes a batch, standardises it, crops and flips it there, and trains with
    torch's SGD (momentum, weight decay) under autocast when ``precision`` is bf16 or fp16 (fp16
    with a gradient scaler), channels_last on CUDA. Each call is one epoch over the images."""

    def __init__(self, model: FedModel, images: np.ndarray, labels: np.ndarray, *, batch: int, precision: str,
                 device: torch.device, lr: float = LR, momentum: float = MOMENTUM,
                 weight_decay: float = WEIGHT_DECAY, seed: int = 0) -> None:
        self.device, self.batch = device, batch
        self.layout = torch.channels_last if device.type == "cuda" else torch.contiguous_format
        self.model = model.to(device, memory_format=self.layout).train()  # type: ignore[call-overload]  # not in torch's stubs
        self.x = torch.from_numpy(images).to(device)
        self.y = torch.from_numpy(labels).to(device)
        mean, std = uint8_channel_stats([images])
        self.scale = torch.as_tensor(1.0 / (255.0 * std), device=device).view(1, -1, 1, 1)
        self.shift = torch.as_tensor(-mean / std, device=device).view(1, -1, 1, 1)
        self.dtype = AUTOCAST.get(precision)
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.generator = torch.Generator(device).manual_seed(seed)

    def step(self, idx: Tensor) -> Tensor:
        """One SGD step on the images at ``idx``; the batch's mean loss (detached, on the device)."""
        x = crop_flip(self.x[idx].float() * self.scale + self.shift, self.generator)
        x = x.contiguous(memory_format=self.layout)
        with torch.autocast(self.device.type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
            loss = F.cross_entropy(self.model(x).logits.float(), self.y[idx])
        self.opt.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        return loss.detach()

    def __call__(self) -> None:
        self.epoch()

    def epoch(self) -> float:
        """One epoch in a fresh random order; its mean batch loss."""
        order = torch.randperm(len(self.y), device=self.device, generator=self.generator)
        losses = [self.step(order[start:start + self.batch]) for start in range(0, len(order), self.batch)]
        mean = float(torch.stack(losses).mean())  # waits for the device
        sync(self.device)
        return mean


def measure(*, device: str = "cpu", samples: int | None = None, reps: int | None = None, precision: str = "auto",
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Both sides on ``device``, alternating, ``reps`` timings each after one warm-up of each
    (:func:`defaults` for what is not given): the sizes, the precisions, FLOP per sample and each
    side's seconds per pass over the images (fedlatent: a round; the bare loop: an epoch), with
    fedlatent's seconds over the mean of the bare loop's right before and after."""
    samples = samples or defaults(device)[0]
    reps = reps or defaults(device)[1]
    batch = min(BATCH, samples)  # a client of fewer images takes them in one batch; the bare loop likewise
    named = torch.device(device)
    resolved = precisions.resolve(precision, device)
    config = run_config(device, precision)
    images, labels = random_images(CLIENTS, samples, config.seed)
    fed = federation(images, labels, CLIENTS)
    fedlatent = FedlatentRounds(config, fed)
    model = simulation.make_model(config, fed, resolve(config.algorithm, config.terms))  # fedlatent's initial weights
    forward, backward = per_sample_flops(model, SHAPE)
    bare = BareLoop(model, images, labels, batch=CLIENTS * batch, precision=resolved, device=named, seed=config.seed)
    times = timing.bracketed(bare, {FEDLATENT: fedlatent}, reps, ("wall",), progress=progress)
    return {"machine": timing.machine(device), "clients": CLIENTS, "samples_per_client": samples,
            "batch_per_client": batch, "total_batch": CLIENTS * batch, "images": len(labels),
            "model": "cnn, width paper (64/128/256)", "reps": reps,
            "precision": {FEDLATENT: resolved, BARE: resolved},
            "flop_per_sample": forward + backward, "flop_forward": forward, "flop_backward": backward,
            "seconds": {FEDLATENT: times[FEDLATENT]["wall_abs"], BARE: times[timing.BASELINE]["wall_abs"]},
            "time_ratio": times[FEDLATENT]["wall"]}


def rows(result: dict[str, Any]) -> list[list[Any]]:
    """One row per side: precision, samples/s (median), FLOP per sample, TFLOP/s, and samples/s as a
    fraction of the bare loop's (the median over repetitions of the bare loop's seconds around each
    fedlatent round over that round's)."""
    images, flop = result["images"], result["flop_per_sample"]
    out = []
    for side in (BARE, FEDLATENT):
        rate = images / timing.median(result["seconds"][side])
        share = 1.0 if side == BARE else timing.median([1.0 / r for r in result["time_ratio"]])
        out.append([side, result["precision"][side], rate, f"{flop / 1e6:.1f}", tflops(rate, flop), share])
    return out


def tflops(samples_per_second: float, flop_per_sample: float) -> float:
    """Achieved TFLOP/s: samples/s × FLOP per sample / 10¹²."""
    return samples_per_second * flop_per_sample / 1e12


def table(result: dict[str, Any]) -> str:
    """The side-by-side table with a line naming the workload, its sizes and the device."""
    head = (f"FedUV CNN (paper widths 64/128/256), {result['clients']} clients x {result['samples_per_client']} "
            f"random uint8 3x32x32 images, {CLASSES} classes, crop + flip, batch {result['batch_per_client']} a "
            f"client (bare loop: {result['total_batch']}), one epoch a timing; medians of {result['reps']} "
            f"alternating timings after a warm-up, on {result['machine']['device']}")
    shown = [[side, precision, f"{rate:.3g}", flop, f"{tf:.3g}", f"{share:.2f}"]  # what the repetitions support
             for side, precision, rate, flop, tf, share in rows(result)]
    return (head + "\n" + timing.table(["side", "precision", "samples/s", "MFLOP/sample", "TFLOP/s",
                                        "÷ bare loop (samples/s)"], shown) + "\n" + judgement(result))


def judgement(result: dict[str, Any]) -> str:
    """One line saying what the ratio means: fedlatent at the bare loop's speed (within 10 %), or the
    time it adds, with the spread over the repetitions, and a caution where they are too few to
    trust (fewer than 3)."""
    shares = sorted(1.0 / r for r in result["time_ratio"])
    share = timing.median(shares)
    spread = f" (repetitions {shares[0]:.2f}-{shares[-1]:.2f})" if len(shares) > 1 else ""
    if share >= 0.9:
        said = f"fedlatent trains at the bare loop's speed, {share:.2f} of its samples/s{spread}"
    else:
        said = (f"fedlatent trains at {share:.2f} of the bare loop's samples/s{spread}: {1 / share:.1f}× its time, "
                "the rest its own work per round (state, aggregation, evaluation) or a slower kernel")
    few = len(shares) < 3
    return f"judgement: {said}" + (f"; {len(shares)} repetition(s) give a rough figure (--reps 5 for a steadier one)"
                                   if few else "")
