"""Checks every image model must pass: a training step that learns, and the vectorized backend's
functional_call/vmap forward (stacked per-client weights) agreeing with one client at a time."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, vmap

from fedlatent.federated.trainer.forward import one_forward
from fedlatent.models.base import FedModel


def batch(n: int = 8, shape: tuple[int, int, int] = (3, 32, 32), classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, *shape, generator=g), torch.randint(0, classes, (n,), generator=g)


def assert_one_step_learns(model: FedModel, lr: float = 0.01) -> None:
    """One SGD step on a fixed batch reaches every trainable tensor (each gets a gradient), changes
    every one whose gradient is not float32 noise, and lowers the loss on it. A convolution's bias
    right before BatchNorm has a gradient of 0 in exact arithmetic (the normalisation removes it):
    its ~1e-8 of rounding, times the learning rate, is below its ulp on some hosts' kernels."""
    x, y = batch(classes=model.num_classes)
    model.train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = nn.functional.cross_entropy(model(x).logits, y)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    after = nn.functional.cross_entropy(model(x).logits, y)
    assert after.item() < loss.item()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert [n for n, g in grads.items() if g is None] == []
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert [n for n, g in grads.items() if g.abs().max() > 1e-6 and n not in moved] == []


def assert_vmap_matches_single(make: Callable[[], FedModel], taps: tuple[str, ...]) -> None:
    """Two differently initialised copies stacked on a client axis: one vmap forward (train mode,
    BatchNorm statistics per client) gives each copy's own outputs and running statistics."""
    models = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        models.append(make().train())
    states = [m.state_dict() for m in models]
    stacked = {k: torch.stack([s[k] for s in states]) for k in states[0]}
    xs = torch.stack([batch(4)[0], batch(4)[0] * 0.5])
    outs = vmap(one_forward(models[0], taps))(stacked, xs)
    for c, model in enumerate(models):
        own = {k: v.clone() for k, v in states[c].items()}
        single = functional_call(model, own, (xs[c], frozenset(taps)))
        torch.testing.assert_close(outs[0][c], single.logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(outs[1][c], single.z, atol=1e-4, rtol=1e-4)
        for i, tap in enumerate(taps):
            torch.testing.assert_close(outs[2 + i][c], single.features[tap], atol=1e-4, rtol=1e-4)
        for k, v in own.items():  # running statistics, updated by each forward in place
            if k.endswith(("running_mean", "running_var")):
                assert not torch.equal(v, states[c][k])
                torch.testing.assert_close(stacked[k][c], v, atol=1e-5, rtol=1e-4)


def norm_layers(model: nn.Module) -> tuple[int, int]:
    """(BatchNorm2d count, GroupNorm count)."""
    return (sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()),
            sum(isinstance(m, nn.GroupNorm) for m in model.modules()))
