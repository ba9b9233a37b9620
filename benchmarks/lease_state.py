"""A device lease's state as a few files that the device tool brings back and carries into the next
lease: ``pack`` at the end of a lease, ``unpack`` at the start of the next (``benchmarks/gpu_lease.sh``
calls both; ``benchmarks/README.md``, "Resuming across leases").

The device tool returns at most 8 files of at most 16 MiB each, 64 MiB in all, at most two folders
below its ``$OUT``, and carries at most 64 MiB of ignored paths into the next call. A lease folder
holds far more (every run's two newest checkpoints, MOON's previous model per client in each), so
``pack`` keeps only what the next lease needs to continue exactly:

- every file of the lease folder but the checkpoints (configurations, metrics so far, summaries,
  figures, the sweeps' records, the throughput tables, the log);
- of an unfinished run (no ``summary.json``), its newest intact checkpoint alone (global model,
  server state, the clients' states where the method keeps them, ``state.json``, sealed by its
  manifest: :mod:`fedlatent.federated.state`); a finished run's checkpoints stay behind (its
  results travel, its final weights do not).

Safetensors files travel byte-shuffled (each tensor's bytes grouped by their place in the element:
float32's sign-and-exponent bytes compress well, its mantissa's do not; about 0.85 of the size
after deflate, against 0.93 unshuffled), everything in one gzip stream of tar archives — the lease's
own files first, then each step (``runs/<step>/``) in the order given — split into ``state.NN``
chunks beside ``index.json`` (the steps packed, their sizes, the stream's SHA-256). A step that does
not fit in what is left is left out, loudly: its name, what it needs, and the advice to run fewer
steps per lease; ``pack`` then exits 3 after writing the others. ``unpack`` checks the stream
against the index, restores every file byte for byte (a checkpoint's manifest verifies it again
when a run resumes) and refuses a pack with a chunk missing.

    python benchmarks/lease_state.py pack runs/lease $OUT/state [--steps feduv_a0.01 feddecorr]
    python benchmarks/lease_state.py unpack runs/lease-state runs/lease
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import struct
import sys
import tarfile
from pathlib import Path

import numpy as np

MIB = 1 << 20
FILES, FILE_MIB, TOTAL_MIB = 8, 16, 64  # the device tool's limits on the files it returns
INDEX = "index.json"
MARGIN = 4096  # bytes kept for the index
ITEMSIZE = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2}


class TooLarge(Exception):
    """A step's state does not fit in what the device tool returns."""


def shuffle(data: bytes, inverse: bool = False) -> bytes:
    """A safetensors file with each tensor's bytes grouped by their place in the element (byte 0 of
    every element, then byte 1, …), or back (``inverse``); the header as it is."""
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = np.frombuffer(data, np.uint8, offset=8 + length).copy()
    for name, entry in header.items():
        size = ITEMSIZE.get(entry["dtype"], 1) if name != "__metadata__" else 1
        begin, end = entry["data_offsets"] if name != "__metadata__" else (0, 0)
        if size > 1 and end > begin:
            grouped = body[begin:end].reshape((size, -1) if inverse else (-1, size))
            body[begin:end] = grouped.T.reshape(-1)
    return data[:8 + length] + body.tobytes()


def lease_files(out: Path) -> tuple[list[Path], dict[str, list[Path]]]:
    """The files the next lease needs (relative to ``out``): the lease's own, and each step's."""
    keep = _checkpoints_kept(out)
    own: list[Path] = []
    steps: dict[str, list[Path]] = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = path.relative_to(out)
        if "checkpoints" in rel.parts:  # a round folder's file, or latest.json (resuming does not read it)
            at = rel.parts.index("checkpoints")
            if len(rel.parts) < at + 3 or out.joinpath(*rel.parts[:at + 2]) not in keep:
                continue
        if len(rel.parts) > 2 and rel.parts[0] == "runs":
            steps.setdefault(rel.parts[1], []).append(rel)
        else:
            own.append(rel)
    return own, steps


def _checkpoints_kept(out: Path) -> set[Path]:
    """The newest intact checkpoint folder of each unfinished run under ``out``."""
    from fedlatent.federated.state import round_folders, verify
    kept = set()
    for root in out.rglob("checkpoints"):
        if not root.is_dir() or (root.parent / "summary.json").is_file():
            continue
        intact = next((f for f in round_folders(root) if verify(f) is None), None)
        if intact is not None:
            kept.add(intact)
    return kept


def _blob(out: Path, files: list[Path]) -> bytes:
    """``files`` of ``out`` as one gzip member of one tar archive (safetensors shuffled)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in files:
            data = (out / rel).read_bytes()
            if rel.suffix == ".safetensors":
                data = shuffle(data)
            info = tarfile.TarInfo(rel.as_posix())
            info.size, info.mtime = len(data), int((out / rel).stat().st_mtime)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=6, mtime=0)


def pack(out: Path, dest: Path, order: list[str], files: int = FILES, file_mib: float = FILE_MIB,
         total_mib: float = TOTAL_MIB) -> list[str]:
    """Pack ``out`` into ``dest`` (see the module's docstring); the steps left out (each with one
    line on stderr). ``order``: the steps first packed, in this order (the others after them)."""
    own, steps = lease_files(out)
    limit = min(total_mib * MIB, (files - 1) * file_mib * MIB) - MARGIN  # the index: one more file
    names = [s for s in order if s in steps] + sorted(s for s in steps if s not in order)
    stream, left_out = [_blob(out, own)], []
    packed = {"(lease)": len(stream[0])}
    if packed["(lease)"] > limit:
        raise TooLarge(f"the lease's own files need {packed['(lease)'] / MIB:.1f} MiB of {limit / MIB:.1f}")
    for name in names:
        blob = _blob(out, steps[name])
        used = sum(map(len, stream))
        if used + len(blob) > limit:
            left_out.append(name)
            advice = (f'run fewer steps per lease: STEPS="{name}" alone fits' if len(stream[0]) + len(blob) <= limit
                      else "it does not fit even alone: let it finish within one lease (a larger BUDGET), or keep "
                           "the lease folder on the device machine's side")
            print(f"lease state: step {name} LEFT OUT: it needs {len(blob) / MIB:.2f} MiB packed and "
                  f"{(limit - used) / MIB:.2f} MiB are left of the {total_mib:g} MiB the device tool returns, so its "
                  f"progress in this lease is lost to the next; {advice}", file=sys.stderr)
            continue
        stream.append(blob)
        packed[name] = len(blob)
    whole = b"".join(stream)
    chunk = int(file_mib * MIB)
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("state.*"):
        old.unlink()
    chunks = [f"state.{i:02d}" for i in range(max(1, -(-len(whole) // chunk)))]
    for i, name in enumerate(chunks):
        (dest / name).write_bytes(whole[i * chunk:(i + 1) * chunk])
    (dest / INDEX).write_text(json.dumps({"chunks": chunks, "bytes": len(whole), "sha256": hashlib.sha256(whole).hexdigest(),
                                          "packed": packed, "left_out": left_out}, indent=1))
    return left_out


def unpack(source: Path, out: Path) -> list[str]:
    """Restore the lease folder ``out`` from the pack in ``source``; the files written."""
    index = json.loads((source / INDEX).read_text())
    missing = [c for c in index["chunks"] if not (source / c).is_file()]
    if missing:
        raise ValueError(f"{source}: the pack lacks {', '.join(missing)} (bring back every file of the lease's state)")
    whole = b"".join((source / c).read_bytes() for c in index["chunks"])
    if len(whole) != index["bytes"] or hashlib.sha256(whole).hexdigest() != index["sha256"]:
        raise ValueError(f"{source}: the pack does not match its index (a chunk damaged or from another lease)")
    written = []
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(whole)), mode="r:", ignore_zeros=True) as tar:
        for member in tar:
            rel = Path(member.name)
            if rel.is_absolute() or ".." in rel.parts or not member.isfile():
                raise ValueError(f"{source}: unexpected entry {member.name!r}")
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            if rel.suffix == ".safetensors":
                data = shuffle(data, inverse=True)
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_bytes(data)
            written.append(member.name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("pack", help="pack a lease folder OUT into DEST")
    p.add_argument("out", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("--steps", nargs="*", default=[], help="the steps packed first, in this order")
    p.add_argument("--files", type=int, default=FILES)
    p.add_argument("--file-mib", type=float, default=FILE_MIB)
    p.add_argument("--total-mib", type=float, default=TOTAL_MIB)
    u = commands.add_parser("unpack", help="restore a lease folder OUT from the pack in SOURCE")
    u.add_argument("source", type=Path)
    u.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            left_out = pack(args.out, args.dest, args.steps, args.files, args.file_mib, args.total_mib)
            index = json.loads((args.dest / INDEX).read_text())
            print(f"lease state: {index['bytes'] / MIB:.1f} MiB in {len(index['chunks'])} file(s) under {args.dest} "
                  f"({', '.join(index['packed'])})")
            return 3 if left_out else 0
        written = unpack(args.source, args.out)
        print(f"lease state: {len(written)} files restored under {args.out} from {args.source}")
        return 0
    except (TooLarge, ValueError, FileNotFoundError) as err:
        print(f"lease state: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
