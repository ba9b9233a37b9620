"""Checkpointable run state: tensors in safetensors, everything else in JSON (never pickle).

A round's checkpoint goes into its own folder ``checkpoints/roundNNNNN/`` (global model, server
state, client states, ``state.json``) and is sealed by ``manifest.json``, written last and
atomically (temporary file, rename), which records the SHA-256 of every other file. A
folder without a manifest is an interrupted write; one whose files do not match their checksums is
damaged. The two newest sealed rounds are kept, so a kill -9 at any moment — inside a write or
while an old folder is being removed — leaves at least one checkpoint that :func:`load_checkpoint`
verifies and reads, and a resumed run continues exactly as the uninterrupted one would.
``latest.json`` names the newest sealed folder for readers of a finished run; resuming does not
trust it and verifies the manifests instead.

Nothing is fsynced: a killed process loses nothing the kernel has accepted, and a file torn by a
power loss fails its checksum, so resuming falls back to the older round. Six fsyncs a round
cost ~10 % of the digits workload's run time; on slow disks much more.

A checkpoint is taken in two steps: :func:`encode_checkpoint` serializes the state into bytes in
the caller's thread (a snapshot: the run may change its tensors right after), and
:func:`write_sealed` writes those bytes, hashing the same bytes in memory instead of reading the
files back. The second step needs nothing but the bytes, so a run hands it to a
:class:`~fedlatent.federated.background.BackgroundWriter`: on ext4 a round's folder creation,
renames and removal of the oldest folder wait ~7 ms on the journal, half the digits workload's
round, and this way they overlap the next round's training.

The client states are files of :data:`SHARD` clients each (``clients.safetensors`` the first, the
only one up to that many clients, ``clients.K.safetensors`` the K-th): a checkpoint writes the
files whose clients a round changed since the last write and hard-links the others from that
write's folder (no byte written; their checksums carried over), so that with 100,000 clients and a
cohort of 100 a checkpoint costs what the cohort's states cost; every folder still holds the full
set, checksummed, and a removed older folder takes none of its files from a newer one.

States in a :class:`~fedlatent.federated.client_states.ClientStates` store (a memory budget, most
of them on disk) are checkpointed by :meth:`Checkpoints.save_stored`: files of :data:`STORE_SHARD`
clients, a rewritten file's unchanged states taken from the previous write's file, so that a write
holds one file's states in memory and never reads the store, which the next round changes meanwhile.

A run's loop goes through :class:`Checkpoints`, which takes the first step every round and the
second at most every :data:`CHECKPOINT_SECONDS` of wall time, after the last round, and on any
way out of the loop that Python sees (a stop, an exception, Ctrl-C): only a hard kill loses
rounds, at most that many seconds of them, and a resume reruns them with the same numbers.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from safetensors.torch import load_file, save

from fedlatent.federated.background import BackgroundWriter
from fedlatent.federated.client_states import ClientStates
from fedlatent.methods.parts import Tensors

MANIFEST = "manifest.json"
KEEP = 2  # sealed rounds kept: the newest may be damaged on disk, the one before is the fallback
CHECKPOINT_SECONDS = 1.0  # the most wall time between two checkpoint writes while a run trains
SHARD = 1000  # clients per file of client states: a checkpoint rewrites only the files whose clients changed
STORE_SHARD = 100  # the same for states in a ClientStates store (its runs are those of many clients)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` so that a reader (or a crash) sees the old or the new file, whole."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def round_folders(root: Path) -> list[Path]:
    """The round folders under ``root``, newest first."""
    found = [p for p in root.glob("round*") if p.is_dir() and p.name[5:].isdigit()] if root.is_dir() else []
    return sorted(found, key=lambda p: int(p.name[5:]), reverse=True)


def _remove(folder: Path) -> None:
    """Unseal first, so that a folder half removed is never taken for a checkpoint."""
    (folder / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


def shard_name(shard: int) -> str:
    """The file of client states ``shard`` (clients ``shard·SHARD`` …): the first keeps today's name."""
    return "clients.safetensors" if shard == 0 else f"clients.{shard}.safetensors"


def shard_count(num_clients: int, shard: int = SHARD) -> int:
    return max(1, -(-num_clients // shard))


def encode_checkpoint(*, global_state: Tensors, server_state: Tensors, client_states: list[Tensors],
                      info: dict[str, Any], shards: Iterable[int] | None = None) -> dict[str, bytes]:
    """The files of a checkpoint, serialized now: name -> content; of the client states' files
    (:data:`SHARD` clients each, keys ``{client}/{name}``) only ``shards`` (None: all of them)."""
    count = shard_count(len(client_states))
    files = {"global.safetensors": _safetensors(global_state), "server.safetensors": _safetensors(server_state)}
    for k in range(count) if shards is None else sorted(set(shards)):
        files[shard_name(k)] = _safetensors({f"{i}/{n}": v for i in range(k * SHARD, min((k + 1) * SHARD,
                                                                                           len(client_states)))
                                             for n, v in client_states[i].items()})
    files["state.json"] = json.dumps(info, indent=1).encode()
    return files


def _safetensors(tensors: Tensors) -> bytes:
    return save({k: v.contiguous() for k, v in tensors.items()})


def write_file(path: Path, data: bytes) -> None:
    """Write one file of a checkpoint (its own function: the crash tests stop a run inside it)."""
    path.write_bytes(data)


def write_sealed(root: Path, rnd: int, files: dict[str, bytes] | Iterable[tuple[str, bytes]],
                 kept: dict[str, tuple[Path, str]] | None = None) -> Path:
    """Write ``files`` (name → bytes, or (name, bytes) pairs made one at a time) into round ``rnd``'s folder, hard-link the ``kept`` ones (name → an earlier
    checkpoint's unchanged file and its checksum: no byte written) and seal it with their checksums
    (taken from the bytes written); then remove the folders of later rounds (left by a damaged
    newest checkpoint) and all but the :data:`KEEP` newest sealed ones."""
    folder = root / f"round{rnd:05d}"
    if folder.exists():
        _remove(folder)
    folder.mkdir(parents=True)
    sums = {}
    for name, data in files.items() if isinstance(files, dict) else files:
        write_file(folder / name, data)
        sums[name] = hashlib.sha256(data).hexdigest()
    for name, (source, _) in (kept or {}).items():
        try:
            os.link(source, folder / name)
        except OSError:  # a file system without hard links: copied
            shutil.copyfile(source, folder / name)
    sums.update({name: digest for name, (_, digest) in (kept or {}).items()})
    checksums = {name: sums[name] for name in sorted(sums, key=_file_order)}
    write_atomically(folder / MANIFEST, json.dumps({"round": rnd, "sha256": checksums}, indent=1))
    write_atomically(root / "latest.json", json.dumps({"folder": folder.name}))
    sealed = 0
    for other in round_folders(root):
        if int(other.name[5:]) <= rnd and sealed < KEEP and (other / MANIFEST).is_file():
            sealed += 1
        else:
            _remove(other)
    return folder


def _file_order(name: str) -> tuple[int, int]:
    """A checkpoint's files in the order the manifest lists them: global, server, the client
    states' shards, state.json."""
    if name.startswith("clients"):
        middle = name.removeprefix("clients").removesuffix(".safetensors").strip(".")
        return (2, int(middle) if middle else 0)
    return ({"global.safetensors": 0, "server.safetensors": 1}.get(name, 3), 0)


def now() -> float:
    """The clock :class:`Checkpoints` paces its writes by (its own function: tests replace it)."""
    return time.monotonic()


class Checkpoints:
    """A run loop's checkpoints under ``root``: :meth:`save` snapshots the state after every round
    (a copy of its tensors: the run changes them in place in the next round) and hands the
    snapshot to a :class:`BackgroundWriter`, which encodes and writes it, when the last write is
    ``interval`` seconds old (:data:`CHECKPOINT_SECONDS` by default) or the round is the run's
    last; leaving the ``with`` block, however it is left, writes the snapshot still pending, so
    that a stop, an exception or Ctrl-C in round r leaves round r-1's checkpoint. Encoding and
    writing cost ~2.4 ms of CPU on the digits workload, about a round's training, and the copy a
    few microseconds a tensor, which is why a snapshot is copied every round and written only
    when due."""

    def __init__(self, root: Path, interval: float | None = None, clock: Callable[[], float] | None = None) -> None:
        self.root = root
        self.interval = CHECKPOINT_SECONDS if interval is None else interval
        self.clock = clock or now
        self.pending: tuple[int, dict[str, Any]] | None = None
        self.written_at = self.clock()
        self.writer = BackgroundWriter()
        self.copies: list[Tensors] | None = None  # the last snapshot's client states (never changed in place)
        self.dirty: set[int] | None = None  # the clients changed since the last write (None: every one)
        self.written: int | None = None  # the round of the last write handed to the writer
        self.changes: dict[int, Tensors] | None = None  # a store's states changed since the last write (copies)

    def save_stored(self, *, global_state: Tensors, server_state: Tensors, client_states: ClientStates,
                    info: dict[str, Any], last: bool = False, changed: Iterable[int] | None = None) -> None:
        """:meth:`save` of states held in a :class:`ClientStates` store (most of them on disk): the
        snapshot copies the ``changed`` clients' states alone (a round's cohort; required), and a
        write takes every other state from the previous write's files — those of the clients it
        changes rewritten, of :data:`STORE_SHARD` clients each, the others hard-linked — so that it
        never reads the store, which the next round changes meanwhile, and holds one file's states
        at a time. The first write of a process (no previous write: a fresh or resumed run) reads
        every state from the store, in this thread, before the next round starts."""
        if changed is None:
            raise ValueError("states in a ClientStates store are checkpointed with the clients each round changed")
        snapshot = {"global_state": _copy(global_state), "server_state": _copy(server_state), "info": dict(info)}
        count = len(client_states)
        if self.written is None:  # nothing was handed to the writer yet: no write to wait for
            write_sealed(self.root, info["round"], _stored_files(
                snapshot, range(shard_count(count, STORE_SHARD)),
                lambda k: ((i, client_states.stored(i)) for i in _shard_clients(k, count))))
            self.written_at, self.written, self.changes = self.clock(), info["round"], {}
            return
        for cid in changed:
            self.changes[cid] = _copy(client_states.stored(cid))  # type: ignore[index]
        self.pending = (info["round"], {**snapshot, "count": count})
        if last or self.clock() - self.written_at >= self.interval:
            self.flush()

    def save(self, *, global_state: Tensors, server_state: Tensors, client_states: list[Tensors] | ClientStates,
             info: dict[str, Any], last: bool = False, changed: Iterable[int] | None = None) -> None:
        """Snapshot the state after round ``info['round']``; write it if it is due or ``last``.
        ``changed``: the clients whose states the round replaced (None: any may have): only theirs are
        copied again, the others' copies shared with the previous snapshot (a round costs what its
        cohort costs, not what the federation's states do). States in a :class:`ClientStates` store:
        see :meth:`save_stored`."""
        if isinstance(client_states, ClientStates):
            self.save_stored(global_state=global_state, server_state=server_state, client_states=client_states,
                             info=info, last=last, changed=changed)
            return
        if changed is None or self.copies is None or len(self.copies) != len(client_states):
            copies = [_copy(c) for c in client_states]
            self.dirty = None
        else:
            copies = list(self.copies)
            for cid in changed:
                copies[cid] = _copy(client_states[cid])
            if self.dirty is not None:
                self.dirty.update(changed)
        self.copies = copies
        self.pending = (info["round"], {"global_state": _copy(global_state), "server_state": _copy(server_state),
                                        "client_states": copies, "info": dict(info)})
        if last or self.clock() - self.written_at >= self.interval:
            self.flush()

    def flush(self) -> None:
        """Hand the pending snapshot, if any, to the writer (which encodes it: the copy is its own)."""
        if self.pending is not None and self.changes is not None:
            (rnd, snapshot), self.pending = self.pending, None
            self.writer.submit(_write_changes, self.root, rnd, snapshot, self.changes, self.written)
            self.written_at, self.written, self.changes = self.clock(), rnd, {}
        elif self.pending is not None:
            (rnd, snapshot), self.pending = self.pending, None
            shards = None if self.dirty is None or self.written is None else {cid // SHARD for cid in self.dirty}
            self.writer.submit(_write_snapshot, self.root, rnd, snapshot, shards, self.written)
            self.written_at, self.written, self.dirty = self.clock(), rnd, set()

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: Any) -> None:
        """Write the pending snapshot and wait for the writes; on the way out with an exception,
        that exception is the one reported (a failed write is then left unsaid)."""
        try:
            self.flush()
        except Exception:
            if exc_type is None:
                raise
        finally:
            self.writer.__exit__(exc_type, *rest)


def _copy(tensors: Tensors) -> Tensors:
    return {k: v.detach().clone() for k, v in tensors.items()}


def _write_snapshot(root: Path, rnd: int, snapshot: dict[str, Any], shards: set[int] | None = None,
                    previous: int | None = None) -> None:
    """Write a snapshot; with ``shards``, only those client-state files, the others hard-linked from
    round ``previous``'s checkpoint (this writer's last, sealed before this job runs)."""
    kept: dict[str, tuple[Path, str]] = {}
    if shards is not None and previous is not None:
        folder = root / f"round{previous:05d}"
        try:
            sums = json.loads((folder / MANIFEST).read_text())["sha256"]
        except (OSError, ValueError, KeyError):
            shards = None  # the previous checkpoint is not there to link from: every file written
        else:
            kept = {shard_name(k): (folder / shard_name(k), sums[shard_name(k)])
                    for k in range(shard_count(len(snapshot["client_states"]))) if k not in shards}
    files = encode_checkpoint(**snapshot, shards=shards)
    if kept and shards is not None:
        write_sealed(root, rnd, files, kept)
    else:
        write_sealed(root, rnd, files)


def _stored_files(snapshot: dict[str, Any], shards: Iterable[int],
                  states: Callable[[int], Iterable[tuple[int, Tensors]]]) -> Iterator[tuple[str, bytes]]:
    """A checkpoint's files, made one at a time, of a store's clients: of their states' files
    (:data:`STORE_SHARD` clients each) only ``shards``, file k's (client, state) pairs ``states(k)``."""
    yield "global.safetensors", _safetensors(snapshot["global_state"])
    yield "server.safetensors", _safetensors(snapshot["server_state"])
    for k in shards:
        yield shard_name(k), _safetensors({f"{i}/{n}": v for i, state in states(k) for n, v in state.items()})
    yield "state.json", json.dumps(snapshot["info"], indent=1).encode()


def _shard_clients(k: int, count: int) -> range:
    return range(k * STORE_SHARD, min((k + 1) * STORE_SHARD, count))


def _write_changes(root: Path, rnd: int, snapshot: dict[str, Any], changes: dict[int, Tensors], previous: int) -> None:
    """Write a store's snapshot: the client-state files holding ``changes`` (the states changed since
    round ``previous``'s write, this writer's last, sealed before this job runs) rewritten from that
    write's file and those changes, the others hard-linked from it."""
    folder, count = root / f"round{previous:05d}", snapshot["count"]
    sums = json.loads((folder / MANIFEST).read_text())["sha256"]
    shards = sorted({cid // STORE_SHARD for cid in changes})
    kept = {shard_name(k): (folder / shard_name(k), sums[shard_name(k)])
            for k in sorted(set(range(shard_count(count, STORE_SHARD))) - set(shards))}

    def states(k: int) -> Iterator[tuple[int, Tensors]]:
        earlier: dict[int, Tensors] = {}
        for key, value in load_file(str(folder / shard_name(k))).items():
            client, _, name = key.partition("/")
            earlier.setdefault(int(client), {})[name] = value
        return ((i, changes[i] if i in changes else earlier.get(i, {})) for i in _shard_clients(k, count))

    write_sealed(root, rnd, _stored_files(snapshot, shards, states), kept)


def verify(folder: Path) -> str | None:
    """Why ``folder`` is not a usable checkpoint (one phrase), or None when it is intact."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        checksums = manifest["sha256"]
    except FileNotFoundError:
        return "incomplete (no manifest: its write was interrupted)"
    except (OSError, ValueError, KeyError, TypeError):
        return f"{MANIFEST} is unreadable"
    for name in ("global.safetensors", "server.safetensors", "clients.safetensors", "state.json", *checksums):
        if name not in checksums:
            return f"{MANIFEST} lists no checksum for {name}"
        if not (folder / name).is_file():
            return f"{name} is missing"
        if sha256(folder / name) != checksums[name]:
            return f"{name} does not match its checksum"
    return None


def load_checkpoint(root: Path, num_clients: int, warn=None, into: ClientStates | None = None
                    ) -> tuple[Tensors, Tensors, list[Tensors] | ClientStates, dict[str, Any]] | None:
    """Read the newest intact checkpoint under ``root`` (None when there is none). Each newer
    folder skipped is reported to ``warn`` in one line. ``into``: a store the client states are
    put in (one file's at a time, the store spilling them as its budget says), returned as they."""
    for folder in round_folders(root):
        problem = verify(folder)
        if problem is None:
            info = json.loads((folder / "state.json").read_text())
            clients: list[Tensors] = [{} for _ in range(num_clients)] if into is None else []
            names = json.loads((folder / MANIFEST).read_text())["sha256"]
            for shard in (name for name in names if name.startswith("clients")):
                read: dict[int, Tensors] = {}
                for key, value in load_file(str(folder / shard)).items():
                    client, _, name = key.partition("/")
                    (clients[int(client)] if into is None else read.setdefault(int(client), {}))[name] = value
                for cid, state in read.items():
                    into[cid] = state  # type: ignore[index]
            return (load_file(str(folder / "global.safetensors")), load_file(str(folder / "server.safetensors")),
                    clients if into is None else into, info)
        if warn is not None:
            warn(f"checkpoint {folder}: {problem}; trying the previous one")
    return None


def has_checkpoint(root: Path) -> bool:
    """Whether ``root`` holds any round folder (intact or not)."""
    return bool(round_folders(root))
