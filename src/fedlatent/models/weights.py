"""Pretrained weights from a local file (``model.weights``): a state dict as published (a ``.pth``
read with ``torch.load(weights_only=True)``, or safetensors) loaded into a model whose keys match,
the classifier head left as initialised (the file's head, e.g. ImageNet's 1000-way ``fc``, is dropped).

No network access: users download the file once (see the README's recipe).
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from fedlatent.errors import ConfigError

_OWN_HEAD = ("classifier.weight", "classifier.bias")


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file or a torch-saved state dict (one line when neither)."""
    where = f"model.weights = '{path}'"
    if not path.is_file():
        raise ConfigError(f"{where}: file not found")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file
            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same user error
        raise ConfigError(f"{where}: not a readable state dict ({type(err).__name__})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"{where}: expected a state dict (parameter name → tensor)")
    return state


def load_pretrained(model: nn.Module, path: str | Path, head_keys: Iterable[str] = ()) -> list[str]:
    """Copy every tensor of the file except the head (``head_keys`` and ``classifier.*``) into
    ``model``; every other model tensor must be in the file with the same shape (BatchNorm's
    ``num_batches_tracked`` may be absent: old checkpoints lack it). Returns the keys loaded."""
    path = Path(path).expanduser()
    where = f"model.weights = '{path}'"
    head = set(head_keys) | set(_OWN_HEAD)
    found = {k: v for k, v in read_state_dict(path).items() if k not in head}
    own = {k: v for k, v in model.state_dict().items() if k not in head}
    unexpected = sorted(set(found) - set(own))
    if unexpected:
        raise ConfigError(f"{where}: key {unexpected[0]} is not in the model ({len(unexpected)} such keys; "
                          f"is the file for another model.arch?)")
    missing = sorted(k for k in set(own) - set(found) if not k.endswith("num_batches_tracked"))
    if missing:
        raise ConfigError(f"{where}: the file lacks the model's key {missing[0]} ({len(missing)} missing)")
    for key, tensor in found.items():
        if tensor.shape != own[key].shape:
            raise ConfigError(f"{where}: {key} has shape {tuple(tensor.shape)} in the file but "
                              f"{tuple(own[key].shape)} in the model")
    with torch.no_grad():
        state = model.state_dict()
        for key, tensor in found.items():
            state[key].copy_(tensor)
    return sorted(found)
