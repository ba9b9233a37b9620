"""Seeds derived from the run seed: every random choice flows from (seed, purpose, round, client)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

# purposes (the second integer of a derived seed)
MODEL_INIT, CLIENT_SAMPLING, HEAD_INIT, LOCAL_TRAINING, CALIBRATION, FINETUNE, KERNEL_INIT = range(7)
# draws of the diagnostics (subsamples, t-SNE): outside the training streams, so turning them on
# changes no training number
DIAGNOSTICS = 16
# the server's DP noise (federated.codec.GaussianCodec): a stream of its own, so that adding noise
# changes no other draw
PRIVACY_NOISE = 17
# adaptive clipping's noise on the count of unclipped clients (federated.adaptive_clipping) and the
# noise on the calibration statistics' sums (federated.codec.GaussianCodec.total): streams of their own
PRIVACY_CLIP_COUNT, PRIVACY_STATISTICS = 18, 19
# sample-level DP-SGD's noise in the local steps (federated.sample_dp): a stream of its own, so that
# the noise changes no batch or augmentation draw
SAMPLE_NOISE = 20
# SecAgg+ (backends.flower.secagg): the stochastic rounding of the clients' updates and statistics,
# and the order of the parties on its graph's ring; streams of their own
SECAGG_UPDATES, SECAGG_STATISTICS, SECAGG_GRAPH = 21, 22, 23
# data.holdout_clients: which clients never train (derive_seed(seed, HOLDOUT)) and each new client's
# adaptation at evaluation (derive_seed(seed, HOLDOUT, client)); a stream of its own, so that holding
# clients out changes no other draw
HOLDOUT = 24
# FedALA's sample of a client's training data at the start of its round (methods.fedala): a stream of
# its own, so that the sample changes no batch draw
ADAPTIVE_AGGREGATION = 25
# distributed DP (federated.distributed_dp): the round's random rotation, shared by every client and
# the server, and each client's conditional rounding and Skellam noise share; streams of their own
DISTRIBUTED_ROTATION, DISTRIBUTED_NOISE = 26, 27
# privacy.randomness = "secret": each client's stream seed, the seed its own draws derive from in place
# of the run seed (federated.randomness.Randomness.client_seed): a stream of the server's secret key
CLIENT_SEED = 28
# eval.clients / eval.final_clients: the clients an evaluation samples (federated.sampled); a stream of
# its own, so that sampling the evaluation changes no training draw
EVALUATION_SAMPLE = 40

# numpy's SeedSequence (O'Neill's seed_seq hash, numpy/random/bit_generator.pyx): its constants
_MASK32 = 0xFFFFFFFF
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R, _XSHIFT, _POOL = 0xCA01F9DD, 0x4973F715, 16, 4
Word = int | np.ndarray  # a uint32 word: one for every row (a Python int) or a column of them
# the run seed of a configuration that holds none (what a Flower SuperNode is sent): any draw derived
# from it is refused, rather than drawn from a default seed every party knows
NO_SEED = -1
_NO_SEED_ERROR = ("a draw derived from the run seed where the configuration holds none (a Flower SuperNode is "
                  "never sent it: its clients' draws derive from the stream seeds the server sends them)")


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers, e.g. ``derive_seed(seed, LOCAL_TRAINING, round, client)``."""
    if parts and parts[0] == NO_SEED:
        raise ValueError(_NO_SEED_ERROR)
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint64)[0] >> 1)


def _words(n: int) -> list[int]:
    """SeedSequence's uint32 words of a non-negative integer, least significant first ([0] for 0)."""
    words = [n & _MASK32]
    while n > _MASK32:
        n >>= 32
        words.append(n & _MASK32)
    return words


def derive_seeds(*prefix: int, last: Sequence[int]) -> list[int]:
    """``[derive_seed(*prefix, c) for c in last]``, hashed for all of ``last`` at once.

    A round seeds one generator per selected client from (seed, purpose, round, client), and one
    ``SeedSequence`` apiece costs ~15 µs, more than a digits client's local step: this runs the
    same hash (numpy's SeedSequence with its default pool of four words, then
    ``generate_state(2, uint64)[0] >> 1``) on uint32 columns, one row per value of ``last``."""
    if prefix and prefix[0] == NO_SEED:
        raise ValueError(_NO_SEED_ERROR)
    if not len(last):
        return []
    if any(int(c) < 0 for c in (*prefix, *last)):
        raise ValueError("derive_seeds: seeds are non-negative integers")
    if max(int(c) for c in last) > _MASK32:  # rows of different lengths: one at a time
        return [derive_seed(*prefix, c) for c in last]
    # the prefix's words are the same in every row: they stay Python ints, and an operation
    # touches an array (a column, one row per value of ``last``) only once a word depends on it
    entropy: list[Word] = [w for p in prefix for w in _words(int(p))]
    entropy.append(np.asarray([int(c) for c in last], dtype=np.uint32))
    hash_const = _INIT_A

    def hashmix(value: Word) -> Word:
        nonlocal hash_const
        value = value ^ hash_const
        hash_const = (hash_const * _MULT_A) & _MASK32
        value = (value * hash_const) & _MASK32
        return value ^ (value >> _XSHIFT)

    def mix(x: Word, y: Word) -> Word:
        result = (((x * _MIX_L) & _MASK32) - ((y * _MIX_R) & _MASK32)) & _MASK32
        return result ^ (result >> _XSHIFT)

    pool = [hashmix(entropy[i] if i < len(entropy) else 0) for i in range(_POOL)]
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for word in entropy[_POOL:]:
        for dst in range(_POOL):
            pool[dst] = mix(pool[dst], hashmix(word))
    # generate_state: the first two uint32 words of the output, as one little-endian uint64
    out, hash_const = [], _INIT_B
    for word in pool[:2]:
        word = word ^ hash_const
        hash_const = (hash_const * _MULT_B) & _MASK32
        word = (word * hash_const) & _MASK32
        # an array: every pool word has mixed in ``last``
        out.append(cast(np.ndarray, word ^ (word >> _XSHIFT)).astype(np.uint64))
    return [int(v) for v in (out[0] | (out[1] << np.uint64(32))) >> np.uint64(1)]
