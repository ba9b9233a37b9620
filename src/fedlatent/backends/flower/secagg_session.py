"""The server's side of one SecAgg+ session over fedlatent's messages: the four stages of Bell et
al. 2020 (Algorithm 2) with each client a party of its own, a SuperNode answering for the clients
it serves — the node's parties share their secrets through the server like any others'.

- stage 0, ``query.secagg_keys``: each party makes its two key pairs and sends the public halves;
- stage 1, ``query.secagg_shares``: each gets its neighbours' public keys and sends them, encrypted
  one by one, the shares of its mask seed and first private key;
- stage 2, the session's own message (``train``, ``query.statistics``, :meth:`Session.attach`):
  each gets the shares addressed to it and sends its masked vector;
- stage 3, ``query.secagg_unmask``: each party whose vector arrived reveals, for each neighbour,
  the share the server needs — of its mask seed if that neighbour's vector arrived, of its key if
  not (:func:`~.secagg.mask_total` takes the masks off the sum).

A party that does not answer drops out; the protocol goes on while every party left has at least
t neighbours left and at least t vectors arrived, else it stops the run with one line saying whose
secret could not be rebuilt (:class:`~fedlatent.errors.RunStopped`). The graph of neighbours is
drawn from the run's seed (``seeding.SECAGG_GRAPH``, the session).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict

from fedlatent.backends.flower.secagg import Reconstruction, mask_total, neighbours, shortfall
from fedlatent.backends.flower.secagg_settings import Settings
from fedlatent.errors import RunStopped

Exchange = Callable[[list[tuple[int, Message]]], dict[int, "Message | None"]]


@dataclass
class Session:
    """One session's server state: its parties (clients) by node, their graph and threshold, the
    public keys, the parties whose shares went out and the ciphertexts to forward, by recipient."""

    name: str
    node_of: dict[int, int]
    neighbours: dict[int, set[int]]
    threshold: int
    where: str  # "round 3", "calibration": how a stop names the session
    rounds_completed: int
    public: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    shared: set[int] = field(default_factory=set)
    forward: dict[int, dict[int, bytes]] = field(default_factory=dict)

    def stop(self, reason: str) -> RunStopped:
        return RunStopped(f"{self.where}: secure aggregation stopped: {reason}", self.rounds_completed)

    def by_node(self, parties: set[int]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for cid in sorted(parties):
            out.setdefault(self.node_of[cid], []).append(cid)
        return out

    def ask(self, exchange: Exchange, kind: str, parties: set[int],
            records: Callable[[int], dict[str, ConfigRecord]]) -> dict[int, ConfigRecord]:
        """Send ``kind`` to the nodes of ``parties`` (each party's ``records``); each party's reply record
        (named ``<reply>.<client>``), for those that answered."""
        msgs = []
        for node, cids in self.by_node(parties).items():
            content = RecordDict({"secagg": ConfigRecord({"session": self.name, "threshold": self.threshold,
                                                          "clients": cids})})
            for cid in cids:
                for name, record in records(cid).items():
                    content[name] = record
            msgs.append((node, Message(content, dst_node_id=node, message_type=f"query.secagg_{kind}")))
        return {cid: record for reply in exchange(msgs).values()
                if reply is not None and reply.has_content()
                for cid, record in replies(reply.content, parties).items()}

    def check_neighbours(self, alive: set[int], what: str) -> None:
        for cid in sorted(alive):
            left = len(self.neighbours[cid] & alive)
            if left < self.threshold:
                raise self.stop(f"client {cid} has {left} neighbour(s) left after {what}, fewer than the threshold "
                                f"t = {self.threshold} (privacy.secagg_threshold)")

    def attach(self, content: RecordDict, clients: list[int]) -> None:
        """Stage 2's records on a node's message: the session and, for each of ``clients``, the shares
        its neighbours sent it."""
        content["secagg"] = ConfigRecord({"session": self.name, "clients": clients})
        for cid in clients:
            got = self.forward.get(cid, {})
            content[f"forward.{cid}"] = ConfigRecord({"srcs": sorted(got), "ctxts": [got[s] for s in sorted(got)]})

    def unmask(self, exchange: Exchange, active: set[int], size: int) -> np.ndarray:
        """Stage 3: the masks left in the sum of the ``active`` parties' vectors of ``size`` entries."""
        if len(active) < self.threshold:
            raise self.stop(f"{len(active)} client(s) sent their masked vector, fewer than the threshold "
                            f"t = {self.threshold} (privacy.secagg_threshold) that unmasking their sum needs")
        dropped = self.shared - active

        def records(cid: int) -> dict[str, ConfigRecord]:
            return {f"unmask.{cid}": ConfigRecord({"active": sorted(self.neighbours[cid] & active),
                                                   "dropped": sorted(self.neighbours[cid] & dropped)})}

        revealed: dict[int, list[bytes]] = {}
        for record in self.ask(exchange, "unmask", active, records).values():
            for owner, share in zip(record["owners"], record["shares"]):
                revealed.setdefault(int(owner), []).append(share)
        rebuilt = Reconstruction(self.neighbours, {c: k[0] for c, k in self.public.items()}, self.shared, active,
                                 revealed)
        missing = shortfall(rebuilt, self.threshold)
        if missing:
            raise self.stop(missing)
        return mask_total(rebuilt, self.threshold, size)


def replies(content: RecordDict, parties: set[int]) -> dict[int, ConfigRecord]:
    """A node's reply records by party (``<name>.<client>``), for the asked ``parties`` only."""
    out = {}
    for name, record in content.config_records.items():
        cid = int(name.rpartition(".")[2])
        if cid in parties:
            out[cid] = record
    return out


def open_session(exchange: Exchange, name: str, node_of: dict[int, int], settings: Settings, graph_seed: int,
                 where: str, rounds_completed: int) -> Session:
    """Stages 0 and 1 of a session ``name`` among the clients of ``node_of`` (its graph drawn from
    ``graph_seed``): the returned session holds the shares to forward at stage 2 (:meth:`Session.attach`)."""
    parties = set(node_of)
    reason = settings.refusal(len(parties))
    graph = neighbours(parties, settings.shares(len(parties)), np.random.default_rng(graph_seed))
    s = Session(name, node_of, graph, settings.threshold_for(len(parties)), where, rounds_completed)
    if reason:
        raise s.stop(reason)
    keys = s.ask(exchange, "keys", parties, lambda cid: {})
    s.public = {cid: (r["pk1"], r["pk2"]) for cid, r in keys.items()}
    s.check_neighbours(set(s.public), "the key exchange")

    def public_of(cid: int) -> dict[str, ConfigRecord]:
        ids = sorted(s.neighbours[cid] & set(s.public))
        return {f"public.{cid}": ConfigRecord({"ids": ids, "pk1": [s.public[i][0] for i in ids],
                                               "pk2": [s.public[i][1] for i in ids]})}

    shares = s.ask(exchange, "shares", set(s.public), public_of)
    s.shared = set(shares)
    s.check_neighbours(s.shared, "sharing their keys")
    for src, record in shares.items():
        for dst, ciphertext in zip(record["dsts"], record["ctxts"]):
            if int(dst) in s.shared:
                s.forward.setdefault(int(dst), {})[src] = ciphertext
    return s
