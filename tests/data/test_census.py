"""The normalisation census: the nodes' per-channel Σx, Σx² and counts, combined, give the
statistics computed on the pooled training data."""
from __future__ import annotations

import numpy as np
import pytest

from fedlatent.data.federation import _channel_stats, channel_census, pooled_channel_stats


@pytest.mark.parametrize("shape", [(3, 4, 5), (7,)])
def test_combined_census_is_the_pooled_statistics(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(90, *shape)) * rng.uniform(0.5, 3.0, size=shape) + 2.0).astype(np.float32)
    nodes = np.split(x, [13, 14, 60])  # unequal nodes, one of a single sample
    mean, std = pooled_channel_stats([channel_census(part) for part in nodes])
    ref_mean, ref_std = _channel_stats(x.astype(np.float64))
    assert mean.shape == ref_mean.shape and mean.dtype == ref_mean.dtype == np.float32
    np.testing.assert_allclose(mean, ref_mean, rtol=2e-7)
    np.testing.assert_allclose(std, ref_std, rtol=2e-7)
    total, squares, count = channel_census(nodes[1])
    assert count == int(np.prod(x.shape[2:]) if x.ndim == 4 else 1)
    np.testing.assert_allclose(squares, (nodes[1].astype(np.float64) ** 2).sum(axis=(0, 2, 3) if x.ndim == 4 else 0,
                                                                                   keepdims=True)[0])
    assert total.dtype == np.float64
