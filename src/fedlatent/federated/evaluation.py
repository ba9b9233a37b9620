"""Evaluation of a model on a split, and the fairness summary over clients (FederatedScope style)."""
from __future__ import annotations

import numpy as np
import torch

from fedlatent.data.types import Split
from fedlatent.methods.parts import task_loss
from fedlatent.models.base import FedModel


@torch.no_grad()
def predict(model: FedModel, split: Split, batch_size: int, device: torch.device) -> tuple[torch.Tensor, float]:
    """Predicted classes and the mean loss (cross-entropy on logits) of ``model`` on ``split``."""
    model.eval()
    preds, loss = [], 0.0
    for start in range(0, len(split), batch_size):
        x = split.x[start:start + batch_size].to(device)
        y = split.y[start:start + batch_size].to(device)
        logits = model(x).logits
        # as a stack of one: the stacked cross-entropy's layout, ~4× faster on the CPU (the same sum)
        loss += float(task_loss("ce", logits.unsqueeze(0), y.unsqueeze(0), reduction="sum"))
        preds.append(logits.argmax(1).cpu())
    return torch.cat(preds) if preds else torch.zeros(0, dtype=torch.long), loss / max(len(split), 1)


def scores(pred: torch.Tensor, y: torch.Tensor, num_classes: int) -> dict[str, float]:
    """Accuracy and balanced accuracy (mean recall over the classes present in ``y``)."""
    if len(y) == 0:
        return {"accuracy": float("nan"), "balanced_accuracy": float("nan")}
    correct = (pred == y).double()
    per_class = torch.zeros(num_classes, dtype=torch.float64).index_add_(0, y, correct)
    counts = torch.bincount(y, minlength=num_classes).double()
    present = counts > 0
    return {"accuracy": float(correct.mean()),
            "balanced_accuracy": float((per_class[present] / counts[present]).mean())}


def evaluate(model: FedModel, split: Split, num_classes: int, batch_size: int = 500,
             device: torch.device = torch.device("cpu")) -> dict[str, float]:
    pred, loss = predict(model, split, batch_size, device)
    return {**scores(pred, split.y, num_classes), "loss": loss}


def majority_rate(train_y: torch.Tensor, test_y: torch.Tensor, num_classes: int) -> float:
    """Accuracy on ``test_y`` of always predicting the most frequent training class (the trivial
    baseline reported beside personalised accuracies)."""
    if len(test_y) == 0 or len(train_y) == 0:
        return float("nan")
    majority = int(torch.bincount(train_y, minlength=num_classes).argmax())
    return float((test_y == majority).double().mean())


def fairness(values: list[float]) -> dict[str, float]:
    """Mean, std, worst and deciles over clients."""
    arr = np.asarray([v for v in values if v == v], dtype=np.float64)
    if arr.size == 0:
        return {"mean": float("nan"), "std": float("nan"), "worst": float("nan")}
    return {"mean": float(arr.mean()), "std": float(arr.std()), "worst": float(arr.min()),
            "decile10": float(np.percentile(arr, 10)), "decile90": float(np.percentile(arr, 90))}


def client_validation(model: FedModel, global_state: dict[str, torch.Tensor], val: Split | None, num_classes: int,
                      batch_size: int, device: torch.device) -> float | None:
    """The client half of a round's ``val_accuracy``: the global model's accuracy on this client's
    validation split (None without one); the server averages the clients' values."""
    if val is None or not len(val):
        return None
    model.load_state_dict(global_state)
    return evaluate(model, val, num_classes, batch_size, device)["accuracy"]
