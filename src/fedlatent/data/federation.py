"""From a data configuration to a :class:`Federation`, in one pass: the source loaded, its samples
chosen and partitioned as indices, the clients that never train (``data.holdout_clients``) drawn and
set apart there (:mod:`fedlatent.data.holdout`), the standardisation's statistics computed from the
training clients' samples, and each client's splits built when a round reads them
(:mod:`fedlatent.data.clients`). :func:`build_federation` returns it as the run trains on it.

Normalisation uses per-channel statistics pooled over every client's training data (what the
published pipelines do with the pooled training set). In one process they are computed here from
the pool; on a deployment no node sees the pool, so each node needs them from the server: a
census in which every node sends its per-channel Σx, Σx² and count (:func:`channel_census`) and
the server returns the pooled mean and std (:func:`pooled_channel_stats`), the same numbers.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from fedlatent.config import DataConfig
from fedlatent.data import holdout
from fedlatent.data import partition as P
from fedlatent.data.augment import Augmentation
from fedlatent.data.cache import lines_held
from fedlatent.data.clients import Clients, JoinedTests, train_labels
from fedlatent.data.compact import Images, uint8_channel_stats
from fedlatent.data.registry import DATASETS, PARTITIONS, check
from fedlatent.data.sources import GivenClients, Labels, Pool
from fedlatent.data.types import ClientData, Federation, Outline, ServerView, Split
from fedlatent.errors import DataError


@lines_held()  # the decoded-image cache's line once the federation is made (an error stays one line)
def build_federation(cfg: DataConfig, seed: int) -> Federation:
    """The federation a run trains on, its held-out clients (``data.holdout_clients``) set apart
    (:attr:`Federation.new_clients`, drawn once here for every source); every random choice flows
    from ``seed`` (the data seed). Names and keys are checked before anything is loaded."""
    check(cfg)
    return _federation(cfg, _load(cfg, seed), seed)


@lines_held()
def server_view(cfg: DataConfig, seed: int) -> ServerView:
    """What a Flower server needs of the data, equal to :func:`build_federation`'s: the global test
    split (standardised with the statistics of the pool's training samples), the classes, the
    input shape, the augmentation, and the number of clients where the configuration fixes it.
    A pool is neither partitioned nor split into clients. Where the global test split is the
    clients' local test splits together (``data.merge_test``, a data set with its own clients), or
    the statistics are those of the clients left to train (``data.holdout_clients``: the partition
    tells which samples they hold), the federation is built and its clients dropped."""
    check(cfg)
    source = _load(cfg, seed)
    assert not isinstance(source, Labels)  # loaded without labels_only
    if isinstance(source, GivenClients) or cfg.merge_test or cfg.holdout_clients:
        fed = _federation(cfg, source, seed)
        return ServerView(fed.test, fed.num_classes, fed.input_shape, fed.name, fed.augment, fed.partition_size)
    train_idx, test_rows, held_out = _selection(cfg, source.labels(), seed)
    test = _test_split(source, test_rows, held_out)
    assert test is not None  # without data.merge_test the global test split is the pool's own
    split, mean, std = _standardiser(cfg, source.x, train_idx)
    return ServerView(split(*test), source.num_classes, tuple(source.x.shape[1:]), name=cfg.dataset,
                      augment=Augmentation(cfg.augment, cfg.autoaugment, mean, std), num_clients=_fixed_count(cfg))


def declared_view(cfg: DataConfig) -> ServerView:
    """What a Flower server knows of the data without opening them (``flower.server_reads_data =
    false``): the classes and input shape where the data set declares them from its configuration
    (else 0 and (), which the nodes' census tells), the number of clients where the configuration
    fixes it (for a data set with its own clients: ``data.num_clients`` when set), and no test split
    (the nodes evaluate the global model on theirs)."""
    check(cfg)
    entry = DATASETS.get(cfg.dataset)
    declare = entry.traits.get("shape")
    shape, classes = declare(cfg) if declare is not None else ((), 0)
    if entry.traits.get("own_clients"):
        count = None if cfg.num_clients == "auto" else int(cfg.num_clients)
    else:
        count = _fixed_count(cfg)
    return ServerView(None, classes, tuple(shape), name=cfg.dataset, num_clients=count)


@lines_held()
def outline(cfg: DataConfig, seed: int, read: dict[Any, Pool | GivenClients | Labels] | None = None) -> Outline:
    """What :func:`build_federation` would make — classes, input shape, the partition's clients and
    those it holds out — after every check it makes, reading no more of the data than those checks
    need: a data set's ``labels`` trait where it declares one (an image tree's listing, not its
    decoded images), else its loader's output (scikit-learn's digits, an .npz, the decoded-image
    cache); a pool's partition is made from its labels (:func:`_plan`, as the run makes it) and its
    held-out clients drawn as :func:`_from_pool` draws them. What ``fedlatent check`` knows of the data.
    ``read``: what earlier calls read, kept by what the data set reads (a study's cells that share
    their data read it once)."""
    check(cfg)
    key = _source_key(cfg, seed)
    source = read.get(key) if read is not None else None
    if source is None:
        source = _load(cfg, seed, labels_only=True)
        if read is not None:
            read[key] = source
    if isinstance(source, GivenClients):
        fed = _federation(cfg, source, seed)
        sizes = np.maximum(source.split_sizes(), 0)  # the partition's, the held-out clients in their rows
        return Outline(fed.num_classes, fed.input_shape, fed.partition_size,
                       tuple((int(a), int(c)) for a, _, c in sizes), fed.held_out)
    labels = source if isinstance(source, Labels) else source.labels()
    train_idx, _, held_out, parts = _plan(cfg, merged_labels(labels) if cfg.merge_test else labels, seed)
    sizes = _client_sizes(cfg, labels, held_out, parts)
    new = holdout.partition_ids(cfg, len(parts), seed)
    return Outline(labels.num_classes, labels.input_shape, len(parts), tuple((int(a), int(c)) for a, _, c in sizes),
                   tuple(new))


def _client_sizes(cfg: DataConfig, labels: Labels, held_out: np.ndarray | None, parts: list[np.ndarray]
                  ) -> np.ndarray:
    """Each client's (training, validation, test) sample counts as :func:`_from_pool` splits its
    part (:func:`fedlatent.data.partition.split_fractions`: ``round(f·n)`` to each fraction), a
    domain's held-out test where a partition by domains leaves the client none of its own."""
    sizes = np.zeros((len(parts), 3), dtype=np.int64)
    domains = None
    if PARTITIONS.get(cfg.partition).traits.get("needs_groups") and held_out is not None:
        assert labels.groups is not None
        domains = np.unique(labels.groups)
    for i, part in enumerate(parts):
        val, local = (int(round(f * len(part))) for f in (cfg.val_fraction, cfg.local_test_fraction))
        test = local
        if not local and domains is not None:  # samples held out of the pool, not cut from the part
            assert labels.groups is not None and held_out is not None
            test = int((labels.groups[held_out] == domains[i]).sum())
        sizes[i] = (len(part) - val - local, val, test)
    return sizes


def _source_key(cfg: DataConfig, seed: int) -> tuple[Any, ...]:
    """What a data set's ``labels`` trait (``cfg -> Labels``: the files alone) or else its loader
    (``(cfg, seed) -> source``) reads."""
    entry = DATASETS.get(cfg.dataset)
    fields = repr((cfg.dataset, [getattr(cfg, k) for k in entry.reads], sorted(cfg.options.items())))
    return (fields,) if "labels" in entry.traits else (fields, seed)


def _load(cfg: DataConfig, seed: int, *, labels_only: bool = False) -> Pool | GivenClients | Labels:
    """The data set's loader's output, or with ``labels_only`` what its ``labels`` trait declares
    where it has one (a file it cannot read is one line)."""
    entry = DATASETS.get(cfg.dataset)
    try:
        return entry.traits["labels"](cfg) if labels_only and "labels" in entry.traits else entry.build(cfg, seed)
    except PermissionError as err:  # a file or folder inside the data set that this user cannot read
        key = "data.path" if "path" in entry.reads else "data.root"
        raise DataError(f"{key}: cannot read {err.filename} (permission denied)") from None


def _federation(cfg: DataConfig, source: Pool | GivenClients | Labels, seed: int) -> Federation:
    assert not isinstance(source, Labels)  # loaded without labels_only
    if isinstance(source, GivenClients):
        if cfg.merge_test:
            raise DataError(f"data.merge_test: data set '{cfg.dataset}' comes with its own clients and their splits")
        return _from_given(cfg, source, seed)
    return _from_pool(cfg, source, seed)


def _fixed_count(cfg: DataConfig) -> int | None:
    """The number of clients a pool's partition makes: ``data.num_clients`` (10 when ``"auto"``), but
    one per domain for a partition by domains (``needs_groups``) or as many as a file names
    (``own_count``), left to the data when ``"auto"``."""
    traits = PARTITIONS.get(cfg.partition).traits
    if cfg.num_clients == "auto" and (traits.get("needs_groups") or traits.get("own_count")):
        return None
    return cfg.clients()


def _split(x: np.ndarray, y: np.ndarray, stats: tuple[np.ndarray, np.ndarray] | None = None,
           crop: int | None = None) -> Split:
    """Tensors sharing the arrays' memory; uint8 images stay uint8 (:class:`Images`, standardised
    with ``stats`` = (mean, std) per batch, centre-cropped to ``crop`` unless augmented)."""
    data = torch.from_numpy(np.ascontiguousarray(x))
    if x.dtype == np.uint8:
        mean, std = stats if stats is not None else (np.zeros(x.shape[1]), np.ones(x.shape[1]))
        return Split(Images(data, mean, std, crop), torch.from_numpy(np.ascontiguousarray(y)))
    return Split(data, torch.from_numpy(np.ascontiguousarray(y)))


def _from_given(cfg: DataConfig, source: GivenClients, seed: int) -> Federation:
    """A data set's own clients, each client's splits built from its arrays when it is read, the
    held-out ones (``data.holdout_clients``) set apart (:func:`fedlatent.data.holdout.split`; their
    inputs' statistics, where the data set has them, are its loader's)."""
    crop = {"train": source.train_crop}

    def client(i: int) -> ClientData:
        c = source.clients[i]
        return ClientData(*(None if c[s] is None else _split(*c[s], source.stats, crop.get(s))
                            for s in ("train", "val", "test")))

    sizes = source.split_sizes()
    clients = Clients(client, sizes)
    stored = source.sample_shape()
    shape = stored if source.train_crop is None else (*stored[:-2], source.train_crop, source.train_crop)
    augment: Augmentation | bool = False
    if cfg.augment_policy != "none":
        mean, std = (source.stats[0].reshape(-1, 1, 1), source.stats[1].reshape(-1, 1, 1)) if source.stats else (0.0, 1.0)
        augment = Augmentation(mean=mean, std=std, transform=cfg.augment_policy, size=shape[-1])
    tested = bool((sizes[:, 2] >= 0).any())
    whole = Federation(clients, JoinedTests(clients) if tested else None, source.num_classes, shape, name=cfg.dataset,
                       augment=augment, test_of_clients=tested)
    return holdout.split(whole, holdout.partition_ids(cfg, len(clients), seed))


def _strata(labels: Labels) -> np.ndarray:
    """Each sample's class, or (domain, class) pair when the pool has domains."""
    return labels.y if labels.groups is None else labels.groups * labels.num_classes + labels.y


def _per_stratum(strata: np.ndarray, take: Callable[[int], int], seed: int, stream: int) -> np.ndarray:
    """Sorted indices of a seeded subset holding ``take(n)`` of each stratum's ``n`` samples."""
    rng = np.random.default_rng([seed, stream])
    chosen = [rng.permutation(np.where(strata == s)[0])[: take(int((strata == s).sum()))] for s in np.unique(strata)]
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, np.int64)


def _holdout(labels: Labels, fraction: float, per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of (train, test) when a data set has no official test split: a stratified hold-out
    (per domain and class when the pool has domains) of ``per_class`` samples, or else of
    ``fraction`` of each stratum."""
    take = (lambda n: min(per_class, n)) if per_class else (lambda n: int(round(fraction * n)))
    test_idx = _per_stratum(_strata(labels), take, seed, 1)
    return np.setdiff1d(np.arange(len(labels.y)), test_idx), test_idx


def merged(pool: Pool) -> Pool:
    """The pool with its official test split appended to the samples to partition (``data.merge_test``;
    SphereFed, Appendix B, after FedBABU and Jiang et al. 2019: CIFAR-100's 50,000 + 10,000 images
    partitioned together, each client's test split cut from its share)."""
    if pool.test_x is None:
        return pool
    return Pool(np.concatenate([pool.x, pool.test_x]), merged_labels(pool.labels()).y, None, None, pool.num_classes)


def merged_labels(labels: Labels) -> Labels:
    """:func:`merged` on a pool's labels alone."""
    if labels.test_y is None:
        return labels
    if labels.groups is not None:
        raise DataError("data.merge_test: this data set's test split has no domains to partition by")
    return Labels(np.concatenate([labels.y, labels.test_y]), None, labels.num_classes, None, labels.input_shape)


def _selection(cfg: DataConfig, labels: Labels, seed: int
               ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Indices of the samples to partition, of the official test split's samples kept (None with
    ``data.merge_test``, the clients' local tests together, or without an official test split), and
    of the hold-out (None but for a data set without an official test split)."""
    held_out: np.ndarray | None = None
    test_rows: np.ndarray | None = None
    if cfg.merge_test:
        train_idx = np.arange(len(labels.y))
    elif labels.test_y is None:
        train_idx, held_out = _holdout(labels, cfg.test_fraction, cfg.test_per_class, seed)
    else:
        train_idx, test_rows = np.arange(len(labels.y)), np.arange(len(labels.test_y))
    if cfg.train_per_class:  # seeded per-class subsets, fixed by the data seed, drawn before partitioning
        train_idx = train_idx[_per_stratum(_strata(labels)[train_idx], lambda n: min(cfg.train_per_class, n), seed, 2)]
    if cfg.test_per_class and test_rows is not None and labels.test_y is not None:  # official (else: the hold-out's size)
        test_rows = _per_stratum(labels.test_y, lambda n: min(cfg.test_per_class, n), seed, 3)
    return train_idx, test_rows, held_out


def _test_split(pool: Pool, test_rows: np.ndarray | None, held_out: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """The global test split's (x, y) as :func:`_selection` chose it (None: the clients' local tests)."""
    if test_rows is not None:
        assert pool.test_x is not None and pool.test_y is not None
        return pool.test_x[test_rows], pool.test_y[test_rows]
    return (pool.x[held_out], pool.y[held_out]) if held_out is not None else None


def _plan(cfg: DataConfig, labels: Labels, seed: int
          ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, list[np.ndarray]]:
    """What a pool's federation is made of, from its labels alone: :func:`_selection`'s indices and
    the partition of the samples to partition (one index array per client, into those samples).
    Every refusal of a partition (too many clients, classes or samples asked of the data) comes from
    here, for a run (:func:`build_federation`) and for its check (:func:`outline`) alike."""
    train_idx, test_rows, held_out = _selection(cfg, labels, seed)
    groups = None if labels.groups is None else labels.groups[train_idx]
    parts = PARTITIONS.get(cfg.partition).build(cfg, labels.y[train_idx], groups, seed)
    return train_idx, test_rows, held_out, parts


Standardiser = Callable[[np.ndarray, np.ndarray], Split]


def _standardiser(cfg: DataConfig, x: np.ndarray, train_idx: np.ndarray
                  ) -> tuple[Standardiser, np.ndarray | float, np.ndarray | float]:
    """(x, y) → a :class:`Split` standardised with the per-channel statistics of the samples to
    partition (``data.normalize``), and those mean and std (C×1×1 for images)."""
    if x.dtype == np.uint8:  # images: uint8 until the batch, statistics computed in chunks
        stats = uint8_channel_stats([x if len(train_idx) == len(x) else x[train_idx]]) if cfg.normalize else None
        mean, std = (stats[0].reshape(-1, 1, 1), stats[1].reshape(-1, 1, 1)) if stats else (0.0, 1.0)
        return (lambda a, b: _split(a, b, stats)), mean, std
    whole = len(train_idx) == len(x) and x.flags.c_contiguous and bool((train_idx == np.arange(len(x))).all())
    mean, std = _channel_stats(x if whole else x[train_idx]) if cfg.normalize else (0.0, 1.0)  # every sample: no copy
    return (lambda a, b: _split((a - mean) / std, b)), mean, std


def _from_pool(cfg: DataConfig, pool: Pool, seed: int) -> Federation:
    """A pool's federation in one pass: the samples chosen and partitioned as indices (:func:`_plan`),
    the held-out clients (``data.holdout_clients``) drawn, the statistics of the training clients'
    samples alone, each client's splits cut from its indices and standardised when it is read
    (:class:`~fedlatent.data.clients.Clients`), and the held-out clients set apart
    (:func:`fedlatent.data.holdout.split`, by the same draw)."""
    if cfg.merge_test:
        pool = merged(pool)
    x, y, groups = pool.x, pool.y, pool.groups
    labels = pool.labels()
    train_idx, test_rows, held_out, parts = _plan(cfg, labels, seed)
    test_xy = _test_split(pool, test_rows, held_out)
    new = holdout.partition_ids(cfg, len(parts), seed)  # data.holdout_clients: their samples standardise nothing
    split, mean, std = _standardiser(cfg, x, train_idx if not new else np.concatenate(
        [train_idx[parts[i]] for i in holdout.kept(len(parts), new)]))
    by_domain = PARTITIONS.get(cfg.partition).traits.get("needs_groups") and held_out is not None and groups is not None
    domains = np.unique(groups) if by_domain else None  # a domain's client tested on its held-out samples

    def cut(i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Client ``i``'s (train, val, test) sample indices."""
        train, val, local_test = P.split_fractions(train_idx[parts[i]], (cfg.val_fraction, cfg.local_test_fraction),
                                                   seed=seed * 7919 + i)
        if domains is not None and not len(local_test):
            assert groups is not None and held_out is not None
            local_test = held_out[groups[held_out] == domains[i]]  # this domain's held-out test
        return train, val, local_test

    def client(i: int) -> ClientData:
        train, val, test = cut(i)
        return ClientData(split(x[train], y[train]), split(x[val], y[val]) if len(val) else None,
                          split(x[test], y[test]) if len(test) else None)

    sizes = _client_sizes(cfg, labels, held_out, parts)
    sizes[:, 1:][sizes[:, 1:] == 0] = -1  # a client without validation or test samples has no such split
    clients = Clients(client, sizes, labels=lambda i: y[cut(i)[0]])
    global_test = split(*test_xy) if test_xy is not None else JoinedTests(clients)
    whole = Federation(clients, global_test, pool.num_classes, tuple(x.shape[1:]),
                       name=cfg.dataset, augment=Augmentation(cfg.augment, cfg.autoaugment, mean, std),
                       test_of_clients=test_xy is None)
    return holdout.split(whole, new)


def _channel_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std of N×C×H×W images (or per-feature for flat data)."""
    axes = (0, 2, 3) if x.ndim == 4 else (0,)
    mean = x.mean(axis=axes, keepdims=True)[0]
    std = x.std(axis=axes, keepdims=True)[0]
    return mean.astype(np.float32), np.maximum(std, 1e-6).astype(np.float32)


def channel_census(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """One node's share of the normalisation census of its N×C×H×W images (or N×F features):
    per-channel Σx and Σx² in float64, and how many values each channel holds."""
    axes = (0, 2, 3) if x.ndim == 4 else (0,)
    x64 = x.astype(np.float64)
    count = int(np.prod([x.shape[a] for a in axes]))
    return x64.sum(axis=axes, keepdims=True)[0], (x64 ** 2).sum(axis=axes, keepdims=True)[0], count


def pooled_channel_stats(census: list[tuple[np.ndarray, np.ndarray, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and (population) std of the nodes' data together from their censuses,
    summed in float64 in node order; shapes and dtype as :func:`_channel_stats`."""
    total = sum(c[0] for c in census)
    squares = sum(c[1] for c in census)
    count = max(sum(c[2] for c in census), 1)
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean ** 2, 0.0))
    return mean.astype(np.float32), np.maximum(std, 1e-6).astype(np.float32)


def counts_table(federation: Federation) -> np.ndarray:
    """Training samples per client × class, from each client's labels (one client at a time, its
    samples not built where the partition's indices tell its labels)."""
    clients = federation.clients
    return np.stack([np.bincount(train_labels(clients, i), minlength=federation.num_classes)
                     for i in range(len(clients))])
