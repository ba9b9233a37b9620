"""Backbones and heads. ``build_model`` turns ``[model]`` settings into a :class:`FedModel`.

Models are an open list: each file of this package registers its names with
:func:`fedlatent.models.registry.register_model` (see that module).
"""
from __future__ import annotations

from fedlatent.config import ModelConfig
from fedlatent.models.base import FedModel, ModelOutput
from fedlatent.models.registry import MODELS, catalogue, check
from fedlatent.models.weights import load_pretrained


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, data_name: str = "") -> FedModel:
    """The network ``cfg.arch`` for inputs of ``input_shape`` (clear ConfigError when it cannot take
    them), with ``cfg.weights`` loaded when set (every tensor but the classifier head)."""
    check(cfg)
    entry = MODELS.get(cfg.arch)
    model: FedModel = entry.build(tuple(input_shape), num_classes, data_name=data_name, **entry.options(cfg))
    model.softmax_output = cfg.softmax_output
    if cfg.weights:
        load_pretrained(model, cfg.weights, entry.traits.get("head_keys", ()))
    return model


__all__ = ["FedModel", "ModelOutput", "build_model", "catalogue"]
