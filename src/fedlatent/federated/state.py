"""Checkpointable run state: tensors in safetensors, everything else in JSON (never pickle).

A checkpoint after round r holds the global model, the server state, every client's state and
the JSON bookkeeping; the round loop derives all randomness from (seed, round, client), so a
resumed run continues exactly as the uninterrupted one would.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from fedlatent.methods.parts import Tensors


def _save(tensors: Tensors, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    os.replace(tmp, path)


def save_checkpoint(root: Path, *, global_state: Tensors, server_state: Tensors,
                    client_states: list[Tensors], info: dict[str, Any]) -> Path:
    """Write the state after round ``info['round']`` into its own folder, then point
    ``latest.json`` at it atomically and remove older folders: a crash at any moment leaves a
    complete, readable checkpoint."""
    folder = root / f"round{info['round']:05d}"
    folder.mkdir(parents=True, exist_ok=True)
    _save(global_state, folder / "global.safetensors")
    _save(server_state, folder / "server.safetensors")
    _save({f"{i}/{k}": v for i, state in enumerate(client_states) for k, v in state.items()},
          folder / "clients.safetensors")
    (folder / "state.json").write_text(json.dumps(info, indent=1))
    tmp = root / "latest.json.tmp"
    tmp.write_text(json.dumps({"folder": folder.name}))
    os.replace(tmp, root / "latest.json")
    for old in root.glob("round*"):
        if old.is_dir() and old.name != folder.name:
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
    return folder


def load_checkpoint(root: Path, num_clients: int) -> tuple[Tensors, Tensors, list[Tensors], dict[str, Any]]:
    """Read the checkpoint ``latest.json`` points at."""
    folder = root / json.loads((root / "latest.json").read_text())["folder"]
    info = json.loads((folder / "state.json").read_text())
    clients: list[Tensors] = [{} for _ in range(num_clients)]
    for key, value in load_file(str(folder / "clients.safetensors")).items():
        i, _, name = key.partition("/")
        clients[int(i)][name] = value
    return (load_file(str(folder / "global.safetensors")), load_file(str(folder / "server.safetensors")),
            clients, info)


def has_checkpoint(root: Path) -> bool:
    return (root / "latest.json").is_file()
