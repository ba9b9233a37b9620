"""The privacy accountant of client-level DP-FedAvg: ε at the configured δ after a number of rounds,
from Google's ``dp-accounting`` (the ``privacy`` extra, imported when a private run starts).

What a round releases (McMahan et al. 2018, "Learning differentially private recurrent language
models", Algorithm 1): the sum of the selected clients' updates, each clipped to L2 norm C, plus
Gaussian noise N(0, σ²C²) per coordinate. fedlatent selects a fixed number m of the n clients per
round, uniformly without replacement (``round.sample_clients``), so the round is dp-accounting's
``SampledWithoutReplacementDpEvent(n, m, GaussianDpEvent)`` under the *replace-one* neighbouring
relation (n is public; Wang, Balle & Kasiviswanathan 2019, Theorem 27), and a round of full
participation (m = n) is the Gaussian event alone, no subsampling. Under replace-one, the sum of
clipped updates moves by at most 2C when one client's data are replaced (‖Δ − Δ'‖ ≤ 2C), and
dp-accounting's noise multiplier is the noise's standard deviation over that sensitivity: σC / 2C
= σ / 2. The rounds compose in the RDP accountant: one round's RDP is computed once, and ε after r
rounds is the accountant's conversion of r times it (RDP adds under composition, Mironov 2017).
"""
from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from dp_accounting import DpEvent

EXTRA = "pip install 'fedlatent[privacy]'"


def available() -> bool:
    """Whether ``dp-accounting`` is installed (without importing it)."""
    return importlib.util.find_spec("dp_accounting") is not None


def round_event(num_clients: int, per_round: int, noise_multiplier: float) -> DpEvent:
    """One round's ``DpEvent``: the Gaussian of multiplier σ/2 (replace-one sensitivity 2C of the sum
    of updates clipped to C, noise σC), on a sample of ``per_round`` of ``num_clients`` clients
    without replacement — the Gaussian alone when every client takes part."""
    import dp_accounting

    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier / 2)
    if per_round >= num_clients:
        return gaussian
    return dp_accounting.SampledWithoutReplacementDpEvent(num_clients, per_round, gaussian)


class Accountant:
    """ε at ``delta`` after any number of rounds of DP-FedAvg with ``per_round`` of ``num_clients``
    clients a round and noise multiplier ``noise_multiplier`` (see the module's docstring)."""

    def __init__(self, num_clients: int, per_round: int, noise_multiplier: float, delta: float) -> None:
        from dp_accounting import NeighboringRelation
        from dp_accounting.rdp import RdpAccountant

        accountant = RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
        accountant.compose(round_event(num_clients, per_round, noise_multiplier))
        self.orders, self.round_rdp = np.asarray(accountant.orders), np.asarray(accountant.rdp)
        self.delta = delta

    def epsilon(self, rounds: int) -> float:
        """ε after ``rounds`` rounds (0 before the first)."""
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        if rounds <= 0:
            return 0.0
        return float(compute_epsilon(self.orders, rounds * self.round_rdp, self.delta)[0])
