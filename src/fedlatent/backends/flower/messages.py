"""fedlatent's round objects as Flower records, and back: what crosses the message boundary.

Tensors travel as :class:`flwr.app.ArrayRecord` (exact: the bytes of each tensor, dtype and shape
kept), scalars as a :class:`flwr.app.ConfigRecord`; metrics as one JSON text, so that NaN,
infinities and integers come back as they left (the failure policy reads them on the server).
"""
from __future__ import annotations

import json
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedlatent.federated.failures import ClientFailure
from fedlatent.federated.round import ClientTask
from fedlatent.methods.parts import Tensors, Upload

EXTRA = "extra."  # record-name prefix of a part's extras in an upload


def to_record(tensors: Tensors) -> ArrayRecord:
    return ArrayRecord({k: v.detach().cpu().contiguous() for k, v in tensors.items()})


def from_record(record: ArrayRecord) -> Tensors:
    return {k: v.clone() for k, v in record.to_torch_state_dict().items()}


def pack_task(task: ClientTask, restore: Tensors | None = None) -> RecordDict:
    """A :class:`ClientTask` as message content; ``restore`` is a client state the server kept (a
    resumed run hands it back to a node that has none)."""
    content = RecordDict({
        "global": to_record(task.global_state), "payload": to_record(task.payload),
        "task": ConfigRecord({"client_id": task.client_id, "round": task.round, "lr": float(task.lr),
                              "num_clients": task.num_clients, "total_samples": task.total_samples})})
    if restore is not None:
        content["restore"] = to_record(restore)
    return content


def unpack_task(content: RecordDict) -> tuple[ClientTask, Tensors | None]:
    t = content["task"]
    task = ClientTask(client_id=int(t["client_id"]), round=int(t["round"]),
                      global_state=from_record(content["global"]), payload=from_record(content["payload"]),
                      lr=float(t["lr"]), num_clients=int(t["num_clients"]), total_samples=int(t["total_samples"]))
    return task, (from_record(content["restore"]) if "restore" in content else None)


def pack_upload(upload: Upload, new_state: Tensors | None) -> RecordDict:
    """An upload (and, when the server keeps a copy, the client's new state) as reply content."""
    content = RecordDict({
        "weights": to_record(upload.state),
        "upload": ConfigRecord({"client_id": upload.client_id, "num_samples": upload.num_samples,
                                "steps": upload.steps, "lr": float(upload.lr), "momentum": float(upload.momentum),
                                "metrics": json.dumps(upload.metrics)})})
    for part, extra in upload.extras.items():
        content[EXTRA + part] = to_record(extra)
    if new_state is not None:
        content["state"] = to_record(new_state)
    return content


def unpack_upload(content: RecordDict) -> tuple[Upload, Tensors | None]:
    u = content["upload"]
    extras = {name[len(EXTRA):]: from_record(content[name]) for name in content.array_records
              if name.startswith(EXTRA)}
    upload = Upload(int(u["client_id"]), from_record(content["weights"]), int(u["num_samples"]), int(u["steps"]),
                    float(u["lr"]), float(u["momentum"]), extras, json.loads(u["metrics"]))
    return upload, (from_record(content["state"]) if "state" in content else None)


def pack_failure(failure: ClientFailure) -> RecordDict:
    """A client that raised or is not finite: its id, the kind and one line saying what."""
    return RecordDict({"failure": ConfigRecord({"client_id": failure.client, "kind": failure.kind,
                                                "detail": failure.detail})})


def unpack_failure(content: RecordDict) -> ClientFailure | None:
    if "failure" not in content:
        return None
    f = content["failure"]
    return ClientFailure(int(f["client_id"]), str(f["kind"]), str(f["detail"]))


def pack_values(values: dict[str, Any]) -> ConfigRecord:
    """Plain JSON-able values (a report row, a census) as one record."""
    return ConfigRecord({"json": json.dumps(values)})


def unpack_values(record: ConfigRecord) -> dict[str, Any]:
    return json.loads(record["json"])

