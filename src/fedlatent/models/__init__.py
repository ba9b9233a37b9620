"""Backbones and heads. ``build_model`` turns ``[model]`` settings into a :class:`FedModel`."""
from __future__ import annotations

from fedlatent.config import ModelConfig
from fedlatent.errors import ConfigError
from fedlatent.models import cnn, mlp, mobilenet, resnet
from fedlatent.models.base import FedModel, ModelOutput


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, data_name: str = "") -> FedModel:
    """The network ``cfg.arch`` for inputs of ``input_shape`` (clear ConfigError when it cannot take them)."""
    if cfg.arch == "mlp":
        if cfg.projector:
            raise ConfigError("model.projector: the mlp has none; its last hidden layer is z")
        model: FedModel = mlp.build(input_shape, num_classes, hidden=list(cfg.hidden))
    elif cfg.arch == "cnn":
        if cfg.projector:
            raise ConfigError("model.projector: the small CNN's z is its fc2 output; no projector option")
        model = cnn.build(input_shape, num_classes, data_name=data_name, width=cfg.width)
    else:
        builders = {"resnet18": resnet.build_resnet18, "resnet50": resnet.build_resnet50,
                    "mobilenetv2": mobilenet.build}
        model = builders[cfg.arch](input_shape, num_classes, data_name=data_name, projector_width=cfg.projector)
    model.softmax_output = cfg.softmax_output
    return model


__all__ = ["FedModel", "ModelOutput", "build_model"]
