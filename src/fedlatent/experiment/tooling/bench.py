"""``fedlatent bench``: whole runs on each backend against a bare PyTorch loop, in one invocation.

Four fixed workloads (issue 18): (a) the peers' digits workload (MLP 64-128-10, 10 IID clients,
20 rounds, test evaluation every round), (b) 100 digits clients at 50 % participation, (c) the small
CNN on random CIFAR-shaped arrays, 10 clients, Dirichlet 0.1, (d) the release-faithful Ditto + MK-MMD
run on the shared Synthetic file (``configs/ditto/release_ditto_mkmmd.toml``, read from the current
folder; skipped with a line when it or its data file is absent). Each side is a whole
``fedlatent.experiment.run`` into a fresh folder (partition table, metrics, checkpoints, summary,
figures); the floor is the FedAvg loop one would write by hand (:func:`bare_run`: the same initial
weights, batches, sampled clients and evaluations). Sides alternate with the floor
(:func:`~fedlatent.experiment.tooling.timing.bracketed`); (d) has no hand-written floor, so there the
simulation run is the baseline. When the flower extra is installed, Flower's simulation engine
(``backend = "flower"``) is a further side of the workloads in :data:`FLOWER_WORKLOADS`: its Ray
start-up (~20 s) makes alternating it every repetition too long, so it runs once per workload,
bracketed by two baseline runs (``--quick`` leaves it out).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.nn import functional as F

from fedlatent.backends import simulation
from fedlatent.config import RunConfig, load_config
from fedlatent.data.federation import build_federation
from fedlatent.data.partition import dirichlet
from fedlatent.data.types import Federation
from fedlatent.errors import ConfigError
from fedlatent.experiment.tooling import timing
from fedlatent.experiment.runner.single import prepare
from fedlatent.experiment.runner.single import run as run_experiment
from fedlatent.federated.trainer.schedule import batches
from fedlatent.federated.round import sample_clients
from fedlatent.methods import resolve
from fedlatent.models import build_model
from fedlatent.seeding import LOCAL_TRAINING, derive_seed

Tensors = dict[str, torch.Tensor]
DITTO_RELEASE = Path("configs") / "ditto" / "release_ditto_mkmmd.toml"
FLOOR = "bare loop"
FLOWER = "flower"
FLOWER_WORKLOADS = "a"  # the workloads Flower's simulation engine is timed on (once each)
SIDES = (FLOOR, "simulation", "vectorized", FLOWER)


@dataclass
class Workload:
    """One benchmark setting: its letter, a label for the table, the run's configuration and the
    timed repetitions; ``floor`` False: no hand-written loop, simulation is the baseline."""

    name: str
    label: str
    config: RunConfig
    reps: int
    floor: bool = True


def plain_round(model: torch.nn.Module, global_state: Tensors, fed: Federation, cfg: RunConfig, rnd: int,
                clients: list[int] | None = None) -> Tensors:
    """One FedAvg round by hand: each client (all, or ``clients``) from the global state with a
    fresh SGD over the simulation backend's batches, then the sample-weighted mean."""
    t = cfg.train
    device = next(model.parameters()).device
    states, sizes = [], []
    for cid in range(len(fed.clients)) if clients is None else clients:
        data = fed.clients[cid].train
        model.load_state_dict(global_state)
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
        generator = torch.Generator().manual_seed(derive_seed(cfg.seed, LOCAL_TRAINING, rnd, cid))
        loss_sum = torch.zeros((), device=device)
        for _ in range(t.local_epochs):
            for idx in batches(len(data), t.batch_size, t.drop_last, generator):
                loss = F.cross_entropy(model(data.x[idx].to(device)).logits, data.y[idx].to(device))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                loss_sum += loss.detach()
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        sizes.append(len(data))
    total = float(sum(sizes))
    out = {}
    for key, first in states[0].items():
        acc = torch.zeros_like(first, dtype=torch.float32)
        for state, n in zip(states, sizes):
            acc += state[key].float() * (n / total)
        out[key] = acc if first.is_floating_point() else acc.round().to(first.dtype)
    return out


def bare_run(config: RunConfig, fed: Federation) -> Callable[[], None]:
    """The floor: ``config.train.rounds`` FedAvg rounds of :func:`plain_round` over the clients the
    simulation backend samples, test accuracy whenever the run evaluates, on ``config.train.device``
    (batches moved there one at a time, as the backends move them)."""
    device = torch.device(config.train.device)
    initial = simulation.make_model(config, fed, resolve(config.algorithm, config.terms)).to(device).state_dict()
    model = build_model(config.model, fed.input_shape, fed.num_classes, fed.name).to(device)
    rounds, every = config.train.rounds, config.eval.every

    def run() -> None:
        state = initial
        for rnd in range(rounds):
            chosen = sample_clients(config.seed, rnd, len(fed.clients), config.train.participation)
            state = plain_round(model, state, fed, config, rnd, chosen)
            if fed.test is not None and ((rnd + 1) % every == 0 or rnd + 1 == rounds):
                model.load_state_dict(state)
                model.eval()
                with torch.no_grad():
                    (model(fed.test.x.to(device)).logits.argmax(1) == fed.test.y.to(device)).float().mean().item()
    return run


def cifar_shaped_npz(path: Path, clients: int, samples: int, classes: int = 10, seed: int = 0,
                     alpha: float | None = None, test: int = 0) -> Path:
    """Random CIFAR-shaped client arrays (3×32×32 float32) for ``data.dataset = "arrays"``: ``samples``
    per client, or with ``alpha`` ``clients × samples`` in all split by a Dirichlet(α) over labels
    (:func:`fedlatent.data.partition.dirichlet`); ``test`` test samples per client."""
    rng = np.random.default_rng(seed)
    image = lambda n: rng.standard_normal((n, 3, 32, 32), dtype=np.float32)  # noqa: E731
    label = lambda n: rng.integers(0, classes, n).astype(np.int64)  # noqa: E731
    pool = label(clients * samples)
    parts = (np.split(np.arange(clients * samples), clients) if alpha is None
             else dirichlet(pool, clients, alpha, seed=seed, min_size=2))
    arrays = {}
    for i, part in enumerate(parts):
        arrays[f"client{i}_train_x"], arrays[f"client{i}_train_y"] = image(len(part)), pool[part]
        if test:
            arrays[f"client{i}_test_x"], arrays[f"client{i}_test_y"] = image(test), label(test)
    np.savez(path, **arrays)
    return path


def workloads(quick: bool, scratch: Path, echo: Callable[[str], None] = print, device: str = "cpu") -> list[Workload]:
    """(a)-(c) always, (d) when its configuration and data are in the current folder (else a line
    to ``echo`` says why not); every run trains on ``device``."""
    on = f'train.device="{device}"'
    digits = ['data.dataset="digits"', 'data.partition="iid"', 'model.arch="mlp"', "model.hidden=[128]",
              "train.batch_size=32", "train.lr=0.05", "train.momentum=0.9", "eval.every=1", on]
    n, samples = (4, 100) if quick else (10, 200)
    npz = cifar_shaped_npz(scratch / "cifar_shaped.npz", n, samples, alpha=0.1, test=20)
    loads = [
        Workload("a", "digits MLP 64-128-10, 10 IID clients, 20 rounds, eval every round",
                 load_config(None, [*digits, "data.num_clients=10", "train.rounds=20"]), 3 if quick else 10),
        Workload("b", f"digits MLP, 100 IID clients, 50 % participation, {5 if quick else 20} rounds",
                 load_config(None, [*digits, "data.num_clients=100", "train.participation=0.5",
                                    f"train.rounds={5 if quick else 20}"]), 2 if quick else 5),
        Workload("c", f"small CNN, {n} clients x ~{samples} 3x32x32 random, Dirichlet 0.1, {1 if quick else 2} round(s)",
                 load_config(None, ['data.dataset="arrays"', f'data.path="{npz}"', 'data.partition="given"',
                                    'model.arch="cnn"', "train.batch_size=32", "train.lr=0.01", on,
                                    f"train.rounds={1 if quick else 2}"]), 1 if quick else 3),
    ]
    if not DITTO_RELEASE.is_file():
        echo(f"(d) skipped: {DITTO_RELEASE} not found (run from the repository root)")
        return loads
    ditto = load_config(DITTO_RELEASE, [on, *(["train.rounds=1", "train.local_epochs=1"] if quick else ["train.rounds=2"])])
    if not Path(ditto.data.path).is_file():
        echo(f"(d) skipped: its data file {ditto.data.path} is absent")
        return loads
    rounds = ditto.train.rounds
    return [*loads, Workload("d", f"Ditto + MK-MMD, release settings, Synthetic file, {rounds} round(s)",
                             ditto, 1, floor=False)]


def _side(config: RunConfig, backend: str, out: Path) -> Callable[[], None]:
    config = dataclasses.replace(config, backend=backend)

    def run() -> None:
        shutil.rmtree(out, ignore_errors=True)
        run_experiment(config, out, echo=None)
    return run


def _backends(config: RunConfig) -> list[str]:
    """simulation, and vectorized where the run trains in lockstep."""
    try:
        prepare(dataclasses.replace(config, backend="vectorized"))
    except ConfigError:
        return ["simulation"]
    return ["simulation", "vectorized"]


def flower_installed() -> bool:
    """Whether the flower extra (``flwr``) can be imported."""
    return importlib.util.find_spec("flwr") is not None


def measure(load: Workload, scratch: Path, reps: int | None = None,
            progress: Callable[[str], None] | None = None, flower: bool = False) -> dict[str, Any]:
    """Raw wall times of every side of one workload: ``{side: {"wall": ratios, "wall_abs": s}}``;
    ``flower``: also one run on Flower's simulation engine between two baseline runs."""
    sides = {b: _side(load.config, b, scratch / f"{load.name}-{b}") for b in _backends(load.config)}
    reps = reps or load.reps
    if load.floor:
        base: Callable[[], None] = bare_run(load.config, build_federation(load.config.data, load.config.data_seed))
        times = timing.bracketed(base, sides, reps, ("wall",), progress=progress)
        times[FLOOR] = times.pop(timing.BASELINE)
    else:
        base = sides.pop("simulation")
        times = timing.bracketed(base, sides, reps, ("wall",), warmup=0, progress=progress)
        times["simulation"] = times.pop(timing.BASELINE)
    if flower:
        import fedlatent.backends.flower.engine  # noqa: F401  (its imports are not the run's start-up)
        once = timing.bracketed(base, {FLOWER: _side(load.config, FLOWER, scratch / f"{load.name}-{FLOWER}")}, 1,
                                ("wall",), warmup=0)
        times[FLOWER] = once[FLOWER]
        times[FLOOR if load.floor else "simulation"]["wall_abs"] += once[timing.BASELINE]["wall_abs"]
        if progress:
            progress(f"{FLOWER}: {once[FLOWER]['wall_abs'][0]:.1f} s")
    return times


def rows(load: Workload, times: dict[str, Any]) -> list[list[Any]]:
    """Table rows of one workload: median seconds, median and min ratio to its baseline, and the
    median ratio to the simulation run."""
    base = FLOOR if load.floor else "simulation"
    sim = timing.median(times["simulation"]["wall_abs"])
    out = []
    for side in SIDES:
        if side not in times:
            continue
        seconds = timing.median(times[side]["wall_abs"])
        ratios = times[side]["wall"] if side != base else None
        out.append([f"({load.name})", side, seconds,
                    timing.median(ratios) if ratios else 1.0, min(ratios) if ratios else "",
                    seconds / sim])
    return out


def bench(*, quick: bool = False, reps: int | None = None, only: str = "abcd", json_path: str | None = None,
          echo: Callable[[str], None] = print, flower: bool | None = None, device: str = "cpu") -> str:
    """Measure the workloads named in ``only`` on ``device`` and return the table (raw timings to
    ``json_path``); ``flower`` (default: when installed and not ``quick``) adds Flower's simulation
    engine on :data:`FLOWER_WORKLOADS`."""
    if flower is None:
        flower = flower_installed() and not quick
        if quick and flower_installed():
            echo("flower: left out of --quick (its start-up alone is ~20 s a run)")
    with tempfile.TemporaryDirectory(prefix="fedlatent-bench-") as tmp:
        scratch = Path(tmp)
        chosen = [w for w in workloads(quick, scratch, echo, device) if w.name in only]
        results: dict[str, Any] = {"machine": timing.machine(device), "quick": quick, "workloads": {}}
        table_rows: list[list[Any]] = []
        for load in chosen:
            echo(f"({load.name}) {load.label}")
            with_flower = flower and load.name in FLOWER_WORKLOADS
            times = measure(load, scratch, reps, progress=lambda line: echo(f"    {line}"), flower=with_flower)
            results["workloads"][load.name] = {"label": load.label, "reps": reps or load.reps,
                                               "baseline": FLOOR if load.floor else "simulation", "times": times}
            table_rows += rows(load, times)
    text = timing.table(["workload", "side", "median s", "÷ baseline (median)", "÷ baseline (min)",
                         "÷ simulation"], table_rows)
    if any(row[1] == FLOWER for row in table_rows):
        text += (f"\n{FLOWER}: one run per workload (Ray's start-up ~20 s a run), between two baseline runs "
                 "that join the baseline's median; the other sides alternate every repetition.")
    timing.dump(json_path, results)
    return text
