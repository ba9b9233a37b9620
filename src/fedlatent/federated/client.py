"""What one client's round is made of, for the client trainer (``federated.trainer``) whatever
the number of clients it trains at once: the local settings, the workspace of models, the update
rule's settings and the optimiser state kept in the client's state across rounds (as the Ditto+MMD
release keeps it), the sum of the parts' loss terms, the end of the round (the parts' ``finish``,
what a client keeps — the program's kept copies (Ditto's personal model), MOON's previous model —,
the upload and its metrics). The batch schedule is the trainer's (``federated.trainer.schedule``).
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fedlatent.data.augment import Augmentation
from fedlatent.data.types import Split
from fedlatent.methods.parts import ClientRound, MethodSpec, Part, Tensors, Upload
from fedlatent.methods.program import GLOBAL, ModelCopy
from fedlatent.methods.program import LOCAL as LOCAL, PERSONAL as PERSONAL, prefixed as prefixed  # re-exported
from fedlatent.losses import update
from fedlatent.federated.compiled import forward_of
from fedlatent.losses.update import LocalOptimizer, Rule
from fedlatent.models.base import FedModel, ModelOutput

# client-state prefixes: a kept copy of the program's (PERSONAL: Ditto's, APFL's personal model),
# the layers a client keeps to itself (LOCAL: partial personalisation) — see methods.program — and:
PREVIOUS = "previous."   # the previous local model (MOON)
OPTIM = ModelCopy(GLOBAL).optim_prefix  # "optim.": the global copy's optimiser state (kept across rounds)
AMP = ModelCopy(GLOBAL).amp_prefix      # "amp.": its fp16 loss scale (losses.amp.LossScale)


@dataclass
class LocalSettings:
    """The local optimiser and loop settings of one round."""

    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    drop_last: bool
    augment: Augmentation | bool  # truthy when training batches are augmented
    num_classes: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    optimizer: str = "sgd"        # sgd | adam | adamw
    steps: int = 0                # local steps per round; 0 = ``epochs`` epochs
    keep_optimizer: bool = False  # optimiser state kept in the client's state across rounds
    precision: str = "fp32"       # fp32 | bf16 | fp16 (resolved: federated.precision)
    # sample-level DP-SGD (federated.sample_dp): per-sample clip norm (inf: off), noise multiplier,
    # and Poisson batches in place of each epoch's permutation
    sample_clip_norm: float = float("inf")
    sample_noise_multiplier: float = 0.0
    poisson: bool = False
    secret_noise: bool = False  # DP-SGD's noise keyed by the client's own OS entropy (privacy.randomness = "secret")


@dataclass
class Workspace:
    """Model instances a backend reuses across clients: the model being trained (the program's global
    copy) and, when needed, frozen copies of the global model and the previous local model (for the
    parts that read them) and a module per other copy the program trains (``copies``: Ditto's personal
    model); ``forward``: the model's compiled forward (``train.compile``, ``federated.compiled``) or None."""

    model: FedModel
    global_copy: FedModel | None = None
    previous: FedModel | None = None
    copies: dict[str, FedModel] = field(default_factory=dict)
    forward: Callable[..., ModelOutput] | None = None
    # the trainer's last pool: its clients' training sets and their concatenation (a
    # round with the same clients draws its batches from it again, without concatenating anew)
    pool: tuple[tuple[Split, ...], Split] | None = None


def workspace_for(model: FedModel, spec: MethodSpec, compile_model: bool = False) -> Workspace:
    """The workspace a method needs around ``model``: frozen copies only for the parts that read them,
    a module per copy of the program's besides the global one, the compiled forward when ``compile_model``."""
    parts = spec.all_parts()
    return Workspace(model=model, forward=forward_of(model, compile_model),
                     global_copy=copy.deepcopy(model) if any(p.needs_global_out for p in parts) else None,
                     previous=copy.deepcopy(model) if any(p.needs_prev_out for p in parts) else None,
                     copies={c.name: copy.deepcopy(model) for c in spec.personalization.copies if c.name != GLOBAL})


def state_to_cpu(model: torch.nn.Module) -> Tensors:
    """A copy of the model's state on the CPU, every tensor contiguous (a model held channels_last
    on its device still saves and averages as NCHW tensors)."""
    return {k: v.detach().to("cpu", copy=True, memory_format=torch.contiguous_format)
            for k, v in model.state_dict().items()}


def rule_of(s: LocalSettings) -> Rule:
    """The update rule of ``s`` (torch's defaults besides lr, SGD's momentum and the weight decay)."""
    return Rule(s.optimizer, s.lr, s.momentum if s.optimizer == "sgd" else 0.0, s.weight_decay)


def save_optimizer(optimizer: LocalOptimizer, names: list[str], state: Tensors, prefix: str,
                   client: int | None = None) -> None:
    """Replace the optimiser state kept under ``prefix`` in the client's state."""
    update.clear(state, prefix)
    state.update(optimizer.save(names, prefix, client))


def add_terms(loss: Tensor, parts: list[Part], term: Callable[[Part], Tensor | None],
              record: Callable[[Part, Tensor], None]) -> Tensor:
    """``loss`` plus each part's weighted term ``term(part)`` (one client's, or the clients' with
    a leading axis), each unweighted value handed to ``record``; a part without a term, or whose
    term is None this step, adds nothing (no autograd node either)."""
    for part in parts:
        if not part.has_term():  # a part acting only on the server or on the step
            continue
        value = term(part)
        if value is None:
            continue
        record(part, value)
        loss = loss + part.weight * value
    return loss


def finish_parts(rc: ClientRound, parts: list[Part]) -> dict[str, Tensors]:
    """The parts' :meth:`~fedlatent.methods.parts.Part.finish` after local training: the extras
    they upload, by part name; then the round's scratch is discarded."""
    extras = {}
    for part in parts:
        extra = part.finish(rc)
        if extra:
            extras[part.name] = extra
    rc.scratch.clear()
    return extras


def keep_models(rc: ClientRound, spec: MethodSpec, trained: Tensors, kept: dict[str, Tensors]) -> None:
    """What the client keeps of the round's models for its next round: the program's kept copies
    (``kept``, by copy: Ditto's personal model), and a copy of the trained model as MOON's previous
    local model."""
    for copy_ in spec.personalization.copies:
        if copy_.kept:
            rc.state.update({copy_.prefix + k: v for k, v in kept[copy_.name].items()})
    if any(p.needs_prev_out for p in spec.parts):
        rc.state.update({PREVIOUS + k: v.clone() for k, v in trained.items()})


def client_upload(rc: ClientRound, state: Tensors, s: LocalSettings, extras: dict[str, Tensors],
                  sums: dict[str, float], steps: int, seconds: float, flops: int | None = None,
                  trace: list[dict[str, float]] | None = None,
                  copies: tuple[ModelCopy, ...] = (ModelCopy(GLOBAL),)) -> Upload:
    """The client's reply: its trained ``state``, sample count and steps, the parts' extras and the
    round's metrics: the means over its ``steps`` of ``sums`` (``train_loss``, each other copy's task
    loss as ``<copy>_loss``: Ditto's ``personal_loss``, each part's unweighted term as
    ``term_<part>``), the parts' own metrics, the FLOPs when counted and the seconds of local training;
    ``copies``: the program's trained copies."""
    done = max(steps, 1)
    losses = [c.loss_key for c in copies]
    metrics = {"train_loss": sums["train_loss"] / done, "steps": rc.steps,
               **{f"term_{k}": v / done for k, v in sums.items() if k not in losses},
               **rc.metrics}
    for key in losses[1:]:
        if key in sums:
            metrics[key] = sums[key] / done
    if flops is not None:
        metrics["flops"] = flops
    metrics["train_seconds"] = seconds
    return Upload(rc.client_id, state, rc.num_samples, rc.steps, s.lr, s.momentum, extras, metrics, trace or [])
