"""Names → models (``model.arch``). A model is one file in this package that registers itself::

    @MODELS.register("vgg13", reads=("projector",), keys={"norm": NORM})
    def _vgg13(input_shape, num_classes, *, data_name, projector, norm) -> FedModel: ...

The builder receives the fields of ``[model]`` it ``reads`` and its own ``keys`` by name, and
``data_name`` (only for error messages). ``[model]`` keys the chosen model does not read are refused.
"""
from __future__ import annotations

from typing import Any

from fedlatent.config import ModelConfig
from fedlatent.registry import Registry, check_section

MODELS = Registry("model", "arch", package="fedlatent.models")
register_model = MODELS.register


def check(cfg: ModelConfig) -> dict[str, Any]:
    """Validate ``model.arch`` and the keys it reads; return the resolved own keys (``options``)."""
    return check_section(cfg, [(MODELS, MODELS.get(cfg.arch))])


def catalogue() -> str:
    """Every registered model with the keys it reads."""
    return MODELS.describe()


__all__ = ["MODELS", "register_model", "check", "catalogue"]
