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

The client states are a log of *segments*: a segment holds the states of the clients one write
changed, in files ``clients.roundRRRRR.P.safetensors`` (written by round R's checkpoint, part P of
at most :data:`PART` clients; keys ``{client}/{name}``, and the changed clients whose state became
empty listed in the header's metadata, ``empty``), and a folder's client states are its segments
applied in order — the latest segment holding a client gives that client's whole state. A write
hard-links the previous folder's segments (no byte written, their checksums carried over) and adds
one segment of exactly the states changed since (none when no state changed), so that with 100,000
clients and a cohort of 100 a checkpoint writes the cohort's states. The first write of a process
(a fresh or a resumed run: nothing to link from) writes the full set as one segment, its *base*,
and so does a *compacting* write: when the bytes of the states the folder's segments hold but later
ones superseded would exceed the live states' bytes, or the folder would hold more than
:data:`SEGMENTS` segments. Amortised, a checkpoint writes at most twice the changed states (a
compaction writes the live set L once the superseded bytes exceed L, and each superseded byte was
first written by an earlier write, when a client's state keeps its size), as long as a cohort's
states are at least L / :data:`SEGMENTS` (100 states of 100,000: else the segment bound compacts,
every :data:`SEGMENTS` writes); a folder's segments hold at most about twice the live bytes. Every
folder still holds the full set, checksummed, and a removed older folder takes none of its files
from a newer one (a hard link keeps the file for the folder still naming it). A folder of an older
fedlatent version (shard files ``clients.safetensors``, ``clients.K.safetensors``: disjoint
clients) reads as one segment.

States in a :class:`~fedlatent.federated.client_states.ClientStates` store (a memory budget, most
of them on disk) are checkpointed by :meth:`Checkpoints.save_stored`, the same log: a write holds
the round's changed states (copies) and never reads the store, which the next round changes
meanwhile; a compacting one streams the live set from the previous folder's segments (one tensor's
bytes at a time) and those changes, and the first write of a process streams it from the store,
one client's state at a time.

A run's loop goes through :class:`Checkpoints`, which takes the first step every round and the
second at most every :data:`CHECKPOINT_SECONDS` of wall time, after the last round, and on any
way out of the loop that Python sees (a stop, an exception, Ctrl-C): only a hard kill loses
rounds, at most that many seconds of them, and a resume reruns them with the same numbers.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

import torch
from safetensors.torch import load_file, save

from fedlatent.federated.background import BackgroundWriter
from fedlatent.federated.client_states import ClientStates, state_bytes
from fedlatent.methods.parts import Tensors

MANIFEST = "manifest.json"
KEEP = 2  # sealed rounds kept: the newest may be damaged on disk, the one before is the fallback
CHECKPOINT_SECONDS = 1.0  # the most wall time between two checkpoint writes while a run trains
PART = 10_000  # the most clients in one file of a segment (its safetensors header stays a few MB)
SEGMENTS = 1000  # the most segments in a folder: the next write compacts (a resume reads them all)

Entry = tuple[str, str, list[int], int]  # a tensor of a client's state: its name, dtype (safetensors'), shape, bytes
Row = tuple[int, list[Entry], Callable[[], Iterable[bytes]]]  # a client, its state's tensors, their bytes in order
Data = TypeVar("Data")  # a file's content: its bytes, or their pieces


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


def segment_name(rnd: int, part: int = 0) -> str:
    """Part ``part`` of the segment of client states written by round ``rnd``'s checkpoint."""
    return f"clients.round{rnd:05d}.{part}.safetensors"


def is_client_file(name: str) -> bool:
    """Whether ``name`` is a file of client states: a segment's part, or an older version's shard."""
    return name.startswith("clients") and name.endswith(".safetensors")


def _client_order(name: str) -> tuple[int, int]:
    """A file of client states' place in its folder's log: (round, part); an older version's shards
    (``clients.safetensors``, ``clients.K.safetensors``: disjoint clients) first."""
    middle = name.removeprefix("clients").removesuffix(".safetensors").strip(".")
    if middle.startswith("round"):
        rnd, _, part = middle.removeprefix("round").partition(".")
        return int(rnd), int(part)
    return -1, int(middle) if middle else 0


def encode_checkpoint(*, global_state: Tensors, server_state: Tensors, client_states: list[Tensors],
                      info: dict[str, Any], changed: Iterable[int] | None = None) -> dict[str, bytes]:
    """The files of a checkpoint, serialized now: name -> content; of the client states one segment
    (round ``info['round']``'s): every client's state (None: a base), or only the ``changed`` ones'
    (none when there are none)."""
    return dict(_encoded({"global_state": global_state, "server_state": server_state, "info": info},
                         client_states, changed))


def _encoded(snapshot: dict[str, Any], client_states: list[Tensors], changed: Iterable[int] | None
             ) -> Iterator[tuple[str, bytes]]:
    """:func:`encode_checkpoint`'s files made one at a time (one file's bytes in memory)."""
    clients = range(len(client_states)) if changed is None else sorted(set(changed))
    rows = (_row(cid, client_states[cid]) for cid in clients if changed is not None or client_states[cid])
    for name, data in _files(snapshot, _segment(snapshot["info"]["round"], rows, base=changed is None)):
        yield name, data if isinstance(data, bytes) else b"".join(data)


def _safetensors(tensors: Tensors) -> bytes:
    return save({k: v.contiguous() for k, v in tensors.items()})


@functools.lru_cache(maxsize=None)
def _dtype_name(dtype: torch.dtype) -> str:
    """safetensors' name of ``dtype`` (``F32``), as its own writer spells it."""
    header = save({"x": torch.empty(0, dtype=dtype)})
    return json.loads(header[8:8 + int.from_bytes(header[:8], "little")])["x"]["dtype"]


def _bytes(value: torch.Tensor) -> bytes:
    return value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _stored_bytes(store: ClientStates, cid: int) -> Iterator[bytes]:
    return (_bytes(v) for v in store.stored(cid).values())


def _row(cid: int, state: Tensors) -> Row:
    """Client ``cid``'s ``state`` (in memory) as a segment's row."""
    entries = [(name, _dtype_name(v.dtype), list(v.shape), v.nbytes) for name, v in state.items()]
    return cid, entries, lambda: (_bytes(v) for v in state.values())


def _segment(rnd: int, rows: Iterable[Row], base: bool = False) -> Iterator[tuple[str, Iterator[bytes]]]:
    """Round ``rnd``'s segment of ``rows`` (a client with no tensors: listed as empty), streamed:
    its files of :data:`PART` clients each, a file's header made before its bytes are asked for;
    a ``base`` has a file even when no client holds a state (a folder always names one)."""
    part, rows = 0, iter(rows)
    while (chunk := list(itertools.islice(rows, PART))) or (base and part == 0):
        yield segment_name(rnd, part), _stream(chunk)
        part += 1


def _stream(rows: list[Row]) -> Iterator[bytes]:
    """One safetensors file of ``rows``: its header, then each client's tensors' bytes, one client at a time."""
    header: dict[str, Any] = {}
    offset, empty = 0, []
    for cid, entries, _ in rows:
        if not entries:
            empty.append(str(cid))
        for name, dtype, shape, size in entries:
            header[f"{cid}/{name}"] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
    if empty:
        header["__metadata__"] = {"empty": ",".join(empty)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    yield len(text).to_bytes(8, "little") + text
    for _, _, data in rows:
        yield from data()


def _files(snapshot: dict[str, Any], segment: Iterable[tuple[str, Iterator[bytes]]]
           ) -> Iterator[tuple[str, bytes | Iterator[bytes]]]:
    """A checkpoint's files, made one at a time: global, server, the client states' ``segment``, state.json."""
    yield "global.safetensors", _safetensors(snapshot["global_state"])
    yield "server.safetensors", _safetensors(snapshot["server_state"])
    yield from segment
    yield "state.json", json.dumps(snapshot["info"], indent=1).encode()


def write_file(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Write one file of a checkpoint, whole or in pieces (its own function: the crash tests stop a run inside it)."""
    if isinstance(data, bytes):
        path.write_bytes(data)
        return
    with path.open("wb") as f:
        for piece in data:
            f.write(piece)


def _hashed(data: Iterable[bytes], digest: Any) -> Iterator[bytes]:
    for piece in data:
        digest.update(piece)
        yield piece


def write_sealed(root: Path, rnd: int, files: dict[str, bytes] | Iterable[tuple[str, bytes | Iterable[bytes]]],
                 kept: dict[str, tuple[Path, str]] | None = None) -> Path:
    """Write ``files`` (name → bytes, or (name, bytes or their pieces) pairs made one at a time) into
    round ``rnd``'s folder, hard-link the ``kept`` ones (name → an earlier checkpoint's unchanged
    file and its checksum: no byte written) and seal it with their checksums (taken from the bytes
    written); then remove the folders of later rounds (left by a damaged newest checkpoint) and all
    but the :data:`KEEP` newest sealed ones."""
    folder = root / f"round{rnd:05d}"
    if folder.exists():
        _remove(folder)
    folder.mkdir(parents=True)
    sums = {}
    for name, data in files.items() if isinstance(files, dict) else files:
        digest = hashlib.sha256()
        if isinstance(data, bytes):
            write_file(folder / name, data)
            digest.update(data)
        else:
            write_file(folder / name, _hashed(data, digest))
        sums[name] = digest.hexdigest()
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


def _file_order(name: str) -> tuple[int, int, int]:
    """A checkpoint's files in the order the manifest lists them: global, server, the client
    states' files in their log's order, state.json."""
    if is_client_file(name):
        return (2, *_client_order(name))
    return ({"global.safetensors": 0, "server.safetensors": 1}.get(name, 3), 0, 0)


def now() -> float:
    """The clock :class:`Checkpoints` paces its writes by (its own function: tests replace it)."""
    return time.monotonic()


class Segments:
    """The client-state files of the writer's last folder, in their log's order, and the bytes of
    the states they hold: what the writer thread (or the first write, before it) keeps to link
    the next write's files and to decide when it compacts."""

    def __init__(self) -> None:
        self.files: list[str] = []
        self.count = 0  # segments (writes) among the files
        self.live: dict[int, int] = {}  # each client holding a state: its bytes
        self.live_bytes = 0
        self.total = 0  # bytes of every state the files hold, superseded ones included

    def compacts(self, sizes: dict[int, int | None]) -> bool:
        """Whether a write of the states of ``sizes`` (client → bytes, None: an emptied state) should
        rewrite the live set instead: superseded bytes above live ones, or one segment too many."""
        new = sum(size or 0 for size in sizes.values())
        live = self.live_bytes + new - sum(self.live.get(cid, 0) for cid in sizes)
        return self.total + new - live > live or (bool(sizes) and self.count >= SEGMENTS)

    def base(self, files: list[str], sizes: dict[int, int]) -> None:
        self.files, self.count, self.live = files, 1, dict(sizes)
        self.live_bytes = self.total = sum(sizes.values())

    def add(self, files: list[str], sizes: dict[int, int | None]) -> None:
        for cid, size in sizes.items():
            self.live_bytes -= self.live.pop(cid, 0)
            if size is not None:
                self.live[cid] = size
                self.live_bytes += size
                self.total += size
        self.files, self.count = self.files + files, self.count + bool(files)


def _sizes(changes: dict[int, Tensors]) -> dict[int, int | None]:
    return {cid: state_bytes(s) if s else None for cid, s in changes.items()}


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
        self.segments = Segments()  # the last write's client-state files (the writer thread's, once it has jobs)

    def save_stored(self, *, global_state: Tensors, server_state: Tensors, client_states: ClientStates,
                    info: dict[str, Any], last: bool = False, changed: Iterable[int] | None = None) -> None:
        """:meth:`save` of states held in a :class:`ClientStates` store (most of them on disk): the
        snapshot copies the ``changed`` clients' states alone (a round's cohort; required), and a
        write adds them as one segment to the previous write's, hard-linked, or compacts the live
        set from those files and these changes — it never reads the store, which the next round
        changes meanwhile. The first write of a process (no previous write: a fresh or resumed run)
        streams every state from the store, in this thread, before the next round starts."""
        if changed is None:
            raise ValueError("states in a ClientStates store are checkpointed with the clients each round changed")
        snapshot = {"global_state": _copy(global_state), "server_state": _copy(server_state), "info": dict(info)}
        if self.written is None:  # nothing was handed to the writer yet: no write to wait for
            files: list[str] = []
            sizes: dict[int, int] = {}

            def rows() -> Iterator[Row]:
                for cid in range(len(client_states)):
                    if entries := [(n, _dtype_name(d), shape, size) for n, d, shape, size in client_states.described(cid)]:
                        sizes[cid] = sum(e[3] for e in entries)
                        yield cid, entries, functools.partial(_stored_bytes, client_states, cid)

            segment = _segment(info["round"], rows(), base=True)
            write_sealed(self.root, info["round"], _listed(_files(snapshot, segment), files))
            self.segments.base(files, sizes)
            self.written_at, self.written, self.changes = self.clock(), info["round"], {}
            return
        for cid in changed:
            self.changes[cid] = _copy(client_states.stored(cid))  # type: ignore[index]
        self.pending = (info["round"], snapshot)
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
            self.writer.submit(_write_changes, self.root, rnd, snapshot, self.changes, self.written, self.segments)
            self.written_at, self.written, self.changes = self.clock(), rnd, {}
        elif self.pending is not None:
            (rnd, snapshot), self.pending = self.pending, None
            dirty = None if self.written is None else self.dirty
            self.writer.submit(_write_snapshot, self.root, rnd, snapshot, dirty, self.written, self.segments)
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


def _kept(root: Path, previous: int | None, segments: Segments) -> dict[str, tuple[Path, str]] | None:
    """The previous write's client-state files to link (name → file, checksum); None when that
    write's folder is not there to link from."""
    folder = root / f"round{previous:05d}"
    try:
        sums = json.loads((folder / MANIFEST).read_text())["sha256"]
        return {name: (folder / name, sums[name]) for name in segments.files}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_snapshot(root: Path, rnd: int, snapshot: dict[str, Any], dirty: set[int] | None,
                    previous: int | None, segments: Segments) -> None:
    """Write a snapshot: with ``dirty`` (the clients changed since round ``previous``'s write, this
    writer's last, sealed before this job runs), a segment of their states added to that write's
    files, hard-linked; without, or when it compacts, the full set as one segment (one file's bytes
    in memory at a time)."""
    clients, files = snapshot["client_states"], list[str]()
    kept = None if dirty is None or previous is None else _kept(root, previous, segments)
    changes = {c: clients[c] for c in sorted(dirty or ()) if clients[c] or c in segments.live} if kept is not None else {}
    if kept is None or segments.compacts(_sizes(changes)):
        write_sealed(root, rnd, _listed(_encoded(snapshot, clients, None), files))
        segments.base(files, {cid: state_bytes(s) for cid, s in enumerate(clients) if s})
    else:
        write_sealed(root, rnd, _listed(_encoded(snapshot, clients, changes), files), kept)
        segments.add(files, _sizes(changes))


def _listed(files: Iterable[tuple[str, Data]], names: list[str]) -> Iterator[tuple[str, Data]]:
    """``files``, the names of those of client states kept in ``names`` as they are made."""
    for name, data in files:
        if is_client_file(name):
            names.append(name)
        yield name, data


def _header(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's header and where its data begins."""
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(size)), 8 + size


def _empty(header: dict[str, Any]) -> list[int]:
    listed = header.get("__metadata__", {}).get("empty", "")
    return [int(cid) for cid in listed.split(",")] if listed else []


def _live_rows(folder: Path, files: list[str], changes: dict[int, Tensors]) -> Iterator[Row]:
    """The live set of ``folder``'s client-state ``files`` (in their log's order) updated by
    ``changes``: each client's state from the latest file holding it, read one tensor at a time."""
    latest: dict[int, tuple[Path, int, list[tuple[str, str, list[int], list[int]]]]] = {}
    for name in files:
        header, start = _header(folder / name)
        held: dict[int, list[tuple[str, str, list[int], list[int]]]] = {}
        for key, entry in header.items():
            if key != "__metadata__":
                client, _, tensor = key.partition("/")
                held.setdefault(int(client), []).append((tensor, entry["dtype"], entry["shape"], entry["data_offsets"]))
        for cid in _empty(header):
            latest.pop(cid, None)
        latest.update({cid: (folder / name, start, entries) for cid, entries in held.items()})

    def read(path: Path, start: int, entries: list[tuple[str, str, list[int], list[int]]]) -> Iterator[bytes]:
        with path.open("rb") as f:
            for *_, (begin, end) in entries:
                f.seek(start + begin)
                yield f.read(end - begin)

    for cid in sorted(set(latest) | set(changes)):
        if cid in changes:
            if changes[cid]:
                yield _row(cid, changes[cid])
        else:
            path, start, entries = latest[cid]
            yield cid, [(n, d, s, e - b) for n, d, s, (b, e) in entries], functools.partial(read, path, start, entries)


def _write_changes(root: Path, rnd: int, snapshot: dict[str, Any], changes: dict[int, Tensors], previous: int,
                   segments: Segments) -> None:
    """Write a store's snapshot: a segment of ``changes`` (the states changed since round
    ``previous``'s write, this writer's last, sealed before this job runs) added to that write's
    files, hard-linked; or, when it compacts, the live set streamed from those files and the changes."""
    folder = root / f"round{previous:05d}"
    sums = json.loads((folder / MANIFEST).read_text())["sha256"]
    changes = {cid: s for cid, s in changes.items() if s or cid in segments.live}
    sizes, files = _sizes(changes), list[str]()
    if segments.compacts(sizes):
        rows = _live_rows(folder, segments.files, changes)
        write_sealed(root, rnd, _listed(_files(snapshot, _segment(rnd, rows, base=True)), files))
        live = {**segments.live, **{cid: size for cid, size in sizes.items() if size is not None}}
        segments.base(files, {cid: size for cid, size in live.items() if sizes.get(cid, 0) is not None})
    else:
        kept = {name: (folder / name, sums[name]) for name in segments.files}
        rows = (_row(cid, state) for cid, state in sorted(changes.items()))
        write_sealed(root, rnd, _listed(_files(snapshot, _segment(rnd, rows)), files), kept)
        segments.add(files, sizes)


def verify(folder: Path) -> str | None:
    """Why ``folder`` is not a usable checkpoint (one phrase), or None when it is intact."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        checksums = manifest["sha256"]
    except FileNotFoundError:
        return "incomplete (no manifest: its write was interrupted)"
    except (OSError, ValueError, KeyError, TypeError):
        return f"{MANIFEST} is unreadable"
    if not any(is_client_file(name) for name in checksums):
        return f"{MANIFEST} lists no file of client states"
    for name in ("global.safetensors", "server.safetensors", "state.json", *checksums):
        if name not in checksums:
            return f"{MANIFEST} lists no checksum for {name}"
        if not (folder / name).is_file():
            return f"{name} is missing"
        if sha256(folder / name) != checksums[name]:
            return f"{name} does not match its checksum"
    return None


def client_files(folder: Path) -> list[str]:
    """A sealed folder's files of client states, in their log's order (its manifest's)."""
    names = json.loads((folder / MANIFEST).read_text())["sha256"]
    return sorted((name for name in names if is_client_file(name)), key=_client_order)


def read_client_files(folder: Path) -> Iterator[dict[int, Tensors]]:
    """The states each of ``folder``'s client-state files holds, one file at a time, in their log's
    order: client → its whole state (``{}``: it became empty); a later file's replaces an earlier's."""
    for name in client_files(folder):
        header, _ = _header(folder / name)
        read: dict[int, Tensors] = {cid: {} for cid in _empty(header)}
        for key, value in load_file(str(folder / name)).items():
            client, _, tensor = key.partition("/")
            read.setdefault(int(client), {})[tensor] = value
        yield read


def read_client_states(folder: Path) -> dict[int, Tensors]:
    """The full set of client states a sealed ``folder`` holds: client → state, for those holding one."""
    states: dict[int, Tensors] = {}
    for read in read_client_files(folder):
        states.update(read)
    return {cid: state for cid, state in sorted(states.items()) if state}


def client_tensors(folder: Path) -> Tensors:
    """A sealed ``folder``'s full set of client states as one flat dict, keys ``{client}/{name}``
    (what a reader of a run folder compares)."""
    return {f"{cid}/{name}": v for cid, state in read_client_states(folder).items() for name, v in state.items()}


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
            for read in read_client_files(folder):
                for cid, state in read.items():
                    if into is None:
                        clients[cid] = state
                    else:
                        into[cid] = state
            return (load_file(str(folder / "global.safetensors")), load_file(str(folder / "server.safetensors")),
                    clients if into is None else into, info)
        if warn is not None:
            warn(f"checkpoint {folder}: {problem}; trying the previous one")
    return None


def has_checkpoint(root: Path) -> bool:
    """Whether ``root`` holds any round folder (intact or not)."""
    return bool(round_folders(root))
