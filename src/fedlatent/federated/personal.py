"""Per-client evaluation of personalised (and global) models, beside each client's majority-class rate.

Each client is evaluated on the model its program names (:meth:`~fedlatent.methods.program.ClientProgram.evaluated`):
Ditto's personal model, the client's own layers with the global ones (FedRep, LG-FedAvg, FedPer,
FedBN), APFL's mixture, the global model fine-tuned on the client's training split, or the global
model, on every client's own test split, so tables compare like with like. A client computes its own row
(:func:`client_report`, from its data and state only); the server combines the rows
(:func:`combine_reports`). Clients that never trained (``data.holdout_clients``) are evaluated the
same way on the global model and on their program's new-client rule (:func:`new_client_reports`,
:func:`combine_new`).
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from fedlatent.calibration.ffc import ffc_solve
from fedlatent.data.types import ClientData, Split
from fedlatent.federated.calibrate import ffc_head
from fedlatent.federated.client import LocalSettings, Workspace
from fedlatent.federated.trainer import local_update
from fedlatent.federated.evaluation import Tally, evaluate, fairness, majority_rate, scores, tally
from fedlatent.federated.finetune import batchnorm_statistics, finetuning
from fedlatent.methods.fedprox import Prox
from fedlatent.methods.parts import ClientRound, MethodSpec, Tensors
from fedlatent.models.base import FedModel
from fedlatent.seeding import HOLDOUT, derive_seed


def client_model(ws: Workspace, spec: MethodSpec, client_state: Tensors, global_state: Tensors, cid: int,
                 train: Split, settings: LocalSettings | None, generator: torch.Generator, *,
                 new: bool = False) -> FedModel:
    """The model client ``cid`` would use, as its program has it: personal, partly its own, mixed,
    fine-tuned on its ``train`` split (``settings``: the fine-tuning's; None: no training), or the
    global one; ``new``: a client that never trained, by the program's new-client rule
    (:meth:`~fedlatent.methods.program.ClientProgram.adapted_new`)."""
    def tune(start: Tensors, scope: str | Collection[str], pull: float = 0.0, steps: int = 0, lr: float = 0.0,
             plain: bool = False, statistics: bool = False) -> Tensors:
        """``start`` trained on the client's split: every parameter, the head alone or the parameters
        named (``scope``), with (``pull``/2)‖v − start‖² (FedProx's term) beside the task loss, for the
        program's epochs or ``steps`` steps, at ``lr`` or the run's last rate, by the run's update rule
        or plain gradient steps (``plain``: Per-FedAvg's adaptation step); ``statistics``: then its
        BatchNorm statistics estimated on the split (:func:`~fedlatent.federated.finetune.batchnorm_statistics`)."""
        assert settings is not None
        s = replace(settings, steps=steps or settings.steps, lr=lr or settings.lr)
        if plain:
            s = replace(s, optimizer="sgd", momentum=0.0, weight_decay=0.0, keep_optimizer=False)
        # no parts of the method: nothing federation-wide is read
        task = MethodSpec("finetune", loss=spec.loss, temperature=spec.temperature, parts=[Prox(pull)] if pull else [])
        rc = ClientRound(cid, ws.model, {}, {}, {}, s.lr, len(train), 1, len(train), s.momentum)
        with finetuning(ws.model, scope, spec.head.bias):
            tuned = local_update(ws, start, train, task, rc, s, generator).state
        if not statistics:
            return tuned
        ws.model.load_state_dict(tuned)
        batchnorm_statistics(ws.model, train, s.batch_size)
        return {k: v.detach().clone() for k, v in ws.model.state_dict().items()}

    parameters = [n for n, _ in ws.model.named_parameters()]
    program = spec.personalization
    if new:
        assert settings is not None, "a new client's rule trains on its split"
        weights = program.adapted_new(parameters, global_state, tune)
    else:
        weights = program.evaluated(parameters, client_state, global_state, tune if settings is not None else None)
    ws.model.load_state_dict(weights)
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
                  settings: LocalSettings | None, generator: torch.Generator,
                  new: bool = False) -> dict[str, Any] | None:
    """The client half: accuracy and balanced accuracy of its model on its test split, the
    majority baseline, and its validation accuracy when it has a validation split; None without
    a test split. ``new``: a client that never trained (:func:`client_model`)."""
    if client.test is None or not len(client.test):
        return None
    model = client_model(ws, spec, client_state, global_state, client_id, client.train, settings, generator, new=new)
    if spec.calibration.declared.personal and spec.calibration.personal:
        personal_ffc(model, client.train, num_classes, spec.calibration.ridge, batch_size, device)
    test = evaluate(model, client.test, num_classes, batch_size, device)
    row = {"client": client_id, "accuracy": test["accuracy"], "balanced_accuracy": test["balanced_accuracy"],
           "majority_baseline": majority_rate(client.train.y, client.test.y, num_classes)}
    if client.val is not None and len(client.val):
        row["val_accuracy"] = evaluate(model, client.val, num_classes, batch_size, device)["accuracy"]
    return row


def new_client_reports(ws: Workspace, spec: MethodSpec, clients: Mapping[int, ClientData], global_state: Tensors, *,
                       num_classes: int, batch_size: int, device: torch.device, settings: LocalSettings,
                       seeds: dict[int, int], personal: bool) -> tuple[dict[int, Tally], list[dict[str, Any]]]:
    """The client half for clients that never trained (``data.holdout_clients``, by their ids):
    the global model's :class:`~fedlatent.federated.evaluation.Tally` on each one's test split and,
    with ``personal``, each one's report under the program's new-client rule (its training drawn from
    ``derive_seed(seeds[client], HOLDOUT, client)``, ``seeds`` the clients' stream seeds); the model is
    left holding ``global_state``."""
    tallies = {}
    ws.model.load_state_dict(global_state)
    for cid, client in clients.items():
        assert client.test is not None  # a held-out client without one is refused (data.holdout.check_tested)
        tallies[cid] = tally(ws.model, client.test, num_classes, batch_size, device)
    rows = []
    for cid, client in clients.items() if personal else ():
        row = client_report(ws, spec, cid, client, {}, global_state, num_classes=num_classes, batch_size=batch_size,
                            device=device, settings=settings,
                            generator=torch.Generator().manual_seed(derive_seed(seeds[cid], HOLDOUT, cid)), new=True)
        if row is not None:
            rows.append(row)
    ws.model.load_state_dict(global_state)
    return tallies, rows


def combine_new(tallies: dict[int, Tally], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The server half for the new clients (their ids: ``new_clients``): the global model's
    ``new_client_accuracy``, balanced accuracy and loss over their test splits together
    (sample-weighted, as the global test split's are), and their reports'
    ``new_client_personal_mean`` / ``_std`` / ``_worst`` and majority baseline (rows in client-id
    order, under ``new_per_client``); empty without new clients."""
    if not tallies:
        return {}
    out: dict[str, Any] = {f"new_client_{k}": v for k, v in scores([tallies[c] for c in sorted(tallies)]).items()}
    out["new_clients"] = sorted(tallies)
    if rows:
        rows = sorted(rows, key=lambda r: r["client"])
        acc = fairness([r["accuracy"] for r in rows])
        out.update(new_client_personal_mean=acc["mean"], new_client_personal_std=acc["std"],
                   new_client_personal_worst=acc["worst"],
                   new_client_majority_baseline=float(np.mean([r["majority_baseline"] for r in rows])),
                   new_per_client=rows)
    return out


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
