"""The ``[diagnostics]`` of a run: computed at the evaluation seam, appended to ``diagnostics.jsonl``.

Every backend calls :meth:`Diagnostics.record` after a round's aggregation with the new global
weights and the round's uploads (the local models the selected clients trained). One JSON object
per (round, model): ``model`` is ``"global"`` or ``"client<i>"``; a ``"data"`` object (round 0)
holds the data figures. NaN values are written as null. The diagnostics draw only from their own
seed stream (``seeding.DIAGNOSTICS``) and run the models in eval mode without gradients, so
turning them on changes no training number.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

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
# sub-streams of seeding.DIAGNOSTICS
_UNIFORMITY_SAMPLE, _TSNE_SAMPLE, _TSNE_FIT = range(3)


def diagnostic_split(federation: Federation, name: str) -> Split:
    """The samples diagnostics run on: the global test set (else the clients' test splits), or all
    clients' validation / training splits."""
    if name == "test" and federation.test is not None and len(federation.test):
        return federation.test
    parts = [getattr(c, name) for c in federation.clients]
    parts = [p for p in parts if p is not None and len(p)]
    if not parts:
        hint = {"val": " (set data.val_fraction)", "test": " (set data.local_test_fraction)"}.get(name, "")
        raise ConfigError(f"diagnostics.split = {name!r}: this federation has no such samples{hint}")
    return Split.concat(parts)


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


class Diagnostics:
    """The configured diagnostics of one run, written to ``path``."""

    def __init__(self, config: RunConfig, federation: Federation, path: Path,
                 device: torch.device = torch.device("cpu")) -> None:
        self.cfg, self.seed, self.rounds = config.diagnostics, config.seed, config.train.rounds
        self.federation, self.path, self.device = federation, path, device
        self.batch_size = config.eval.batch_size
        self.which = set(self.cfg.which)
        self.split = diagnostic_split(federation, self.cfg.split)
        if "tsne" in self.which and self.cfg.tsne_class >= federation.num_classes:
            raise ConfigError(f"diagnostics.tsne_class = {self.cfg.tsne_class}: the data set has "
                              f"{federation.num_classes} classes (0 .. {federation.num_classes - 1})")
        self.uniformity_index = _subsample(len(self.split), self.cfg.max_samples,
                                           derive_seed(self.seed, DIAGNOSTICS, _UNIFORMITY_SAMPLE))
        self.tsne_sets = self._tsne_sets() if "tsne" in self.which else {}

    def _tsne_sets(self) -> dict[int, Tensor]:
        """The first ``tsne_clients`` clients holding ≥ 2 training samples of the class, with at most
        ``tsne_samples`` of them each (the same samples every round)."""
        sets: dict[int, Tensor] = {}
        for cid, client in enumerate(self.federation.clients):
            idx = torch.nonzero(client.train.y == self.cfg.tsne_class).flatten()
            if len(idx) >= 2 and len(sets) < self.cfg.tsne_clients:
                keep = _subsample(len(idx), self.cfg.tsne_samples, derive_seed(self.seed, DIAGNOSTICS, _TSNE_SAMPLE, cid))
                sets[cid] = client.train.x[idx[keep]]
        return sets

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
        """The FedUV supplement's data figures: label counts and per-client mean-input histograms."""
        fed = self.federation
        counts = [torch.bincount(c.train.y, minlength=fed.num_classes).tolist() for c in fed.clients]
        return {"round": 0, "model": "data", "split": "train", "label_counts": counts,
                "mean_value_histogram": dg.mean_value_histograms([c.train.x[:] for c in fed.clients],
                                                                 self.cfg.histogram_bins)}

    def record(self, rnd: int, model: FedModel, global_state: Tensors, uploads: list[Upload]) -> None:
        """Diagnostics of round ``rnd`` for the global model and, when asked, each upload's local
        model; ``model`` is a scratch instance, left holding ``global_state``."""
        started = time.perf_counter()
        model.load_state_dict(global_state)
        line = {"round": rnd, "model": "global", "split": self.cfg.split, **self.model_values(model)}
        if "flops" in self.which:  # the round's local training, counted by each client
            line["flops"] = sum(u.metrics["flops"] for u in uploads)
        if "alignment" in self.which:
            align = dg.classifier_alignment([u.state[CLASSIFIER] for u in uploads])
            line.update({f"alignment_{k}": v for k, v in align.items()})
        lines = [line]
        if self.cfg.clients:
            for upload in uploads:
                model.load_state_dict(upload.state)
                lines.append({"round": rnd, "model": f"client{upload.client_id}", "split": self.cfg.split,
                              **self.model_values(model),
                              **({"flops": upload.metrics["flops"]} if "flops" in self.which else {})})
        if "tsne" in self.which:
            line["tsne"] = self.tsne(rnd, model, global_state, uploads)
        model.load_state_dict(global_state)
        line["time_s"] = time.perf_counter() - started
        self._write(lines)

    def model_values(self, model: FedModel) -> dict[str, Any]:
        """The per-model diagnostics of ``model`` on the split."""
        out: dict[str, Any] = {}
        needs_z = self.which & {"collapse", "uniformity", "per_class"}
        if needs_z:
            z, pred = dg.representations(model, self.split.x, self.batch_size, self.device)
            out["num_samples"] = len(z)
        if "collapse" in self.which:
            out.update(dg.collapse(z, self.cfg.threshold), threshold=self.cfg.threshold)
        if "uniformity" in self.which:
            out["uniformity"] = dg.hyperspherical_uniformity(z[self.uniformity_index], self.cfg.uniformity_t)
        if "per_class" in self.which:
            out["per_class_accuracy"] = dg.per_class_accuracy(pred, self.split.y, self.federation.num_classes)
        if "classifier" in self.which:
            out["classifier_singular_values"] = dg.classifier_spectrum(model.classifier.weight).tolist()
        return out

    def tsne(self, rnd: int, model: FedModel, global_state: Tensors, uploads: list[Upload]) -> dict[str, Any]:
        """t-SNE of the class's samples of several clients: each through that client's local model
        when ``clients`` is on and it trained this round, else through the global model."""
        local = {u.client_id: u.state for u in uploads} if self.cfg.clients else {}
        feats, groups, sources = [], [], []
        for cid, x in self.tsne_sets.items():
            model.load_state_dict(local.get(cid, global_state))
            feats.append(dg.representations(model, x, self.batch_size, self.device)[0])
            groups.append(cid)
            sources.append("local" if cid in local else "global")
        emb = dg.tsne_embedding(feats, groups, derive_seed(self.seed, DIAGNOSTICS, _TSNE_FIT, rnd))
        return {"class": self.cfg.tsne_class, "xy": emb["xy"], "client": emb["group"],
                "model_of_client": dict(zip(map(str, groups), sources))}

    def _write(self, lines: list[dict[str, Any]]) -> None:
        with self.path.open("a") as sink:
            for line in lines:
                sink.write(json.dumps(_jsonable(line)) + "\n")
