"""``train.compile``: the trained model's forward through ``torch.compile`` (inductor) in the
one-client step (``federated.trainer.local_update``); backward follows by AOTAutograd.

Measured with ``benchmarks/compile.py`` (2 cores, 1 thread, CPU time; ``benchmarks/README.md``):
on the small CNN a compiled round of 10 clients x 7 steps costs 0.70x an eager one, after a
one-off compile of ~46 CPU seconds with an empty inductor cache (~1 s with a warm one): it pays
off after ~90 such rounds, sooner with more steps per round. On the digits MLP a compiled round
costs 1.9x an eager one (per-call guard and wrapper costs exceed what fusion saves on a 64-128-10
net), and a compiled lockstep forward 1.35x: the option is off by default and the vectorized
backend refuses it.
"""
from __future__ import annotations

import importlib.util
import shutil
from typing import Callable

import torch

from fedlatent.models.base import FedModel


def refusal(device: str) -> str | None:
    """Why ``train.compile = true`` cannot work on ``device`` (a few words), or None when it can; which
    backends compile is declared in ``backends.capabilities``."""
    if torch.device(device).type == "cpu":
        compilers = [c for c in torch._inductor.config.cpp.cxx if c]
        if not any(shutil.which(c) for c in compilers):
            return f"inductor needs a C++ compiler on a CPU and finds none of {compilers} (set CXX)"
    elif importlib.util.find_spec("triton") is None:
        return f"inductor needs triton on device '{device}'"
    return None


def forward_of(model: FedModel, enabled: bool) -> Callable | None:
    """The compiled forward of ``model`` when ``enabled``, else None (the client calls the model)."""
    return torch.compile(model) if enabled else None
