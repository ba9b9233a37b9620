"""SecAgg+ (Bell, Bonawitz, Gascón, Lepoint and Raykova 2020, "Secure single-server aggregation
with (poly)logarithmic overhead", Algorithm 2; Bonawitz et al. 2017 on the complete graph): the
arithmetic of one party and of the server, on Flower's primitives — key agreement (ECDH + HKDF,
Fernet for the shares in transit) and Shamir's secret sharing — with two changes to Flower's
``secaggplus_mod``: the masks live in Z_{2^64} (numpy's uint64 wraps around: no modulus to pick,
and a sum of m values of at most ``levels / 2`` cannot wrap while m · levels < 2^64) and they are
expanded from their 32-byte seeds by SHAKE-256 (FIPS 202), where Flower's ``pseudo_rand_gen``
folds a seed to 32 bits for numpy's Mersenne twister.

A party is one client (:class:`Party`): in a session it makes two key pairs, shares the seed of its
own mask and its first private key among its neighbours (t of k Shamir shares, each encrypted for
one neighbour), adds to its quantised vector its own mask and, for each neighbour it holds shares
of, a pairwise mask of opposite signs at the two ends; asked to unmask, it reveals the own-mask
share of each neighbour that sent its vector and the key share of each that did not — never both
of one. The pairwise masks of two parties that both sent cancel in the sum; the server takes off
the rest (:func:`mask_total`). Keys and mask seeds come from the operating system's entropy, not
the run's seed (which the server knows); they cancel, so the unmasked sum — and the run — still
depends on the run's seed alone (the quantisation's stochastic rounding is drawn from it).
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ConfigRecord
from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt, generate_shared_key
from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_concat, share_keys_plaintext_separate
from flwr.supercore.primitives.asymmetric import (bytes_to_private_key, bytes_to_public_key, generate_key_pairs,
                                                  private_key_to_bytes, public_key_to_bytes)


# quantisation ------------------------------------------------------------------------------------
def quantize(values: np.ndarray, bound: float, levels: int, rng: np.random.Generator) -> np.ndarray:
    """``values``, within [−bound, bound], rounded stochastically (unbiased) to the grid of step
    2·bound / levels, as signed integers in Z_{2^64} (uint64, two's complement). A value outside
    raises: Flower clips it, which would change the sum without a word."""
    largest = float(np.abs(values).max()) if values.size else 0.0
    if not largest <= bound:
        raise ValueError(f"an entry of magnitude {largest:.4g} lies outside the quantisation's range [-{bound:g}, {bound:g}]")
    scaled = values * (levels / (2 * bound))
    low = np.floor(scaled)
    up = rng.random(scaled.shape) < scaled - low
    return (low + up).astype(np.int64).view(np.uint64)


def dequantize(total: np.ndarray, bound: float, levels: int) -> np.ndarray:
    """A sum of quantised vectors (uint64, two's complement) back in the values' units (float64)."""
    return total.view(np.int64).astype(np.float64) * (2 * bound / levels)


def expand(seed: bytes, size: int) -> np.ndarray:
    """``size`` uniform elements of Z_{2^64} from a secret ``seed`` (SHAKE-256's output)."""
    return np.frombuffer(hashlib.shake_256(seed).digest(8 * size), dtype="<u8").astype(np.uint64)


def neighbours(parties: Iterable[int], shares: int, rng: np.random.Generator) -> dict[int, set[int]]:
    """SecAgg+'s graph: the parties in a random order (``rng``), each with the ``shares`` nearest on
    that ring, itself included (every party when ``shares`` is at least their number)."""
    order = [int(p) for p in rng.permutation(sorted(parties))]
    m, half = len(order), shares // 2
    if shares >= m:
        return {p: set(order) for p in order}
    return {p: {order[(i + o) % m] for o in range(-half, half + 1)} for i, p in enumerate(order)}


def pairwise_mask(private_key: bytes, public_key: bytes, size: int) -> np.ndarray:
    """The mask two parties share: expanded from their key agreement (ECDH, then HKDF)."""
    return expand(generate_shared_key(bytes_to_private_key(private_key), bytes_to_public_key(public_key)), size)


def signed(mask: np.ndarray, own: int, other: int) -> np.ndarray:
    """A pairwise mask with the sign party ``own`` adds it with: + above ``other``, − below."""
    return mask if own > other else (np.uint64(0) - mask)


# a party -----------------------------------------------------------------------------------------
STAGES = ("keys", "shared", "masked", "revealed")


@dataclass
class Party:
    """One client's side of one session (``session``), kept between messages in its node's context."""

    client: int
    session: str
    threshold: int
    sk1: bytes
    pk1: bytes
    sk2: bytes
    pk2: bytes
    stage: str = "keys"
    seed: bytes = b""  # b_u: the seed of the party's own mask
    public: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)  # neighbours' (pk1, pk2), itself too
    seed_shares: dict[int, bytes] = field(default_factory=dict)  # shares of the neighbours' b held
    key_shares: dict[int, bytes] = field(default_factory=dict)  # shares of the neighbours' sk1 held

    @classmethod
    def new(cls, client: int, session: str, threshold: int) -> Party:
        """Stage 0 (setup): two fresh key pairs, one for the masks, one for the shares in transit."""
        if threshold < 2:
            raise ValueError(f"SecAgg+: a threshold of {threshold} would let one share reveal a secret")
        (sk1, pk1), (sk2, pk2) = generate_key_pairs(), generate_key_pairs()
        return cls(client, session, threshold, private_key_to_bytes(sk1), public_key_to_bytes(pk1),
                   private_key_to_bytes(sk2), public_key_to_bytes(pk2))

    def _advance(self, session: str, before: str, after: str) -> None:
        if session != self.session or self.stage != before:
            raise ValueError(f"SecAgg+: client {self.client} is at stage {self.stage!r} of session {self.session!r}, "
                             f"not {before!r} of {session!r}")
        self.stage = after

    def share(self, session: str, public: dict[int, tuple[bytes, bytes]]) -> dict[int, bytes]:
        """Stage 1 (share keys): a fresh seed b for the own mask; b and sk1 split into Shamir shares,
        ``threshold`` of them reconstructing each, one pair per neighbour in ``public`` (their public
        keys, this party's own among them), each encrypted for its neighbour: the ciphertexts by neighbour."""
        self._advance(session, "keys", "shared")
        if public.get(self.client) != (self.pk1, self.pk2):
            raise ValueError(f"SecAgg+: client {self.client}'s own public keys are not among its neighbours'")
        if len(public) < self.threshold:
            raise ValueError(f"SecAgg+: client {self.client} has {len(public)} neighbours, fewer than the "
                             f"threshold {self.threshold}")
        keys = [k for pair in public.values() for k in pair]
        if len(set(keys)) != len(keys):
            raise ValueError("SecAgg+: two neighbours announced the same public key")
        self.public = dict(public)
        self.seed = os.urandom(32)
        owners = sorted(public)
        seeds = create_shares(self.seed, self.threshold, len(owners))
        sks = create_shares(self.sk1, self.threshold, len(owners))
        out = {}
        for owner, seed_share, key_share in zip(owners, seeds, sks):
            if owner == self.client:
                self.seed_shares[owner], self.key_shares[owner] = seed_share, key_share
                continue
            out[owner] = encrypt(self._channel(owner), share_keys_plaintext_concat(self.client, owner, seed_share,
                                                                                    key_share))
        return out

    def _channel(self, other: int) -> bytes:
        return generate_shared_key(bytes_to_private_key(self.sk2), bytes_to_public_key(self.public[other][1]))

    def mask(self, session: str, ciphertexts: dict[int, bytes], vector: np.ndarray) -> np.ndarray:
        """Stage 2 (masked input): keep the shares the neighbours sent (``ciphertexts``, by sender),
        then ``vector`` (uint64) plus the own mask and a pairwise mask with each of those senders."""
        self._advance(session, "shared", "masked")
        for src, ciphertext in ciphertexts.items():
            sender, dst, seed_share, key_share = share_keys_plaintext_separate(decrypt(self._channel(src), ciphertext))
            if (sender, dst) != (src, self.client):
                raise ValueError(f"SecAgg+: client {self.client} got a share from {sender} to {dst} as one from {src}")
            self.seed_shares[src], self.key_shares[src] = seed_share, key_share
        if len(self.seed_shares) < self.threshold:
            raise ValueError(f"SecAgg+: client {self.client} holds shares of {len(self.seed_shares)} parties, "
                             f"fewer than the threshold {self.threshold}")
        masked = vector + expand(self.seed, vector.size)
        for other in sorted(set(self.seed_shares) - {self.client}):
            masked += signed(pairwise_mask(self.sk1, self.public[other][0], vector.size), self.client, other)
        return masked

    def reveal(self, session: str, active: list[int], dropped: list[int]) -> dict[int, bytes]:
        """Stage 3 (unmask): the share of b of each ``active`` neighbour (its vector is in the sum) and
        of sk1 of each ``dropped`` one (its pairwise masks are to be taken off), by owner; refused for a
        neighbour named in both, or with fewer active neighbours than the threshold."""
        self._advance(session, "masked", "revealed")
        if set(active) & set(dropped):
            raise ValueError(f"SecAgg+: client {self.client} was asked to reveal both secrets of {set(active) & set(dropped)}")
        if len(active) < self.threshold:
            raise ValueError(f"SecAgg+: client {self.client} has {len(active)} active neighbours, fewer than the "
                             f"threshold {self.threshold}")
        return {**{p: self.seed_shares[p] for p in active}, **{p: self.key_shares[p] for p in dropped}}

    # in a node's Context.state, between messages
    def to_record(self) -> ConfigRecord:
        return ConfigRecord({
            "client": self.client, "session": self.session, "threshold": self.threshold, "stage": self.stage,
            "sk1": self.sk1, "pk1": self.pk1, "sk2": self.sk2, "pk2": self.pk2, "seed": self.seed,
            "public_ids": list(self.public), "public_pk1": [v[0] for v in self.public.values()],
            "public_pk2": [v[1] for v in self.public.values()],
            "seed_ids": list(self.seed_shares), "seed_shares": list(self.seed_shares.values()),
            "key_ids": list(self.key_shares), "key_shares": list(self.key_shares.values())})

    @classmethod
    def from_record(cls, r: ConfigRecord) -> Party:
        def pairs(ids: str, values: str) -> dict[int, bytes]:
            return dict(zip((int(i) for i in r[ids]), r[values]))

        public = dict(zip((int(i) for i in r["public_ids"]), zip(r["public_pk1"], r["public_pk2"])))
        return cls(int(r["client"]), str(r["session"]), int(r["threshold"]), r["sk1"], r["pk1"], r["sk2"],
                   r["pk2"], str(r["stage"]), r["seed"], public, pairs("seed_ids", "seed_shares"),
                   pairs("key_ids", "key_shares"))


# the server ---------------------------------------------------------------------------------------
@dataclass
class Reconstruction:
    """What the server knows at the end of a session: each party's neighbours, first public keys,
    those whose shares went out (``shared``) and those whose vectors are in the sum (``active``),
    and the shares the active parties revealed, by owner."""

    neighbours: dict[int, set[int]]
    pk1: dict[int, bytes]
    shared: set[int]
    active: set[int]
    revealed: dict[int, list[bytes]]


def shortfall(r: Reconstruction, threshold: int) -> str | None:
    """Which party's secret the revealed shares cannot reconstruct (fewer than ``threshold``), or None."""
    for owner in sorted(r.shared):
        got = len(r.revealed.get(owner, []))
        if got < threshold:
            what = "own mask" if owner in r.active else "pairwise masks (it dropped out after sharing its keys)"
            return f"client {owner}'s {what}: {got} share(s) revealed, fewer than the threshold t = {threshold}"
    return None


def mask_total(r: Reconstruction, threshold: int, size: int) -> np.ndarray:
    """The masks left in the sum of the active parties' vectors (uint64, ``size`` elements): each
    active party's own mask, from its seed rebuilt from ``threshold`` shares, and the pairwise mask of
    each active party with each neighbour that shared its keys and then dropped out, from the
    dropped party's first private key rebuilt likewise (the other pairwise masks cancel)."""
    total = np.zeros(size, dtype=np.uint64)
    for owner in sorted(r.shared):
        secret = combine_shares(r.revealed[owner][:threshold])
        if owner in r.active:
            total += expand(secret, size)
            continue
        for other in sorted(r.neighbours[owner] & r.active):
            total += signed(pairwise_mask(secret, r.pk1[other], size), other, owner)
    return total
