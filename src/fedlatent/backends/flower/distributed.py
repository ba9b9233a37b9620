"""Distributed DP on Flower (``privacy.distributed = "skellam"`` with SecAgg+): what the server sends
each node for a round's Skellam shares, what a node builds from it, and the server's codec.

A node needs, beside its run configuration's clip norm, σ and bits: the round's *rotation seed*
(public randomness, the same for every party: the server's (run seed, ``DISTRIBUTED_ROTATION``, r))
and m, the clients a round samples (the census's, the server's); nothing else of the run's seed.
Its conditional rounding and Skellam share come from its own source: with ``privacy.randomness =
"secret"`` (Flower's default under noise) a SHAKE-256 stream keyed by 32 bytes of the node's own
OS entropy (``secrets.token_bytes``), drawn afresh for each client and round and never stored, so
that no other party — the server included — can reproduce or subtract it; seeded, the generator
of (run seed, ``DISTRIBUTED_NOISE``, r, k), whose seed the server sends with the client's task
(the embedded backends' draws: a seeded run's weights are theirs to the rounding).

The accountant's worst case is the fewest clients whose vectors a round's sum may hold: at least
``train.min_clients`` (the failure policy) and at least SecAgg+'s threshold t (no sum of fewer is
unmasked), so ε is computed for t' = max(1, min_clients, t) noise shares; a round whose sum holds
fewer stops the run (:class:`~.secagg_codec.UnmaskedModularSum`).
"""
from __future__ import annotations

import torch
from flwr.app import ConfigRecord, RecordDict

from fedlatent.backends.flower.secagg_codec import DistributedUnmaskingCodec, UnmaskingCodec
from fedlatent.backends.flower.secagg_settings import Settings
from fedlatent.config import RunConfig
from fedlatent.federated.codec import DistributedCodec, UpdateCodec
from fedlatent.federated.distributed_dp import SkellamShare, SkellamSpec
from fedlatent.federated.randomness import SECRET, Randomness, Source, client_noise_source, noised, resolve
from fedlatent.federated.round import ClientTask
from fedlatent.seeding import DISTRIBUTED_NOISE, derive_seed

RECORD = "distributed"  # a train message's record: the round's rotation seed, m, and (seeded) each client's noise seed


def survivors(config: RunConfig, per_round: int) -> int:
    """The fewest clients whose noise shares a round's unmasked sum may hold (the module's docstring)."""
    return max(1, config.train.min_clients, Settings.of(config.privacy).threshold_for(per_round))


def unmasking(codec: UpdateCodec, config: RunConfig) -> UnmaskingCodec:
    """The server's codec under SecAgg+ in place of its own ``codec``: the sample-weighted unmasking,
    or, for distributed DP, the unmasked modular sum with ``codec``'s decoding and fixed denominator."""
    levels = config.privacy.secagg_quantization_range
    if not isinstance(codec, DistributedCodec):
        return UnmaskingCodec(levels)
    return DistributedUnmaskingCodec(levels, codec, survivors(config, codec.spec.per_round))


def attach(content: RecordDict, codec: UnmaskingCodec, randomness: Randomness, rnd: int, clients: list[int]) -> None:
    """Round ``rnd``'s :data:`RECORD` on a ``train`` message to the node of ``clients`` (nothing
    without distributed DP): the rotation seed, m and, seeded, each client's noise seed."""
    if not isinstance(codec, DistributedUnmaskingCodec):
        return
    seeded = [] if randomness.secret else clients
    content[RECORD] = ConfigRecord({
        "round": rnd, "rotation": codec.distributed.rotation(rnd), "per_round": codec.distributed.spec.per_round,
        "clients": seeded, "noise": [derive_seed(randomness.seed, DISTRIBUTED_NOISE, rnd, c) for c in seeded]})


def share(content: RecordDict, config: RunConfig, task: ClientTask) -> SkellamShare | None:
    """A node's Skellam share link for ``task`` (None without distributed DP): its spec from the run
    configuration and the server's m, the round's rotation seed as sent, its noise from the node's
    own OS entropy (secret) or the sent seed (seeded). A run that asks for distributed DP and a
    message without its record fail the client: its vector never leaves without its noise."""
    p = config.privacy
    if p.distributed == "off":
        return None
    record = content.config_records.get(RECORD)
    if record is None or int(record["round"]) != task.round:
        raise ValueError(f"distributed DP: the train message of round {task.round + 1} carries no rotation seed")
    spec = SkellamSpec(p.clip_norm, p.noise_multiplier, int(record["per_round"]), p.distributed_bits)
    rotation = int(record["rotation"])
    secret = resolve(p.randomness, "flower", noised(p)) == SECRET
    sent = dict(zip((int(c) for c in record["clients"]), (int(s) for s in record["noise"])))
    if not secret and task.client_id not in sent:
        raise ValueError(f"distributed DP: seeded, but the train message carries no noise seed of client {task.client_id}")

    def noise(rnd: int, client: int) -> Source:
        return client_noise_source(True, 0, DISTRIBUTED_NOISE, rnd, client) if secret \
            else torch.Generator().manual_seed(sent[client])
    return SkellamShare(spec, lambda _: rotation, noise)
