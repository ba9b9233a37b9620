"""A study on a Ray cluster (``fedlatent sweep|reproduce --cluster ray[:ADDRESS]``): each unit (a cell,
or a stack of cells) is a Ray task that declares its resources, and Ray places it on a node that has them.

The task runs the function ``--jobs`` workers run (:func:`~fedlatent.experiment.studies.units.run_unit`)
on the study folder itself, which must lie on storage every node shares at the same path (NFS, a
cluster file system): a cell's run folder, checkpoints included, is written where the driver reads
it, so the sweep's progress lines, heartbeat, tables and resume are those of ``--jobs``. Each task
first checks that it sees the study's ``cluster.json`` token (written by the driver), so a node
without the shared folder fails its cells with one line instead of writing elsewhere, and appends a
line to the cell's ``placement.jsonl``: the node, the host, the GPUs Ray gave it, and the newest
checkpoint the attempt starts from.

Faults: a task whose node (or worker process) dies is retried by Ray on another node up to
:data:`RETRIES` times; it resumes from the cell's last checkpoint, which survives on the shared
storage, and gives the uninterrupted run's numbers. A cell that fails on its own (bad input,
divergence) returns its error line as under ``--jobs``: never retried. The sweep keeps one row per
cell, so a retried cell is counted once. A driver stopped and started again resumes the study as
``--jobs`` does (finished cells skipped, unfinished ones continued from their checkpoints).

``ray`` is imported only here, and only when ``--cluster`` is given (the ``cluster`` extra).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
import socket
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fedlatent.config import RunConfig
from fedlatent.errors import UserInputError
from fedlatent.experiment.studies import units
from fedlatent.experiment.studies.placement import PLACEABLE, cuda_count, settle
from fedlatent.experiment.studies.study import Study

EXTRA = "fedlatent[cluster]"
RETRIES = 3  # times Ray starts a task again after its node or worker process died
TOKEN = "cluster.json"  # in the study folder: the driver's token, which every task must see
PLACEMENT = "placement.jsonl"  # in a cell's run folder: one line per attempt, where it ran
UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


@dataclass(frozen=True)
class Resources:
    """What one unit asks of a node: CPUs, GPUs (a fraction shares one), memory in bytes (None: no claim)."""

    cpus: float
    gpus: float
    memory: int | None = None

    def ray_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": self.cpus, "num_gpus": self.gpus}
        if self.memory:
            options["memory"] = self.memory
        return options

    def __str__(self) -> str:
        memory = f", memory={self.memory / 2**30:.3g}GiB" if self.memory else ""
        return f"cpus={self.cpus:g}, gpus={self.gpus:g}{memory}"


def parse_address(text: str) -> str:
    """``--cluster``'s value → the address ``ray.init`` takes: ``ray`` a new Ray instance on this
    machine (``local``), ``ray:auto`` the cluster this machine belongs to, ``ray:HOST:PORT`` a head
    node's GCS, ``ray:ray://HOST:PORT`` a Ray client server."""
    kind, sep, address = text.partition(":")
    if kind != "ray" or (sep and not address):
        raise UserInputError(f"--cluster {text}: expected ray (a Ray instance started on this machine), ray:auto "
                             f"(the running cluster) or ray:HOST:PORT (a head node's address)")
    return address or "local"


def parse_resources(text: str | None) -> dict[str, float]:
    """``--cell-resources cpus=2,gpus=0.5,memory=8GiB`` → the keys given (each cell's or stack's claim)."""
    given: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, _, value = item.partition("=")
        key = key.strip()
        match = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", value)
        if key not in ("cpus", "gpus", "memory") or not match or (key != "memory" and match.group(2)) \
                or match.group(2) not in UNITS:
            raise UserInputError(f"--cell-resources {item.strip()}: expected cpus=N, gpus=N (a fraction shares "
                                 f"a GPU) or memory=N[KB|MB|GB|KiB|MiB|GiB]")
        try:
            number = float(match.group(1)) * UNITS[match.group(2)]
        except ValueError:
            raise UserInputError(f"--cell-resources {item.strip()}: {match.group(1)} is not a number") from None
        if number <= 0 and key != "gpus":
            raise UserInputError(f"--cell-resources {item.strip()}: must be positive")
        given[key] = number
    return given


def resources(configs: list[RunConfig], given: dict[str, float]) -> Resources:
    """A unit's claim: ``given`` keys, else as many CPUs as its cells' ``train.threads`` and one GPU
    for cells on ``cuda`` (none on the CPU, whatever ``gpus`` says)."""
    on_gpu = any(c.train.device.split(":")[0] == "cuda" for c in configs)
    cpus = given.get("cpus", max(c.train.threads for c in configs))
    gpus = given.get("gpus", 1.0) if on_gpu else 0.0
    memory = given.get("memory")
    return Resources(cpus, gpus, int(memory) if memory else None)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserInputError(f"--cluster: Ray is not installed here; install the extra: pip install '{EXTRA}'") from None
    return ray


def _reachable(address: str) -> str | None:
    """Why a HOST:PORT (or ray://HOST:PORT) address cannot be reached within 5 s, or None."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return None  # not HOST:PORT ("auto", "local"): ray.init says
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        return f"nothing answers at {host}:{port} ({err.strerror or err})"
    return None


class Cluster:
    """``--cluster``: the Ray cluster a study runs on, connected when the study is admitted
    (:meth:`admit`), before its folder exists; :meth:`executor` runs its units there."""

    def __init__(self, text: str, cell_resources: str | None = None, **init: Any) -> None:
        self.text, self.address = text, parse_address(text)
        self.given = parse_resources(cell_resources)
        self.init = init  # extra ray.init arguments (a local instance's num_cpus, ...)
        self.ray = _ray()
        self.started = False

    def connect(self) -> None:
        """Join the cluster (or start the local instance) once; an address nobody answers is bad input."""
        ray = self.ray
        if ray.is_initialized():
            return
        why = _reachable(self.address)
        if why:
            raise UserInputError(f"--cluster {self.text}: {why}")
        try:
            # Ray's own INFO lines ("Connecting to existing Ray cluster ...") kept off the terminal: the
            # study's progress lines and a refusal's one line are the driver's output
            ray.init(address=self.address, **{"logging_level": logging.WARNING, **self.init})
        except Exception as err:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise UserInputError(f"--cluster {self.text}: cannot join the cluster ({first})") from None
        self.started = True

    def nodes(self) -> list[dict[str, float]]:
        """The alive nodes' resources (``CPU``, ``GPU``, ``memory``, ...)."""
        return [n["Resources"] for n in self.ray.nodes() if n.get("Alive")]

    def admit(self, configs: list[RunConfig], jobs: int = 1) -> None:
        """Refuse, before any folder exists, what the cluster cannot run: ``--jobs`` (Ray decides how
        many cells run at once), cells on Flower (its engine runs Ray itself), a numbered CUDA device
        (a device of one machine), a unit's resources that no alive node has."""
        if jobs > 1:
            raise UserInputError(f"--jobs {jobs} with --cluster: on a cluster the cells' resources decide how many "
                                 f"run at once (--cell-resources); leave out --jobs")
        for config in configs:
            if config.backend == "flower":
                raise UserInputError("--cluster: a cell with backend = 'flower' runs Flower's own engine (Ray "
                                     "inside); run its study with --jobs")
            if config.train.device.startswith("cuda:"):
                raise UserInputError(f"--cluster: train.device = {config.train.device!r} names a device of one machine; "
                                     f"give {PLACEABLE!r} and Ray gives each cell its GPU")
            if config.train.device == PLACEABLE and resources([config], self.given).gpus == 0:
                raise UserInputError("--cell-resources gpus=0: cells on 'cuda' would see no GPU; give a share (gpus=0.5)")
        self.connect()
        nodes = self.nodes()
        for claim in sorted({resources([c], self.given) for c in configs}, key=str):
            if not any(fits(claim, node) for node in nodes):
                self.close()
                have = "; ".join(_node(node) for node in nodes) or "none alive"
                raise UserInputError(f"--cell-resources {claim}: no node of the cluster has that much (nodes: {have})")

    def driver_view(self, study: Study) -> Study:
        """:func:`driver_view`: what this driver can validate of the study."""
        return driver_view(study)

    def executor(self, out: Path, echo: Callable[[str], None] | None) -> RayExecutor:
        """Run the study in ``out`` (on shared storage) on the cluster; ``echo`` is told where."""
        self.connect()
        token = uuid.uuid4().hex
        (out / TOKEN).write_text(json.dumps({"token": token, "cluster": self.text}) + "\n")
        if echo:
            nodes = self.nodes()
            echo(f"Ray cluster {self.address}: {len(nodes)} node(s), {sum(n.get('CPU', 0) for n in nodes):g} CPUs, "
                 f"{sum(n.get('GPU', 0) for n in nodes):g} GPUs; a cell asks {resources_text(self.given)}")
        return RayExecutor(self, out / TOKEN, token)

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()
            self.started = False


def driver_view(study: Study) -> Study:
    """The study as a driver without a CUDA device validates it before a cluster runs it: its cells on
    ``cuda`` checked on the CPU (their shape, keys, data), since their GPUs are the nodes'; what only
    the node's device can tell (bfloat16 support, compilation) its run checks there, a refusal
    failing the cell in one line. A driver with CUDA validates the cells as they are."""
    if cuda_count() > 0:
        return study
    on_cpu = lambda c: dataclasses.replace(c.config, train=dataclasses.replace(c.config.train, device="cpu"))  # noqa: E731
    return dataclasses.replace(study, cells=[dataclasses.replace(c, config=on_cpu(c)) if c.config.train.device
                                             .split(":")[0] == "cuda" else c for c in study.cells])


def fits(claim: Resources, node: dict[str, float]) -> bool:
    """Whether a node's total resources hold one unit's claim."""
    return node.get("CPU", 0) >= claim.cpus and node.get("GPU", 0) >= claim.gpus \
        and (claim.memory is None or node.get("memory", 0) >= claim.memory)


def _node(node: dict[str, float]) -> str:
    return f"{node.get('CPU', 0):g} CPUs, {node.get('GPU', 0):g} GPUs, {node.get('memory', 0) / 2**30:.3g} GiB"


def resources_text(given: dict[str, float]) -> str:
    """What a cell asks, as ``--cell-resources`` or its defaults say."""
    cpus = f"cpus={given['cpus']:g}" if "cpus" in given else "cpus=train.threads"
    gpus = f"gpus={given.get('gpus', 1):g} on cuda"
    return ", ".join([cpus, gpus] + ([f"memory={given['memory'] / 2**30:.3g}GiB"] if "memory" in given else []))


class RayExecutor:
    """Each unit a Ray task with its :class:`Resources`, all submitted at once (Ray queues what does not
    fit yet); a task lost with its node is retried by Ray (:data:`RETRIES`)."""

    def __init__(self, cluster: Cluster, token_file: Path, token: str) -> None:
        self.cluster, self.token_file, self.token = cluster, token_file, token
        self.task = cluster.ray.remote(max_retries=RETRIES, retry_exceptions=False)(run_task)
        self.sizes: dict[Future, int] = {}

    def room(self, running: int) -> bool:
        return True

    def submit(self, configs: list[RunConfig], outs: list[str], figures: bool) -> Future:
        claim = resources(configs, self.cluster.given)
        ref = self.task.options(**claim.ray_options()).remote(configs, outs, figures, str(self.token_file), self.token)
        future = ref.future()
        self.sizes[future] = len(configs)
        return future

    def collect(self, future: Future) -> list[str]:
        size = self.sizes.pop(future)
        try:
            return future.result()
        except Exception as err:  # noqa: BLE001 - retries spent (node lost again and again), or a worker crash
            first = (str(err).strip().splitlines() or [""])[0]
            return [f"lost on the cluster after {RETRIES} retries: {type(err).__name__}: {first}"] * size

    def close(self) -> None:
        self.cluster.close()


def newest_checkpoint(out: Path) -> int:
    """The newest sealed checkpoint's round in a run folder (0: none; the attempt starts afresh)."""
    folders = [p for p in (out / "checkpoints").glob("round*") if (p / "manifest.json").is_file()] \
        if (out / "checkpoints").is_dir() else []
    return max((int(p.name[5:]) for p in folders if p.name[5:].isdigit()), default=0)


def run_task(configs: list[RunConfig], outs: list[str], figures: bool, token_file: str, token: str) -> list[str]:
    """One unit on whichever node Ray chose: check the shared study folder is here, record the
    placement, run the unit (:func:`~fedlatent.experiment.studies.units.run_unit`)."""
    import ray
    host = socket.gethostname()
    try:
        seen = json.loads(Path(token_file).read_text()).get("token")
    except (OSError, ValueError, AttributeError):
        seen = None
    if seen != token:
        return [f"the study folder {Path(token_file).parent} is not on node {host}'s storage: --cluster needs it "
                f"on storage every node shares, at the same path"] * len(configs)
    context = ray.get_runtime_context()
    for config, out in zip(configs, outs):
        folder = Path(out)
        settle(config, folder)  # started on a numbered device under --jobs: continues on the one Ray gave
        folder.mkdir(parents=True, exist_ok=True)
        line = {"node": context.get_node_id(), "host": host, "gpus": [str(g) for g in ray.get_gpu_ids()],
                "device": config.train.device, "from_checkpoint_round": newest_checkpoint(folder)}
        with (folder / PLACEMENT).open("a") as f:
            f.write(json.dumps(line) + "\n")
    return units.run_unit(configs, outs, figures)
