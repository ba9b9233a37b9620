"""LEAF's federated data sets (FEMNIST, Sent140 features, …): their users as clients, from LEAF's JSON files."""
from __future__ import annotations

from fedlatent.config import DataConfig
from fedlatent.data.natural import read_leaf
from fedlatent.data.registry import register_dataset
from fedlatent.data.sources import GivenClients
from fedlatent.registry import Key

KEYS = {"classes": Key(0, "the number of classes (0: the largest label + 1); a label at or above it is refused")}


@register_dataset("leaf", reads=("path",), own_clients=True, required=("path",), keys=KEYS)
def _leaf(cfg: DataConfig, seed: int) -> GivenClients:
    """LEAF's JSON layout at data.path (users, num_samples, user_data): a .json file, or a folder with train/ and test/."""
    return read_leaf(cfg.path, int(cfg.options.get("classes", 0)))
