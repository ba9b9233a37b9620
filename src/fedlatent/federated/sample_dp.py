"""Sample-level DP-SGD in the client trainer (Abadi et al. 2016, "Deep Learning with Differential
Privacy", Algorithm 1): the gradient a local step hands to the update rule's chain is the noisy sum
of the batch's clipped per-sample gradients over the batch's denominator
(:func:`fedlatent.losses.dp_sgd.private_gradient`), so momentum, weight decay, Adam's scaling and
Ditto's pull act on the privatised gradient.

The per-sample gradients of the task loss come from ``torch.func``: ``grad`` of one sample's loss
through ``functional_call`` of the model, under ``vmap`` over the batch and ``vmap`` over the
clients of a step (one client: a group of one), from the weights as the trainer holds them (one
client's module weights with a client axis of 1, or a group's rows of the stack). Only the task
loss (cross-entropy, MSE) reads the batch; the parameter-only terms (FedProx's proximal term,
FedDyn's linear term) carry no data and are added by the trainer after the noise.

The noise of a step is drawn, one standard normal value per trainable weight entry, from a
generator of its own per client and model (the local model, Ditto's personal one) seeded by (the
client's stream seed — the run seed in a seeded run —, :data:`~fedlatent.seeding.SAMPLE_NOISE`,
round, client, model) and read step after step: a client draws the same noise whether it trains alone or in a stack, and a run repeats to
the bit. The generators live on the training device, so the noise is drawn there (a GPU's generator
draws other numbers than the CPU's from the same seed: a run on a GPU repeats itself, not a CPU run).

The denominator L: under Poisson batches (``privacy.batch_sampling = "poisson"``, each sample in
with probability q = min(1, b / n_k)) the expected batch size q·n_k = min(b, n_k), fixed, so that
an empty or a large batch changes no sample's weight (Algorithm 1's lot of expected size L); under
shuffled batches (clipping without noise, no guarantee) the batch's own size, today's mean.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import Tensor
from torch.func import functional_call, grad, vmap

from fedlatent.federated import devices
from fedlatent.federated.client import LocalSettings
from fedlatent.losses.dp_sgd import private_gradient
from fedlatent.methods.parts import ClientRound, task_loss
from fedlatent.models.base import FedModel, has_dropout
from fedlatent.federated.randomness import Source, client_noise_source, standard_normal
from fedlatent.seeding import SAMPLE_NOISE, derive_seed

GLOBAL, PERSONAL = 0, 1  # the models whose steps draw noise: the local model, Ditto's personal model

PerSample = Callable[[dict[str, Tensor], dict[str, Tensor], Tensor, Tensor], tuple[dict[str, Tensor], Tensor]]


def enabled(s: LocalSettings) -> bool:
    """Whether the local steps of ``s`` run sample-level DP-SGD (a finite per-sample clip norm)."""
    return math.isfinite(s.sample_clip_norm)


def noise_generators(rcs: list[ClientRound], model: int, secret: bool = False,
                     device: torch.device | str = "cpu") -> list[Source]:
    """Each client's generator of the noise of ``model``'s steps this round: (seed, SAMPLE_NOISE,
    round, client, model) on the training ``device`` (:func:`fedlatent.federated.devices.generator`),
    so that the noise is drawn where the gradients are; or, ``secret`` (``privacy.randomness``), a
    stream keyed by the client's own OS entropy (drawn on the host, then moved)."""
    if secret:
        return [client_noise_source(True, rc.seed, SAMPLE_NOISE, rc.round, rc.client_id, model) for rc in rcs]
    return [devices.generator(device).manual_seed(derive_seed(rc.seed, SAMPLE_NOISE, rc.round, rc.client_id, model))
            for rc in rcs]


def _standard_normals(n: int, source: Source, device: torch.device) -> Tensor:
    """``n`` standard normals on ``device``: drawn there from a seeded generator, or on the host from
    a secret stream (:func:`~fedlatent.federated.randomness.standard_normal`) and moved."""
    if isinstance(source, torch.Generator):
        return torch.randn(n, generator=source, device=device)
    return standard_normal(n, source).to(device)


def per_sample_gradients(model: FedModel, loss: str, temperature: float) -> PerSample:
    """(trained, other, x, y) ↦ the gradients of each sample's task loss with respect to ``trained``,
    (clients, batch, …) per weight, and the losses (clients, batch): ``grad`` of one sample's loss
    through ``functional_call`` of ``model`` with the weights ``trained`` and ``other`` (buffers,
    frozen weights), under ``vmap`` over the batch and over the clients (every tensor with a leading
    client axis; x (clients, batch, …), y (clients, batch)); a group of one client without the
    outer ``vmap`` (which would cost more than the batch's own, ~1.8 ms a step of the digits MLP).
    A model with dropout draws its masks per sample and client."""
    def sample_loss(trained: dict[str, Tensor], other: dict[str, Tensor], x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        out = functional_call(model, {**trained, **other}, (x.unsqueeze(0),))
        value = task_loss(loss, out.logits, y.unsqueeze(0), temperature=temperature)
        return value, value.detach()

    randomness = "different" if has_dropout(model) else "error"
    samples = vmap(grad(sample_loss, has_aux=True), in_dims=(None, None, 0, 0), randomness=randomness)
    clients = vmap(samples, in_dims=(0, 0, 0, 0), randomness=randomness)

    def per_sample(trained: dict[str, Tensor], other: dict[str, Tensor], x: Tensor,
                   y: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        if len(x) > 1:
            return clients(trained, other, x, y)
        grads, losses = samples({n: t[0] for n, t in trained.items()}, {n: t[0] for n, t in other.items()}, x[0], y[0])
        return {n: g.unsqueeze(0) for n, g in grads.items()}, losses.unsqueeze(0)
    return per_sample


class PrivateGradients:
    """One model's DP-SGD gradients for the clients of a trainer (rows of its stack): the clipped,
    summed, noised per-sample gradients of the task loss over the denominator (see the module's
    docstring), and the task loss per client the same way (the sum over the denominator).
    ``sizes``: the clients' training-set sizes; ``model``: :data:`GLOBAL` or :data:`PERSONAL`."""

    def __init__(self, module: FedModel, loss: str, temperature: float, s: LocalSettings, rcs: list[ClientRound],
                 sizes: list[int], trainable: list[str], model: int = GLOBAL) -> None:
        self.per_sample = per_sample_gradients(module, loss, temperature)
        self.trainable = trainable
        self.clip_norm, self.noise_multiplier = s.sample_clip_norm, s.sample_noise_multiplier
        self.generators = noise_generators(rcs, model, s.secret_noise, s.device) if self.noise_multiplier > 0 else None
        self.expected = [min(s.batch_size, n) for n in sizes] if s.poisson else None

    def __call__(self, params: Mapping[str, Tensor], members: list[int], x: Tensor, y: Tensor,
                 weights: Tensor | None, sizes: list[int]) -> tuple[list[Tensor], Tensor]:
        """The gradients of ``members``' step, (clients, …) per trainable weight, and their task
        losses (clients,); ``params``: their weights with a leading client axis, ``x``, ``y`` and
        ``weights`` their (padded) batches, ``sizes`` the batches' real sizes."""
        trained = {n: params[n].detach() for n in self.trainable}
        other = {n: params[n].detach() for n in params if n not in trained}
        grads, losses = self.per_sample(trained, other, x, y)
        per_sample = [grads[n] for n in self.trainable]
        count = self.expected
        denominators = devices.upload([count[c] for c in members] if count is not None else sizes,
                                      losses.device, losses.dtype)
        noise = self._noise(members, [g.shape[2:] for g in per_sample], losses) if self.generators else None
        gradients = private_gradient(per_sample, self.clip_norm, weights, denominators, noise, self.noise_multiplier)
        task = (losses if weights is None else losses * weights).sum(1) / denominators
        return gradients, task

    def _noise(self, members: list[int], shapes: list[torch.Size], like: Tensor) -> list[Tensor]:
        """One standard normal draw per trainable weight entry for each member, from its own
        generator (one call per client and step) on the training device, as (members, …) tensors
        per weight."""
        assert self.generators is not None
        numels = [math.prod(shape) for shape in shapes]
        flat = torch.stack([_standard_normals(sum(numels), self.generators[c], like.device)
                            for c in members]).to(like.dtype)
        return [part.reshape(len(members), *shape) for part, shape in zip(flat.split(numels, 1), shapes)]
