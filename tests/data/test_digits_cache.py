"""The digits pool is parsed once per process; every run still gets its own arrays, equal to a
fresh parse of scikit-learn's file."""
from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits

from fedlatent.config import DataConfig
from fedlatent.data.datasets.digits import _digits


def test_every_call_gets_fresh_equal_arrays_from_the_parsed_file() -> None:
    cfg = DataConfig(dataset="digits")
    first = _digits(cfg, 0)
    first.x[:] = -1.0  # a run that changes its arrays in place does not reach the next run
    first.y[:] = -1
    second = _digits(cfg, 0)
    assert second.x.min() == 0.0 and second.y.min() == 0
    bunch = load_digits()
    assert len(second.x) + len(second.test_x) == len(bunch.target)
    assert np.array_equal(np.sort(np.concatenate([second.y, second.test_y])), np.sort(bunch.target))
    pooled = np.concatenate([second.x, second.test_x]).reshape(len(bunch.target), -1)
    assert np.array_equal(np.unique(pooled * 16.0, axis=0), np.unique(bunch.data.astype(np.float32), axis=0))
    assert second.x.dtype == np.float32 and second.x.shape[1:] == (1, 8, 8) and second.y.dtype == np.int64


def test_the_test_fraction_still_decides_the_split() -> None:
    small, large = _digits(DataConfig(dataset="digits", test_fraction=0.1), 0), _digits(
        DataConfig(dataset="digits", test_fraction=0.3), 0)
    assert len(small.test_y) < len(large.test_y) and len(small.y) + len(small.test_y) == 1797
