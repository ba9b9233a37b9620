"""SecAgg+'s parameters as ``[privacy]`` sets them, and the sessions they allow: apart from the
protocol (:mod:`.secagg`), so that a run's settings are checked without Flower installed."""
from __future__ import annotations

import math
from dataclasses import dataclass

from fedlatent.config import PrivacyConfig

DEFAULT_RANGE = 8.0  # the update range where no clip norm bounds the updates (Flower's default clipping range)


@dataclass(frozen=True)
class Settings:
    """The protocol's parameters from ``[privacy]``: a party's neighbours (``num_shares``, itself
    included; 0: every party of the session), the shares that reconstruct a secret (``threshold``;
    0: a majority of the neighbours, at least 2), the range every value must lie in, quantised to
    ``levels`` levels (``update_range`` for model updates, ``statistics_range`` for calibration
    statistics)."""

    num_shares: int
    threshold: int
    update_range: float
    statistics_range: float
    levels: int

    @classmethod
    def of(cls, cfg: PrivacyConfig) -> Settings:
        """The settings ``cfg`` asks for, the update range resolved: ``secagg_update_range``, else the
        clip norm where it is finite (no entry of a clipped update exceeds it), else 8."""
        bound = cfg.secagg_update_range or (cfg.clip_norm if math.isfinite(cfg.clip_norm) else DEFAULT_RANGE)
        return cls(cfg.secagg_num_shares, cfg.secagg_threshold, bound, cfg.secagg_statistics_range,
                   cfg.secagg_quantization_range)

    def shares(self, parties: int) -> int:
        """k, the neighbours of each of ``parties`` parties (itself included)."""
        return parties if not self.num_shares else min(self.num_shares, parties)

    def threshold_for(self, parties: int) -> int:
        """t, the shares that reconstruct a secret in a session of ``parties`` parties."""
        return self.threshold or max(2, self.shares(parties) // 2 + 1)

    def refusal(self, parties: int) -> str | None:
        """Why a session of ``parties`` parties cannot run, or None."""
        if parties < 2:
            return f"secure aggregation needs at least 2 parties (clients) in a session, not {parties}"
        t, k = self.threshold_for(parties), self.shares(parties)
        if t > k:
            return (f"its threshold t = {t} is more than the {k} share holders each of the {parties} parties "
                    f"(clients) has")
        return None
