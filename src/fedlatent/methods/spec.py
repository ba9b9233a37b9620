"""The method's data types: what a method is (:class:`MethodSpec`: its :class:`Part` objects, its
:class:`ClientProgram`, head policy and :class:`Calibration`) and what its hooks read and return
(:class:`ModelCopy`, :class:`Step`, :class:`Tune`; the terms' contexts, a client's round and its
upload are in :mod:`fedlatent.methods.contexts`, below this module).

These types refer to one another (a spec holds parts and a program; their hooks take the spec), so
they live in one module that imports nothing else of ``methods/`` but those contexts: :mod:`fedlatent.methods.parts`
(the task loss, the parts' helpers) and :mod:`fedlatent.methods.program` (the program registry,
fine-tuning) import it and never each other, type-only imports included (``tests/test_layers.py``).
A ``Part`` declares what it needs (taps, the frozen global model's output, the previous local
model's output, the round's global weights) and implements only the hooks it uses; the client and
server in ``federated/`` call the hooks, so methods never own a loop. Parts and programs keep no
per-client state on themselves: state lives in flat ``dict[str, Tensor]`` stores the backend owns
and checkpoints.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from torch import Tensor

from fedlatent.calibration.registry import CalibrationKind, calibration_kind
from fedlatent.methods.contexts import (ClientRound, Combine, LockstepContext, Tensors, TermContext, Upload,
                                        WithClientAxis, one_client, vmap_loss)
from fedlatent.models.base import FedModel

__all__ = ["GLOBAL", "HEAD_INITS", "LOCAL", "PERSONAL", "Calibration", "ClientProgram", "ClientRound", "Combine",
           "HeadPolicy", "LockstepContext", "MethodSpec", "ModelCopy", "Objective", "Part", "Step", "Tensors",
           "TermContext", "Train", "Tune", "Upload", "WithClientAxis", "one_client", "vmap_loss"]

class Part:
    """One composable piece of a method; every hook is optional.

    ``weight`` scales the value returned by :meth:`loss`. ``needs_global_out`` /
    ``needs_prev_out`` make the client run the frozen global / previous local model on the
    batch (MOON, feature-drift constraints); ``taps`` names intermediate features to return;
    ``needs_global_params`` keeps a snapshot of the round's global weights (FedProx, SCAFFOLD).
    ``output_only`` declares that :meth:`loss` reads nothing but ``ctx.out``, ``ctx.y``,
    ``ctx.global_out`` and ``ctx.num_classes`` and has no side effects, so that the vectorized
    backend can evaluate it for many clients at once with ``torch.vmap``. ``term_reads_batch``
    False declares that the term reads the weights alone, never the batch (FedProx, FedDyn), so
    that the vectorized backend may pad a client's shorter batch to share a step with the others.
    ``coefficients`` names the attributes besides ``weight`` that only scale the term (FedProx's μ)
    or what ``begin`` derives per client (FedDyn's α): runs that differ in them alone share a
    lockstep call, the term then reading a (clients,) tensor of them (:mod:`fedlatent.methods.coefficients`).
    """

    name: str = "part"
    weight: float | Tensor = 1.0  # a number; a (clients,) tensor in a stack whose runs differ in it
    coefficients: tuple[str, ...] = ()
    taps: frozenset[str] = frozenset()
    needs_global_out: bool = False
    needs_prev_out: bool = False
    needs_global_params: bool = False
    owns_aggregation: bool = False
    output_only: bool = False
    term_reads_batch: bool = True

    def configure(self, spec: "MethodSpec") -> None:
        """Adjust the method's head, task loss or calibration (SphereFed's part does); called once
        when the method is resolved."""

    def check_model(self, model: FedModel) -> None:
        """Refuse a key ``model`` cannot satisfy (a ConfigError naming it: a constraint's depth
        beyond the model's features, a width beyond z's) and resolve what the keys derive from the
        model (the features a depth names). The run calls it on the model's shape before any run
        folder exists (:func:`fedlatent.methods.registry.check_model`), so that such a key is the
        user's error, never a client's failure in round 1."""

    # client side -------------------------------------------------------------------------------
    def begin(self, rc: ClientRound) -> None:
        """Before local training (read state/payload, keep round-scoped data in
        ``rc.scratch[self.name]``, set ``rc.extra_weight_decay``; a part may
        still set its ``taps`` here from ``rc.model.tap_names``: the client reads them afterwards)."""

    # A part writes its loss term once: as :meth:`loss` (one client's batch) or as
    # :meth:`lockstep_loss` (a leading client axis), never both; each form is derived from the other.
    def loss(self, ctx: TermContext) -> Tensor | None:
        """This part's loss term for one client's batch (unweighted), or None. By default the
        part's :meth:`lockstep_loss` over that one client (:func:`one_client`)."""
        if type(self).lockstep_loss is Part.lockstep_loss:
            return None
        value = self.lockstep_loss(one_client(ctx))
        return None if value is None else value[0]

    def lockstep_loss(self, ctx: LockstepContext) -> Tensor | None:
        """:meth:`loss` for a group of clients trained at once (the vectorized backend): the
        (clients,) unweighted terms, or None where :meth:`loss` would give None for all of them. By
        default :meth:`loss` under ``torch.vmap`` for an ``output_only`` part; a part with state or
        weights in its term (or an operation without a ``vmap`` rule) writes this form instead of
        :meth:`loss`."""
        if not self.output_only:
            raise NotImplementedError(f"part '{self.name}' has no lockstep form")
        return vmap_loss(self.loss, ctx)

    def has_term(self) -> bool:
        """Whether the part adds a loss term (a part may act only on the server or the step)."""
        return type(self).loss is not Part.loss or type(self).lockstep_loss is not Part.lockstep_loss

    def has_lockstep_form(self) -> bool:
        return self.output_only or type(self).lockstep_loss is not Part.lockstep_loss

    def lockstep_drift(self, rcs: list[ClientRound], trainable: list[str]) -> Tensors | None:
        """The part's move of the clients' weights after every optimiser step, p −= lr·d: d per
        trainable weight with a leading client axis (SCAFFOLD's c − c_i, from what :meth:`begin`
        kept in each client's scratch), or None. :meth:`finish` is then called per client with
        ``rc.model`` holding that client's trained weights."""
        return None

    def finish(self, rc: ClientRound) -> Tensors | None:
        """After local training: update ``rc.state`` and return extras to upload, or None."""
        return None

    # server side -------------------------------------------------------------------------------
    def payload(self, server_state: Tensors) -> Tensors:
        """What the server sends every client for this part (e.g. SCAFFOLD's c)."""
        return {}

    def aggregate(self, global_state: Tensors, uploads: list[Upload], server_state: Tensors,
                  trainable: set[str], num_clients: int, combine: Combine | None = None) -> Tensors:
        """Replace the weighted mean (only for a part with ``owns_aggregation``), taking its sums
        of the uploads' states through ``combine`` (the run's update codec; None: the plain mean)."""
        raise NotImplementedError

    def server_update(self, uploads: list[Upload], server_state: Tensors, num_clients: int) -> None:
        """Update this part's entries of ``server_state`` from the uploads' extras."""

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "weight": self.weight}


GLOBAL = "global"  # the copy of the global model a client trains and uploads
# the client-state prefixes of what a client keeps (the trainer keeps each kept copy's weights
# under "<name>.", its optimiser state under "<name>_optim.", its fp16 loss scale under "<name>_amp.")
PERSONAL = "personal."  # Ditto's and APFL's personal model
LOCAL = "local."        # the layers a client keeps to itself (partial personalisation)


@dataclass(frozen=True)
class ModelCopy:
    """A copy of the model a client trains in its round.

    ``global`` starts from the round's start weights and is uploaded; it takes the method's parts
    (their terms, SCAFFOLD's drift, FedDyn's decay); ``kept``, its trained weights also stay in the
    client's state (FedALA's local model, which the next round's start reads). Any other copy is the
    client's own: ``kept`` in its state across rounds (starting from the round's start weights until
    it has one), trained on the program's own parts, pulled towards the round's start weights by
    (``pull``/2)‖v − w̄‖² (Ditto). ``stacked``: the copy trains on the vectorized backend's client
    axis beside the others (a copy that cannot is trained one client at a time: that backend
    refuses it)."""

    name: str
    kept: bool = False
    pull: float = 0.0
    stacked: bool = True

    @property
    def prefix(self) -> str:
        return f"{self.name}."

    @property
    def optim_prefix(self) -> str:
        """Where its optimiser state is kept (the global copy's under ``optim.``, as always)."""
        return "optim." if self.name == GLOBAL else f"{self.name}_optim."

    @property
    def amp_prefix(self) -> str:
        return "amp." if self.name == GLOBAL else f"{self.name}_amp."

    @property
    def loss_key(self) -> str:
        """Its task loss in the client's metrics (``train_loss`` for the global copy)."""
        return "train_loss" if self.name == GLOBAL else f"{self.name}_loss"


Objective = Callable[[Mapping[str, Tensor]], Tensor]


class Step(Protocol):
    """One local step of a group of clients as a program sees it (``federated.trainer`` implements
    it). ``data``: what the program's :meth:`ClientProgram.begin` returned; ``lr``: the round's rate."""

    data: Any
    lr: float

    def objective(self, copy: str, weights: Callable[[Mapping[str, Tensor]], Mapping[str, Tensor]] | None = None,
                  recorded: bool = True) -> Objective:
        """The copy's loss on the step's batch: its task loss plus its parts' terms, recorded in the
        clients' metrics (``recorded`` False: an inner computation's, left out of them); ``weights``:
        run the model on ``weights(params)`` instead of the copy's own (APFL's mixture, Per-FedAvg's
        adapted weights, pFedMe's personal model), by a functional forward."""
        ...

    def part(self, index: int, parts: int) -> Step:
        """The step on part ``index`` of ``parts`` consecutive parts of each client's batch (Per-FedAvg's
        batches D, D', D''): the rows ⌊index·n/parts⌋ … ⌊(index + 1)·n/parts⌋ − 1 of a batch of n
        rows; a batch of fewer than 2·``parts`` rows (a part of one sample: BatchNorm cannot train on
        it) is each of its parts whole."""
        ...

    def train(self, copy: str, objective: Objective | None = None, extras: Sequence[Tensor] = (),
              again: bool | None = None) -> list[Tensor | None]:
        """One optimiser step of the copy on ``objective`` (its :meth:`objective` by default), through
        the run's update rule; returns the gradients of ``extras`` (tensors the objective reads that
        the program updates itself: APFL's α), None where the step was skipped (fp16). May be called
        several times a step (inner steps on the batch); ``again``: a buffer is needed again."""
        ...

    def weights(self, copy: str) -> dict[str, Tensor]:
        """The group's current weights of ``copy`` (detached, a leading client axis)."""
        ...

    def rows(self, values: Tensor) -> Tensor:
        """The group's rows of a (clients, …) tensor of the round (a view where the group is a run of rows)."""
        ...

    def put(self, values: Tensor, rows: Tensor) -> None:
        """Write the group's ``rows`` into ``values`` (a (clients, …) tensor of the round)."""
        ...


Train = Callable[[list[Tensors], "MethodSpec", list["ClientRound"], Any], list["Upload"]]


class Tune(Protocol):
    """Weights trained on the client's training split at evaluation (``federated.personal``):
    fine-tuning's, an adaptation step's, a new client's."""

    def __call__(self, start: Tensors, scope: str | Collection[str], pull: float = 0.0, steps: int = 0,
                 lr: float = 0.0, plain: bool = False, statistics: bool = False) -> Tensors:
        """``start`` trained with the parameters of ``scope`` — ``"all"``, ``"head"`` or the names of
        those to train — with (``pull``/2)‖v − start‖² added to the loss (Ditto's personal objective),
        for the program's epochs or ``steps`` steps when > 0, at the rate ``lr`` when > 0 (else the
        run's last), by the run's update rule or, ``plain``, by plain gradient steps (no momentum, no
        weight decay); ``statistics``: then every BatchNorm layer's running statistics estimated anew
        as their average over the split."""
        ...


class ClientProgram:
    """Plain local training of the global copy, evaluated on the global model (the base program).

    FedAvg's and every method's without personalisation; a program overrides the hooks it needs."""

    kind: ClassVar[str] = "none"
    copies: tuple[ModelCopy, ...] = (ModelCopy(GLOBAL),)
    parts: list[Part]                # the loss terms of the program's own copies (Ditto's constraints)
    personalizes: ClassVar[bool] = False  # each client is evaluated on a model of its own
    # its step takes gradients of its own (inner steps) outside fp16's loss scaling: refused under fp16
    inner_gradients: ClassVar[bool] = False
    stacks_runs: ClassVar[bool] = True    # clients of several runs may train in one stack
    # its paper's step of the global copy is plain SGD (no momentum, no weight decay), which the run's
    # update rule must then be: refused otherwise (experiment.runner.validation.check_plain_update)
    plain_update: ClassVar[bool] = False
    # the attributes stacked runs may differ in (methods.coefficients; its copies' pulls are too)
    coefficients: ClassVar[tuple[str, ...]] = ()
    epochs: int = 1                  # local epochs of an evaluation-time training (fine-tuning's, a new client's)
    # how a client that never trained is evaluated (data.holdout_clients; :meth:`adapted_new`), in a
    # few words; None: the program has no rule (a run holding clients out is refused)
    new_client_rule: ClassVar[str | None] = "the global model"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A program that personalises has a new-client rule only where its own class states one
        (``new_client_rule`` beside its :meth:`adapted_new`): a rule inherited from a program that
        evaluates its clients otherwise would misreport it."""
        super().__init_subclass__(**kwargs)
        if cls.personalizes and "new_client_rule" not in cls.__dict__:
            cls.new_client_rule = None

    def __init__(self) -> None:
        self.parts = []

    @property
    def passes(self) -> float:
        """Forward and backward passes over a step's batch, in units of one pass of every sample
        (what its FLOPs are counted as): one per declared copy by default."""
        return float(len(self.copies))

    def local_keys(self, parameters: list[str], keys: list[str]) -> list[str]:
        """The state entries each client keeps to itself, never averaged (``parameters`` and
        ``keys``: the model's parameter and state names, in its order)."""
        return []

    def start(self, model: FedModel, starts: list[Tensors], spec: MethodSpec, rcs: list[ClientRound],
              datas: Sequence[Any], s: Any) -> list[Tensors]:
        """The weights each client of ``rcs`` starts its round from (``starts``: the round's global
        weights, one object for clients of one run); a round-start procedure may read the clients'
        training ``datas`` with the round's local settings ``s`` (batch size, device) and the
        method's task loss (draws seeded from ``rc.seed``)."""
        return starts

    def round(self, model: FedModel, starts: list[Tensors], spec: MethodSpec, rcs: list[ClientRound],
              s: Any, train: Train) -> list[Upload]:
        """The round around the trainer ``train(starts, spec, rcs, settings)``: one call by default."""
        return train(starts, spec, rcs, s)

    def begin(self, rcs: list[ClientRound], device: Any) -> Any:
        """The program's round-scoped values for the clients of ``rcs`` (in the trainer's order),
        read from their states; handed to :meth:`step` as ``Step.data`` and back to :meth:`finish`."""
        return None

    def step(self, st: Step) -> None:
        """One local step: each declared copy takes one step on its objective."""
        for copy in self.copies:
            st.train(copy.name)

    def finish(self, rc: ClientRound, row: int, data: Any) -> None:
        """After the round: keep client ``row``'s values of ``data`` in ``rc.state`` (and its metrics)."""

    def evaluated(self, parameters: list[str], client_state: Tensors, global_state: Tensors,
                  tune: Tune | None) -> Tensors:
        """The weights client ``client_state`` is evaluated with; ``tune`` fine-tunes weights on its
        training split (None where the evaluation does not train)."""
        return global_state

    def adapted_new(self, parameters: list[str], global_state: Tensors, tune: Tune) -> Tensors:
        """The weights a client that never trained (``data.holdout_clients``) is evaluated with, by the
        program's :attr:`new_client_rule`: from the global weights, ``tune`` trains on the new client's
        training split. The global model by default."""
        return global_state


HEAD_INITS = ("default", "orthogonal", "tammes")


@dataclass
class HeadPolicy:
    """The classifier: learned, or fixed at init (random, orthonormal or Tammes-spread rows, no
    bias); ``normalize_z`` L2-normalises features before it (SphereFed's switches, separable)."""

    fixed: bool = False
    init: str = "default"  # one of HEAD_INITS (orthogonal: SphereFed / Freeze option; tammes: SphereFed App. D)
    init_steps: int = 10_000  # tammes: SGD steps
    bias: bool = True
    normalize_z: bool = False


@dataclass
class Calibration:
    """After-training classifier calibration: ``ffc`` (SphereFed), ``ccvr`` or ``centralized`` (the
    head retrained on all clients' pooled real features: SphereFed's oracle baseline)."""

    kind: str = "none"  # none | ffc | ccvr | centralized
    ridge: float = 0.0
    every: int = 0  # FFC every R rounds (0 = only after training)
    personal: bool = False
    virtual_per_class: int = 100
    epochs: int = 5
    lr: float = 0.01
    loss: str = "ce"  # ccvr / centralized: the head's retraining loss, ce | mse

    @property
    def declared(self) -> CalibrationKind:
        """What ``kind`` declares (:mod:`fedlatent.calibration.registry`): its statistics, whether it
        runs periodically or per client."""
        return calibration_kind(self.kind)


@dataclass
class MethodSpec:
    """A resolved method: everything the client and server need to run it."""

    name: str
    loss: str = "ce"  # ce | mse
    temperature: float = 1.0  # cross-entropy of logits / temperature
    server_optimizer: str = "sgd"  # the preset's choice when [server] optimizer = "auto"
    parts: list[Part] = field(default_factory=list)
    head: HeadPolicy = field(default_factory=HeadPolicy)
    personalization: ClientProgram = field(default_factory=ClientProgram)  # the client's program
    calibration: Calibration = field(default_factory=Calibration)
    trace: bool = False  # record each local step's task loss and unweighted terms in Upload.trace
    count_flops: bool = False  # count the local training's FLOPs in Upload.metrics["flops"]

    @property
    def aggregator(self) -> Part | None:
        owners = [p for p in self.parts if p.owns_aggregation]
        return owners[0] if owners else None

    def all_parts(self) -> list[Part]:
        return self.parts + self.personalization.parts

    @property
    def personalizes(self) -> bool:
        """Whether each client is evaluated on a model of its own (personal, partly its own, fine-tuned,
        or with its own FFC head: ``federated.personal.client_model``), not on the global one."""
        return self.personalization.personalizes or (self.calibration.declared.personal and self.calibration.personal)
