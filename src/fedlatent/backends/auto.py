"""``backend = "auto"``: the backend a run is measured to be fastest on, with the reason.

``vectorized`` where the run trains in lockstep (:func:`fedlatent.backends.vectorized.refusal`
finds nothing to refuse), the model has no dropout and, on a CPU, no convolution; ``simulation``
otherwise. Both give the same numbers up to float rounding (``tests/test_vectorized.py``), so the
choice is one of speed only (dropout masks are drawn differently in lockstep: same distribution,
other numbers, so a model with dropout stays on the sequential path). The figures behind it (``fedlatent bench``, ``benchmarks/README.md``; 2 cores,
1 thread): on the digits MLP the vectorized round costs ~0.4× the simulation round with 10 clients
and less with 100, while the small CNN runs 1.45× slower vectorized on a CPU (vmap turns each
convolution into a grouped one, which the CPU kernels run slower than C separate ones). On a CUDA
device convolutions go vectorized too: there one small kernel per client and operator leaves the
device idle between launches, which is what lockstep removes; re-run ``fedlatent bench`` on the
device to check.
"""
from __future__ import annotations

import torch

from fedlatent.backends import simulation, vectorized
from fedlatent.config import RunConfig
from fedlatent.data.types import Federation
from fedlatent.methods.parts import MethodSpec


def choose(config: RunConfig, federation: Federation, spec: MethodSpec) -> tuple[str, str]:
    """The backend ``auto`` resolves to for this run and why (a few words, for the log)."""
    model = simulation.make_model(config, federation, spec)
    reason = vectorized.refusal(config, spec)
    if reason:
        return "simulation", f"no lockstep form: {reason}"
    if config.train.compile:
        return "simulation", "train.compile = true compiles the sequential client step"
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) for m in model.modules()):
        return "simulation", "dropout masks are drawn differently in lockstep"
    convolutions = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
    if convolutions and torch.device(config.train.device).type == "cpu":
        return "simulation", "convolutions run slower in lockstep on a CPU"
    return "vectorized", "the run trains in lockstep"
