"""A model's stacked forward (``FedModel.stacked_forward``, C clients' weights on a leading axis)
against its ``forward`` under ``vmap`` + ``functional_call``, the lockstep trainer's general form:
the same logits, z and taps, and the same gradients, in float64; and which models offer it."""
from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, vmap

from fedlatent.models.cnn import build as build_cnn
from fedlatent.models.mlp import build as build_mlp

TAPS = ("hidden1", "hidden2")


def _clients(model: torch.nn.Module, count: int, seed: int) -> dict[str, torch.Tensor]:
    """``count`` different float64 states of ``model`` stacked on a leading axis."""
    g = torch.Generator().manual_seed(seed)
    return {n: (p.detach().double() + 0.3 * torch.randn(count, *p.shape, generator=g, dtype=torch.float64))
            for n, p in model.state_dict().items()}


def _outputs_and_grads(forward, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor):
    """(logits, z, taps...) and the gradients of a per-client weighted loss mixing all of them."""
    leaves = {n: p.clone().requires_grad_(True) for n, p in params.items()}
    values = forward(leaves, x)
    loss = torch.nn.functional.cross_entropy(values[0].flatten(0, 1), y.flatten())
    for k, v in enumerate(values[1:], start=1):
        loss = loss + (v.tanh() * torch.arange(v.shape[-1], dtype=v.dtype)).mean() * k
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return [v.detach() for v in values], dict(zip(leaves, grads))


@pytest.mark.parametrize("normalize_z,softmax_output,fixed_head", [
    (False, False, False), (True, False, False), (False, True, False), (True, False, True)])
def test_mlp_stacked_forward_equals_vmapped_forward_values_and_gradients(normalize_z: bool, softmax_output: bool,
                                                                          fixed_head: bool) -> None:
    torch.manual_seed(0)
    model = build_mlp((2, 3, 3), 5, hidden=[12, 9, 7]).double()
    model.normalize_z, model.softmax_output = normalize_z, softmax_output
    if fixed_head:  # SphereFed's head: fixed, no bias in use (still a state entry)
        model.classifier.bias.data.zero_()
        model.classifier.requires_grad_(False)
    assert model.has_stacked_forward and set(model.tap_names) == set(TAPS)
    params = _clients(model, 4, seed=1)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 6, 2, 3, 3, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (4, 6), generator=g)

    def one(p, xc):
        out = functional_call(model, p, (xc, frozenset(TAPS)))
        return (out.logits, out.z, *(out.features[t] for t in TAPS))

    def stacked(p, xc):
        out = model.stacked_forward(p, xc, frozenset(TAPS))
        return (out.logits, out.z, *(out.features[t] for t in TAPS))

    want, want_grads = _outputs_and_grads(vmap(one), params, x, y)
    got, got_grads = _outputs_and_grads(stacked, params, x, y)
    assert [v.shape for v in got] == [v.shape for v in want] == [(4, 6, 5), (4, 6, 7), (4, 6, 12), (4, 6, 9)]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    for n in want_grads:
        torch.testing.assert_close(got_grads[n], want_grads[n], rtol=1e-12, atol=1e-12, msg=n)
    assert any(g.abs().sum() > 0 for g in got_grads.values())


def test_stacked_forward_returns_only_the_taps_asked_for() -> None:
    model = build_mlp((8,), 3, hidden=[6, 5, 4])
    params = _clients(model, 2, seed=3)
    out = model.double().stacked_forward(params, torch.ones(2, 3, 8, dtype=torch.float64), frozenset({"hidden2"}))
    assert set(out.features) == {"hidden2"} and out.logits.shape == (2, 3, 3) and out.z.shape == (2, 3, 4)


def test_models_without_a_stacked_form_or_with_dropout_or_a_projector_are_vmapped() -> None:
    """A model with no stacked_encode (the CNN), an MLP given a projector or a dropout: the lockstep
    trainer must take vmap (dropout masks are drawn per client there)."""
    assert not build_cnn((3, 32, 32), 10).has_stacked_forward
    mlp = build_mlp((8,), 3, hidden=[4])
    mlp.projector = torch.nn.Dropout(0.0)
    assert not mlp.has_stacked_forward
    mlp.projector = torch.nn.Linear(4, 4)
    assert not mlp.has_stacked_forward
    mlp.projector = torch.nn.Identity()
    assert mlp.has_stacked_forward
    mlp.layers[0].append(torch.nn.Dropout(0.1))  # dropout inside the encoder too
    assert not mlp.has_stacked_forward


def test_the_lockstep_trainer_takes_the_stacked_forward_where_the_model_offers_one(monkeypatch) -> None:
    """``trainer.forward.stacked_forward``: no vmap for the plain MLP (same outputs as the vmapped forward), vmap
    with per-client randomness once the MLP drops units."""
    from fedlatent.federated.trainer import forward as lockstep

    calls = []

    def spy(fn, **kwargs):
        calls.append(kwargs)
        return vmap(fn, **kwargs)

    monkeypatch.setattr(lockstep, "vmap", spy)
    mlp = build_mlp((6,), 3, hidden=[5, 4]).double()
    params = _clients(mlp, 3, seed=7)
    x = torch.randn(3, 2, 6, dtype=torch.float64)
    got = lockstep.stacked_forward(mlp, ("hidden1",))(params, x)
    assert not calls
    want = lockstep.stacked_forward(build_cnn((3, 32, 32), 3), ())  # a CNN: vmapped
    assert calls == [{"randomness": "error"}] and callable(want)
    ref = vmap(lockstep.one_forward(mlp, ("hidden1",)))(params, x)
    for a, b in zip((got.logits, got.z, got.features["hidden1"]), ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    mlp.projector = torch.nn.Dropout(0.5)
    lockstep.stacked_forward(mlp, ())
    assert calls[-1] == {"randomness": "different"}
