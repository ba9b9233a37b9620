"""``[diagnostics]`` on Flower: the server halves of :mod:`fedlatent.federated.diagnostics` here,
the client halves on the SuperNodes (:mod:`.client_app`), gathered in extra rounds of messages.

``query.diagnostics`` carries the model states to measure (the global model, and the selected
clients' local models with ``clients`` on) and each holder's rows of the uniformity sample; each
node answers with every served client's :func:`~fedlatent.federated.diagnostics.model_statistics`.
``query.tsne`` and ``query.data`` (label counts and mean-value ranges, then, sent the common bin
edges, the histogram counts) likewise. The server combines the replies in client-id order, so the
records are the embedded backend's (up to float rounding of the summed moments). The global test
split is measured on the server where it holds it (``flower.server_reads_data``), as on the
embedded backend, else on the first node holding it (``sample.global``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
from flwr.app import Message
from torch import Tensor

from fedlatent.analysis import diagnostics as dg
from fedlatent.backends.flower import messages as M
from fedlatent.config import RunConfig
from fedlatent.data.types import GlobalData
from fedlatent.errors import ConfigError
from fedlatent.federated.diagnostics import (_UNIFORMITY_SAMPLE, FEATURE_DIAGNOSTICS, Diagnostics, data_record,
                                             no_samples, sample_plan)
from fedlatent.methods.parts import Tensors
from fedlatent.models.base import FedModel
from fedlatent.seeding import DIAGNOSTICS, derive_seed

Broadcast = Callable[..., dict[int, Message]]  # (message type, records, nodes=None: every node) → replies
GLOBAL_TEST = "global"  # the global test split where holders are named (client ids otherwise)


def model_records(states: dict[str, Tensors]) -> dict[str, Any]:
    return {f"model.{name}": M.to_record(state) for name, state in states.items()}


def replies_by_holder(replies: dict[int, Message], prefix: str) -> dict[str, dict[str, Tensors]]:
    """The replies' ArrayRecords ``prefix.<name>.<holder>`` as {name: {holder: tensors}}, a holder
    being a client id or :data:`GLOBAL_TEST`."""
    out: dict[str, dict[str, Tensors]] = {}
    for reply in replies.values():
        for key, record in reply.content.array_records.items():
            kind, _, rest = key.partition(".")
            if kind == prefix:
                name, _, holder = rest.rpartition(".")
                out.setdefault(name, {})[holder] = M.from_record(record)
    return out


class FlowerDiagnostics(Diagnostics):
    """The configured diagnostics of a run on Flower: the clients' splits stay on their nodes;
    ``data`` is the server's view of the data (its classes, its test split where it holds one),
    ``sizes`` the census's split sizes by client id, ``global_test`` the nodes holding the global
    test split and its size (measured on the first of them where the server holds no copy),
    ``broadcast`` sends a message type and its records to every node (or those named) and returns
    the replies."""

    def __init__(self, config: RunConfig, data: GlobalData, path: Path, sizes: dict[str, list[int]],
                 broadcast: Broadcast, warn: Callable[[str], None], device: torch.device = torch.device("cpu"),
                 global_test: tuple[list[int], int] = ([], 0)) -> None:
        self.cfg, self.seed, self.rounds = config.diagnostics, config.seed, config.train.rounds
        self.num_classes, self.path, self.device = data.num_classes, path, device
        self.batch_size, self.which = config.eval.batch_size, set(self.cfg.which)
        self.broadcast, self.warn, self.train_sizes = broadcast, warn, sizes["train"]
        name = self.cfg.split
        self.nodes: list[int] | None = None  # the nodes asked for the holders' statistics (None: every node)
        self.holders: list[str]
        if name == "test" and data.test is not None and len(data.test):
            self.splits, self.holders, held = [data.test], [], [len(data.test)]
        elif name == "test" and global_test[1]:
            self.splits, self.holders, held, self.nodes = [], [GLOBAL_TEST], [global_test[1]], global_test[0][:1]
        else:
            self.splits = []
            self.holders = [str(cid) for cid, n in enumerate(sizes[name]) if n]
            held = [sizes[name][int(cid)] for cid in self.holders]
            if not self.holders:
                raise no_samples(name)
        if "tsne" in self.which and self.cfg.tsne_class >= data.num_classes:
            raise ConfigError(f"diagnostics.tsne_class = {self.cfg.tsne_class}: the data set has "
                              f"{data.num_classes} classes (0 .. {data.num_classes - 1})")
        self.samples = sample_plan(held, self.cfg.max_samples, derive_seed(self.seed, DIAGNOSTICS, _UNIFORMITY_SAMPLE))

    def holder_statistics(self, model: FedModel, states: dict[str, Tensors]) -> dict[str, list[Tensors]]:
        """The server's own split measured here; else each holder's statistics of every state,
        gathered in one ``query.diagnostics`` exchange, in client-id order."""
        if self.splits:
            return super().holder_statistics(model, states)
        records = {**model_records(states),
                   **{f"sample.{cid}": M.to_record({"rows": rows}) for cid, rows in zip(self.holders, self.samples)},
                   "diagnostics": M.pack_values({"which": sorted(self.which & FEATURE_DIAGNOSTICS),
                                                 "split": self.cfg.split})}
        got = replies_by_holder(self.broadcast("query.diagnostics", records, nodes=self.nodes), "stats")
        out = {}
        for name in states:
            by_client = got.get(name, {})
            missing = [cid for cid in self.holders if cid not in by_client]
            if missing:
                self.warn(f"diagnostics of {name} without {_holders(missing)} (no statistics came back)")
            out[name] = [by_client[cid] for cid in self.holders if cid in by_client]
        return out

    def tsne_features(self, model: FedModel, global_state: Tensors, local: dict[int, Tensors]) -> dict[int, Tensor]:
        """Every served client's t-SNE features from one ``query.tsne`` exchange; the first
        ``tsne_clients`` holders in client-id order kept, as the embedded backend picks them."""
        records = {**model_records({"global": global_state, **{f"client{c}": s for c, s in local.items()}}),
                   "tsne": M.pack_values({"class": self.cfg.tsne_class, "cap": self.cfg.tsne_samples})}
        got = {int(cid): z for cid, z in replies_by_holder(self.broadcast("query.tsne", records), "tsne")
               .get("z", {}).items()}
        return {cid: got[cid]["z"] for cid in sorted(got)[:self.cfg.tsne_clients]}

    def data_record(self) -> dict[str, Any]:
        """The data figures from two ``query.data`` exchanges: label counts and mean-value ranges,
        then the histogram counts over the common edges."""
        first = self._data_values({})
        n = len(self.train_sizes)
        edges = dg.histogram_edges([first[cid]["range"] for cid in range(n)], self.cfg.histogram_bins)
        second = self._data_values({"edges": M.pack_values({"edges": edges.tolist()})})
        return data_record([first[cid]["counts"] for cid in range(n)], edges,
                           [second[cid]["histogram"] for cid in range(n)])

    def _data_values(self, records: dict[str, Any]) -> dict[int, dict[str, Any]]:
        values: dict[int, dict[str, Any]] = {}
        for reply in self.broadcast("query.data", records).values():
            values.update({int(k): v for k, v in M.unpack_values(reply.content["data"]).items()})
        missing = sorted(set(range(len(self.train_sizes))) - set(values))
        if missing:
            raise RuntimeError(f"diagnostics: no data figures came back from client(s) {missing}")
        return values



def _holders(missing: list[str]) -> str:
    return "the global test split" if missing == [GLOBAL_TEST] else f"client(s) {[int(c) for c in missing]}"
