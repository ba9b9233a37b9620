"""Ditto (Li, Hu, Beirami & Smith 2021, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML) and the feature-drift constraints of the Ditto+MMD paper (METHODS.md,
"Personalised FL: Ditto and feature-drift constraints").

Each client keeps a personal model w_L beside the global copy. Per batch the client takes one step
on the global copy and one on w_L with

    task loss + (λ/2)‖w_L − w̄‖² + μ · Σ_layers d(f_L(b), f_ḡ(b)),

f_ḡ the frozen global model received at the start of the round (Algorithm 1 of the Ditto+MMD
paper; the loop is ``federated.trainer``'s personal step). This module declares the constraints d
as parts and the presets that combine them with Ditto:

* ``cosine`` — mean over the batch of 1 − cos(f_L(x), f_ḡ(x)) (paired samples);
* ``mk_mmd`` — Σ_j β_j MMD²_j with test-power kernel weights β (Gretton et al. 2012, NeurIPS);
* ``mmd_d`` — MMD² under a learned deep kernel (Liu et al. 2020, ICML).

Layers (``depth``): depth 1 constrains z, the classifier's input (for the 60 → 20 → 10 MLP of the
Synthetic experiments, the 20-d hidden output); depth d adds the d − 1 deepest named features of
``model.tap_names`` (checked before the run starts, read again when a client starts a round).
``layers`` names the features explicitly instead (``"z"`` or tap names), overriding ``depth``.
With several layers the per-layer distances are summed.

Per-client state (checkpointed with the client's other tensors): β under ``mk_mmd.beta.<layer>``,
the deep kernel's weights under ``mmd_d.kernel.<layer>.``. The accumulated feature batches and the
step counter are per client and round: a window opened in :meth:`Part.begin` in the client's
``rc.scratch`` (with MMD-D's kernels of the round), so that the vectorized backend can train
several clients at once (the parts' ``lockstep_loss``).

Where the authors' release differs (options for faithful runs, defaults follow the paper):

* MK-MMD kernels exp(−‖a − b‖²/γ_j) instead of exp(−γ_j‖a − b‖²) (``kernel = "official"``), features
  L2-normalised (``normalize = true``), ε = 1e-5 instead of 1e-3, β's covariance from the n²
  paired h-statistics (``quadruples = "paired"``);
* β re-optimised every 20 steps on 50 accumulated batches that are in fact 51 (an off-by-one:
  ``beta_batches = 50`` with ``release_off_by_one = true``), and after the step, so the first step
  of a round uses the previous round's β (``stale_first_step = true``); the deep kernel is
  refreshed on the same schedule (``kernel_every``, ``kernel_batches``);
* the release draws those batches afresh from the loader and runs the current models on them;
  fedlatent re-uses the features of the most recent batches the personal step has seen (computed
  with the personal weights of their own step), which costs no extra forward pass;
* its deep-kernel optimiser (AdamW) keeps its moments across updates, fedlatent starts a fresh
  one per update; its φ is 10 wide with a 50-d output (``hidden``, ``out_dim`` here);
* the model's softmax output feeds cross-entropy (``model.softmax_output = true``).
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from fedlatent.errors import ConfigError
from fedlatent.losses.mmd import (kernel_bandwidths, mk_mmd_batch, mmd_estimates_with_covariance_batch,
                                  optimize_kernel_weights)
from fedlatent.losses.mmd_d import DeepKernel, GramWorkspace, mmd_d_stacked, stack_parameters, train_deep_kernels
from fedlatent.methods.parts import ClientRound, LockstepContext, MethodSpec, Part, TermContext
from fedlatent.methods.program import GLOBAL, PERSONAL, ClientProgram, ModelCopy, Tensors, Tune, prefixed, \
    register_program
from fedlatent.methods.registry import register_part, register_preset
from fedlatent.models.base import FedModel, ModelOutput
from fedlatent.seeding import KERNEL_INIT, derive_seed

# keys shared by the part and its preset (the preset adds ``lam``); defaults follow the paper
LAYER_KEYS: dict[str, Any] = {"depth": 1, "layers": []}
MKMMD_KEYS: dict[str, Any] = {
    **LAYER_KEYS, "kernel": "paper", "estimator": "biased", "normalize": False, "beta_every": 20,
    "beta_batches": 50, "release_off_by_one": False, "eps": 1e-3, "stale_first_step": False,
    "quadruples": "all", "fixed_kernels": 0}
MMDD_KEYS: dict[str, Any] = {
    **LAYER_KEYS, "semantics": "paper", "estimator": "unbiased", "kernel_every": 20,
    "kernel_batches": 50, "train_steps": 5, "kernel_lr": 1e-3, "hidden": 10, "out_dim": 50,
    "release_off_by_one": False, "stale_first_step": False}
CHOICES = {"kernel": ("paper", "official"), "estimator": ("biased", "linear"),
           "quadruples": ("all", "paired"), "semantics": ("paper", "official"),
           "mmdd_estimator": ("unbiased", "unbiased_two_sample", "biased")}


def _choice(part: str, key: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{part}.{key} = {value!r}: allowed values are {', '.join(allowed)}")
    return value


def _features(out: ModelOutput, layer: str, batch_dims: int = 1) -> Tensor:
    """The named feature of one forward pass, flattened to (N, d) (or (C, N, d) with ``batch_dims=2``)."""
    return (out.z if layer == "z" else out.features[layer]).flatten(batch_dims)


def _window(batches: int, off_by_one: bool) -> int:
    """How many recent batches a refresh sees (the release keeps one more than it asks for)."""
    return max(1, batches + (1 if off_by_one else 0))


def refresh_due(step: int, every: int, stale_first_step: bool) -> bool:
    """Whether β / the deep kernel is refreshed before the personal step ``step`` (1-based, within
    the round). Paper: at steps 1, 1 + every, … (before the loss, on data including this batch).
    Release (``stale_first_step``): after steps 1, 1 + every, …, i.e. before steps 2, 2 + every, …,
    so step 1 of a round uses the previous round's value. ``every = 0`` never refreshes."""
    if every <= 0:
        return False
    if stale_first_step:
        return step >= 2 and (step - 2) % every == 0
    return (step - 1) % every == 0


class FeatureDrift(Part):
    """Common ground of the constraints: the layers they compare, read from the model at ``begin``.

    ``weight`` is μ; ``needs_global_out`` makes the client run the frozen round-start global model
    on every batch (its output arrives as ``ctx.global_out``).
    """

    needs_global_out = True

    def __init__(self, mu: float, depth: int, layers: list[str]) -> None:
        if depth < 1:
            raise ConfigError(f"{self.name}.depth = {depth}: must be >= 1 (1 = z, the classifier's input)")
        if not all(isinstance(l, str) and l for l in layers):
            raise ConfigError(f"{self.name}.layers = {layers!r}: expected a list of feature names")
        self.weight, self.depth, self.explicit = mu, depth, tuple(layers)
        self.layers: tuple[str, ...] = self.explicit or ("z",)
        self.taps = frozenset(self.layers) - {"z"}

    def check_model(self, model: FedModel) -> None:
        """The constrained layers from the model's features (``layers``, else ``depth``); a name or
        a depth the model does not have is a ConfigError."""
        names = tuple(getattr(model, "tap_names", ()))
        if self.explicit:
            unknown = [l for l in self.explicit if l != "z" and l not in names]
            if unknown:
                raise ConfigError(f"{self.name}.layers: {unknown[0]!r} is not a feature of this model; "
                                  f"it has z{''.join(', ' + n for n in names)}")
        elif self.depth - 1 > len(names):
            raise ConfigError(f"{self.name}.depth = {self.depth}: this model has {len(names) + 1} "
                              f"constrainable layer(s) (z{''.join(', ' + n for n in names)})")
        else:
            self.layers = ("z",) + names[:self.depth - 1]
        self.taps = frozenset(self.layers) - {"z"}

    def begin(self, rc: ClientRound) -> None:
        self.check_model(rc.model)  # a client that built its own parts (Flower's) resolves them here

    def pairs(self, out: ModelOutput, global_out: ModelOutput, batch_dims: int = 1) -> dict[str, tuple[Tensor, Tensor]]:
        """(personal, frozen global) features of the batch, per constrained layer."""
        return {l: (_features(out, l, batch_dims), _features(global_out, l, batch_dims)) for l in self.layers}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "weight": self.weight, "layers": list(self.layers)}


class Cosine(FeatureDrift):
    """d = mean over the batch of (1 − cos(f_L(x), f_ḡ(x))), summed over layers."""

    name = "cosine"
    output_only = True

    def loss(self, ctx: TermContext) -> Tensor:
        return sum((1.0 - F.cosine_similarity(p, g, dim=1)).mean()
                   for p, g in self.pairs(ctx.out, ctx.global_out).values())


class _Window:
    """One client's round for a periodically refreshed constraint: its most recent feature
    batches per layer, the count of personal steps taken and (MMD-D) the deep kernels in use."""

    def __init__(self, rc: ClientRound, layers: tuple[str, ...], size: int) -> None:
        self.rc, self.step = rc, 0
        self.buffers = {l: deque(maxlen=size) for l in layers}
        self.kernels: dict[str, DeepKernel] = {}

    def observe(self, pairs: dict[str, tuple[Tensor, Tensor]]) -> None:
        self.step += 1
        for l, (p, g) in pairs.items():
            self.buffers[l].append((p.detach(), g.detach()))

    def samples(self, layer: str) -> tuple[Tensor, Tensor]:
        batches = self.buffers[layer]
        return torch.cat([p for p, _ in batches]), torch.cat([g for _, g in batches])


def _observe(part: MkMmd | MmdD, ctx: LockstepContext) -> tuple[dict[str, tuple[Tensor, Tensor]], list[_Window],
                                                             list[_Window]]:
    """The step's (personal, global) features per layer ((C, N, d) each), recorded in each
    client's window (``rc.scratch[part.name]``); the windows, and those due for a refresh before
    this step's loss (:func:`refresh_due` with the part's ``every``, 0: never, and ``stale``)."""
    pairs = part.pairs(ctx.out, ctx.global_out, batch_dims=2)
    windows = [rc.scratch[part.name] for rc in ctx.rcs]
    for i, window in enumerate(windows):
        window.observe({l: (p[i], g[i]) for l, (p, g) in pairs.items()})
    return pairs, windows, [w for w in windows if refresh_due(w.step, part.every, part.stale)]


class MkMmd(FeatureDrift):
    """d = MK-MMD² = Σ_j β_j MMD²_j (19 Gaussian kernels), β re-optimised for test power.

    Every ``beta_every`` personal steps (0 = never: β stays uniform) β is re-solved from the
    features of the last ``beta_batches`` batches: argmin βᵀ(Q + εI)β s.t. βᵀm̂ = 1, β ≥ 0, then
    normalised to sum 1 (:func:`fedlatent.losses.mmd.optimize_kernel_weights`). β is per client
    and layer, kept in the client state (initially uniform); the seconds spent re-solving it are
    reported as ``personal_beta_seconds``. ``fixed_kernels = r`` > 0 is the paper's fixed-kernel
    ablation (Sec. 5, Figure 3 right): only the first r kernels (smallest γ), each with the fixed
    weight 1/r, never re-optimised.
    """

    name = "mk_mmd"

    def __init__(self, opts: dict[str, Any]) -> None:
        super().__init__(opts["mu"], opts["depth"], opts["layers"])
        self.kernel = _choice(self.name, "kernel", opts["kernel"], CHOICES["kernel"])
        self.estimator = _choice(self.name, "estimator", opts["estimator"], CHOICES["estimator"])
        self.quadruples = _choice(self.name, "quadruples", opts["quadruples"], CHOICES["quadruples"])
        self.normalize, self.eps = opts["normalize"], opts["eps"]
        self.every, self.stale = opts["beta_every"], opts["stale_first_step"]
        self.window = _window(opts["beta_batches"], opts["release_off_by_one"])
        self.num_kernels = len(kernel_bandwidths(self.kernel))
        self.fixed = opts["fixed_kernels"]
        if self.fixed > self.num_kernels:
            raise ConfigError(f"{self.name}.fixed_kernels = {self.fixed}: there are {self.num_kernels} kernels")
        if self.fixed:
            self.every = 0

    def key(self, layer: str) -> str:
        return f"{self.name}.beta.{layer}"

    def begin(self, rc: ClientRound) -> None:
        super().begin(rc)
        rc.scratch[self.name] = _Window(rc, self.layers, self.window)
        for l in self.layers:
            if self.fixed:
                rc.state[self.key(l)] = (torch.arange(self.num_kernels) < self.fixed).float() / self.fixed
            else:
                rc.state.setdefault(self.key(l), torch.full((self.num_kernels,), 1.0 / self.num_kernels))

    def lockstep_loss(self, ctx: LockstepContext) -> Tensor:
        """Each client's window records the step's features, β re-solved where due (before this
        step's loss, the windows due together); the terms of all clients from one batched call."""
        pairs, _, due = _observe(self, ctx)
        if due:
            self.refresh(due)
        rcs = ctx.rcs
        return sum(mk_mmd_batch(p, g, betas=torch.stack([rc.state[self.key(l)] for rc in rcs]), kernel=self.kernel,
                                normalize=self.normalize, estimator=self.estimator) for l, (p, g) in pairs.items())

    def refresh(self, windows: list[_Window]) -> None:
        """Re-solve β of every layer from each window's batches (kept as is when too few samples);
        windows holding as many samples are computed together."""
        started = time.perf_counter()
        est = dict(kernel=self.kernel, estimator=self.estimator, normalize=self.normalize, quadruples=self.quadruples)
        for l in self.layers:
            by_size: dict[int, list[tuple[_Window, Tensor, Tensor]]] = {}
            for window in windows:
                x, y = window.samples(l)
                if not (self.estimator == "linear" and x.shape[0] < 4):
                    by_size.setdefault(x.shape[0], []).append((window, x, y))
            for group in by_size.values():
                with torch.no_grad():  # β is a constant of the loss: no graph for its statistics
                    ms, qs = mmd_estimates_with_covariance_batch(torch.stack([x for _, x, _ in group]),
                                                                 torch.stack([y for _, _, y in group]), **est)
                for (window, _, _), m, q in zip(group, ms, qs):
                    window.rc.state[self.key(l)] = optimize_kernel_weights(m, q, eps=self.eps).to("cpu", torch.float32)
        share = (time.perf_counter() - started) / len(windows)
        for window in windows:
            metrics = window.rc.metrics
            metrics["personal_beta_seconds"] = metrics.get("personal_beta_seconds", 0.0) + share
            metrics["personal_beta_refreshes"] = metrics.get("personal_beta_refreshes", 0) + 1


class MmdD(FeatureDrift):
    """d = MMD² under a deep kernel per client and layer (Liu et al. 2020), trained for test power.

    The kernel (φ: in → hidden → hidden → hidden → out_dim with Softplus, σ_φ, σ_q, ε) is seeded
    from ``derive_seed(the client's stream seed, KERNEL_INIT, client, layer index)`` at a client's first round and kept in
    its state afterwards. Every ``kernel_every`` personal steps it is trained with AdamW
    (``kernel_lr``) for ``train_steps`` steps on the last ``kernel_batches`` batches to maximise
    MMD²_u/σ̂ (:func:`fedlatent.losses.mmd_d.train_deep_kernel`); the paper's alternatives are
    5 steps every 20 steps or 25 steps every step (``kernel_every = 1``, ``kernel_batches = 1``).
    The loss is ``mmd_d(personal, global)`` with the kernel fixed. Training time is reported as
    ``personal_kernel_seconds``.
    """

    name = "mmd_d"

    def __init__(self, opts: dict[str, Any]) -> None:
        super().__init__(opts["mu"], opts["depth"], opts["layers"])
        self.semantics = _choice(self.name, "semantics", opts["semantics"], CHOICES["semantics"])
        self.estimator = _choice(self.name, "estimator", opts["estimator"], CHOICES["mmdd_estimator"])
        if min(opts["hidden"], opts["out_dim"]) < 1:
            raise ConfigError(f"{self.name}.hidden / out_dim: must be >= 1")
        self.hidden, self.out_dim, self.lr = opts["hidden"], opts["out_dim"], opts["kernel_lr"]
        self.every, self.stale, self.steps = opts["kernel_every"], opts["stale_first_step"], opts["train_steps"]
        if not self.steps:  # no kernel training: never a refresh
            self.every = 0
        self.window = _window(opts["kernel_batches"], opts["release_off_by_one"])
        # stacked kernel weights of the clients stepping together, per layer (see stacked_kernels)
        self.stacks: dict[tuple[str, tuple[int, ...]], tuple[list[_Window], DeepKernel, dict[str, Tensor]]] = {}
        # the kernel training's Gram buffers, allocated once for the run (not at each of its steps)
        self.workspace = GramWorkspace()

    def prefix(self, layer: str) -> str:
        return f"{self.name}.kernel.{layer}."

    def begin(self, rc: ClientRound) -> None:
        super().begin(rc)
        rc.scratch[self.name] = _Window(rc, self.layers, self.window)
        self.stacks.clear()

    def kernel_for(self, rc: ClientRound, layer: str, sample: Tensor) -> DeepKernel:
        """Client ``rc``'s kernel for ``layer``: from its state, or freshly seeded."""
        kernels = rc.scratch[self.name].kernels
        if layer not in kernels:
            generator = torch.Generator().manual_seed(
                derive_seed(rc.seed, KERNEL_INIT, rc.client_id, self.layers.index(layer)))
            kernel = DeepKernel(sample.shape[-1], self.hidden, self.out_dim, generator)
            prefix = self.prefix(layer)
            own = {k[len(prefix):]: v for k, v in rc.state.items() if k.startswith(prefix)}
            if own:
                kernel.load_state_dict(own)
            kernels[layer] = kernel.to(sample.device).requires_grad_(False)
        return kernels[layer]

    def lockstep_loss(self, ctx: LockstepContext) -> Tensor:
        """Each client's window records the step's features, the kernels due trained together
        (:func:`~fedlatent.losses.mmd_d.train_deep_kernels`); the terms of all clients from one
        batched call on their stacked kernel weights (:func:`~fedlatent.losses.mmd_d.mmd_d_stacked`)."""
        pairs, windows, due = _observe(self, ctx)
        if due:
            self.train_kernels(due, pairs)
        total = 0.0
        for l, (p, g) in pairs.items():
            template, params = self.stacked_kernels(windows, l, p)
            total = total + mmd_d_stacked(p, g, template, params, semantics=self.semantics, estimator=self.estimator)
        return total

    def stacked_kernels(self, windows: list[_Window], layer: str, sample: Tensor) -> tuple[DeepKernel, dict[str, Tensor]]:
        """The windows' kernels for ``layer`` and their stacked weights, stacked once and reused
        until a kernel changes (training, or a client's round beginning or ending). Keyed by the
        windows' identities; the entry keeps the windows alive, so no identity is reused meanwhile."""
        key = (layer, tuple(map(id, windows)))
        if key not in self.stacks:
            kernels = [self.kernel_for(window.rc, layer, sample) for window in windows]
            self.stacks[key] = (windows, kernels[0], stack_parameters(kernels))
        return self.stacks[key][1:]

    def train_kernels(self, windows: list[_Window], pairs: dict[str, tuple[Tensor, Tensor]]) -> None:
        """Train every layer's kernel of each window on its batches (kept as is when fewer than
        two samples); windows holding as many samples together with :func:`train_deep_kernels`."""
        started = time.perf_counter()
        self.stacks.clear()
        for l in self.layers:
            by_size: dict[int, list[tuple[DeepKernel, Tensor, Tensor]]] = {}
            for window in windows:
                x, y = window.samples(l)
                if x.shape[0] >= 2:
                    by_size.setdefault(x.shape[0], []).append((self.kernel_for(window.rc, l, pairs[l][0]), x, y))
            for group in by_size.values():
                train_deep_kernels([k for k, _, _ in group], torch.stack([x for _, x, _ in group]),
                                   torch.stack([y for _, _, y in group]), steps=self.steps, lr=self.lr,
                                   semantics=self.semantics, workspace=self.workspace)
        share = (time.perf_counter() - started) / len(windows)
        for window in windows:
            metrics = window.rc.metrics
            metrics["personal_kernel_seconds"] = metrics.get("personal_kernel_seconds", 0.0) + share

    def finish(self, rc: ClientRound) -> None:
        self.stacks.clear()
        for l, kernel in rc.scratch[self.name].kernels.items():
            rc.state.update({self.prefix(l) + k: v.detach().to("cpu", copy=True)
                             for k, v in kernel.state_dict().items()})
        return None


# ---------------------------------------------------------------------------------------- parts

@register_part("cosine", mu=1.0, **LAYER_KEYS)
def cosine_part(opts: dict[str, Any]) -> Part:
    """Feature-drift constraint: mean (1 − cos) between personal and frozen global features."""
    return Cosine(opts["mu"], opts["depth"], opts["layers"])


@register_part("mk_mmd", mu=0.1, **MKMMD_KEYS)
def mk_mmd_part(opts: dict[str, Any]) -> Part:
    """Feature-drift constraint: MK-MMD² with test-power β (per client, in its state)."""
    return MkMmd(opts)


@register_part("mmd_d", mu=1.0, **MMDD_KEYS)
def mmd_d_part(opts: dict[str, Any]) -> Part:
    """Feature-drift constraint: MMD² under a per-client deep kernel (Liu et al. 2020)."""
    return MmdD(opts)


# -------------------------------------------------------------------------------------- program

@register_program("ditto")
class DittoProgram(ClientProgram):
    """A personal model trained beside the global copy, pulled towards w̄; evaluated on it (Ditto).

    Algorithm 1: the personal model v, kept in the client's state, takes a step beside the global
    copy on every batch, on the task loss, the constraints ``parts`` and (λ/2)‖v − w̄‖² towards the
    round's global weights w̄; each client is evaluated on v."""

    personalizes = True
    coefficients = ("lam",)  # λ, the personal copy's pull: stacked runs may differ in it

    def __init__(self, lam: float = 0.0, parts: list[Part] | None = None) -> None:
        super().__init__()
        self.lam, self.parts = lam, list(parts or [])
        self.copies = (ModelCopy(GLOBAL), ModelCopy("personal", kept=True, pull=lam))

    def evaluated(self, parameters: list[str], client_state: Tensors, global_state: Tensors,
                  tune: Tune | None) -> Tensors:
        return prefixed(client_state, PERSONAL) or global_state

    new_client_rule = "a personal model trained from the global one on its training split, pulled towards it by λ"

    def adapted_new(self, parameters: list[str], global_state: Tensors, tune: Tune) -> Tensors:
        """A new client's personal model: v from w̄, trained on the task loss plus (λ/2)‖v − w̄‖² (Algorithm 1's
        personal objective h_k with the final w̄), for the evaluation's epochs;
        the constraints ``parts`` are not applied (their windows and kernels come from rounds the
        client never trained)."""
        return tune(global_state, "all", self.lam)


# -------------------------------------------------------------------------------------- presets

def _ditto(name: str, lam: float, parts: list[Part]) -> MethodSpec:
    return MethodSpec(name, personalization=DittoProgram(lam, parts))


@register_preset("ditto", lam=0.01)
def ditto(opts: dict[str, Any]) -> MethodSpec:
    """Ditto: a personal model per client with (λ/2)‖w_L − w̄‖² (λ = 0.01).

    λ = 0.01 is the paper's best for Synthetic(0,0), 0.1 for Synthetic(.5,.5) (Table 3)."""
    return _ditto("ditto", opts["lam"], [])


@register_preset("ditto_cosine", lam=0.01, mu=1.0, **LAYER_KEYS)
def ditto_cosine(opts: dict[str, Any]) -> MethodSpec:
    """Ditto + cosine feature constraint (λ = 0.01, μ = 1; λ = 0: the constraint alone).

    λ = 0.01, μ = 1 are the paper's best on both Synthetic settings (Table 3)."""
    return _ditto("ditto_cosine", opts["lam"], [cosine_part(opts)])


@register_preset("ditto_mkmmd", lam=0.01, mu=0.1, **MKMMD_KEYS)
def ditto_mkmmd(opts: dict[str, Any]) -> MethodSpec:
    """Ditto + MK-MMD constraint (λ = 0.01, μ = 0.1, β every 20 steps; λ = 0: the constraint alone).

    Paper's best (Table 3): Synthetic(0,0) λ 0.01, μ 0.1; Synthetic(.5,.5) λ 0.01, μ 1. β is
    re-solved every 20 steps on the last 50 batches, the paper's s = 50 (``beta_every = 1``, ``beta_batches = 1``:
    every step), ε = 1e-3. The release: ``kernel = "official"``, ``normalize = true``, ε = 1e-5,
    ``quadruples = "paired"``, ``beta_batches = 50`` with ``release_off_by_one``, ``stale_first_step``."""
    return _ditto("ditto_mkmmd", opts["lam"], [MkMmd(opts)])


@register_preset("ditto_mmdd", lam=0.01, mu=1.0, **MMDD_KEYS)
def ditto_mmdd(opts: dict[str, Any]) -> MethodSpec:
    """Ditto + MMD-D constraint (λ = 0.01, μ = 1, kernel trained every 20 steps; λ = 0: alone).

    λ = 0.01, μ = 1 are the paper's best on both Synthetic settings (Table 3). The deep kernel
    takes 5 AdamW steps every 20 personal steps on the last 50 batches (or 25 every step:
    ``kernel_every = 1``, ``kernel_batches = 1``, ``train_steps = 25``). The release uses
    ``semantics = "official"``, 50(+1) batches and the stale first step."""
    return _ditto("ditto_mmdd", opts["lam"], [MmdD(opts)])
