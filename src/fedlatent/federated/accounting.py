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
rounds is the accountant's conversion of r times it (RDP adds under composition, Mironov 2017). Given
the selections, ε is the smaller of that and the unamplified composition over the most-selected
client's own rounds (:class:`Accountant`).

With adaptive clipping (``federated.adaptive_clipping``) a round also releases the noisy count of
clients within the clip norm; the updates' noise multiplier is lowered so that the round as a whole
is the Gaussian of multiplier σ (Andrew et al. 2021, Theorem 1), and the accountant is given σ, as
without it. Under replace-one the check holds as well: the bit sum moves by at most 1, so the round is
the Gaussians of multipliers σ_Δ/2 and σ_b composed, whose RDP α/(2(σ_Δ/2)²) + α/(2σ_b²) is that of
the Gaussian of multiplier σ/2 exactly when σ⁻² = σ_Δ⁻² + (2σ_b)⁻².

A calibration (FFC's Σ V_k, Σ U_k; CCVR's per-class sums) under DP is one more release: every
client's statistics, clipped to a bound B, summed, with Gaussian noise σ_s·B — the Gaussian of
multiplier σ_s/2 under replace-one, on every client (no sampling) — composed with the rounds
(:func:`statistics_event`; ε after r rounds and c such releases from r times the round's RDP plus
c times the release's).

Sample-level DP-SGD (:class:`SampleAccountant`; Abadi et al. 2016, Algorithm 1, in the clients'
local steps: ``federated.sample_dp``) releases, at each local step of client k, the sum of the
batch's per-sample gradients clipped to C_s plus N(0, σ_s²C_s²). Its batches are Poisson samples
(each of the client's n_k samples in independently with probability q_k = min(1, b / n_k),
``client.poisson_batches``), so a step is dp-accounting's ``PoissonSampledDpEvent(q_k,
GaussianDpEvent(σ_s))`` under the *add-or-remove-one* relation (adding or removing one sample moves
the sum by at most C_s: noise multiplier σ_s), the relation the amplification by Poisson sampling
is proved under (Mironov, Talwar & Zhang 2019). n_k, b and the step count are treated as public,
as in Abadi et al. and Opacus. A client takes T_k = ``client.poisson_steps`` steps in a round it is
selected in and none in another (the selection is seeded by (seed, round), independent of the
data), so after r rounds its steps compose c_k(r)·T_k times, c_k(r) the rounds among the first r
that selected it; the accountant reports the worst client's ε (the largest over clients).
"""
from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from fedlatent.federated.trainer.schedule import poisson_rate, poisson_steps

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


def statistics_event(noise_multiplier: float) -> DpEvent:
    """One release of calibration statistics: the Gaussian of multiplier σ_s/2 (replace-one
    sensitivity 2B of the sum of statistics clipped to B, noise σ_s·B), every client taking part."""
    import dp_accounting

    return dp_accounting.GaussianDpEvent(noise_multiplier / 2)


def _rdp(event: DpEvent) -> tuple[np.ndarray, np.ndarray]:
    """The RDP orders and ``event``'s RDP at them, under replace-one (the accountant's default orders)."""
    from dp_accounting import NeighboringRelation
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    accountant.compose(event)
    return np.asarray(accountant.orders), np.asarray(accountant.rdp)


class Accountant:
    """ε at ``delta`` after any number of rounds of DP-FedAvg with ``per_round`` of ``num_clients``
    clients a round and noise multiplier ``noise_multiplier``, and of releases of calibration
    statistics with noise multiplier ``statistics_noise_multiplier`` (see the module's docstring).

    ``selected(r)``: the clients round r (0-based) selects, where the server knows them. ε is then
    the smaller of two valid bounds: the rounds composed with the amplification by sampling, and
    the plain composition over the worst client's own participations — a client's data enter only
    the rounds that select it, and the selection does not depend on the data, so client k's loss
    after r rounds is the Gaussian of multiplier σ/2 composed c_k(r) times, unamplified. At small
    σ, or when the draws favour no client, the second is the tighter (σ = 0.5, 10 of 100 clients,
    10 rounds: the amplified bound 131)."""

    def __init__(self, num_clients: int, per_round: int, noise_multiplier: float, delta: float,
                 statistics_noise_multiplier: float = 0.0,
                 selected: Callable[[int], Sequence[int]] | None = None) -> None:
        self.orders, self.round_rdp = _rdp(round_event(num_clients, per_round, noise_multiplier))
        self.release_rdp = _rdp(statistics_event(statistics_noise_multiplier))[1] \
            if statistics_noise_multiplier > 0 else None
        self.delta = delta
        sampled = selected is not None and per_round < num_clients
        self.gaussian_rdp = _rdp(round_event(num_clients, num_clients, noise_multiplier))[1] if sampled else None
        self.selected = selected
        self.counts = [np.zeros(num_clients, dtype=np.int64)]  # c_k(r) for r = 0, 1, … as far as asked

    def most_participations(self, rounds: int) -> int:
        """max_k c_k(rounds): the participations of the client the first ``rounds`` rounds select most."""
        assert self.selected is not None
        while len(self.counts) <= rounds:
            counts = self.counts[-1].copy()
            counts[list(self.selected(len(self.counts) - 1))] += 1
            self.counts.append(counts)
        return int(self.counts[rounds].max())

    def epsilon(self, rounds: int, releases: int = 0) -> float:
        """ε after ``rounds`` rounds and ``releases`` releases of statistics (0 before the first)."""
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        if rounds <= 0 and releases <= 0:
            return 0.0
        released: float | np.ndarray = 0.0
        if releases:
            if self.release_rdp is None:
                raise ValueError("statistics were released without noise: no finite epsilon")
            released = releases * self.release_rdp
        epsilon = float(compute_epsilon(self.orders, rounds * self.round_rdp + released, self.delta)[0])
        if self.gaussian_rdp is None or rounds <= 0:
            return epsilon
        plain = self.most_participations(rounds) * self.gaussian_rdp + released
        return min(epsilon, float(compute_epsilon(self.orders, plain, self.delta)[0]))


class PoissonAccountant:
    """ε at ``delta`` of DP-FedAvg under Poisson client sampling (``train.client_sampling = "poisson"``:
    each client in each round independently with probability q = ``rate``), by dp-accounting's
    ``kind`` accountant, "rdp" or "pld" (the privacy-loss distribution, which supports Poisson
    sampling and not sampling without replacement). Under the add-or-remove-one relation the
    amplification by Poisson sampling is proved under, one client moves the sum of updates clipped
    to C by at most C: a round is ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))`` (McMahan et al.
    2018), and a release of calibration statistics (every client, clipped to B, noise σ_s·B) the
    Gaussian of multiplier σ_s. (Its ε is under add-or-remove-one, the fixed-size sampling's
    under replace-one: a replacement is a removal and an addition, so the two are not one scale.)
    The server's mean divides by m = ⌊qN⌋ (``train.participation``'s count), qN where it is whole:
    McMahan et al.'s fixed denominator qW."""

    def __init__(self, rate: float, noise_multiplier: float, delta: float, statistics_noise_multiplier: float = 0.0,
                 kind: str = "rdp") -> None:
        self.rate, self.noise_multiplier, self.delta, self.kind = rate, noise_multiplier, delta, kind
        self.statistics_noise_multiplier = statistics_noise_multiplier
        self.cache: dict[tuple[int, int], float] = {}

    def event(self, rounds: int, releases: int) -> DpEvent:
        """The run's ``DpEvent`` after ``rounds`` rounds and ``releases`` releases of statistics."""
        import dp_accounting

        gaussian = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        one = gaussian if self.rate >= 1 else dp_accounting.PoissonSampledDpEvent(self.rate, gaussian)
        events = [dp_accounting.SelfComposedDpEvent(one, rounds)]
        if releases:
            if self.statistics_noise_multiplier <= 0:
                raise ValueError("statistics were released without noise: no finite epsilon")
            events.append(dp_accounting.SelfComposedDpEvent(
                dp_accounting.GaussianDpEvent(self.statistics_noise_multiplier), releases))
        return dp_accounting.ComposedDpEvent(events)

    def epsilon(self, rounds: int, releases: int = 0) -> float:
        """ε after ``rounds`` rounds and ``releases`` releases (0 before the first)."""
        if rounds <= 0 and releases <= 0:
            return 0.0
        if (rounds, releases) not in self.cache:
            from dp_accounting import NeighboringRelation
            from dp_accounting.pld import PLDAccountant
            from dp_accounting.rdp import RdpAccountant

            relation = NeighboringRelation.ADD_OR_REMOVE_ONE
            accountant = PLDAccountant(relation) if self.kind == "pld" else RdpAccountant(neighboring_relation=relation)
            absl = logging.getLogger("absl")  # the RDP series' warnings per fractional order, as SampleAccountant's
            level = absl.level
            absl.setLevel(logging.ERROR)
            try:
                accountant.compose(self.event(rounds, releases))
                self.cache[rounds, releases] = float(accountant.get_epsilon(self.delta))
            finally:
                absl.setLevel(level)
        return self.cache[rounds, releases]


def sample_step_event(rate: float, noise_multiplier: float) -> DpEvent:
    """One local step of sample-level DP-SGD: the Gaussian of multiplier σ_s (add-or-remove
    sensitivity C_s of the sum of per-sample gradients clipped to C_s, noise σ_s·C_s) on a Poisson
    sample of rate q — the Gaussian alone when q = 1 (every sample in every batch)."""
    import dp_accounting

    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
    return gaussian if rate >= 1 else dp_accounting.PoissonSampledDpEvent(rate, gaussian)


class SampleAccountant:
    """ε at ``delta`` of sample-level DP-SGD after any number of rounds, the worst client's (see the
    module's docstring): clients of training-set ``sizes``, Poisson batches of expected size
    ``batch_size``, ``epochs`` epochs or ``local_steps`` steps a round, noise multiplier
    ``noise_multiplier``; ``selected(r)``: the clients round r (0-based) selects."""

    def __init__(self, sizes: Sequence[int], batch_size: int, epochs: int, local_steps: int,
                 noise_multiplier: float, delta: float, selected: Callable[[int], Sequence[int]]) -> None:
        from dp_accounting.rdp import RdpAccountant

        self.delta, self.selected, self.noise_multiplier = delta, selected, noise_multiplier
        # each client's (q_k, T_k); one round's RDP computed once per distinct pair, when first needed
        self.kinds = [(poisson_rate(n, batch_size), poisson_steps(n, batch_size, epochs, local_steps)) for n in sizes]
        self.rdp: dict[tuple[float, int], np.ndarray] = {}
        self.orders = np.asarray(RdpAccountant().orders)
        # c_k(r) after the newest round asked (``self.at``): one array, not one a round (rounds × clients)
        self.counts, self.at = np.zeros(len(sizes), dtype=np.int64), 0

    def round_rdp(self, kind: tuple[float, int]) -> np.ndarray:
        """The RDP (at each order) of one round of a client of ``kind`` (q_k, T_k): T_k steps composed
        by dp-accounting's RDP accountant (add-or-remove-one, its default); the fractional orders
        its series does not converge at are left out of the minimum over orders, as it warns
        (silenced here: one warning per order and client size)."""
        if kind not in self.rdp:
            from dp_accounting.rdp import RdpAccountant

            accountant = RdpAccountant()
            absl = logging.getLogger("absl")
            level = absl.level
            absl.setLevel(logging.ERROR)
            try:
                accountant.compose(sample_step_event(kind[0], self.noise_multiplier), kind[1])
            finally:
                absl.setLevel(level)
            self.rdp[kind] = np.asarray(accountant.rdp)
        return self.rdp[kind]

    def participations(self, rounds: int) -> np.ndarray:
        """c_k(rounds): how many of the first ``rounds`` rounds selected each client (counted on from
        the newest round asked; an earlier one is counted again from round 0)."""
        if rounds < self.at:
            self.counts, self.at = np.zeros_like(self.counts), 0
        while self.at < rounds:
            self.counts[list(self.selected(self.at))] += 1
            self.at += 1
        return self.counts.copy()

    def epsilons(self, rounds: int) -> list[float]:
        """Each client's ε after ``rounds`` rounds (0 for a client not selected yet, or without data)."""
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        memo: dict[tuple[float, int, int], float] = {}
        out = []
        for kind, count in zip(self.kinds, self.participations(rounds).tolist()):
            if not count or not kind[1]:  # not selected yet, or no data: no step
                out.append(0.0)
                continue
            key = (*kind, count)
            if key not in memo:
                memo[key] = float(compute_epsilon(self.orders, count * self.round_rdp(kind), self.delta)[0])
            out.append(memo[key])
        return out

    def epsilon(self, rounds: int) -> float:
        """The worst client's ε after ``rounds`` rounds (0 before the first)."""
        return max(self.epsilons(rounds), default=0.0)
