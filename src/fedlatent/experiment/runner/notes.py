"""Notes a run prints where its numbers would surprise a reader without being wrong: a personalising
method that keeps nothing of its own on the model (FedBN on a model without BatchNorm is FedAvg bit for
bit), and, in the final table, personal models that end below the global model
(:func:`fedlatent.analysis.tables.summary_table`)."""
from __future__ import annotations

import dataclasses

import torch

from fedlatent.config import RunConfig
from fedlatent.methods.partial import Partial
from fedlatent.methods.parts import MethodSpec
from fedlatent.models import build_model

__all__ = ["setup_notes"]


def setup_notes(config: RunConfig, spec: MethodSpec, input_shape: tuple[int, ...], num_classes: int) -> list[str]:
    """One ``note:`` line per surprise known before training, from the model's shape alone (built on
    the meta device: no memory, no weights read)."""
    program = spec.personalization
    if not isinstance(program, Partial):  # the program that keeps named entries of the client's own
        return []
    with torch.device("meta"):
        model = build_model(dataclasses.replace(config.model, weights=""), input_shape, num_classes,
                            config.data.dataset)
    if program.local_keys([n for n, _ in model.named_parameters()], list(model.state_dict())):
        return []
    return [f"note: {spec.name} keeps no entry of its own on this model (model.arch = {config.model.arch!r}"
            f"{': it has no BatchNorm layer' if spec.name == 'fedbn' else ''}), so every entry is averaged and the "
            "run trains exactly as FedAvg"]
