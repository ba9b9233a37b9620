"""The server half of fedlatent as a Flower ServerApp (Message API).

:func:`serve` is the embedded backend's run with messages in place of calls: a census of the
SuperNodes (which clients each serves, the sizes and label counts of their splits, how many
clients their federation has), then the run driver
(``federated.driver``: the same round, round loop, checkpoints and final evaluation as the
embedded backends) with :class:`ServerRun` as its clients: one ``train`` message per SuperNode
(its selected clients' tasks; replies sorted by client id, so reply order cannot change the
numbers), the validation accuracies, calibration statistics and personalised reports gathered by
messages. A client that raises, diverges or does not reply within ``flower.timeout`` seconds is a
:class:`ClientFailure` for the shared failure policy; each is told in one log line. Under secure
aggregation a round's ``train`` and a calibration's ``query.statistics`` are the middle of a SecAgg+
session (:mod:`.secagg_session`) and the server's codec reads only their sums (:mod:`.secagg_codec`).

:func:`deployment_app` builds the ServerApp ``flwr run`` starts; the simulation engine
(:mod:`.engine`) runs :func:`serve` on its in-memory grid.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.superlink.grid import InMemoryGrid

from fedlatent.backends.flower import distributed as flower_dp
from fedlatent.backends.flower import messages as M
from fedlatent.backends.flower import node_view
from fedlatent.backends.flower.diagnostics import FlowerDiagnostics
from fedlatent.backends.flower.node_terms import is_refusal
from fedlatent.backends.flower.secagg_settings import Settings
from fedlatent.backends.flower.secagg_codec import VECTOR, Layout, Unmasking, UnmaskingCodec, layout
from fedlatent.backends.flower.secagg_session import Session, open_session
from fedlatent.federated.round import ClientTask, stream_seed
from fedlatent.backends.simulation import initial_server
from fedlatent.federated import driver
from fedlatent.federated.accounting import SampleAccountant
from fedlatent.config import RunConfig, holdout_count
from fedlatent.data.federation import pooled_channel_stats
from fedlatent.data.types import Outline, ServerView
from fedlatent.errors import ConfigError, DataError
from fedlatent.federated import evaluation, sampled
from fedlatent.federated.calibrate import summed_statistics
from fedlatent.federated.failures import ClientFailure, RunStopped
from fedlatent.federated.server import Server
from fedlatent.federated.state import write_atomically
from fedlatent.methods.parts import MethodSpec, Tensors, Upload
from fedlatent.models import FedModel
from fedlatent.seeding import SECAGG_GRAPH, derive_seed

CENSUS_WAIT_S = 120.0  # how long the census waits for SuperNodes to serve every client
POLL_S = 1e-4  # the simulation engine's grid: seconds between its polls for replies per message outstanding


def pace(grid: Grid, outstanding: int) -> None:
    """On the simulation engine's grid, poll for replies every ``POLL_S`` seconds per message
    ``outstanding`` (0.1 s, Flower's interval, up to 1 s): each poll checks every outstanding message
    under the engine's lock, so a census of 10,000 nodes polled at 0.1 s spent ~40% of the
    driver's time polling (Flower 1.41), time taken from delivering messages and from the ClientApps."""
    if isinstance(grid, InMemoryGrid):
        grid.pull_interval = min(1.0, max(0.1, POLL_S * outstanding))


def _warn(message: str) -> None:
    print(f"fedlatent: warning: {message}", file=sys.stderr)


@dataclass
class Census:
    """Which SuperNode serves each client, the sizes and training label counts of the clients'
    splits (by client id), the classes and input shape of the nodes' data, and which nodes hold the
    global test split (its size)."""

    node_of: dict[int, int]
    train_sizes: list[int]
    val_sizes: list[int]
    test_sizes: list[int]
    norms: dict[int, Tensors] = field(default_factory=dict)  # own files' normalisation censuses, by client
    label_counts: list[list[int]] = field(default_factory=list)
    num_classes: int = 0
    input_shape: tuple[int, ...] = ()
    test_holders: list[int] = field(default_factory=list)  # nodes holding the global test split, in id order
    global_test_size: int = 0
    held_out: int = 0  # the partition's clients that never train (data.holdout_clients), numbered after these
    new_node_of: dict[int, int] = field(default_factory=dict)  # which SuperNode serves each held-out client
    _served: dict[int, list[int]] | None = field(default=None, init=False, repr=False, compare=False)

    def clients_of(self, node: int) -> list[int]:
        """The clients ``node`` serves, training and held-out, in id order (indexed once: every message
        to a node asks, and a scan of the federation per message would make a round cost the federation)."""
        if self._served is None:
            self._served = {}
            for cid, n in sorted((*self.node_of.items(), *self.new_node_of.items())):
                self._served.setdefault(n, []).append(cid)
        return list(self._served.get(node, []))

    def view(self, data: ServerView) -> ServerView:
        """``data`` completed with what the census tells: the classes and input shape where the
        configuration left them unknown, the number of clients."""
        return dataclasses.replace(data, num_classes=data.num_classes or self.num_classes,
                                   input_shape=data.input_shape or self.input_shape, num_clients=len(self.train_sizes))

    def outline(self, data: ServerView) -> Outline:
        """What the census found, as ``fedlatent check`` knows a federation (the run's checks of it)."""
        view = self.view(data)
        return Outline(view.num_classes, view.input_shape, len(self.train_sizes) + self.held_out)

    def normalization(self) -> Tensors | None:
        """The pooled per-channel mean and std of the nodes' own files (in client-id order), or None
        when no node has one."""
        if not self.norms:
            return None
        mean, std = pooled_channel_stats([(c["sum"].numpy(), c["squares"].numpy(), int(c["count"]))
                                          for _, c in sorted(self.norms.items())])
        return {"mean": torch.from_numpy(mean), "std": torch.from_numpy(std)}

    def partition(self, num_classes: int) -> np.ndarray:
        """Training samples per client × class (the run's partition table), at least ``num_classes``
        columns (a node's own file may hold fewer classes)."""
        width = max([num_classes, *map(len, self.label_counts)])
        return np.array([row + [0] * (width - len(row)) for row in self.label_counts], dtype=np.int64)


SIZES = ("train_sizes", "val_sizes", "test_sizes", "label_counts")  # a census reply's lists, one entry per client


@dataclass
class Tally:
    """The census replies so far: each client's node (the first to claim it) and its entries of
    :data:`SIZES`, the own files' normalisation censuses, the number of clients each node's
    federation has (nodes reading their own file tell none), each node's classes and input shape,
    and the size of the global test split each holds."""

    node_of: dict[int, int] = field(default_factory=dict)
    entries: dict[int, dict[str, Any]] = field(default_factory=dict)
    norms: dict[int, Tensors] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    shapes: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    tests: dict[int, int] = field(default_factory=dict)
    new_node_of: dict[int, int] = field(default_factory=dict)  # held-out clients: the first node to claim each

    def add(self, node: int, content: RecordDict) -> None:
        values = M.unpack_values(content["census"])
        for cid in values.get("new_clients", []):
            self.new_node_of.setdefault(int(cid), node)
        if "num_clients" in values:
            self.sizes[node] = int(values["num_clients"])
        self.shapes[node] = int(values["num_classes"]), tuple(int(d) for d in values["input_shape"])
        self.tests[node] = int(values["global_test"])
        for i, cid in enumerate(int(c) for c in values["clients"]):
            if self.node_of.setdefault(cid, node) != node:
                continue
            self.entries[cid] = {key: values[key][i] for key in SIZES}
            if f"norm.{cid}" in content.array_records:
                self.norms[cid] = M.from_record(content[f"norm.{cid}"])

    def num_clients(self, fixed: int | None) -> int | None:
        """``fixed`` (the configuration's number of clients), else the one the nodes tell (None
        before any does); nodes that disagree with it or each other are refused in one line."""
        told = set(self.sizes.values()) | ({fixed} if fixed is not None else set())
        if len(told) > 1:
            nodes = ", ".join(f"SuperNode {node}: {n}" for node, n in sorted(self.sizes.items()))
            config = f"; the configuration: {fixed}" if fixed is not None else ""
            raise DataError(f"census: the SuperNodes' data make different numbers of clients ({nodes}{config})")
        return next(iter(told), None)

    def census(self, n: int, held_out: int = 0) -> Census:
        """The census of clients 0 .. n-1 (a node's claim of another client is ignored), ``held_out``
        more clients of the partition numbered after them."""
        train, val, test, labels = ([self.entries[cid][key] for cid in range(n)] for key in SIZES)
        node_of = {cid: self.node_of[cid] for cid in range(n)}
        nodes = sorted(set(node_of.values()))
        holders = [node for node in nodes if self.tests.get(node)]
        classes = max([self.shapes[node][0] for node in nodes] + [len(row) for row in labels], default=0)
        return Census(node_of, train, val, test, {cid: c for cid, c in self.norms.items() if cid < n}, labels,
                      classes, self.shapes[nodes[0]][1] if nodes else (), holders,
                      self.tests[holders[0]] if holders else 0, held_out,
                      {cid: node for cid, node in self.new_node_of.items() if n <= cid < n + held_out})


@dataclass
class ServerRun:
    """One run's server side: the grid, the configuration, the server role and what it keeps."""

    grid: Grid
    config: RunConfig
    federation: ServerView  # classes, input shape (the global test split with flower.server_reads_data)
    spec: MethodSpec
    warn: Callable[[str], None] = _warn
    census: Census | None = None
    server: Server | None = None
    client_states: list[Tensors] = field(default_factory=list)
    contacted: set[int] = field(default_factory=set)  # clients reached since this process started
    model: FedModel | None = None
    normalization: Tensors | None = None  # sent with every message after the census
    initial: Tensors = field(default_factory=dict)  # the seeded initial model, as each node builds it
    diagnostics: FlowerDiagnostics | None = None
    calibrations: int = 0  # the SecAgg+ sessions of calibration statistics so far
    rounds_done: int = 0  # the rounds before the one training now: what a stopped session has completed
    unmasking: UnmaskingCodec | None = None  # the server's codec under SecAgg+ (set up with the server)
    trace: Callable[[list[Upload]], None] | None = None  # told each round's uploads (diagnostics.trace_terms)
    sample_accountant: SampleAccountant | None = None  # sample-level DP-SGD's ε (the driver's), set after the census

    tells_each_drop = True  # a deployment's log tells each client left out as it happens

    # the run as the run driver (federated.driver) asks for it; its clients answer through messages
    @property
    def train_sizes(self) -> list[int]:
        return self.census.train_sizes

    @property
    def num_clients(self) -> int:
        return len(self.census.train_sizes)

    @property
    def device(self) -> torch.device:
        return torch.device(self.config.train.device)

    def node_seeds(self, node: int) -> dict[int, int]:
        """The stream seeds of the clients ``node`` serves, and no other's (:mod:`.node_view`)."""
        return {cid: stream_seed(self.server, self.config, cid) for cid in self.census.clients_of(node)}

    def exchange(self, messages: list[tuple[int, Message]]) -> dict[int, Message | None]:
        """Send each (key, message) and wait up to ``flower.timeout`` seconds; the reply per key
        (None where none came). Each message carries the run as a node is told it (no run seed) and,
        once the server is set up, the stream seeds of its destination's clients alone (:mod:`.node_view`)."""
        run = node_view.run_record(self.config)
        for _, msg in messages:
            msg.content[node_view.RUN] = run
            seeds = self.node_seeds(msg.metadata.dst_node_id) if self.server is not None else {}
            if seeds:  # a node the census gave no client is sent none
                msg.content[node_view.STREAMS] = node_view.streams_record(seeds)
            if self.normalization is not None:
                msg.content["normalization"] = M.to_record(self.normalization)
        pace(self.grid, len(messages))
        replies = self.grid.send_and_receive([m for _, m in messages], timeout=self.config.flower.timeout)
        by_id = {msg.metadata.message_id: key for key, msg in messages}
        out: dict[int, Message | None] = {key: None for key, _ in messages}
        for reply in replies:
            key = by_id.get(reply.metadata.reply_to_message_id)
            if key is not None:
                out[key] = reply
                refused_by_node(reply)
        return out

    def take_census(self) -> Census:
        """Ask every SuperNode which clients it serves (their split sizes and label counts) and how
        many clients its federation has; wait until every client is served. The number of clients
        is the configuration's where it fixes it, else the one the nodes tell."""
        tally = Tally()
        asked: set[int] = set()
        deadline = time.monotonic() + CENSUS_WAIT_S
        while True:
            new = [node for node in self.grid.get_node_ids() if node not in asked]
            msgs = [(node, Message(RecordDict(), dst_node_id=node, message_type="query.census")) for node in new]
            for node, reply in self.exchange(msgs).items() if msgs else ():
                if reply is not None and reply.has_content():
                    asked.add(node)
                    tally.add(node, reply.content)
            n = tally.num_clients(self.federation.num_clients)
            held = holdout_count(self.config.data.holdout_clients, n) if n and self.config.data.holdout_clients else 0
            missing = sorted(set(range(n - held)) - set(tally.node_of)) if n is not None else None
            if missing == []:
                return tally.census(n - held, held)
            if time.monotonic() > deadline:
                raise RunStopped(_unserved(missing), 0)
            time.sleep(1.0)

    @property
    def secure(self) -> bool:
        """Whether the clients' updates and statistics reach the server only as SecAgg+ sums."""
        return self.config.privacy.secure_aggregation != "off"

    def setup(self) -> None:
        """The model and the server, after the census (which tells the number of clients); under
        secure aggregation the server's codec unmasks sums (:class:`.secagg_codec.UnmaskingCodec`; under
        distributed DP, modular sums: :func:`.distributed.unmasking`)."""
        self.model, self.server = initial_server(self.config, self.federation, self.spec, self.num_clients)
        if self.secure:
            self.server.codec = self.unmasking = flower_dp.unmasking(self.server.codec, self.config)
        self.initial = {k: v.clone() for k, v in self.server.global_state.items()}
        self.client_states = [{} for _ in range(self.num_clients)]

    def open_session(self, kind: str, index: int, clients: list[int], where: str) -> Session:
        """Stages 0 and 1 of the SecAgg+ session ``<kind>.<index>`` among ``clients`` (those of live nodes)."""
        graph = derive_seed(self.config.seed, SECAGG_GRAPH, ("update", "statistics").index(kind), index)
        return open_session(self.exchange, f"{kind}.{index}", {cid: self.census.node_of[cid] for cid in clients},
                            Settings.of(self.config.privacy), graph, where, self.rounds_done)

    def expect(self, session: Session, kind: str, vectors: dict[int, torch.Tensor], entries: Layout,
               bound: float) -> None:
        """The server's codec told how to read sums of the ``vectors`` (by client) that arrived in
        ``session``: stage 3 for the clients it combines."""
        def unmask(clients: list[int] | None) -> Unmasking:
            kept = sorted(vectors if clients is None else clients)
            size = vectors[kept[0]].numel() if kept else 0
            mask = session.unmask(self.exchange, set(kept), size)
            return Unmasking(kept, mask, entries, bound, float(sum(self.train_sizes)))
        assert self.unmasking is not None, "a SecAgg+ session without its codec"
        self.unmasking.expect(kind, unmask)

    def restore_for(self, cid: int) -> Tensors | None:
        """The server's copy of a client's state, sent the first time this process reaches it
        (a resumed run: the node has none)."""
        if cid in self.contacted or not self.client_states[cid]:
            return None
        return self.client_states[cid]

    def restored_states(self) -> dict[int, dict[str, ArrayRecord]]:
        """By node, the records of the checkpointed client states its clients have not yet been
        sent (:meth:`restore_for`; after a resume): each node gets only its own clients' states."""
        own: dict[int, dict[str, ArrayRecord]] = {}
        for cid, node in self.census.node_of.items():
            state = self.restore_for(cid)
            if state is not None:
                own.setdefault(node, {})[f"client.{cid}"] = M.to_record(state)
        return own

    def withheld(self) -> tuple[frozenset[str], frozenset[str]]:
        """What the ``train`` messages leave out: of the entries no client needs
        (:meth:`Server.untransmitted`: a fixed head, the clients' own layers) those still at their
        initial values, which each node builds from the initial model's seeds (an FFC-calibrated head
        travels); and what uploads leave out, filled from the sent global model on arrival (the
        aggregate keeps the global values of those entries): the same, but the clients' own layers
        travel when the diagnostics measure the uploads."""
        never = self.server.untransmitted()
        down = frozenset(k for k in never if torch.equal(self.server.global_state[k], self.initial[k]))
        d = self.diagnostics
        reads_uploads = d is not None and (d.cfg.clients or "alignment" in d.which)
        return down, frozenset(never - set(self.server.local) if reads_uploads else never)

    def train(self, tasks: list[ClientTask]) -> tuple[list[Upload | ClientFailure], dict[int, Tensors]]:
        """One ``train`` message per SuperNode holding its selected clients' tasks; the outcomes
        back, and the new states of the clients that sent one."""
        live = set(self.grid.get_node_ids())
        by_node: dict[int, list[ClientTask]] = {}
        for task in tasks:
            by_node.setdefault(self.census.node_of[task.client_id], []).append(task)
        outcomes: list[Upload | ClientFailure] = []
        sent = []
        down, up = self.withheld()
        rnd = self.rounds_done = tasks[0].round
        session = self.open_session("update", rnd, [t.client_id for t in tasks if self.census.node_of[t.client_id]
                                                    in live], f"round {rnd + 1}") if self.secure else None
        for node, node_tasks in sorted(by_node.items()):
            if node not in live:
                outcomes += [ClientFailure(t.client_id, "error", f"SuperNode {node} is gone") for t in node_tasks]
                continue
            if session is not None:  # a client out of the session would send its update in the clear
                outcomes += [ClientFailure(t.client_id, "error", "left out of secure aggregation: it did not share "
                                           "its keys") for t in node_tasks if t.client_id not in session.shared]
                node_tasks = by_node[node] = [t for t in node_tasks if t.client_id in session.shared]
                if not node_tasks:
                    continue
            restore = {t.client_id: self.restore_for(t.client_id) for t in node_tasks}
            content = M.pack_tasks(node_tasks, {c: r for c, r in restore.items() if r is not None}, down, up)
            if session is not None:
                session.attach(content, [t.client_id for t in node_tasks])
                flower_dp.attach(content, self.unmasking, self.server.randomness, rnd, [t.client_id for t in node_tasks])
            sent.append((node, Message(content, dst_node_id=node, message_type="train")))
        new_states: dict[int, Tensors] = {}
        for node, reply in self.exchange(sent).items():
            for cid, (outcome, state) in self.outcomes(by_node[node], reply).items():
                outcomes.append(outcome)
                if state is not None:
                    new_states[cid] = state
        self.contacted.update(t.client_id for node, _ in sent for t in by_node[node])
        if session is not None:
            uploads = {o.client_id: o.state[VECTOR] for o in outcomes if isinstance(o, Upload)}
            self.expect(session, "update", uploads, layout(tasks[0].global_state, self.server.untransmitted()),
                        Settings.of(self.config.privacy).update_range)
        if self.trace is not None:  # the step traces the uploads carry, in client-id order as on the embedded backends
            self.trace(sorted((o for o in outcomes if isinstance(o, Upload)), key=lambda u: u.client_id))
        return outcomes, new_states

    def outcomes(self, tasks: list[ClientTask], reply: Message | None) -> dict[int, M.Outcome]:
        """A node's reply as the failure policy sees it, per client (with the client's new state
        when it sent one); a missing reply or a ClientApp error is each of its clients' failure."""
        ids = [t.client_id for t in tasks]
        if reply is None:
            detail = f"no reply within flower.timeout = {self.config.flower.timeout:g} s"
        elif reply.has_error():
            detail = f"ClientApp error: {reply.error.reason}"
        else:
            got = M.unpack_outcomes(reply.content)
            for upload, _ in got.values():
                if isinstance(upload, Upload) and not self.secure:  # the withheld entries, as the node was sent them
                    upload.state = {k: upload.state.get(k, v) for k, v in tasks[0].global_state.items()}
            return {cid: got.get(cid, (ClientFailure(cid, "error", "missing from its node's reply"), None))
                    for cid in ids}
        return {cid: (ClientFailure(cid, "error", detail), None) for cid in ids}

    def validation(self, state: Tensors, clients: list[int] | None = None) -> dict[int, float]:
        """The clients' validation accuracies of the global ``state``, by client id (none without a
        validation split); ``clients``: an evaluation's sample, those ids kept, asked of the nodes
        serving them alone (a cross-device run's round messages its sample, not every node)."""
        values: dict[int, float] = {}
        nodes = None if clients is None else sorted({self.census.node_of[c] for c in clients if c in self.census.node_of})
        if any(self.census.val_sizes):
            for reply in self.broadcast("evaluate.validate", {"global": M.to_record(state)}, nodes=nodes).values():
                values.update({int(k): v for k, v in M.unpack_values(reply.content["values"]).items()})
        return values if clients is None else {cid: values[cid] for cid in clients if cid in values}

    def new_clients(self, state: Tensors, personal: bool,
                    clients: list[int] | None = None) -> tuple[dict[int, evaluation.Tally], list[dict[str, Any]]]:
        """The held-out clients (``data.holdout_clients``) on the global ``state``, evaluated by the nodes
        that serve them (``evaluate.new``): their tallies by client id and, with ``personal``, their
        report rows under the program's new-client rule; ``clients``: only those at these positions
        among the held-out clients (a sampled evaluation: only their nodes are asked, each for those)."""
        if not self.census.held_out:
            return {}, []
        first = len(self.census.train_sizes)
        ids = list(range(first, first + self.census.held_out)) if clients is None else [first + i for i in clients]
        records = {"global": M.to_record(state), "new": ConfigRecord({"personal": personal})}
        if clients is None:
            replies = self.broadcast("evaluate.new", records)
        else:
            asked = _asked(ids, self.census.new_node_of)
            replies = self.broadcast("evaluate.new", records, asked, nodes=sorted(asked))
        tallies: dict[int, evaluation.Tally] = {}
        rows: list[dict[str, Any]] = []
        for reply in replies.values():
            tallies.update({int(k.removeprefix("client.")): t for k, t in M.unpack_tallies(reply.content).items()})
            rows += M.unpack_values(reply.content["rows"])["rows"]
        missing = sorted(set(ids) - set(tallies))
        if missing:
            self.warn(f"new clients {missing}: no SuperNode evaluated them")
        return dict(sorted(tallies.items())), rows

    def broadcast(self, message_type: str, records: dict[str, Any],
                  own: dict[int, dict[str, Any]] | None = None, nodes: list[int] | None = None) -> dict[int, Message]:
        """The same ``records`` to every SuperNode of the census (or to ``nodes``), each with its ``own``
        records beside them (by node); the replies with content, by node."""
        nodes = sorted(set(self.census.node_of.values())) if nodes is None else nodes
        own = own or {}
        msgs = [(node, Message(RecordDict({**records, **own.get(node, {})}), dst_node_id=node,
                               message_type=message_type))
                for node in nodes]
        return {node: r for node, r in self.exchange(msgs).items() if r is not None and r.has_content()}

    def test(self, state: Tensors, clients: list[int] | None = None) -> dict[str, float]:
        """The global ``state``'s scores on the global test split: evaluated here where the server
        holds it (``flower.server_reads_data``), else added up from the nodes' tallies (``evaluate.test``)
        — shares of it, one per node holding it (a share whose node does not reply asked once more of
        those that did), or without such a node each client's test split — in order, so that the
        scores are the server's own evaluation's, to the bit. ``clients`` (an evaluation's sample)
        is taken where the global test split is the clients' test splits together (no node holds a
        share of it): only the nodes serving sampled clients are asked, each for those clients'
        tallies, and the scores come with the ratio estimate's ``accuracy_se`` as on the embedded
        backend; a global test split of its own is evaluated in full."""
        fed, batch = self.federation, self.config.eval.batch_size
        if fed.test is not None:
            return evaluation.evaluate(self.model, fed.test, fed.num_classes, batch, self.device)
        record = {"global": M.to_record(state)}
        holders = self.census.test_holders
        if not holders:  # the clients' test splits together are the global one (nodes with their own files)
            ids = [cid for cid in (range(self.num_clients) if clients is None else clients) if self.census.test_sizes[cid]]
            wanted = [f"client.{cid}" for cid in ids]
            if clients is None:
                own: dict[int, dict[str, Any]] = {node: {} for node in sorted(set(self.census.node_of.values()))}
            else:  # the sampled clients' nodes alone, each told which of its clients to tally
                own = _asked(ids, self.census.node_of)
            got = self.tallies(record, own)
        else:
            wanted = [f"shard.{i}" for i in range(len(holders))]
            got = self.tallies(record, {node: {"shard": _shards([i], len(holders))} for i, node in enumerate(holders)})
            helpers = [node for i, node in enumerate(holders) if f"shard.{i}" in got]
            lost = [i for i in range(len(holders)) if f"shard.{i}" not in got]
            if lost and helpers:
                redo = {node: lost[k::len(helpers)] for k, node in enumerate(helpers) if lost[k::len(helpers)]}
                got.update(self.tallies(record, {node: {"shard": _shards(i, len(holders))} for node, i in redo.items()}))
        missing = [name for name in wanted if name not in got]
        if missing:
            self.warn(f"evaluation of the global model without {', '.join(missing)} (no SuperNode evaluated them)")
        present = [got[name] for name in wanted if name in got]
        if not present:
            return {}
        out = evaluation.scores(present)
        if clients is not None and not holders:  # a sample of the clients' test splits: the ratio estimate's SE
            out["accuracy_se"] = sampled.ratio_se([int(t.correct.sum()) for t in present],
                                                  [int(t.count.sum()) for t in present], self.num_clients)
        return out

    def tallies(self, records: dict[str, Any], own: dict[int, dict[str, Any]]) -> dict[str, evaluation.Tally]:
        """``evaluate.test`` to the nodes of ``own`` (each with its own records): their tallies by name."""
        out: dict[str, evaluation.Tally] = {}
        for reply in self.broadcast("evaluate.test", records, own, nodes=sorted(own)).values():
            out.update(M.unpack_tallies(reply.content))
        return out

    def statistics(self, state: Tensors) -> dict[int, Tensors]:
        """The clients' calibration statistics of the global ``state``, gathered in an extra round of
        messages, by client id (under secure aggregation, masked: :meth:`secure_statistics`)."""
        if self.secure:
            return self.secure_statistics(state)
        stats: dict[int, Tensors] = {}
        for reply in self.broadcast("query.statistics", {"global": M.to_record(state)}).values():
            stats.update(_statistics(reply.content))
        return stats

    def secure_statistics(self, state: Tensors) -> dict[int, Tensors]:
        """The masked statistics of the clients of live nodes, each divided by the clients' total
        training samples, in a SecAgg+ session of their own; the server's codec then reads their sum."""
        live = set(self.grid.get_node_ids())
        session = self.open_session("statistics", self.calibrations, [c for c, n in self.census.node_of.items()
                                                                       if n in live], "calibration")
        self.calibrations += 1
        msgs = []
        for node, cids in session.by_node(session.shared).items():
            content = RecordDict({"global": M.to_record(state)})
            session.attach(content, cids)
            content["secagg"]["total_samples"] = sum(self.train_sizes)
            msgs.append((node, Message(content, dst_node_id=node, message_type="query.statistics")))
        stats: dict[int, Tensors] = {}
        for node, reply in self.exchange(msgs).items():
            if reply is not None and reply.has_error():  # a statistic out of its range, say: told, not hidden
                self.warn(f"calibration: SuperNode {node}'s clients sent no statistics: {reply.error.reason}")
            elif reply is not None and reply.has_content():
                stats.update({cid: s for cid, s in _statistics(reply.content).items() if cid in session.shared})
        classes, features = self.model.classifier.weight.shape  # FFC's V, U or CCVR's sums, as the clients send
        entries = layout(summed_statistics(self.spec.calibration.kind, classes, features))
        self.expect(session, "statistics", {cid: s[VECTOR] for cid, s in stats.items()}, entries,
                    Settings.of(self.config.privacy).statistics_range)
        return stats

    def reports(self, state: Tensors, clients: list[int] | None = None) -> list[dict[str, Any]]:
        """The personalised report the clients compute from the final global ``state`` (with their
        checkpointed states after a resume); ``clients``: an evaluation's sample, asked of the nodes
        serving them alone, each for those clients' rows."""
        if not any(self.census.test_sizes):
            return []
        restored = self.restored_states()
        if clients is None:
            replies = self.broadcast("evaluate.report", {"global": M.to_record(state)}, restored)
        else:
            own = {node: {**restored.get(node, {}), **asked} for node, asked in _asked(clients, self.census.node_of).items()}
            replies = self.broadcast("evaluate.report", {"global": M.to_record(state)}, own, nodes=sorted(own))
        return [row for reply in replies.values() for row in M.unpack_values(reply.content["rows"])["rows"]]


def _asked(clients: list[int], node_of: dict[int, int]) -> dict[int, dict[str, ConfigRecord]]:
    """By node, the ``clients`` record telling it which of its clients a sampled evaluation asks of it
    (those of ``clients`` it serves: ``node_of``), for the nodes serving any of them alone."""
    by_node: dict[int, list[int]] = {}
    for cid in clients:
        if cid in node_of:
            by_node.setdefault(node_of[cid], []).append(cid)
    return {node: {"clients": ConfigRecord({"ids": cids})} for node, cids in by_node.items()}


def _shards(indices: list[int], count: int) -> ConfigRecord:
    return ConfigRecord({"indices": indices, "count": count})


def _statistics(content: RecordDict) -> dict[int, Tensors]:
    """A node's reply to ``query.statistics``: each client's statistics, by client id."""
    return {int(name.split(".")[1]): M.from_record(record)
            for name, record in content.array_records.items() if name.startswith("stats.")}


def refused_by_node(reply: Message) -> None:
    """Raise the ``ConfigError`` of a node's refusal (its own terms, :mod:`.node_terms`): the run's
    settings and the node's terms are the user's to reconcile (exit 2), not a client's failure."""
    if reply.has_error() and is_refusal(reply.error.reason):
        raise ConfigError(f"SuperNode {reply.metadata.src_node_id} refuses the run: {reply.error.reason}")


def _unserved(missing: list[int] | None) -> str:
    """Why the census stops the run: the clients no node serves, or no node told their number."""
    start = "start one with --node-config 'partition-id=K num-partitions=P'"
    if missing is None:
        return f"census: no SuperNode told the number of clients after {CENSUS_WAIT_S:.0f} s ({start})"
    return f"census: no SuperNode serves client(s) {missing} after {CENSUS_WAIT_S:.0f} s ({start})"


def serve(grid: Grid, config: RunConfig, data: ServerView, spec: MethodSpec, out: Path, *,
          resume: bool = False, progress: Callable[[dict[str, Any]], None] | None = None,
          warn: Callable[[str], None] = _warn,
          partition: Callable[[np.ndarray], None] | None = None,
          rounds_start: Callable[[], None] | None = None,
          check: Callable[[Outline], None] | None = None,
          trace: Callable[[list[Upload]], None] | None = None) -> tuple[dict[str, Any], float]:
    """Train for ``config.train.rounds`` rounds through ``grid``, writing metrics and checkpoints
    under ``out`` as the embedded backend does; return the final evaluation and the wall seconds
    (including the part before a resume). ``data`` is the server's view of the data (no client's),
    completed by the census; ``check`` is told what the census found (classes, input shape, clients:
    a :class:`~fedlatent.errors.ConfigError` from it ends the run before ``metrics.jsonl`` exists);
    ``partition`` is told the census's training samples per client × class; ``rounds_start``, when
    the rounds start (after the census and the set-up); ``trace``, each round's uploads (their step
    traces, ``diagnostics.trace_terms``)."""
    clock = time.perf_counter()
    torch.set_num_threads(config.train.threads)
    s = ServerRun(grid, config, data, spec, warn, trace=trace)
    metrics_path = out / "metrics.jsonl"
    try:
        s.census = s.take_census()
    except RunStopped:
        metrics_path.touch()  # a failed census is a stopped run with a summary
        raise
    if check is not None:
        check(s.census.outline(data))
    metrics_path.touch()
    s.federation = data = s.census.view(data)
    s.normalization = s.census.normalization()
    if partition is not None:
        partition(s.census.partition(data.num_classes))
    s.setup()
    s.sample_accountant = driver.sample_accountant(config, s.train_sizes, s.server.randomness)  # the selection's source
    start, before = driver.restore(s, out / "checkpoints", s.num_clients, warn) if resume else (0, 0.0)
    write_atomically(metrics_path, "".join(line + "\n" for line in driver.metrics_upto(metrics_path, start)))
    if config.diagnostics.which:
        sizes = {"train": s.census.train_sizes, "val": s.census.val_sizes, "test": s.census.test_sizes}
        s.diagnostics = FlowerDiagnostics(config, data, out / "diagnostics.jsonl", sizes,
                                          lambda kind, records, nodes=None: s.broadcast(kind, records, nodes=nodes),
                                          warn, torch.device(config.train.device),
                                          (s.census.test_holders, s.census.global_test_size))
        s.diagnostics.start(start)
    final = driver.play_rounds(s, range(start, config.train.rounds), out, lambda rnd: driver.play_round(s, rnd),
                               lambda last: driver.finish(s, last), since=clock - before, progress=progress,
                               rounds_start=rounds_start)
    return final, before + time.perf_counter() - clock


def bundled(path: str) -> str:
    """``path`` as given when it names a file (absolute, or relative to the working folder), else
    the file of that name inside the app bundle (Flower puts the bundle's folder on ``sys.path``)."""
    if Path(path).is_absolute() or Path(path).is_file():
        return path
    found = [Path(entry) / path for entry in sys.path if entry and (Path(entry) / path).is_file()]
    return str(found[0]) if found else path


def deployment_app(runner: Callable[..., Any]) -> ServerApp:
    """The ServerApp ``flwr run`` starts on a SuperLink: it reads the run config — ``config`` (a
    TOML path on the SuperLink's machine), ``overrides`` (``--set`` items separated by ``;``),
    ``out`` (the run directory) and ``resume`` — and hands them to ``runner`` (``fedlatent.run``'s
    engine, which writes the run directory) together with the grid."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        rc = context.run_config
        overrides = [o.strip() for o in str(rc.get("overrides", "")).split(";") if o.strip()]
        runner(grid, bundled(str(rc["config"])), [*overrides, 'backend="flower"'], str(rc.get("out", "")) or None,
               bool(rc.get("resume", False)))

    return app
