"""SphereFed (Dong et al. 2022): fixed classifier with orthonormal rows, L2-normalised features,
MSE loss, then fast federated calibration (FFC) of the classifier from per-client sums.

Each switch is separate, for the paper's ablation (Fix(R), Fix(OU), Norm, CE/MSE): ``fix`` =
'orthonormal' | 'tammes' (Appendix D's alternative, Table 10) | 'random' | 'none',
``normalize``, ``loss``, ``ffc``. The same switches are a
part, so SphereFed stacks on any base: ``[[terms]] name = "spherefed"`` beside
``algorithm.name = "fednova"`` (or fedprox, fedadam, ...).
"""
from __future__ import annotations

from typing import Any

from fedlatent.errors import ConfigError
from fedlatent.methods.parts import Calibration, HeadPolicy, MethodSpec, Part
from fedlatent.methods.registry import register_part, register_preset

FIXES = {"orthonormal": "orthogonal", "tammes": "tammes", "random": "default", "none": "default"}  # fix → init
KEYS = dict(fix="orthonormal", normalize=True, loss="mse", ffc=True, ridge=0.0, ffc_every=0)


class Sphere(Part):
    """Contributes no loss term: it sets the head, the task loss and the calibration."""

    name = "spherefed"
    weight = 0.0

    def __init__(self, opts: dict[str, Any]) -> None:
        if opts["fix"] not in FIXES:
            raise ConfigError(f"algorithm.fix = {opts['fix']!r}: allowed values are {', '.join(FIXES)}")
        if opts["loss"] not in ("ce", "mse"):
            raise ConfigError(f"algorithm.loss = {opts['loss']!r}: allowed values are ce, mse")
        self.opts = opts

    def configure(self, spec: MethodSpec) -> None:
        o = self.opts
        spec.head = HeadPolicy(fixed=o["fix"] != "none", init=FIXES[o["fix"]],
                               bias=o["fix"] == "none", normalize_z=o["normalize"])
        spec.loss = o["loss"]
        if o["ffc"]:
            spec.calibration = Calibration(kind="ffc", ridge=o["ridge"], every=o["ffc_every"])


@register_part("spherefed", **KEYS)
def sphere_part(opts: dict[str, Any]) -> Part:
    """SphereFed head, loss and FFC switches (on any base)."""
    return Sphere(opts)


@register_preset("spherefed", **{k: v for k, v in KEYS.items() if k != "loss"})
def spherefed(opts: dict[str, Any]) -> MethodSpec:
    """SphereFed: fixed orthonormal head, normalised z, MSE, FFC after training (ridge λ = 0)."""
    return MethodSpec("spherefed", parts=[Sphere({**opts, "loss": opts["loss"] or "mse"})])
