"""Sample-level DP-SGD's accountant keeps one count a client (c_k after the newest round asked), not
one array a round: the counts equal a count by hand for rounds asked forwards and backwards."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("dp_accounting")

from fedlatent.federated.accounting import SampleAccountant  # noqa: E402
from fedlatent.federated.round import sample_clients  # noqa: E402


def test_participations_equal_a_count_by_hand_and_are_one_array() -> None:
    n = 50
    chosen = lambda rnd: sample_clients(7, rnd, n, 0.1)  # noqa: E731
    accountant = SampleAccountant([20] * n, 5, 1, 0, 1.0, 1e-5, chosen)
    for rounds in (3, 8, 2, 8, 0, 5):
        by_hand = np.zeros(n, dtype=np.int64)
        for rnd in range(rounds):
            by_hand[chosen(rnd)] += 1
        assert np.array_equal(accountant.participations(rounds), by_hand)
        assert isinstance(accountant.counts, np.ndarray) and accountant.counts.shape == (n,)
    first = accountant.epsilon(8)
    assert first > 0 and accountant.epsilon(8) == first == SampleAccountant(
        [20] * n, 5, 1, 0, 1.0, 1e-5, chosen).epsilon(8)
