"""Device placement: every tensor a training step combines lives on the weights' device.

PyTorch's ``meta`` device stands in for a GPU on a CPU machine: it computes shapes, not values,
refuses to combine its tensors with CPU tensors (a 0-d CPU tensor aside, which CUDA also takes as
a number) and refuses host reads (``.item()``, ``.tolist()``, ``bool()``), so a tensor a step
creates on the CPU fails here, not on a lent GPU."""
from __future__ import annotations

import pytest
import torch

from fedlatent.losses import update
from fedlatent.losses.update import Links, Rule

META = torch.device("meta")


@pytest.mark.parametrize("kind", ["adam", "adamw"])
@pytest.mark.parametrize("kept", [False, True])
def test_a_stacks_adam_counts_live_on_the_weights_device(kind: str, kept: bool) -> None:
    """Stacked Adam/AdamW (a per-row step count, FedDyn's per-row decay), fresh or restored from
    kept states, steps a group of rows picked by a device index: the counts are made on the
    weights' device (the code before made them on the CPU: a GPU step failed on mixed devices)."""
    params = [torch.zeros(3, 4, 2, device=META), torch.zeros(3, 5, device=META)]
    names = ["w", "b"]
    saved = [{"w.exp_avg": torch.ones(4, 2), "w.exp_avg_sq": torch.ones(4, 2), "b.exp_avg": torch.ones(5),
              "b.exp_avg_sq": torch.ones(5), "step": torch.tensor(2.0, dtype=torch.float64)}] * 3 if kept \
        else [{}] * 3
    opt = update.restore(Rule(kind, lr=0.1, weight_decay=0.01), params, names, saved, stacked=True,
                         links=Links(extra_decay=torch.full((3,), 0.1, device=META)))
    rows = torch.tensor([0, 2], device=META)
    picked = [p.index_select(0, rows) for p in params]
    opt.step(picked, [torch.ones_like(p) for p in picked], rows=rows)
    views = [p[1:3] for p in params]
    opt.step(views, [torch.ones_like(p) for p in views], rows=slice(1, 3))
    assert all(v.device == META for vs in opt.slots.values() for v in vs)
    assert isinstance(opt.steps, torch.Tensor) and opt.steps.device == META
