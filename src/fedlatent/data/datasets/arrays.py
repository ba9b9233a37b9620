"""A federation of your own: per-client arrays from an .npz file (``data.path``)."""
from __future__ import annotations

from fedlatent.config import DataConfig
from fedlatent.data.registry import register_dataset
from fedlatent.data.sources import GivenClients, read_client_arrays


@register_dataset("arrays", reads=("path",), own_clients=True, required=("path",))
def _arrays(cfg: DataConfig, seed: int) -> GivenClients:
    """Per-client arrays from the .npz at data.path (keys client{i}_{train,val,test}_{x,y})."""
    return read_client_arrays(cfg.path)
