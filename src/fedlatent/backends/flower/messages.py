"""fedlatent's round objects as Flower records, and back: what crosses the message boundary.

Tensors travel as :class:`flwr.app.ArrayRecord` (exact: the bytes of each tensor, dtype and shape
kept), scalars as a :class:`flwr.app.ConfigRecord`; metrics as one JSON text, so that NaN,
infinities and integers come back as they left (the failure policy reads them on the server).
"""
from __future__ import annotations

import json
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedlatent.federated.evaluation import Tally
from fedlatent.federated.failures import ClientFailure
from fedlatent.federated.round import ClientTask
from fedlatent.methods.parts import Tensors, Upload


def to_record(tensors: Tensors) -> ArrayRecord:
    return ArrayRecord({k: v.detach().cpu().contiguous() for k, v in tensors.items()})


def from_record(record: ArrayRecord) -> Tensors:
    """The tensors of ``record``: new tensors (Flower decodes each array afresh), not views of it."""
    return dict(record.to_torch_state_dict())


def pack_tasks(tasks: list[ClientTask], restore: dict[int, Tensors], withheld: frozenset[str] = frozenset(),
               withheld_up: frozenset[str] = frozenset()) -> RecordDict:
    """One node's tasks of a round as one message's content (the node trains its clients in turn:
    its Context is then updated by one message at a time; each task with its client's stream seed).
    The global model and a payload shared by all tasks travel once, without the ``withheld`` entries (those the node builds itself from the
    initial model's seeds), and the node is told which entries its uploads leave out (``withheld_up``);
    ``restore`` holds client states the server kept (a resumed run hands them back to nodes that
    have none)."""
    shared = all(t.payload is tasks[0].payload for t in tasks)
    content = RecordDict({"global": to_record({k: v for k, v in tasks[0].global_state.items() if k not in withheld}),
                          "withheld": ConfigRecord({"down": sorted(withheld), "up": sorted(withheld_up)})})
    if shared:
        content["payload"] = to_record(tasks[0].payload)
    for t in tasks:
        content[f"task.{t.client_id}"] = ConfigRecord({
            "client_id": t.client_id, "round": t.round, "lr": float(t.lr), "num_clients": t.num_clients,
            "total_samples": t.total_samples, "seed": t.seed})
        if not shared:
            content[f"payload.{t.client_id}"] = to_record(t.payload)
        if t.client_id in restore:
            content[f"restore.{t.client_id}"] = to_record(restore[t.client_id])
    return content


def withheld(content: RecordDict) -> tuple[set[str], set[str]]:
    """The entries a ``train`` message leaves out of the global model, and those its uploads leave out."""
    record = content["withheld"]
    return set(record["down"]), set(record["up"])


def unpack_tasks(content: RecordDict, initial: Tensors | None = None) -> list[tuple[ClientTask, Tensors | None]]:
    """The tasks (in client-id order) and the server's copy of each client's state, if sent; the
    global model's withheld entries taken from ``initial`` (the node's seeded initial model)."""
    received = from_record(content["global"])
    global_state = received if initial is None else \
        {k: received[k] if k in received else initial[k].clone() for k in initial}
    shared = from_record(content["payload"]) if "payload" in content else None
    out = []
    for cid in sorted(int(name.split(".")[1]) for name in content.config_records if name.startswith("task.")):
        t = content[f"task.{cid}"]
        payload = shared if shared is not None else from_record(content[f"payload.{cid}"])
        task = ClientTask(client_id=cid, round=int(t["round"]), global_state=global_state, payload=payload,
                          lr=float(t["lr"]), num_clients=int(t["num_clients"]), total_samples=int(t["total_samples"]),
                          seed=int(t["seed"]))
        restore = content.get(f"restore.{cid}")
        out.append((task, from_record(restore) if restore is not None else None))
    return out


Outcome = tuple[Upload | ClientFailure, Tensors | None]


def pack_outcomes(outcomes: list[Outcome], withheld_up: set[str] | frozenset[str] = frozenset()) -> RecordDict:
    """A node's replies for its clients: each upload (without the ``withheld_up`` entries; with its
    step trace, empty unless ``diagnostics.trace_terms``; with the client's new state when the server keeps a copy) or failure (the kind and one line saying what)."""
    content = RecordDict()
    for outcome, state in outcomes:
        if isinstance(outcome, ClientFailure):
            content[f"failure.{outcome.client}"] = ConfigRecord({"kind": outcome.kind, "detail": outcome.detail})
            continue
        u, cid = outcome, outcome.client_id
        content[f"upload.{cid}"] = ConfigRecord({"num_samples": u.num_samples, "steps": u.steps, "lr": float(u.lr),
                                                 "momentum": float(u.momentum), "metrics": json.dumps(u.metrics),
                                                 "extras": sorted(u.extras), "trace": json.dumps(u.trace)})
        content[f"weights.{cid}"] = to_record({k: v for k, v in u.state.items() if k not in withheld_up})
        for part, extra in u.extras.items():
            content[f"extra.{cid}.{part}"] = to_record(extra)
        if state is not None:
            content[f"state.{cid}"] = to_record(state)
    return content


def unpack_outcomes(content: RecordDict) -> dict[int, Outcome]:
    """The outcomes of a node's reply by client id."""
    out: dict[int, Outcome] = {}
    for name, record in content.config_records.items():
        kind, _, cid_text = name.partition(".")
        cid = int(cid_text)
        if kind == "failure":
            out[cid] = ClientFailure(cid, str(record["kind"]), str(record["detail"])), None
        elif kind == "upload":
            extras = {part: from_record(content[f"extra.{cid}.{part}"]) for part in record["extras"]}
            upload = Upload(cid, from_record(content[f"weights.{cid}"]), int(record["num_samples"]),
                            int(record["steps"]), float(record["lr"]), float(record["momentum"]), extras,
                            json.loads(record["metrics"]), json.loads(record["trace"]))
            state = content.get(f"state.{cid}")
            out[cid] = upload, (from_record(state) if state is not None else None)
    return out


def pack_values(values: dict[str, Any]) -> ConfigRecord:
    """Plain JSON-able values (a report row, a census) as one record."""
    return ConfigRecord({"json": json.dumps(values)})


def unpack_values(record: ConfigRecord) -> dict[str, Any]:
    return json.loads(record["json"])



def pack_tallies(tallies: dict[str, Tally]) -> RecordDict:
    """A node's evaluation of the global model (``evaluate.test``): each part's :class:`Tally` by
    name (``shard.<index>`` of the global test split, ``client.<id>``), its batch losses as float64."""
    return RecordDict({f"tally.{name}": to_record({"losses": torch.tensor(t.losses, dtype=torch.float64),
                                                   "correct": t.correct, "count": t.count})
                       for name, t in tallies.items()})


def unpack_tallies(content: RecordDict) -> dict[str, Tally]:
    out = {}
    for key, record in content.array_records.items():
        if key.startswith("tally."):
            t = from_record(record)
            out[key.removeprefix("tally.")] = Tally(t["losses"].tolist(), t["correct"], t["count"])
    return out
