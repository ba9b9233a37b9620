"""Per-FedAvg (Fallah, Mokhtari & Ozdaglar 2020, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS, Algorithm 1).

The global model w is trained on the MAML objective F(w) = f(w − α∇f(w)): a client's local step on
the batches D, D', D'' is, from w,

- w̃ = w − α ∇f(w; D): the adaptation step (a temporary, plain gradient at rate α);
- first-order (``variant = "fo"``): w ← w − β ∇f(w̃; D'), the gradient at w̃ applied at w;
- Hessian-free (``"hf"``): w ← w − β [∇f(w̃; D') − α ∇²f(w; D'') ∇f(w̃; D')], the Hessian-vector
  product by automatic differentiation (a double backward through ∇f(w; D''): exact, where the
  paper's analysis allows an approximation).

β is its own key, ``beta`` (0.001: the pFedMe repository's Per-FedAvg, its MNIST command), not
``train.lr``: w's step is the paper's plain one, so the run's update rule must be plain SGD (refused
otherwise, :attr:`~fedlatent.methods.program.ClientProgram.plain_update`), and the meta-objective is
scaled by β / the round's rate, which makes that rule's step exactly w − β ∇. f is the copy's objective: the task loss plus the method's terms. D, D', D''
are consecutive parts of the step's batch (``split_batch``: halves for FO, thirds for HF; PFLlib draws
a batch of 2B and halves it likewise), or each the whole batch. Each client is evaluated on the
global model after one adaptation step, w̄ − α∇f(w̄; ·) on a batch of its training split. α = 0
with whole batches trains exactly as FedAvg.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from fedlatent.errors import ConfigError, not_allowed
from fedlatent.methods.inner import gradients, per_client_dot
from fedlatent.methods.parts import MethodSpec
from fedlatent.methods.program import GLOBAL, ClientProgram, Step, Tensors, Tune, register_program
from fedlatent.methods.registry import register_preset

VARIANTS = ("fo", "hf")


@register_program("perfedavg")
class PerFedAvgProgram(ClientProgram):
    """The global copy trained on the MAML objective (its first-order or Hessian-free step), each
    client evaluated after one adaptation step at rate α from the global model (Per-FedAvg)."""

    personalizes = True
    inner_gradients = True
    plain_update = True  # Algorithm 1's w-step: plain gradient descent at β

    def __init__(self, alpha: float, variant: str, split_batch: bool, beta: float) -> None:
        super().__init__()
        self.alpha, self.variant, self.beta = alpha, variant, beta
        self.parts_of_batch = (3 if variant == "hf" else 2) if split_batch else 1

    @property
    def passes(self) -> float:
        """FO: two forward-backward passes over a part each; HF: a third part's gradient and its
        backward again (the Hessian-vector product, about two passes more)."""
        return (2.0 if self.variant == "fo" else 5.0) / self.parts_of_batch

    def step(self, st: Step) -> None:
        """w's step on the MAML objective: the adaptation at w on D inside the objective, so that the
        update rule applies the meta-gradient at w."""
        parts = [st.part(i, self.parts_of_batch) for i in range(self.parts_of_batch)]
        first, second, third = parts[0], parts[1 % len(parts)], parts[2 % len(parts)]
        scale = self.beta / st.lr if st.lr > 0 else 0.0  # plain SGD at the round's rate: a step of β

        def meta(params: Mapping[str, Tensor]) -> Tensor:
            w = dict(params)  # one view each (one client's weights come as views with a client axis)
            g = gradients(first.objective(GLOBAL, lambda _: w, recorded=False)(w), w)
            adapted = {n: (t - self.alpha * g[n]) if n in g else t for n, t in w.items()}  # w̃, g held constant
            if self.variant == "fo":  # its gradient at w: ∇f(w̃; D')
                return scale * second.objective(GLOBAL, lambda _: adapted)(w)
            leaves = {n: t.detach().requires_grad_(n in g) for n, t in adapted.items()}
            v = gradients(second.objective(GLOBAL, lambda _: leaves)(w), leaves)  # ∇f(w̃; D')
            h = gradients(third.objective(GLOBAL, lambda _: w, recorded=False)(w), w, create_graph=True)
            # gradient v − α ∇²f(w; D'') v: ⟨w, v⟩ − α ⟨∇f(w; D''), v⟩ with v held constant
            return scale * (per_client_dot({n: w[n] for n in v}, v) - self.alpha * per_client_dot(h, v))
        st.train(GLOBAL, meta)

    def evaluated(self, parameters: list[str], client_state: Tensors, global_state: Tensors,
                  tune: Tune | None) -> Tensors:
        """The global model after one plain gradient step at rate α on a batch of the client's training split."""
        if tune is None or self.alpha == 0:
            return global_state
        return tune(global_state, "all", steps=1, lr=self.alpha, plain=True)

    new_client_rule = "the global model after one plain gradient step at rate α on a batch of its training split"

    def adapted_new(self, parameters: list[str], global_state: Tensors, tune: Tune) -> Tensors:
        """A new client adapts as a trained one does: the meta-model is the same global model."""
        return self.evaluated(parameters, {}, global_state, tune)


BETA = 0.001  # the pFedMe repository's Per-FedAvg, its MNIST command (--beta 0.001, plain SGD)


@register_preset("perfedavg", alpha=0.005, variant="fo", split_batch=True, beta=BETA)
def perfedavg(opts: dict[str, Any]) -> MethodSpec:
    """Per-FedAvg: the global model trained on the MAML objective (α = 0.005, β = 0.001, first-order), one step at evaluation."""
    if opts["beta"] <= 0:
        raise ConfigError(f"algorithm.beta = {opts['beta']}: must be > 0 (the meta-step's rate)")
    if opts["variant"] not in VARIANTS:
        raise ConfigError(not_allowed(f"algorithm.variant = {opts['variant']!r}: allowed values are "
                                      f"{', '.join(VARIANTS)}", opts["variant"], VARIANTS))
    return MethodSpec("perfedavg", personalization=PerFedAvgProgram(opts["alpha"], opts["variant"],
                                                                   opts["split_batch"], opts["beta"]))
