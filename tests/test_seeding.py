"""Derived seeds: the hash of many clients' seeds at once equals numpy's SeedSequence one at a time,
and a round's client generators are the ones a client derives for itself."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlatent.federated.round import ClientTask, client_generator, client_generators
from fedlatent.seeding import LOCAL_TRAINING, derive_seed, derive_seeds


@pytest.mark.parametrize("prefix", [(), (0,), (0, LOCAL_TRAINING, 3), (2**32 - 1, 1, 0), (2**32, 3, 19),
                                    (2**63 + 5, 2**40, 7, 1, 2), (123456789, 3, 0, 0, 0, 0)])
def test_derive_seeds_equals_one_seed_sequence_per_value(prefix: tuple[int, ...]) -> None:
    last = [0, 1, 2, 99, 2**31, 2**32 - 1]
    assert derive_seeds(*prefix, last=last) == [derive_seed(*prefix, c) for c in last]


def test_derive_seeds_on_random_inputs_and_values_past_one_word() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        prefix = [int(v) for v in rng.integers(0, 2**62, rng.integers(0, 5))]
        last = [int(v) for v in rng.integers(0, 2**32, rng.integers(1, 20))]
        assert derive_seeds(*prefix, last=last) == [derive_seed(*prefix, c) for c in last]
    wide = [5, 2**32, 2**45 + 1]  # more than one uint32 word: rows of different lengths
    assert derive_seeds(7, 3, last=wide) == [derive_seed(7, 3, c) for c in wide]
    assert derive_seeds(7, last=[]) == []
    seeds = derive_seeds(1, 2, last=list(range(200)))
    assert len(set(seeds)) == 200 and all(0 <= v < 2**63 for v in seeds)


def test_derive_seeds_refuses_negative_values() -> None:
    with pytest.raises(ValueError):
        derive_seeds(1, last=[3, -1])


def test_client_generators_are_each_clients_own_generator() -> None:
    ids = [0, 4, 17, 63]
    tasks = [ClientTask(c, 5, {}, {}, 0.1, 64, 1000, 11) for c in ids]
    together = client_generators(11, 5, ids)
    for task, generator in zip(tasks, together):
        assert torch.equal(torch.randperm(50, generator=generator),
                           torch.randperm(50, generator=client_generator(11, task)))
