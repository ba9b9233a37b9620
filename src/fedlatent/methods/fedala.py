"""FedALA (Zhang, Hua, Wang, Song, Xue, Ma & Guan 2023, "FedALA: Adaptive Local Aggregation for
Personalized Federated Learning", AAAI, Algorithm 1 and Eq. 4–6).

At the start of its round a client builds its start weights from its local model w (its trained
weights of the last round it took part in, kept in its state under ``global.*``) and the global
model w̄, element-wise: ŵ = w + (w̄ − w) ⊙ W on the parameters of the top ``ala_layers`` layers
(counted from the output as FedPer counts them), w̄ elsewhere (the lower layers, every buffer). The
weights W ∈ [0, 1] (one per element, kept under ``ala.weights.*``, all ones at first) are learned
on a seeded ``rand_percent``% sample of the client's training split, batch after batch:

    W ← clip(W − η ∇_ŵ f(ŵ; batch) ⊙ (w̄ − w), 0, 1)   (Eq. 6)

one pass over the sample per round, and in the client's first round with a local model until the
losses converge (the population std of the last ``num_pre_loss`` epochs' last-batch losses below
``threshold``; at most ``max_start_epochs`` epochs). Then the client trains ŵ as FedAvg does and
keeps its trained weights as its local model; it is evaluated on it. A client with no local model
yet (its first round) starts from w̄; ``ala_layers = 0`` starts every client from w̄: FedAvg.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call

from fedlatent.data.types import Split
from fedlatent.errors import ConfigError
from fedlatent.methods.inner import gradients
from fedlatent.methods.partial import layer_of, layers
from fedlatent.methods.parts import ClientRound, MethodSpec, task_loss
from fedlatent.methods.program import GLOBAL, ClientProgram, ModelCopy, Tensors, Tune, prefixed, register_program
from fedlatent.methods.registry import register_preset
from fedlatent.models.base import FedModel
from fedlatent.seeding import ADAPTIVE_AGGREGATION, derive_seed

LOCAL_MODEL = ModelCopy(GLOBAL, kept=True).prefix  # "global.": the client's trained weights (its local model)
WEIGHTS = "ala.weights."  # the element-wise aggregation weights W of the top layers' parameters


def mixed(local: Tensors, global_: Tensors, weights: Tensors) -> Tensors:
    """w + (w̄ − w) ⊙ W over the names of ``weights`` (Eq. 4's adaptive aggregation)."""
    return {n: local[n] + (global_[n] - local[n]) * w for n, w in weights.items()}


def sample_batches(num_samples: int, percent: int, batch_size: int, generator: torch.Generator) -> list[Tensor]:
    """The batches of a seeded ``percent``% sample of ``num_samples`` (⌊n·p/100⌋ of them, in a random
    order), its incomplete last batch dropped as the release's loader drops it, unless it is the only one."""
    count = int(percent / 100 * num_samples)
    chunks = list(torch.randperm(num_samples, generator=generator)[:count].split(batch_size))
    return chunks[:-1] if len(chunks) > 1 and len(chunks[-1]) < batch_size else chunks


@register_program("fedala")
class FedAlaProgram(ClientProgram):
    """Each round starts from the client's local model and the global model aggregated element-wise
    by weights learned on its data (its top layers); the trained copy is kept as its local model (FedALA)."""

    personalizes = True

    def __init__(self, eta: float, rand_percent: int, ala_layers: int, threshold: float, num_pre_loss: int,
                 max_start_epochs: int) -> None:
        super().__init__()
        self.eta, self.rand_percent, self.ala_layers = eta, rand_percent, ala_layers
        self.threshold, self.num_pre_loss, self.max_start_epochs = threshold, num_pre_loss, max_start_epochs
        self.copies = (ModelCopy(GLOBAL, kept=True),)

    def top(self, parameters: list[str]) -> list[str]:
        """The parameters of the top ``ala_layers`` layers, in the model's order."""
        ordered = layers(parameters)
        chosen = set(ordered[len(ordered) - min(self.ala_layers, len(ordered)):]) if self.ala_layers else set()
        return [n for n in parameters if layer_of(n) in chosen]

    def start(self, model: FedModel, starts: list[Tensors], spec: MethodSpec, rcs: list[ClientRound],
              datas: Sequence[Any], s: Any) -> list[Tensors]:
        """Each client's ŵ, its W learned and kept in its state; the round's start where it has no local model."""
        top = self.top([n for n, _ in model.named_parameters()])
        if not top or not any(prefixed(rc.state, LOCAL_MODEL) for rc in rcs):
            return starts
        out = []
        for rc, start, data in zip(rcs, starts, datas):
            local = prefixed(rc.state, LOCAL_MODEL)
            if not local:
                out.append(start)
                continue
            kept = prefixed(rc.state, WEIGHTS)
            generator = torch.Generator().manual_seed(derive_seed(rc.seed, ADAPTIVE_AGGREGATION, rc.round,
                                                                  rc.client_id))
            weights = self.learn(model, spec, local, start, kept or {n: torch.ones_like(local[n]) for n in top},
                                 data, s, generator, first=not kept)
            rc.state.update({WEIGHTS + n: w for n, w in weights.items()})
            out.append({**start, **mixed(local, start, weights)})
        return out

    def learn(self, model: FedModel, spec: MethodSpec, local: Tensors, start: Tensors, weights: Tensors, data: Split,
              s: Any, generator: torch.Generator, first: bool) -> Tensors:
        """W trained on the sample's batches (Eq. 6), in eval mode (no dropout draw, no BatchNorm
        statistics moved): one pass, or until the losses converge in the client's ``first`` round."""
        device = next(model.parameters()).device
        on = {k: v.to(device) for k, v in start.items()}
        own = {n: local[n].to(device) for n in weights}
        w = {n: v.to(device) for n, v in weights.items()}
        chunks = sample_batches(len(data), self.rand_percent, s.batch_size, generator)
        losses: list[float] = []
        training = model.training
        model.eval()
        try:
            while chunks:
                for idx in chunks:
                    leaves = {n: v.requires_grad_(True) for n, v in mixed(own, on, w).items()}
                    out = functional_call(model, {**on, **leaves}, (data.x[idx].to(device),))
                    loss = task_loss(spec.loss, out.logits, data.y[idx].to(device), temperature=spec.temperature)
                    g = gradients(loss, leaves)
                    with torch.no_grad():
                        w = {n: (v - self.eta * g[n] * (on[n] - own[n])).clamp(0.0, 1.0) for n, v in w.items()}
                losses.append(float(loss.detach()))
                if not first or len(losses) >= self.max_start_epochs or (
                        len(losses) > self.num_pre_loss
                        and statistics.pstdev(losses[-self.num_pre_loss:]) < self.threshold):
                    break
        finally:
            model.train(training)
        return {n: v.detach().to("cpu") for n, v in w.items()}

    def evaluated(self, parameters: list[str], client_state: Tensors, global_state: Tensors,
                  tune: Tune | None) -> Tensors:
        """The client's local model (the global model where it has none yet)."""
        return prefixed(client_state, LOCAL_MODEL) or global_state

    new_client_rule = ("the global model trained on its training split for the evaluation's epochs: its first round, "
                       "whose adaptive aggregation leaves the global model as it is (no local model yet)")

    def adapted_new(self, parameters: list[str], global_state: Tensors, tune: Tune) -> Tensors:
        return tune(global_state, "all")


THRESHOLD = 0.01  # the paper's (the FedALA release's README: "we set it to 0.01 in our paper"); ALA.py's default is 0.1


@register_preset("fedala", eta=1.0, rand_percent=80, ala_layers=1, threshold=THRESHOLD, num_pre_loss=10,
                 max_start_epochs=1000)
def fedala(opts: dict[str, Any]) -> MethodSpec:
    """FedALA: each round starts from the local model aggregated element-wise with the global one on its top layer."""
    if not 0 < opts["rand_percent"] <= 100:
        raise ConfigError(f"algorithm.rand_percent = {opts['rand_percent']}: must be in (0, 100]")
    if opts["num_pre_loss"] < 1 or opts["max_start_epochs"] < 1:
        key = "num_pre_loss" if opts["num_pre_loss"] < 1 else "max_start_epochs"
        raise ConfigError(f"algorithm.{key} = {opts[key]}: must be >= 1")
    return MethodSpec("fedala", personalization=FedAlaProgram(
        opts["eta"], opts["rand_percent"], opts["ala_layers"], opts["threshold"], opts["num_pre_loss"],
        opts["max_start_epochs"]))
