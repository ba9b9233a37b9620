"""SecAgg+ (``backends/flower/secagg.py``) against Flower's own SecAgg+ primitives where the two
interoperate: the key agreement (ECDH on SECP384R1 + HKDF-SHA256, anchored in turn on the
``cryptography`` package called directly), the shares in transit (Flower's Fernet ``decrypt`` and
``share_keys_plaintext_separate`` read what a party sends), Shamir's reconstruction (Flower's
``combine_shares`` from any t of a party's shares, and not from fewer), and a whole session with
dropouts unmasked by the rule of Flower's ``SecAggPlusWorkflow`` (subtract each active party's own
mask; for a party lost after sharing, add its pairwise mask with each active neighbour it sits
above and subtract the one with each it sits below), its secrets rebuilt by Flower's
``combine_shares`` and its pairwise keys by Flower's ``generate_shared_key``.

Where they do not interoperate, by design (the module's docstring): Flower's masks are drawn in
Z_M by ``pseudo_rand_gen`` (a seed folded to 32 bits for numpy's Mersenne twister), fedlatent's
in Z_{2^64} by SHAKE-256 (:func:`~fedlatent.backends.flower.secagg.expand`); a masked vector of one
cannot be unmasked by the other's masks, so the session below expands each rebuilt secret with
fedlatent's ``expand``, the one step not Flower's."""
from __future__ import annotations

import base64

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedlatent[flower]')")

from cryptography.hazmat.primitives import hashes  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.hazmat.primitives.kdf.hkdf import HKDF  # noqa: E402
from flwr.common.secure_aggregation.crypto.shamir import combine_shares  # noqa: E402
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, generate_shared_key  # noqa: E402
from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_separate  # noqa: E402
from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key  # noqa: E402

from fedlatent.backends.flower.secagg import Party, expand, pairwise_mask, quantize  # noqa: E402


def _agreed(private: bytes, public: bytes) -> bytes:
    """ECDH then HKDF-SHA256 to 32 bytes, url-safe base64: the key agreement written with the
    ``cryptography`` package alone."""
    secret = bytes_to_private_key(private).exchange(ec.ECDH(), bytes_to_public_key(public))
    return base64.urlsafe_b64encode(HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=None).derive(secret))


def test_both_ends_agree_on_the_pairwise_mask_through_flowers_key_agreement() -> None:
    a, b = Party.new(1, "s", 2), Party.new(2, "s", 2)
    key = generate_shared_key(bytes_to_private_key(a.sk1), bytes_to_public_key(b.pk1))
    assert key == generate_shared_key(bytes_to_private_key(b.sk1), bytes_to_public_key(a.pk1)) == _agreed(a.sk1, b.pk1)
    assert np.array_equal(pairwise_mask(a.sk1, b.pk1, 40), expand(key, 40))
    assert np.array_equal(pairwise_mask(b.sk1, a.pk1, 40), expand(key, 40))
    other = Party.new(3, "s", 2)
    assert not np.array_equal(pairwise_mask(a.sk1, other.pk1, 40), expand(key, 40))


def _shared_round(count: int, threshold: int) -> tuple[dict[int, Party], dict[int, dict[int, bytes]]]:
    """``count`` parties on the complete graph through stage 1: the parties and each one's inbox of
    ciphertexts (by sender)."""
    parties = {c: Party.new(c, "s", threshold) for c in range(1, count + 1)}
    public = {c: (p.pk1, p.pk2) for c, p in parties.items()}
    inbox: dict[int, dict[int, bytes]] = {c: {} for c in parties}
    for src, party in parties.items():
        for dst, ciphertext in party.share("s", public).items():
            inbox[dst][src] = ciphertext
    return parties, inbox


def test_flower_reads_the_shares_in_transit_and_rebuilds_each_secret_from_t_of_them() -> None:
    threshold = 3
    parties, inbox = _shared_round(5, threshold)
    owner = parties[2]
    seed_shares, key_shares = [owner.seed_shares[2]], [owner.key_shares[2]]  # the owner keeps its own pair
    for dst, party in parties.items():
        if dst == 2:
            continue
        channel = generate_shared_key(bytes_to_private_key(party.sk2), bytes_to_public_key(owner.pk2))
        sender, receiver, seed_share, key_share = share_keys_plaintext_separate(decrypt(channel, inbox[dst][2]))
        assert (sender, receiver) == (2, dst)
        seed_shares.append(seed_share)
        key_shares.append(key_share)
    for chosen in ([0, 1, 2], [4, 2, 3], [1, 3, 4, 0]):
        assert combine_shares([seed_shares[i] for i in chosen]) == owner.seed
        assert combine_shares([key_shares[i] for i in chosen]) == owner.sk1
    try:
        fewer = combine_shares(seed_shares[:threshold - 1])
    except ValueError:  # Flower's unpadding refuses what is not a secret
        fewer = b""
    assert fewer != owner.seed


@pytest.mark.parametrize("dropped", [[], [3], [2, 5]])
def test_a_session_unmasked_by_flowers_workflow_rule_is_the_exact_sum(dropped: list[int]) -> None:
    threshold, size = 3, 64
    parties, inbox = _shared_round(6, threshold)
    rng = np.random.default_rng(4)
    values = {c: quantize(rng.uniform(-2, 2, size), 2.0, 2 ** 30, rng) for c in parties}
    masked = {c: p.mask("s", inbox[c], values[c]) for c, p in parties.items() if c not in dropped}
    active = sorted(masked)
    revealed: dict[int, list[bytes]] = {}
    for c in active:
        for owner, share in parties[c].reveal("s", active, dropped).items():
            revealed.setdefault(owner, []).append(share)
    total = np.sum(list(masked.values()), axis=0, dtype=np.uint64)
    for nid, shares in sorted(revealed.items()):
        secret = combine_shares(shares[:threshold])
        if nid in masked:
            total = total - expand(secret, size)
            continue
        for neighbour in active:  # Flower's workflow: nid > neighbour → add, else subtract
            mask = expand(generate_shared_key(bytes_to_private_key(secret),
                                              bytes_to_public_key(parties[neighbour].pk1)), size)
            total = total + mask if nid > neighbour else total - mask
    assert np.array_equal(total, np.sum([values[c] for c in active], axis=0, dtype=np.uint64))
