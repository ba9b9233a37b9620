"""Per-client evaluation of personalised (and global) models, beside each client's majority-class rate.

Each client is evaluated on the model its program names (:meth:`~fedlatent.methods.program.ClientProgram.evaluated`):
Ditto's personal model, the client's own layers with the global ones (FedRep, LG-FedAvg, FedPer,
FedBN), APFL's mixture, the global model fine-tuned on the client's training split, or the global
model, on every client's own test split, so tables compare like with like. A client computes its own row
(:func:`client_report`, from its data and state only); the server combines the rows
(:func:`combine_reports`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from fedlatent.calibration.ffc import ffc_solve
from fedlatent.data.types import ClientData, Split
from fedlatent.federated.calibrate import ffc_head
from fedlatent.federated.client import LocalSettings, Workspace
from fedlatent.federated.lockstep import local_update
from fedlatent.federated.evaluation import evaluate, fairness, majority_rate
from fedlatent.federated.finetune import finetuning
from fedlatent.methods.parts import ClientRound, MethodSpec, Tensors
from fedlatent.models.base import FedModel


def client_model(ws: Workspace, spec: MethodSpec, client_state: Tensors, global_state: Tensors, cid: int,
                 train: Split, settings: LocalSettings | None, generator: torch.Generator) -> FedModel:
    """The model client ``cid`` would use, as its program has it: personal, partly its own, mixed,
    fine-tuned on its ``train`` split (``settings``: the fine-tuning's; None: no training), or the
    global one."""
    def tune(start: Tensors, scope: str, steps: int = 0, lr: float = 0.0, plain: bool = False) -> Tensors:
        """``start`` trained on the client's split: every parameter or the head alone (``scope``), for
        the program's epochs or ``steps`` steps, at ``lr`` or the run's last rate, by the run's update
        rule or plain gradient steps (``plain``: Per-FedAvg's adaptation step)."""
        assert settings is not None
        s = replace(settings, steps=steps or settings.steps, lr=lr or settings.lr)
        if plain:
            s = replace(s, optimizer="sgd", momentum=0.0, weight_decay=0.0, keep_optimizer=False)
        task = MethodSpec("finetune", loss=spec.loss, temperature=spec.temperature)  # no parts: nothing federation-wide is read
        rc = ClientRound(cid, ws.model, {}, {}, {}, s.lr, len(train), 1, len(train), s.momentum)
        with finetuning(ws.model, scope, spec.head.bias):
            return local_update(ws, start, train, task, rc, s, generator).state

    parameters = [n for n, _ in ws.model.named_parameters()]
    ws.model.load_state_dict(spec.personalization.evaluated(parameters, client_state, global_state,
                                                            tune if settings is not None else None))
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
