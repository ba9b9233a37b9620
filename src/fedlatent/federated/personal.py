"""Per-client evaluation of personalised (and global) models, beside each client's majority-class rate.

Ditto evaluates each client's personal model; partial personalisation (FedRep, LG-FedAvg) the
client's own layers with the global ones; ``finetune`` fine-tunes the global model on the
client's training split first; otherwise the global model is evaluated on every client's own
test split, so tables compare like with like. A client computes its own row
(:func:`client_report`, from its data and state only); the server combines the rows
(:func:`combine_reports`).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedlatent.calibration.ffc import ffc_solve
from fedlatent.data.types import ClientData, Split
from fedlatent.federated.calibrate import ffc_head
from fedlatent.federated.client import PERSONAL, LocalSettings, Workspace, own_state, prefixed
from fedlatent.federated.lockstep import local_update
from fedlatent.federated.evaluation import evaluate, fairness, majority_rate
from fedlatent.federated.finetune import finetuning
from fedlatent.methods.parts import ClientRound, MethodSpec, Tensors
from fedlatent.models.base import FedModel


def client_model(ws: Workspace, spec: MethodSpec, client_state: Tensors, global_state: Tensors, cid: int,
                 train: Split, settings: LocalSettings | None, generator: torch.Generator) -> FedModel:
    """The model client ``cid`` would use: personal (Ditto), its own layers with the global ones
    (partial personalisation), fine-tuned on its ``train`` split (the whole model or the head alone,
    the personalisation's ``scope``), or the global one."""
    if spec.personalization.kind == "partial":
        ws.model.load_state_dict(own_state(ws.model, spec.personalization, client_state, global_state))
        return ws.model
    own = prefixed(client_state, PERSONAL)
    if spec.personalization.kind == "ditto" and own:
        ws.model.load_state_dict(own)
        return ws.model
    if spec.personalization.kind == "finetune" and settings is not None:
        # no parts: nothing federation-wide is read
        plain = MethodSpec("finetune", loss=spec.loss, temperature=spec.temperature)
        rc = ClientRound(cid, ws.model, {}, {}, {}, settings.lr, len(train), 1, len(train), settings.momentum)
        with finetuning(ws.model, spec.personalization.scope, spec.head.bias):
            upload = local_update(ws, global_state, train, plain, rc, settings, generator)
        ws.model.load_state_dict(upload.state)
        return ws.model
    ws.model.load_state_dict(global_state)
    return ws.model


@torch.no_grad()
def personal_ffc(model: FedModel, train, num_classes: int, ridge: float, batch_size: int,
                 device: torch.device) -> None:
    """Personalised FFC (SphereFed): the client's head solved from its own (V_k, U_k) only."""
    weight = ffc_solve(ffc_head(model, train, num_classes, batch_size, device), ridge=ridge)
    model.classifier.weight.copy_(weight.to(model.classifier.weight))
    if model.classifier.bias is not None:
        model.classifier.bias.zero_()


def client_report(ws: Workspace, spec: MethodSpec, client_id: int, client: ClientData, client_state: Tensors,
                  global_state: Tensors, *, num_classes: int, batch_size: int, device: torch.device,
                  settings: LocalSettings | None, generator: torch.Generator) -> dict[str, Any] | None:
    """The client half: accuracy and balanced accuracy of its model on its test split, the
    majority baseline, and its validation accuracy when it has a validation split; None without
    a test split."""
    if client.test is None or not len(client.test):
        return None
    model = client_model(ws, spec, client_state, global_state, client_id, client.train, settings, generator)
    if spec.calibration.kind == "ffc" and spec.calibration.personal:
        personal_ffc(model, client.train, num_classes, spec.calibration.ridge, batch_size, device)
    test = evaluate(model, client.test, num_classes, batch_size, device)
    row = {"client": client_id, "accuracy": test["accuracy"], "balanced_accuracy": test["balanced_accuracy"],
           "majority_baseline": majority_rate(client.train.y, client.test.y, num_classes)}
    if client.val is not None and len(client.val):
        row["val_accuracy"] = evaluate(model, client.val, num_classes, batch_size, device)["accuracy"]
    return row


def combine_reports(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The server half: ``personalized_accuracy`` (mean, std, worst), balanced accuracy and the
    majority baseline over the clients' rows (in client-id order); empty without rows."""
    if not rows:
        return {}
    rows = sorted(rows, key=lambda r: r["client"])
    acc = fairness([r["accuracy"] for r in rows])
    return {"personalized_accuracy": acc["mean"], "personalized_accuracy_std": acc["std"],
            "personalized_accuracy_worst": acc["worst"],
            "personalized_balanced_accuracy": float(np.mean([r["balanced_accuracy"] for r in rows])),
            "majority_baseline_accuracy": float(np.mean([r["majority_baseline"] for r in rows])),
            "per_client": rows}
