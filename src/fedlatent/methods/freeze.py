"""Freeze (FedBABU-like; Oh et al. 2022): the classifier keeps its initial weights, never trained
nor aggregated. ``init`` = 'default' (PyTorch's init) or 'orthogonal' (orthonormal rows)."""
from __future__ import annotations

from typing import Any

from fedlatent.errors import ConfigError
from fedlatent.methods.parts import HEAD_INITS, HeadPolicy, MethodSpec
from fedlatent.methods.registry import register_preset


@register_preset("freeze", init="default")
def freeze(opts: dict[str, Any]) -> MethodSpec:
    """Freeze: fixed classifier at init ('default' random or 'orthogonal')."""
    if opts["init"] not in HEAD_INITS:
        raise ConfigError(f"algorithm.init = {opts['init']!r}: allowed values are {', '.join(HEAD_INITS)}")
    return MethodSpec("freeze", head=HeadPolicy(fixed=True, init=opts["init"]))
