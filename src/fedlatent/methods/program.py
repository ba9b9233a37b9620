"""Client programs: what a client does in its round besides the method's loss terms, and which model
it is evaluated on.

A program declares the model copies a client trains (:class:`ModelCopy`: the copy of the global
model it uploads, and copies of its own kept in its state across rounds, Ditto's and APFL's
personal models), the state entries it keeps to itself (the layers of FedRep, LG-FedAvg, FedPer,
FedBN), and implements only the hooks it needs: the weights a round starts from (:meth:`start`, with
the clients' training data: a round-start procedure), the round around the trainer (:meth:`round`:
FedRep's two phases), each local step (:meth:`step`: the declared copies each take a step, or any
number of inner steps on the batch), its round-scoped values (:meth:`begin` / :meth:`finish`: APFL's
α), the model a client is evaluated on (:meth:`evaluated`) and the one a client that never trained
is evaluated on (:meth:`adapted_new`, ``data.holdout_clients``: a personalising program states its
rule in :attr:`ClientProgram.new_client_rule`, else it has none and such a run is refused). The client trainer
(``federated.trainer``) runs every program the same way, iterating over the declared copies;
programs never own a loop and keep no per-client state on themselves.

Each program is registered by name (:func:`register_program`); a method preset chooses one as
``MethodSpec.personalization``.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from torch import Tensor

if TYPE_CHECKING:  # parts.py imports this module for MethodSpec's default program
    from fedlatent.methods.parts import ClientRound, MethodSpec, Part, Upload
    from fedlatent.models.base import FedModel

Tensors = dict[str, Tensor]
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
P = TypeVar("P", bound="ClientProgram")


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


PROGRAMS: dict[str, type[ClientProgram]] = {}


def register_program(name: str) -> Callable[[type[P]], type[P]]:
    """Register a program class under ``name`` (its :attr:`ClientProgram.kind`)."""
    def wrap(cls: type[P]) -> type[P]:
        cls.kind = name
        PROGRAMS[name] = cls
        return cls
    return wrap


@register_program("none")
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


@register_program("finetune")
class Finetune(ClientProgram):
    """Plain training; each client evaluated on the global model fine-tuned on its training split.

    ``epochs`` of fine-tuning of every parameter (``scope = "all"``, FedBABU; a head fixed during
    training included) or of the classifier alone on the fixed encoder (``"head"``, SphereFed's
    "Ours (SGD)", Appendix B)."""

    personalizes = True

    def __init__(self, epochs: int = 1, scope: str = "all") -> None:
        super().__init__()
        self.epochs, self.scope = epochs, scope

    new_client_rule = "the global model fine-tuned on its training split"

    def evaluated(self, parameters: list[str], client_state: Tensors, global_state: Tensors,
                  tune: Tune | None) -> Tensors:
        return tune(global_state, self.scope) if tune is not None else global_state

    def adapted_new(self, parameters: list[str], global_state: Tensors, tune: Tune) -> Tensors:
        return tune(global_state, self.scope)


def prefixed(state: Mapping[str, Tensor], prefix: str) -> Tensors:
    """The entries of ``state`` under ``prefix``, without it."""
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
