"""Device placement: every tensor a training step combines lives on the weights' device.

PyTorch's ``meta`` device stands in for a GPU on a CPU machine: it computes shapes, not values,
refuses to combine its tensors with CPU tensors (a 0-d CPU tensor aside, which CUDA also takes as
a number) and refuses host reads (``.item()``, ``.tolist()``, ``bool()``), so a tensor a step
creates on the CPU fails here, not on a lent GPU."""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import fedlatent
from fedlatent.backends import simulation
from fedlatent.backends.stacked import Cohort
from fedlatent.data.federation import build_federation
from fedlatent.experiment.runner.validation import sample_private_refusal
from fedlatent.federated.trainer import entry as lockstep  # the trainer's steps, patched by name there
from fedlatent.federated.trainer import lockstep_update
from fedlatent.federated.round import plan_round
from fedlatent.federated.failures import ClientFailure
from fedlatent.losses import update
from fedlatent.losses.update import Links, Rule
from fedlatent.methods import PRESETS, ditto, resolve

META = torch.device("meta")


@pytest.mark.parametrize("kind", ["adam", "adamw"])
@pytest.mark.parametrize("kept", [False, True])
def test_a_stacks_adam_counts_live_on_the_weights_device(kind: str, kept: bool) -> None:
    """Stacked Adam/AdamW (a per-row step count, FedDyn's per-row decay), fresh or restored from
    kept states, steps a group of rows picked by a device index: the counts are made on the
    weights' device (the code before made them on the CPU: a GPU step failed on mixed devices)."""
    params = [torch.zeros(3, 4, 2, device=META), torch.zeros(3, 5, device=META)]
    names = ["w", "b"]
    saved = [{"w.exp_avg": torch.ones(4, 2), "w.exp_avg_sq": torch.ones(4, 2), "b.exp_avg": torch.ones(5),
              "b.exp_avg_sq": torch.ones(5), "step": torch.tensor(2.0, dtype=torch.float64)}] * 3 if kept \
        else [{}] * 3
    opt = update.restore(Rule(kind, lr=0.1, weight_decay=0.01), params, names, saved, stacked=True,
                         links=Links(extra_decay=torch.full((3,), 0.1, device=META)))
    rows = torch.tensor([0, 2], device=META)
    picked = [p.index_select(0, rows) for p in params]
    opt.step(picked, [torch.ones_like(p) for p in picked], rows=rows)
    views = [p[1:3] for p in params]
    opt.step(views, [torch.ones_like(p) for p in views], rows=slice(1, 3))
    assert all(v.device == META for vs in opt.slots.values() for v in vs)
    assert isinstance(opt.steps, torch.Tensor) and opt.steps.device == META


# --- a round of every preset on the meta device ------------------------------------------------------

ATEN = torch.ops.aten
TRANSFERS = (ATEN._to_copy.default, ATEN.copy_.default)  # a tensor sent between devices: explicit


def _tensors(tree: object) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


class MetaStandIn(TorchDispatchMode):
    """The rules of a GPU on the ``meta`` device. Outside a training step, a read of a meta tensor
    on the host (``.item()``, ``.tolist()``, ``bool()``, a copy to the CPU: what a round does once at
    its end, and evaluation) yields zeros, so that the round can go on. Inside a step (``strict``),
    such a read fails, and so does an operation that combines a meta tensor with a CPU tensor of
    one or more dimensions — the index of an ``index_select``, ``index_add_`` or ``x[rows]``, which
    the meta device itself lets through but CUDA refuses or copies with a wait; a 0-d CPU tensor is
    a number to CUDA too. ``reads``: the host reads tolerated, by operation."""

    def __init__(self) -> None:
        super().__init__()
        self.strict = False
        self.reads: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        tensors = _tensors((args, kwargs))
        on_meta = [t for t in tensors if t.device == META]
        read = on_meta and (func is ATEN._local_scalar_dense.default
                            or (func is ATEN._to_copy.default and torch.device(kwargs.get("device") or META) != META)
                            or (func is ATEN.copy_.default and args[0].device != META))
        if self.strict:
            if read:
                raise AssertionError(f"a training step reads a device tensor on the host ({func})")
            if on_meta and func not in TRANSFERS:
                host = [tuple(t.shape) for t in tensors if t.device.type == "cpu" and t.dim() > 0]
                if host:
                    raise AssertionError(f"a training step combines device tensors with host tensors {host} ({func})")
            return func(*args, **kwargs)
        if read:
            self.reads[str(func)] = self.reads.get(str(func), 0) + 1
            source = args[0] if func is not ATEN.copy_.default else args[1]
            if func is ATEN._local_scalar_dense.default:
                return False if source.dtype == torch.bool else 0.0 if source.dtype.is_floating_point else 0
            if func is ATEN.copy_.default:
                return args[0].zero_()
            return torch.zeros(source.shape, dtype=kwargs.get("dtype") or source.dtype)
        return func(*args, **kwargs)


def test_the_stand_in_refuses_in_a_step_what_a_gpu_would_and_reads_zeros_elsewhere() -> None:
    """Strict: a host read, a CPU index into a meta tensor and a CPU tensor in an index_add_ fail;
    a 0-d CPU tensor and a copy to the device pass. Tolerant: the reads give zeros, counted."""
    stand_in, x = MetaStandIn(), torch.zeros(4, 3, device=META)
    with stand_in:
        stand_in.strict = True
        for bad in (lambda: x.sum().item(), lambda: x.tolist(), lambda: x.index_select(0, torch.tensor([0, 2])),
                    lambda: x.new_zeros(4).index_add_(0, torch.tensor([1]).to(META), torch.ones(1))):
            with pytest.raises(AssertionError):
                bad()
        assert (x * torch.tensor(2.0) + torch.ones(3).to(META)).shape == (4, 3)
        stand_in.strict = False
        assert x.sum().item() == 0.0 and x.tolist() == [[0.0] * 3] * 4
    assert stand_in.reads


# The points of a step that read the host by design, each every so many steps (not every step):
# MMD-D's deep kernels' training, whose test-power statistics its loop reads (``kernel_every``),
# run under the tolerant rules; MK-MMD's kernel weights β (``beta_every``), a quadratic program
# solved on the host from estimates the meta device cannot compute, left out (β keeps its start;
# tests/losses/test_mmd.py checks the solve)
HOST_POINTS = ((ditto.MmdD, "train_kernels"),)
LEFT_OUT = ((ditto.MkMmd, "refresh"),)


def _strict(stand_in: MetaStandIn, fn: Callable[..., Any], strict: bool) -> Callable[..., Any]:
    """``fn`` run with the stand-in's rules strict (or tolerant), as they were afterwards."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        before, stand_in.strict = stand_in.strict, strict
        try:
            return fn(*args, **kwargs)
        finally:
            stand_in.strict = before
    return run


@contextmanager
def steps_on_meta(monkeypatch: pytest.MonkeyPatch) -> Iterator[MetaStandIn]:
    """The lockstep trainer's step loop (``take_steps``: every step of every client and backend)
    under :class:`MetaStandIn`'s strict rules but for :data:`HOST_POINTS`, the rest of the round
    under its tolerant ones, in whichever thread trains (the stacked backend trains in its runs'
    threads); the stand-in."""
    stand_in = MetaStandIn()
    train_together = lockstep._train_together
    for owner, name in HOST_POINTS:
        monkeypatch.setattr(owner, name, _strict(stand_in, getattr(owner, name), False))
    for owner, name in LEFT_OUT:
        monkeypatch.setattr(owner, name, lambda *args, **kwargs: None)

    def tolerant_round(*args: object, **kwargs: object) -> object:
        with stand_in:
            return train_together(*args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(lockstep, "take_steps", _strict(stand_in, lockstep.take_steps, True))
    monkeypatch.setattr(lockstep, "_train_together", tolerant_round)
    yield stand_in


def _tiny(name: str, seed: int = 4, extra: tuple[str, ...] = ()) -> Any:
    """One round of preset ``name`` on digits: 3 clients of unequal size, 2 local steps of 8
    samples (``extra``: more overrides), the meta device."""
    config = fedlatent.load_config(None, [
        f"seed={seed}", 'data.dataset="digits"', 'data.partition="dirichlet"', "data.alpha=0.5",
        "data.num_clients=3", 'model.arch="mlp"', "model.hidden=[16]", "train.rounds=1",
        "train.local_steps=2", "train.batch_size=8", "train.lr=0.05", "train.momentum=0.9",
        "train.weight_decay=0.001", "train.precision=fp32", *extra])
    config.algorithm = {"name": name, **PRESET_KEYS.get(name, {})}
    config.train = dataclasses.replace(config.train, device="meta")
    return config


# a preset's keys shrunk to a short round (its refreshes and kernels within two steps; FedRep's
# head phase, which counts epochs, to one)
PRESET_KEYS = {"fedrep": {"head_epochs": 1}, "ditto_mkmmd": {"beta_every": 1, "beta_batches": 2},
               "ditto_mmdd": {"kernel_every": 1, "kernel_batches": 2, "train_steps": 1}}


def _setup(config: Any, trainer: Any) -> simulation.Setup:
    fed = build_federation(config.data, config.data_seed)
    return simulation.setup(config, fed, resolve(config.algorithm, config.terms), trainer)


def _uploads_of(s: simulation.Setup) -> list[Any]:
    """The first round's client half on ``s`` (every selected client's outcome)."""
    outcomes, _ = s.train(plan_round(s.server, s.config, 0, s.train_sizes))
    return outcomes


def _assert_trained(outcomes: list[Any]) -> None:
    failures = [o for o in outcomes if isinstance(o, ClientFailure)]
    assert not failures, failures[0].detail
    assert outcomes


@pytest.mark.parametrize("backend", ["simulation", "vectorized"])
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_presets_round_trains_on_the_meta_device(name: str, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every preset's first round on the meta device: the model, the clients' batches (planned and
    gathered there), the stacks, the update rule's state, the recorded losses and terms all live
    on the device; no step combines a device tensor with a host one or reads one on the host.
    The run's set-up and the round's end (the uploads, the server's aggregation) run under the
    stand-in's tolerant rules, which read zeros; their values are not checked (meta has none)."""
    trainer = simulation.train_in_turn if backend == "simulation" else lockstep_update
    with steps_on_meta(monkeypatch) as stand_in, stand_in:
        s = _setup(_tiny(name), trainer)
        outcomes = _uploads_of(s)
    _assert_trained(outcomes)
    assert stand_in.reads  # the round's results came off the device, outside the steps


@pytest.mark.parametrize("name", sorted(n for n in PRESETS if resolve({"name": n}).personalization.stacks_runs))
def test_every_presets_stacked_round_trains_on_the_meta_device(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs of each preset (two seeds) stacked into one lockstep call, on the meta device, as
    :func:`test_every_presets_round_trains_on_the_meta_device` has it (every preset whose client
    program trains across runs: the partial programs, FedRep's, LG-FedAvg's, FedPer's and FedBN's,
    train in phases around the trainer and are not stacked)."""
    _stacked_round_on_meta([_tiny(name, seed) for seed in (4, 5)], monkeypatch)


def _stacked_round_on_meta(configs: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    cohort = Cohort(len(configs))
    results: list[Any] = [None] * len(configs)
    with steps_on_meta(monkeypatch) as stand_in:
        def member(i: int) -> Callable[[], None]:
            def go() -> None:
                with stand_in:
                    results[i] = _uploads_of(_setup(configs[i], cohort.trainer))
            return go
        done = cohort.play([member(i) for i in range(len(configs))])
    assert not any(isinstance(r, BaseException) for r in done), done
    for outcomes in results:
        _assert_trained(outcomes)


# the local settings a preset's round crosses with: Adam and AdamW (a per-row step count; AdamW's
# state kept), sample-level DP-SGD (per-sample gradients, the noise), the step trace, crop + flip
# and AutoAugment (planned batches), SGD's momentum kept
SETTINGS = {
    "adam": ("train.optimizer=adam", "train.lr=0.003"),
    "adamw-kept": ("train.optimizer=adamw", "train.lr=0.003", "train.optimizer_state=kept"),
    "dp-sgd": ("privacy.sample_clip_norm=1.0",),  # clipped, no noise: shuffled batches
    "poisson-dp-sgd": ("privacy.sample_clip_norm=1.0", "privacy.sample_noise_multiplier=1.0", "privacy.delta=1e-5",
                       'privacy.batch_sampling="poisson"'),
    "trace": ("diagnostics.trace_terms=true",),
    "autoaugment": ("data.augment=true", 'data.autoaugment="cifar10"'),
    "momentum-kept": ("train.optimizer_state=kept",),
}
METHODS = ("fedavg", "moon", "feduv", "fedproto", "scaffold", "feddyn", "ditto", "fedrep")


@pytest.mark.parametrize("name, setting", [
    pytest.param(name, setting, marks=() if name == "fedavg" else pytest.mark.slow)  # FedAvg's in the quick suite
    for name in METHODS for setting in sorted(SETTINGS)])
def test_a_round_with_each_local_setting_trains_on_the_meta_device(name: str, setting: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A few presets' rounds on the vectorized backend with each local setting (:data:`SETTINGS`),
    on the meta device, as :func:`test_every_presets_round_trains_on_the_meta_device` has it; two
    rounds where a state is kept (the second restores it on the device). FedAvg's in the quick
    suite, the other presets' in the slow one."""
    config = _tiny(name, extra=SETTINGS[setting])
    reason = sample_private_refusal(config, resolve(config.algorithm, config.terms)) if "dp-sgd" in setting else None
    if reason:
        pytest.skip(reason)
    with steps_on_meta(monkeypatch) as stand_in, stand_in:
        s = _setup(config, lockstep_update)
        for rnd in range(2 if "kept" in setting else 1):
            outcomes, states = s.train(plan_round(s.server, s.config, rnd, s.train_sizes))
            _assert_trained(outcomes)
            for cid, state in states.items():
                s.client_states[cid] = state
