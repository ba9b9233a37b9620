"""What a SuperNode is told of the run: what its own clients need, and no seed of anyone else's draws.

Every message carries the run record (:func:`run_record`): the resolved configuration **without
the run seed** (``to_toml(config, seed=False)``), with its data seed written out as ``data.seed``
(the split every node must build alike: the run seed unless ``data.seed`` is set) and its
``privacy.randomness`` as the server resolves it (so that a node knows a secret run's DP-SGD noise
is its clients' own), and the seeds of the initial model's construction and head
(:func:`~fedlatent.backends.simulation.init_seeds`: the model every node builds alike). Once the
server is set up (after the census), a message to a node also carries the **stream seeds of the
clients that node serves** (:func:`streams_record`), and no other client's: each client's own draws
— its batches and augmentation, FedALA's sample, MMD-D's kernels, its fine-tuning or new-client
adaptation, its t-SNE sample, SecAgg+'s stochastic rounding — derive from its stream seed
(:meth:`~fedlatent.federated.randomness.Randomness.client_seed`).

In a secret run (``privacy.randomness = "secret"``) a stream seed is a secret of the server's key,
so a node cannot compute another client's draws. The data seed and the initial model's seeds
derive from the run seed, which a secret run treats as public (a seed that is a small integer is
found from either by trying them all): nothing private derives from it. In a seeded run every
stream seed is the run seed, so the numbers are the embedded backend's and every node holds the
seed: its ε holds only against parties without it, and no node is one.

A node's configuration holds :data:`~fedlatent.seeding.NO_SEED` as its run seed: a draw a node
would derive from a run seed is refused (``derive_seed`` raises) rather than drawn from a default
seed every party knows.
"""
from __future__ import annotations

import dataclasses
import tomllib

from flwr.app import ConfigRecord, RecordDict

from fedlatent.backends.simulation import init_seeds
from fedlatent.config import RunConfig, from_dict, to_toml
from fedlatent.federated.randomness import noised, resolve
from fedlatent.seeding import NO_SEED

RUN, STREAMS = "run", "streams"  # the records' names in a message's content


def run_record(config: RunConfig) -> ConfigRecord:
    """The run as a node is told it: the configuration without the run seed (its data seed and
    resolved randomness written out) and the initial model's seeds."""
    mode = resolve(config.privacy.randomness, config.backend, noised(config.privacy))
    node = dataclasses.replace(config, data=dataclasses.replace(config.data, seed=config.data_seed),
                               privacy=dataclasses.replace(config.privacy, randomness=mode))
    model_seed, head_seed = init_seeds(config.seed)
    return ConfigRecord({"config": to_toml(node, seed=False), "model_seed": model_seed, "head_seed": head_seed})


_PARSED: dict[str, RunConfig] = {}  # the last run record's configuration, by its text (one run at a time)


def node_config(record: ConfigRecord) -> RunConfig:
    """The configuration of a run record, its run seed :data:`~fedlatent.seeding.NO_SEED` (whatever
    the text says: a node never draws from a run seed). Parsed once per process and text: every
    message carries the record, and its parse (~5 ms) was most of a node's own work per message;
    the configuration is shared, not to be changed in place."""
    text = str(record["config"])
    if text not in _PARSED:
        _PARSED.clear()
        _PARSED[text] = dataclasses.replace(from_dict(tomllib.loads(text)), seed=NO_SEED)
    return _PARSED[text]


def model_seeds(record: ConfigRecord) -> tuple[int, int]:
    """The seeds of the initial model's construction and head a run record carries."""
    return int(record["model_seed"]), int(record["head_seed"])


def streams_record(seeds: dict[int, int]) -> ConfigRecord:
    """The stream seeds of one node's clients (client id → seed)."""
    return ConfigRecord({"clients": list(seeds), "seeds": list(seeds.values())})


def stream_seed(content: RecordDict, cid: int) -> int:
    """Client ``cid``'s stream seed as the message ``content`` carries it; a clear error where the
    server sent none (a client the server does not count as this node's)."""
    record = content.config_records.get(STREAMS)
    seeds = {} if record is None else dict(zip((int(c) for c in record["clients"]), (int(s) for s in record["seeds"])))
    if cid not in seeds:
        raise ValueError(f"the server sent no stream seed for client {cid} (it sent those of {sorted(seeds)})")
    return seeds[cid]
