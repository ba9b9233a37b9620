"""Evaluation of a model on a split, and the fairness summary over clients (FederatedScope style)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedlatent.data.compact import Images
from fedlatent.data.types import Split
from fedlatent.methods.parts import task_loss
from fedlatent.models.base import FedModel


@dataclass
class Tally:
    """What the scores of a model on some samples are computed from, and what parts of those samples
    add up to (the nodes' shares of the global test split, the clients' test splits): each batch's
    summed loss in batch order, and per class the samples and the correct predictions."""

    losses: list[float]
    correct: torch.Tensor  # (classes,) int64
    count: torch.Tensor  # (classes,) int64


@torch.no_grad()
def tally(model: FedModel, split: Split, num_classes: int, batch_size: int = 500,
          device: torch.device = torch.device("cpu"), batches: range | None = None) -> Tally:
    """The :class:`Tally` of ``model`` on ``split``, over the batches of ``batch_size`` samples
    numbered ``batches`` (all of them by default): a shard of a split evaluated elsewhere. Each
    batch goes to ``device`` as it is stored (compact images as uint8, standardised there), and the
    tally stays there until the last batch, read back once."""
    model.eval()
    losses = []
    correct = torch.zeros(num_classes, dtype=torch.int64, device=device)
    count = torch.zeros(num_classes, dtype=torch.int64, device=device)
    for b in batches if batches is not None else range(num_batches(len(split), batch_size)):
        rows = slice(b * batch_size, (b + 1) * batch_size)
        x = split.x.take(rows).to(device)[:] if isinstance(split.x, Images) else split.x[rows].to(device)
        y = split.y[rows].to(device)
        logits = model(x).logits
        # as a stack of one: the stacked cross-entropy's layout, ~4× faster on the CPU (the same sum)
        losses.append(task_loss("ce", logits.unsqueeze(0), y.unsqueeze(0), reduction="sum"))
        correct.index_add_(0, y, (logits.argmax(1) == y).long())
        count.index_add_(0, y, torch.ones_like(y))  # not bincount, whose output size is read on the host
    return Tally(torch.stack(losses).tolist() if losses else [], correct.cpu(), count.cpu())


def num_batches(samples: int, batch_size: int) -> int:
    return -(-samples // batch_size)


def shard(samples: int, batch_size: int, index: int, count: int) -> range:
    """The batches of the ``index``-th of ``count`` contiguous shares of a split of ``samples``
    (batch boundaries kept, so the shares' tallies in order score as the whole: :func:`scores`)."""
    batches = num_batches(samples, batch_size)
    return range(index * batches // count, (index + 1) * batches // count)


def scores(tallies: list[Tally]) -> dict[str, float]:
    """Accuracy, balanced accuracy (mean recall over the classes present) and mean loss of the
    ``tallies`` together, their losses summed in the order given (so parts of a split, in order,
    score as the split in one piece, to the bit)."""
    loss = 0.0
    for t in tallies:
        for batch in t.losses:
            loss += batch
    n = sum(int(t.count.sum()) for t in tallies)
    if n == 0:
        return {"accuracy": float("nan"), "balanced_accuracy": float("nan"), "loss": 0.0}
    correct = torch.stack([t.correct for t in tallies]).sum(0).double()
    count = torch.stack([t.count for t in tallies]).sum(0).double()
    present = count > 0
    return {"accuracy": int(correct.sum()) / n, "balanced_accuracy": float((correct[present] / count[present]).mean()),
            "loss": loss / n}


def evaluate(model: FedModel, split: Split, num_classes: int, batch_size: int = 500,
             device: torch.device = torch.device("cpu")) -> dict[str, float]:
    """Accuracy, balanced accuracy and mean loss (cross-entropy on logits) of ``model`` on ``split``."""
    return scores([tally(model, split, num_classes, batch_size, device)])


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
