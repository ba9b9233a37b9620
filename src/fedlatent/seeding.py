"""Seeds derived from the run seed: every random choice flows from (seed, purpose, round, client)."""
from __future__ import annotations

import numpy as np

# purposes (the second integer of a derived seed)
MODEL_INIT, CLIENT_SAMPLING, HEAD_INIT, LOCAL_TRAINING, CALIBRATION, FINETUNE, KERNEL_INIT = range(7)
# draws of the diagnostics (subsamples, t-SNE): outside the training streams, so turning them on
# changes no training number
DIAGNOSTICS = 16


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers, e.g. ``derive_seed(seed, LOCAL_TRAINING, round, client)``."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint64)[0] >> 1)
