"""The lockstep stack's step against torch.optim client by client (SGD with and without momentum
and weight decay, Adam, AdamW): groups of every form (all, a run of rows, scattered rows), and
clients that drop out of later steps."""
from __future__ import annotations

import pytest
import torch

from fedlatent.federated.trainer.gradients import Loss
from fedlatent.federated.trainer.weights import Recipe, Stacked, Training
from fedlatent.losses.update import Rule

TORCH = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}

def _states(clients: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [{"w": torch.randn(3, 2, generator=g), "b": torch.randn(3, generator=g)} for _ in range(clients)]


def _loss(target: torch.Tensor):
    """Σ over the group's clients of a quadratic in (w, b) around per-client targets."""
    def loss(params: dict[str, torch.Tensor]) -> torch.Tensor:
        return ((params["w"].sum(-1) + params["b"] - target.unsqueeze(-1)) ** 2).sum()
    return loss


# each schedule: per step, the clients that step (increasing); a client's last step is its last entry
SCHEDULES = [
    [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]],    # all clients, three steps
    [[0, 1, 2, 3], [1, 2], [2]],                   # runs of rows, clients dropping out
    [[0, 1, 2, 3], [0, 2, 3], [0, 3], [3]],        # scattered rows
    [[0, 1, 2, 3]],                                # one step each: no buffer is ever kept
]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("kind,momentum,weight_decay", [("sgd", 0.9, 0.0), ("sgd", 0.9, 1e-2), ("sgd", 0.0, 1e-2),
                                                        ("adam", 0.0, 1e-2), ("adamw", 0.0, 1e-2)])
def test_stack_steps_equal_torch_per_client(schedule, kind: str, momentum: float, weight_decay: float) -> None:
    rule, states = Rule(kind, 0.1, momentum, weight_decay), _states(4)
    stack = Stacked(Recipe(states, None), Training(["w", "b"], ["w", "b"], [], torch.device("cpu"), rule, [{}] * 4,
                                                  [{}] * 4, "fp32"))
    models = [{k: v.clone().requires_grad_() for k, v in st.items()} for st in states]
    extra = {"momentum": momentum} if kind == "sgd" else {}
    optims = [TORCH[kind](list(m.values()), lr=rule.lr, weight_decay=weight_decay, **extra) for m in models]
    targets = torch.linspace(-1, 1, 4)
    last = {c: max(i for i, members in enumerate(schedule) if c in members) for c in range(4)}
    for i, members in enumerate(schedule):
        if members == list(range(4)):
            group = None
        elif members[-1] - members[0] + 1 == len(members):
            group = slice(members[0], members[-1] + 1)
        else:
            group = torch.tensor(members)
        stack.step(group, Loss(_loss(targets[members]), (), "fp32", torch.device("cpu")), again=any(last[c] > i for c in members))
        for c in members:
            optims[c].zero_grad()
            _loss(targets[c])(models[c]).backward()
            optims[c].step()
    for c in range(4):
        for key in ("w", "b"):
            assert torch.allclose(stack.params[key][c], models[c][key].detach(), atol=1e-6, rtol=0)
    if kind == "sgd" and (len(schedule) == 1 or not momentum):
        assert stack.optimizer.slots == {}  # one step each, or no momentum: no buffer was ever needed
