"""``backend = "flower"``: a run on Flower's simulation engine, or on a deployment's grid.

Without a grid, :func:`run` starts Flower's simulation engine (``flwr.simulation.run_simulation``,
Ray backend) with ``flower.supernodes`` virtual SuperNodes (one per client by default) running
fedlatent's ClientApp, Ray given ``flower.cpus`` CPUs and each ClientApp ``flower.client_cpus``
(so ``cpus / client_cpus`` clients train at once); the ServerApp runs :func:`.server_app.serve` in
this process. With a grid (a ServerApp started by ``flwr run`` on a SuperLink) it serves on that
grid. Either way the server holds only its view of the data (the classes, input shape and clients
the configuration or the nodes' census tell; its own test split only with
``flower.server_reads_data``; each ClientApp builds its own clients' data) and the run directory is
the embedded backend's.
"""
from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedlatent.backends.flower import client_app
from fedlatent.backends.flower.server_app import serve
from fedlatent.config import RunConfig
from fedlatent.data.types import Outline, ServerView
from fedlatent.errors import ConfigError
from fedlatent.methods.parts import MethodSpec, Upload


def backend_config(config: RunConfig) -> dict[str, Any]:
    """The simulation engine's resources from ``[flower]``."""
    f = config.flower
    init: dict[str, Any] = {"logging_level": "error", "log_to_driver": True}
    if f.cpus:
        init["num_cpus"] = f.cpus
    return {"client_resources": {"num_cpus": f.client_cpus, "num_gpus": f.client_gpus}, "init_args": init}


def num_supernodes(config: RunConfig, data: ServerView) -> int:
    """``flower.supernodes``, at most one per client (one per client when unset); set, it is the
    only count where the clients' number comes from the data (the census tells it later)."""
    n, nodes = data.num_clients, config.flower.supernodes
    if n is None:
        if not nodes:
            raise ConfigError(f"flower.supernodes: set it (or data.num_clients): partition "
                              f"'{config.data.partition}' takes the number of clients from the data")
        return nodes
    return min(nodes, n) if nodes else n


# Ray's notice, at ray.init, that a default will change in a future Ray (whether it hides the GPUs
# from actors given none): it asks nothing of a fedlatent user, whose client_gpus set what a client sees
RAY_FUTURE_NOTICE = r"Tip: In future versions of Ray"


@contextmanager
def quiet_engine() -> Iterator[None]:
    """Silence what the simulation engine prints that tells a user nothing: Flower's per-message
    lines and run_simulation's deprecation notice (they would drown fedlatent's own; failures reach
    fedlatent's log lines and metrics) and Ray's :data:`RAY_FUTURE_NOTICE`; other warnings pass."""
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=RAY_FUTURE_NOTICE, category=FutureWarning)
            yield
    finally:
        flwr_logger.setLevel(level)


def run(config: RunConfig, data: ServerView, spec: MethodSpec, out: Path, *, resume: bool = False,
        progress: Callable[[dict[str, Any]], None] | None = None, grid: Grid | None = None,
        partition: Callable[[np.ndarray], None] | None = None,
        rounds_start: Callable[[], None] | None = None,
        check: Callable[[Outline], None] | None = None,
        trace: Callable[[list[Upload]], None] | None = None) -> tuple[dict[str, Any], float]:
    """Train as :func:`fedlatent.backends.simulation.run` does, through Flower: on ``grid`` when
    given, else on the simulation engine; return the final evaluation and the wall seconds.
    ``partition`` is told the nodes' training samples per client × class, ``check`` what the census
    found, ``rounds_start`` when the rounds start and ``trace`` each round's uploads (:func:`.server_app.serve`)."""
    if grid is not None:
        return serve(grid, config, data, spec, out, resume=resume, progress=progress, partition=partition,
                     rounds_start=rounds_start, check=check, trace=trace)
    result: dict[str, Any] = {}
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        result["value"] = serve(grid, config, data, spec, out, resume=resume, progress=progress, partition=partition,
                                rounds_start=rounds_start, check=check, trace=trace)

    with quiet_engine():
        run_simulation(server_app, client_app.app, num_supernodes=num_supernodes(config, data),
                       backend_config=backend_config(config))
    if "value" not in result:
        raise RuntimeError("Flower's simulation engine ended before the run finished (see its log above)")
    return result["value"]
