"""The ``[diagnostics]`` of a run: client halves computed by the holders of the samples, server
halves that combine them in holder order; appended to ``diagnostics.jsonl``.

Every backend calls :meth:`Diagnostics.record` after a round's aggregation with the new global
weights and the round's uploads (the local models the selected clients trained). One JSON object
per (round, model): ``model`` is ``"global"`` or ``"client<i>"``; a ``"data"`` object (round 0)
holds the data figures. NaN values are written as null. The diagnostics draw only from their own
seed stream (``seeding.DIAGNOSTICS``) and run the models in eval mode without gradients, so
turning them on changes no training number.

No server half reads a sample. The diagnostic split is held by the server (the global test set)
or by the clients (their own splits of that name); each holder runs the model state it is sent on
its own samples (:func:`model_statistics`, :func:`tsne_features`, :func:`label_counts`,
:func:`mean_value_range`, :func:`mean_value_counts`) and the server combines the results in
client-id order (:func:`combine_statistics`, :func:`tsne_record`, :func:`data_record`). Sums
combine: counts, per-class hits and histogram counts exactly, the collapse spectrum's feature
moments up to float rounding. Two diagnostics need raw features, so a client sends a seeded
sample of its z: uniformity (the rows of its split that the server's seeded subsample of the
pooled split picks, :func:`sample_plan`, from the holders' split sizes; pairwise distances are no
sum) and t-SNE (at most ``tsne_samples`` features of the class). With ``clients`` on, every
holder is also sent the selected clients' local models, since each is measured on the whole
split. The classifier spectra, the alignments and the FLOPs read only weights and uploads.
:class:`Diagnostics` drives both halves for the embedded backends, which play every client in
one process; a backend whose holders are remote overrides where the client halves run
(:meth:`Diagnostics.holder_statistics`, :meth:`Diagnostics.tsne_features`,
:meth:`Diagnostics.data_record`; ``backends/flower/diagnostics.py``).
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from fedlatent.analysis import diagnostics as dg
from fedlatent.config import RunConfig
from fedlatent.data.types import Federation, Split
from fedlatent.errors import ConfigError
from fedlatent.methods.parts import Tensors, Upload
from fedlatent.models.base import FedModel
from fedlatent.seeding import DIAGNOSTICS, derive_seed

CLASSIFIER = "classifier.weight"
FEATURE_DIAGNOSTICS = frozenset({"collapse", "uniformity", "per_class"})  # those that run the split through a model
# sub-streams of seeding.DIAGNOSTICS
_UNIFORMITY_SAMPLE, _TSNE_SAMPLE, _TSNE_FIT = range(3)


def held_splits(federation: Federation, name: str) -> list[Split]:
    """The samples diagnostics run on, as their holders keep them: the global test set (the
    server's), else each client's split ``name`` in client-id order (clients without one left out)."""
    if name == "test" and federation.test is not None and len(federation.test):
        return [federation.test]
    parts = [getattr(c, name) for c in federation.clients]
    parts = [p for p in parts if p is not None and len(p)]
    if not parts:
        raise no_samples(name)
    return parts


def no_samples(name: str) -> ConfigError:
    """The error of a diagnostics split no client holds."""
    hint = {"val": " (set data.val_fraction)", "test": " (set data.local_test_fraction)"}.get(name, "")
    return ConfigError(f"diagnostics.split = {name!r}: this federation has no such samples{hint}")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _subsample(n: int, cap: int, seed: int) -> Tensor:
    """Indices of at most ``cap`` of ``n`` items: all in order, or a seeded sorted choice."""
    if n <= cap:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:cap].sort().values


def sample_plan(sizes: list[int], cap: int, seed: int) -> list[Tensor]:
    """Server half of the uniformity sample: a seeded sorted choice of at most ``cap`` rows of the
    pooled split (holders' rows one after another, in order), as each holder's own row indices."""
    pooled = _subsample(sum(sizes), cap, seed)
    starts = np.cumsum([0, *sizes])
    return [pooled[(pooled >= lo) & (pooled < hi)] - int(lo) for lo, hi in zip(starts[:-1], starts[1:])]


def model_statistics(model: FedModel, state: Tensors, split: Split, which: set[str], num_classes: int,
                     sample: Tensor, batch_size: int, device: torch.device) -> Tensors:
    """Client half: what one holder sends for the model ``state`` on its own ``split``
    (:func:`split_statistics` of ``model`` loaded with ``state``)."""
    model.load_state_dict(state)
    return split_statistics(model, split, which, num_classes, sample, batch_size, device)


@torch.no_grad()
def split_statistics(model: FedModel, split: Split, which: set[str], num_classes: int,
                     sample: Tensor, batch_size: int, device: torch.device) -> Tensors:
    """What one holder sends for ``model`` (loaded already) on its own ``split``. Always the
    count; ``collapse``: the float64 mean and centred scatter Σ(z − z̄)(z − z̄)ᵀ of z; ``uniformity``:
    the raw z of the rows ``sample`` (the server's seeded choice); ``per_class``: per-class hits and counts."""
    z, pred = dg.representations(model, split.x, batch_size, device)
    out: Tensors = {"count": torch.tensor(len(z))}
    if "collapse" in which:
        _, out["mean"], out["scatter"] = dg.feature_moments(z)
    if "uniformity" in which:
        out["sample"] = z[sample]
    if "per_class" in which:
        out["class_correct"], out["class_count"] = dg.class_hits(pred, split.y, num_classes)
    return out


def combine_statistics(stats: list[Tensors], which: set[str], threshold: float, t: float) -> dict[str, Any]:
    """Server half: the diagnostics of one model over the whole split from its holders'
    statistics (in holder order): the collapse spectrum of the pooled moments, the uniformity of the
    concatenated samples, the per-class accuracy of the summed hits."""
    out: dict[str, Any] = {"num_samples": sum(int(s["count"]) for s in stats)}
    if "collapse" in which:
        count, _, scatter = dg.pool_moments([(int(s["count"]), s["mean"], s["scatter"]) for s in stats])
        out.update(dg.spectrum_collapse(dg.moments_spectrum(count, scatter), threshold), threshold=threshold)
    if "uniformity" in which:
        out["uniformity"] = dg.hyperspherical_uniformity(torch.cat([s["sample"] for s in stats]), t)
    if "per_class" in which:
        out["per_class_accuracy"] = dg.hits_accuracy(sum(s["class_correct"] for s in stats),
                                                     sum(s["class_count"] for s in stats))
    return out


@torch.no_grad()
def tsne_features(model: FedModel, state: Tensors, train: Split, cls: int, cap: int, seed: int,
                  batch_size: int, device: torch.device) -> Tensor | None:
    """Client half of the t-SNE: z under ``state`` of at most ``cap`` of its training samples of
    class ``cls`` (a choice seeded by ``seed``, the same every round). Raw features, since t-SNE
    embeds points; None when it holds fewer than two such samples."""
    idx = torch.nonzero(train.y == cls).flatten()
    if len(idx) < 2:
        return None
    model.load_state_dict(state)
    return dg.representations(model, train.x[idx[_subsample(len(idx), cap, seed)]], batch_size, device)[0]


def tsne_seed(seed: int, cid: int) -> int:
    """The seed of client ``cid``'s choice of t-SNE samples (the same every round), from its stream
    seed ``seed`` (:meth:`~fedlatent.federated.randomness.Randomness.client_seed`)."""
    return derive_seed(seed, DIAGNOSTICS, _TSNE_SAMPLE, cid)


def tsne_record(features: dict[int, Tensor], sources: dict[int, str], cls: int, seed: int) -> dict[str, Any]:
    """Server half of the t-SNE: one seeded embedding of the clients' features (by client id)."""
    groups = sorted(features)
    emb = dg.tsne_embedding([features[c] for c in groups], groups, seed)
    return {"class": cls, "xy": emb["xy"], "client": emb["group"],
            "model_of_client": {str(c): sources[c] for c in groups}}


def label_counts(train: Split, num_classes: int) -> list[int]:
    """Client half of the data figures: its training label counts."""
    return torch.bincount(train.y, minlength=num_classes).tolist()


def mean_value_range(train: Split) -> tuple[float, float] | None:
    """Client half of the histograms' common range: min and max of its samples' mean input
    values (None without samples)."""
    means = dg.sample_means(train.x[:])
    return (float(means.min()), float(means.max())) if means.size else None


def mean_value_counts(train: Split, edges: np.ndarray) -> list[int]:
    """Client half of the histograms: its samples' mean input values counted in the server's bins."""
    return np.histogram(dg.sample_means(train.x[:]), edges)[0].tolist()


def data_record(counts: list[list[int]], edges: np.ndarray, histograms: list[list[int]]) -> dict[str, Any]:
    """Server half of the FedUV supplement's data figures, clients in id order: their label counts
    and their histograms over the common ``edges`` (``analysis.diagnostics.histogram_edges`` of
    their ranges)."""
    return {"round": 0, "model": "data", "split": "train", "label_counts": counts,
            "mean_value_histogram": {"edges": edges.tolist(), "counts": histograms}}


class Diagnostics:
    """The configured diagnostics of one run, written to ``path``: the server halves, with the
    client halves run in this process on every holder's samples (the embedded backends)."""

    def __init__(self, config: RunConfig, federation: Federation, path: Path,
                 device: torch.device = torch.device("cpu"), client_seed: Callable[[int], int] | None = None) -> None:
        self.cfg, self.seed, self.rounds = config.diagnostics, config.seed, config.train.rounds
        # each client's stream seed (its t-SNE sample's): the run seed unless the run's randomness is secret
        self.client_seed = client_seed or (lambda cid: self.seed)
        self.federation, self.path, self.device = federation, path, device
        self.num_classes, self.batch_size = federation.num_classes, config.eval.batch_size
        self.which = set(self.cfg.which)
        self.splits = held_splits(federation, self.cfg.split)
        if "tsne" in self.which and self.cfg.tsne_class >= federation.num_classes:
            raise ConfigError(f"diagnostics.tsne_class = {self.cfg.tsne_class}: the data set has "
                              f"{federation.num_classes} classes (0 .. {federation.num_classes - 1})")
        self.samples = sample_plan([len(s) for s in self.splits], self.cfg.max_samples,
                                   derive_seed(self.seed, DIAGNOSTICS, _UNIFORMITY_SAMPLE))

    def start(self, start_round: int) -> None:
        """Keep the records of rounds ≤ ``start_round`` (a resumed run) and, on a fresh run, write
        the data figures."""
        kept = [l for l in self.path.read_text().splitlines() if json.loads(l)["round"] <= start_round] \
            if start_round and self.path.exists() else []
        self.path.write_text("".join(l + "\n" for l in kept))
        if start_round == 0 and "data" in self.which:
            self._write([self.data_record()])

    def due(self, rnd: int) -> bool:
        """Whether round ``rnd`` (1-based) is a diagnostics round: every ``every``-th and the last."""
        return bool(self.which - {"data"}) and (rnd % self.cfg.every == 0 or rnd == self.rounds)

    def data_record(self) -> dict[str, Any]:
        """The FedUV supplement's data figures: label counts and per-client mean-input histograms,
        in one pass over each training set (this process holds them all; the client halves that
        Flower's nodes run give the same record: tests/test_diagnostics_halves.py)."""
        clients = self.federation.clients  # read one client at a time (built when read: clients.Clients)
        pooled = dg.mean_value_histograms((c.train.x[:] for c in clients), self.cfg.histogram_bins)
        return data_record([label_counts(c.train, self.federation.num_classes) for c in clients],
                           np.asarray(pooled["edges"]), pooled["counts"])

    def record(self, rnd: int, model: FedModel, global_state: Tensors, uploads: list[Upload]) -> None:
        """Diagnostics of round ``rnd`` for the global model and, when asked, each upload's local
        model; ``model`` is a scratch instance, left holding ``global_state``."""
        started = time.perf_counter()
        local = {f"client{u.client_id}": u.state for u in uploads} if self.cfg.clients else {}
        values = self.models_values(model, {"global": global_state, **local})
        line = {"round": rnd, "model": "global", "split": self.cfg.split, **values["global"]}
        if "flops" in self.which:  # the round's local training, counted by each client
            line["flops"] = sum(u.metrics["flops"] for u in uploads)
        if "alignment" in self.which:
            align = dg.classifier_alignment([u.state[CLASSIFIER] for u in uploads])
            line.update({f"alignment_{k}": v for k, v in align.items()})
        if "layer_alignment" in self.which:  # FedDecorr Assumption 2 (Fig. 6) on the global weights
            model.load_state_dict(global_state)
            pairs = dg.consecutive_alignment(model)
            line["layer_alignment"] = pairs
            line["layer_alignment_top"] = float(np.mean([p["alignment"][0] for p in pairs])) if pairs else None
        lines = [line]
        if self.cfg.clients:
            for upload in uploads:
                lines.append({"round": rnd, "model": f"client{upload.client_id}", "split": self.cfg.split,
                              **values[f"client{upload.client_id}"],
                              **({"flops": upload.metrics["flops"]} if "flops" in self.which else {})})
        if "tsne" in self.which:
            line["tsne"] = self.tsne(rnd, model, global_state, uploads)
        model.load_state_dict(global_state)
        line["time_s"] = time.perf_counter() - started
        self._write(lines)

    def models_values(self, model: FedModel, states: dict[str, Tensors]) -> dict[str, dict[str, Any]]:
        """The per-model diagnostics of each named state on the split (``model`` is the scratch
        instance the holders run it in)."""
        stats = self.holder_statistics(model, states) if self.which & FEATURE_DIAGNOSTICS else {}
        out: dict[str, dict[str, Any]] = {}
        for name, state in states.items():
            out[name] = combine_statistics(stats[name], self.which, self.cfg.threshold, self.cfg.uniformity_t) \
                if name in stats else {}
            if "classifier" in self.which:
                out[name]["classifier_singular_values"] = dg.classifier_spectrum(state[CLASSIFIER]).tolist()
        return out

    def holder_statistics(self, model: FedModel, states: dict[str, Tensors]) -> dict[str, list[Tensors]]:
        """The client halves: each holder's :func:`model_statistics` of each named state, in holder
        order (a backend whose holders are remote gathers them all in one exchange); each state
        loaded once for all holders."""
        stats: dict[str, list[Tensors]] = {}
        for name, state in states.items():
            model.load_state_dict(state)
            stats[name] = [split_statistics(model, split, self.which, self.num_classes, sample,
                                            self.batch_size, self.device)
                           for split, sample in zip(self.splits, self.samples)]
        return stats

    def tsne(self, rnd: int, model: FedModel, global_state: Tensors, uploads: list[Upload]) -> dict[str, Any]:
        """t-SNE of the class's samples of the first ``tsne_clients`` clients holding at least two:
        each through that client's local model when ``clients`` is on and it trained this round,
        else through the global model."""
        local = {u.client_id: u.state for u in uploads} if self.cfg.clients else {}
        features = self.tsne_features(model, global_state, local)
        sources = {cid: "local" if cid in local else "global" for cid in features}
        return tsne_record(features, sources, self.cfg.tsne_class, derive_seed(self.seed, DIAGNOSTICS, _TSNE_FIT, rnd))

    def tsne_features(self, model: FedModel, global_state: Tensors, local: dict[int, Tensors]) -> dict[int, Tensor]:
        """The t-SNE features of the first ``tsne_clients`` clients holding at least two samples of
        the class, by client id (each through ``local[cid]`` when given, else the global model)."""
        features: dict[int, Tensor] = {}
        for cid, client in enumerate(self.federation.clients):
            if len(features) == self.cfg.tsne_clients:
                break
            z = tsne_features(model, local.get(cid, global_state), client.train, self.cfg.tsne_class,
                              self.cfg.tsne_samples, tsne_seed(self.client_seed(cid), cid), self.batch_size, self.device)
            if z is not None:
                features[cid] = z
        return features

    def _write(self, lines: list[dict[str, Any]]) -> None:
        with self.path.open("a") as sink:
            for line in lines:
                sink.write(json.dumps(_jsonable(line)) + "\n")
