"""The after-training calibrations a method may name (``algorithm.calibration``), each declaring
what its clients send: the statistics' keys in the clear and, where they add up over clients, their
shapes as sums (what a bounded or masked codec carries, and what a server that reads only the sum
lays it out as). The run's checks, the client and server halves (``federated.calibrate``) and
the evaluation read these declarations instead of comparing names.

- ``none``: nothing sent, nothing calibrated.
- ``ffc`` (SphereFed Sec. 3.3): V = ZᵀZ (l × l) and U = Zᵀ onehot(y) (l × C), always sums; the only
  one that may run every R rounds (``calibration.every``) and give each client a head of its own
  (``calibration.personal``: its own V, U solved on its training split).
- ``ccvr`` (Luo et al. 2021, Eq. 3-4): per-class mean, covariance and count in the clear, or
  per-class count, Σ z and Σ zzᵀ as sums.
- ``centralized`` (SphereFed Sec. 5.3, Table 4's sanity check): every client's features and labels
  themselves, an oracle by design; never sums.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class CalibrationKind:
    """One calibration's declaration. ``sent``: the keys of a client's statistics in the clear;
    ``sums``: (classes, feature dim) → the shapes of its statistics as sums, or None where they are
    not sums; ``periodic`` / ``personal``: whether it honours ``calibration.every`` /
    ``calibration.personal``; ``oracle``: the statistics are the clients' data themselves."""

    name: str
    sent: tuple[str, ...]
    sums: Callable[[int, int], Shapes] | None = None
    periodic: bool = False
    personal: bool = False
    oracle: bool = False

    @property
    def calibrates(self) -> bool:
        """Whether it does anything: its clients send statistics of their data."""
        return bool(self.sent)

    def shapes_as_sums(self, num_classes: int, dim: int) -> Shapes:
        """Its statistics' shapes as sums, by key; a ValueError where they are not sums."""
        if self.sums is None:
            raise ValueError(f"the {self.name!r} calibration's statistics are not sums")
        return self.sums(num_classes, dim)


CALIBRATIONS: dict[str, CalibrationKind] = {kind.name: kind for kind in (
    CalibrationKind("none", ()),
    CalibrationKind("ffc", ("V", "U"), sums=lambda c, d: {"V": (d, d), "U": (d, c)}, periodic=True, personal=True),
    CalibrationKind("ccvr", ("mean", "cov", "count"),
                    sums=lambda c, d: {"count": (c,), "first": (c, d), "second": (c, d, d)}),
    CalibrationKind("centralized", ("z", "y"), oracle=True),
)}


def calibration_kind(name: str) -> CalibrationKind:
    """The declaration of calibration ``name``; a KeyError naming the known ones otherwise."""
    if name not in CALIBRATIONS:
        raise KeyError(f"unknown calibration {name!r}; known: {sorted(CALIBRATIONS)}")
    return CALIBRATIONS[name]


def with_sums() -> list[str]:
    """The calibrations whose statistics are sums, in registration order."""
    return [k.name for k in CALIBRATIONS.values() if k.sums is not None]
