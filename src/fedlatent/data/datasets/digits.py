"""scikit-learn's bundled handwritten digits: 1,797 8×8 images, 10 classes, offline."""
from __future__ import annotations

import numpy as np

from fedlatent.config import DataConfig
from fedlatent.data.registry import register_dataset
from fedlatent.data.sources import Pool


@register_dataset("digits", reads=("test_fraction",))
def _digits(cfg: DataConfig, seed: int) -> Pool:
    """scikit-learn's 8×8 digits (offline); a fixed stratified test_fraction is the global test set."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    bunch = load_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[:, None]  # 1×8×8
    y = bunch.target.astype(np.int64)
    # digits has no official test split: a fixed stratified hold-out (seed 0, independent of the run)
    tr_x, te_x, tr_y, te_y = train_test_split(x, y, test_size=cfg.test_fraction, stratify=y,
                                              random_state=0)
    return Pool(tr_x, tr_y, te_x, te_y, num_classes=10)
