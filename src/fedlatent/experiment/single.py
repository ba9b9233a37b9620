"""One run end to end: resolve the method, build the federation, hand the loop to a backend, and
write the run directory (config.toml, partition table, metrics.jsonl, summary.json, plots/)."""
from __future__ import annotations

import json
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from fedlatent.analysis.tables import partition_table
from fedlatent.backends import simulation, vectorized
from fedlatent.config import RunConfig, to_toml
from fedlatent.data.federation import build_federation, counts_table
from fedlatent.data.types import Federation
from fedlatent.errors import ConfigError
from fedlatent.experiment.figures import FigureWorker
from fedlatent.methods import resolve, resolved_keys
from fedlatent.methods.parts import MethodSpec

BACKENDS = {"simulation": simulation.run, "vectorized": vectorized.run}


def fedlatent_version() -> str:
    try:
        return version("fedlatent")
    except PackageNotFoundError:
        return "0+unknown"


def partition_tag(config: RunConfig) -> str:
    """The partition in a few characters: ``iid``, ``dirichlet0.05``, ``shards2``, ``given``."""
    d = config.data
    return {"dirichlet": f"dirichlet{d.alpha:g}", "shards": f"shards{d.classes_per_client}"}.get(d.partition, d.partition)


def default_out(config: RunConfig) -> Path:
    """``runs/<dataset>-<partition>-<algorithm>-seed<seed>``, e.g. ``runs/digits-dirichlet0.05-fedavg-seed0``."""
    return Path("runs") / f"{config.data.dataset}-{partition_tag(config)}-{config.algorithm['name']}-seed{config.seed}"


def identity(config: RunConfig) -> dict[str, Any]:
    """What identifies a run beside its seed: the partition's keys and the method's resolved keys."""
    d = config.data
    return {"partition": {"dataset": d.dataset, "partition": d.partition, "alpha": d.alpha,
                          "num_clients": d.num_clients, "classes_per_client": d.classes_per_client,
                          "data_seed": config.data_seed},
            "method": resolved_keys(config.algorithm, config.terms)}


def prepare(config: RunConfig) -> tuple[Federation, MethodSpec]:
    """Resolve the method first (cheap, catches typos), then build the federation."""
    spec = resolve(config.algorithm, config.terms)
    if config.backend not in BACKENDS:
        raise ConfigError(f"backend = '{config.backend}': not available in this version; "
                          f"use {' or '.join(repr(b) for b in BACKENDS)}")
    federation = build_federation(config.data, config.data_seed)
    if config.backend == "vectorized":
        vectorized.check(config, federation, spec)
    return federation, spec


def write_partition(federation: Federation, out: Path) -> str:
    counts = counts_table(federation)
    table = partition_table(counts)
    (out / "partition.txt").write_text(table + "\n")
    (out / "partition.json").write_text(json.dumps({"counts": counts.tolist()}))
    return table


def run(config: RunConfig, out: str | Path | None = None, *, resume: bool = False, progress: bool = False,
        echo=print, figures_in_background: bool = True) -> dict[str, Any]:
    """Run ``config`` and return the summary (the content of ``summary.json``); the figures are
    drawn by a child process while the run trains (``figures_in_background=False``: in-process)."""
    started = time.perf_counter()
    out = Path(out) if out is not None else default_out(config)
    federation, spec = prepare(config)
    if (out / "checkpoints").exists() and not resume:
        raise ConfigError(f"--out {out}: holds a run already; pass --resume to continue it or choose another --out")
    if resume and (out / "config.toml").exists() and (out / "config.toml").read_text() != to_toml(config):
        raise ConfigError(f"--resume: the configuration differs from the one in {out / 'config.toml'}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.toml").write_text(to_toml(config))
    table = write_partition(federation, out)
    figures = FigureWorker(out, background=figures_in_background)
    figures.draw("partition", title=f"{federation.name}: samples per client and class")
    if echo:
        echo(f"partition ({config.data.partition}, {len(federation.clients)} clients):\n{table}")
    bar = _progress_bar(config) if progress else None
    backend_started = time.perf_counter()
    try:
        final, wall = BACKENDS[config.backend](config, federation, spec, out, resume=resume,
                                               progress=bar.update_line if bar else None)
    except BaseException:
        figures.close()  # the partition heatmap is kept; the child ends
        raise
    backend_seconds = time.perf_counter() - backend_started
    if bar:
        bar.close()
    figures.draw("curves")
    if config.diagnostics.which:
        figures.draw("diagnostics")
    metrics = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    summary = {"final": final, "rounds_completed": len(metrics), "seed": config.seed,
               "method": spec.name, "dataset": config.data.dataset, "identity": identity(config),
               "wall_seconds": wall + time.perf_counter() - started - backend_seconds,
               "fedlatent_version": fedlatent_version()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    figures.close()
    return summary


class _Bar:
    """A tqdm bar over rounds showing the latest loss and accuracy."""

    def __init__(self, total: int, desc: str) -> None:
        from tqdm.auto import tqdm
        self.bar = tqdm(total=total, desc=desc, unit="round", dynamic_ncols=True)

    def update_line(self, line: dict[str, Any]) -> None:
        self.bar.n = line["round"]
        shown = {"loss": f"{line['train_loss']:.3f}"}
        if "test_accuracy" in line:
            shown["acc"] = f"{line['test_accuracy']:.3f}"
        self.bar.set_postfix(shown)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def _progress_bar(config: RunConfig) -> _Bar:
    return _Bar(config.train.rounds, f"{config.algorithm['name']} on {config.data.dataset}")
