"""APFL (Deng, Kamani & Mahdavi 2020, "Adaptive Personalized Federated Learning", arXiv:2003.13461,
Algorithm 1).

Each client keeps a personal model v (``personal.*`` in its state) and a mixing weight α
(``apfl.alpha``); its personalised model is the mixture v̄ = α v + (1 − α) w of v and its copy w of
the global model. On every batch ξ, from the values before the step:

- w ← w − η ∇f(w; ξ): local SGD as in FedAvg (w is uploaded and averaged);
- v ← v − η ∇_v f(v̄; ξ) = v − η α ∇f(v̄; ξ);
- α ← clip(α − η ∇_α f(v̄; ξ), 0, 1), ∇_α f(v̄; ξ) = ⟨v − w, ∇f(v̄; ξ)⟩ (the paper's α step),
  with ``adapt_alpha``; else α stays at ``alpha``.

v trains with the run's update rule (``train.optimizer``: the paper's SGD by default), α with plain
SGD at the round's rate η, clipped to [0, 1]. The mixture mixes the parameters; a BatchNorm layer's
running statistics are v's. Each client is evaluated on α v + (1 − α) w̄ with the round's global
weights w̄ (the global model where it has no v yet). α fixed at 0 leaves w to train exactly as FedAvg.
A client that never trained (``data.holdout_clients``) is evaluated on α₀ v + (1 − α₀) w̄, α₀ =
``alpha`` and v the global model fine-tuned on its training split (APFL learns v and α over rounds the
new client never had).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from fedlatent.errors import ConfigError
from fedlatent.methods.parts import ClientRound, MethodSpec
from fedlatent.methods.program import (GLOBAL, PERSONAL, ClientProgram, ModelCopy, Step, Tensors, Tune, prefixed,
                                       register_program)
from fedlatent.methods.registry import register_preset

ALPHA = "apfl.alpha"  # client-state key of the client's mixing weight α, shape (1,)


def mixed(alpha: Tensor, v: Tensor, w: Tensor) -> Tensor:
    """α v + (1 − α) w with a leading client axis: ``alpha`` (clients,), ``v`` and ``w`` (clients, …)."""
    a = alpha.reshape(-1, *[1] * (v.dim() - 1))
    return a * v + (1 - a) * w


@register_program("apfl")
class ApflProgram(ClientProgram):
    """A personal model mixed with the global copy by a learned α; evaluated on the mixture (APFL).

    The global copy w and a personal model v kept in the client's state, v trained on the loss of
    the mixture α v + (1 − α) w, α (kept too) by its gradient step when ``adapt``."""

    personalizes = True

    def __init__(self, alpha: float, adapt: bool) -> None:
        super().__init__()
        self.alpha, self.adapt = alpha, adapt
        self.copies = (ModelCopy(GLOBAL), ModelCopy("personal", kept=True))

    def begin(self, rcs: list[ClientRound], device: Any) -> Tensor:
        """The clients' α (clients,), ``alpha`` where a client has none yet, in the weights' dtype."""
        dtype = next(rcs[0].model.parameters()).dtype
        return torch.cat([rc.state[ALPHA] if ALPHA in rc.state else torch.tensor([self.alpha]) for rc in rcs]) \
            .to(device, dtype)

    def step(self, st: Step) -> None:
        """v's step on the mixture's loss (and α's gradient), then w's: both from the values before the step."""
        alpha = st.rows(st.data).detach().clone().requires_grad_(self.adapt)  # α before the step
        w = st.weights(GLOBAL)

        def mixture(v: Mapping[str, Tensor]) -> dict[str, Tensor]:  # the trained weights mixed; buffers: v's
            return {n: mixed(alpha, t, w[n]) if t.requires_grad else t for n, t in v.items()}
        grads = st.train("personal", st.objective("personal", mixture), extras=[alpha] if self.adapt else [])
        st.train(GLOBAL)
        if self.adapt and grads[0] is not None:  # a row whose fp16 step was skipped keeps its α
            grad = torch.nan_to_num(grads[0], nan=0.0, posinf=0.0, neginf=0.0)
            st.put(st.data, (alpha.detach() - st.lr * grad).clamp(0.0, 1.0))

    def finish(self, rc: ClientRound, row: int, data: Any) -> None:
        rc.state[ALPHA] = data[row:row + 1].detach().to("cpu", copy=True)
        rc.metrics["personal_alpha"] = float(data[row])

    def evaluated(self, parameters: list[str], client_state: Tensors, global_state: Tensors,
                  tune: Tune | None) -> Tensors:
        own = prefixed(client_state, PERSONAL)
        if not own:
            return global_state
        return mixture(parameters, client_state[ALPHA], own, global_state)

    new_client_rule = "α's initial value mixing the global model with the global model fine-tuned on its training split"

    def adapted_new(self, parameters: list[str], global_state: Tensors, tune: Tune) -> Tensors:
        """A new client has no v nor α: v is the global model fine-tuned on its training split (every
        parameter, on v's own loss), mixed with w̄ by α's initial value ``alpha``."""
        return mixture(parameters, torch.tensor([self.alpha]), tune(global_state, "all"), global_state)


def mixture(parameters: list[str], alpha: Tensor, own: Tensors, global_state: Tensors) -> Tensors:
    """α v + (1 − α) w̄ over the ``parameters`` (α (1,), in each entry's dtype); the buffers v's."""
    names = set(parameters)
    return {k: mixed(alpha.to(own[k].dtype), own[k].unsqueeze(0), v.unsqueeze(0))[0] if k in names else own[k]
            for k, v in global_state.items()}


@register_preset("apfl", alpha=0.5, adapt_alpha=True)
def apfl(opts: dict[str, Any]) -> MethodSpec:
    """APFL: a personal model mixed with the global one by α (0.5 at first), α learned by its gradient step."""
    if not 0.0 <= opts["alpha"] <= 1.0:
        raise ConfigError(f"algorithm.alpha = {opts['alpha']}: must be in [0, 1]")
    return MethodSpec("apfl", personalization=ApflProgram(opts["alpha"], opts["adapt_alpha"]))
