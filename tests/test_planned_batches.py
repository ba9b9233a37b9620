"""The lockstep trainer's planned batches (a round's draws made at its start, the pool on the
training device, crop + flip and AutoAugment applied to a whole stack at once) against the
streamed ones (each client's batches drawn and augmented as it takes them), and the device layout
(channels_last) against the default."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import fedlatent
from fedlatent.backends import simulation
from fedlatent.data import augment
from fedlatent.data.augment import Augmentation
from fedlatent.data.compact import Images
from fedlatent.data.federation import build_federation
from fedlatent.data.types import Split
from fedlatent.federated import devices
from fedlatent.federated.client import LocalSettings, Workspace
from fedlatent.federated.trainer.schedule import planned_steps
from fedlatent.federated.trainer import lockstep_update
from fedlatent.federated.trainer.batches import Batches as _Batches, step_groups as _step_groups
from fedlatent.methods import resolve

from tests.test_vectorized import _rounds, image_clients_config

MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
AUGMENTATIONS = {"crop_flip": Augmentation(crop_flip=True),
                 "crop_flip_autoaugment": Augmentation(crop_flip=True, policy="cifar10",
                                                       mean=np.array(MEAN, dtype=np.float32).reshape(3, 1, 1),
                                                       std=np.array(STD, dtype=np.float32).reshape(3, 1, 1))}
SCHEDULES = {"epochs": {"epochs": 2}, "steps": {"epochs": 1, "steps": 7}}


def _clients(sizes: list[int], compact: bool) -> list[Split]:
    """Random 3×8×8 images: uint8 held compactly, or floats."""
    gen = torch.Generator().manual_seed(0)
    datas = []
    for n in sizes:
        raw = torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=gen)
        x = Images(raw, MEAN, STD) if compact else raw.float() / 255 - 0.5
        datas.append(Split(x, torch.randint(0, 10, (n,), generator=gen)))
    return datas


def _steps(draws: _Batches, sizes: list[int], s: LocalSettings, pad: bool) -> list[tuple[list[int], tuple]]:
    """Every step's groups and their (x, y), as the trainer takes them (``_train_together``)."""
    total = [planned_steps(n, s) for n in sizes]
    steps = [0] * len(sizes)
    active = [c for c in range(len(sizes)) if total[c]]
    out = []
    while active:
        taken = draws.take(active)
        for c in active:
            steps[c] += 1
        batch_sizes = {c: draws.size(taken[c]) for c in active}
        for members in _step_groups(active, batch_sizes, pad):
            out.append((members, draws.stacked(taken, members, max(batch_sizes[c] for c in members))))
        active = [c for c in active if steps[c] < total[c]]
    return out


def _both(monkeypatch, sizes: list[int], s: LocalSettings, compact: bool, pad: bool):
    """The steps of the planned and of the streamed batches for the same seeds, and the clients'
    generators after each."""
    datas = _clients(sizes, compact)
    runs = []
    for planned in (True, False):
        with monkeypatch.context() as patch:
            if not planned:
                patch.setattr(augment, "pooled", lambda _: False)
            generators = [torch.Generator().manual_seed(7 + c) for c in range(len(sizes))]
            draws = _Batches(Workspace(model=None), datas, sizes, s, generators)
            assert hasattr(draws, "pool") == planned
            runs.append((_steps(draws, sizes, s, pad), generators))
    return runs


@pytest.mark.parametrize("aug", sorted(AUGMENTATIONS))
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("sizes", [[5, 11, 11, 1, 8], [11]])
def test_planned_batches_equal_streamed(monkeypatch, aug: str, schedule: str, drop_last: bool, pad: bool,
                                        compact: bool, sizes: list[int]) -> None:
    """Bitwise the same (x, y) at every step, for a stack (short last batches, padded or grouped by
    size) and for one client, for epochs and for a step budget; and each client's generator has
    drawn exactly as much."""
    s = LocalSettings(batch_size=4, lr=0.1, momentum=0.0, weight_decay=0.0, drop_last=drop_last,
                      augment=AUGMENTATIONS[aug], num_classes=10, **SCHEDULES[schedule])
    (planned, planned_gens), (streamed, streamed_gens) = _both(monkeypatch, sizes, s, compact, pad)
    assert len(planned) == len(streamed) > 0
    for (members, (x, y)), (ref_members, (ref_x, ref_y)) in zip(planned, streamed):
        assert members == ref_members
        assert torch.equal(x, ref_x) and torch.equal(y, ref_y)
    for g, ref in zip(planned_gens, streamed_gens):
        assert torch.equal(g.get_state(), ref.get_state())


def test_a_changed_crop_or_flip_changes_the_batch() -> None:
    """The comparison above sees one image's crop or flip: the plan's draws are what is applied."""
    sizes = [6, 6]
    s = LocalSettings(epochs=1, batch_size=6, lr=0.1, momentum=0.0, weight_decay=0.0, drop_last=False,
                      augment=Augmentation(crop_flip=True), num_classes=10)
    datas = _clients(sizes, compact=True)

    def first_batch(change=None):
        draws = _Batches(Workspace(model=None), datas, sizes, s, [torch.Generator().manual_seed(c) for c in range(2)])
        if change is not None:
            change(draws.drawn)
        taken = draws.take([0, 1])
        return draws.stacked(taken, [0, 1], 6)[0]

    reference = first_batch()
    for change in (lambda d: d["flip"].__setitem__(7, ~d["flip"][7]),
                   lambda d: d["top"].__setitem__(7, (d["top"][7] + 1) % 9),
                   lambda d: d["left"].__setitem__(7, (d["left"][7] + 1) % 9)):
        changed = first_batch(change)
        assert torch.equal(changed[0], reference[0]) and not torch.equal(changed[1, 1], reference[1, 1])


def test_planned_pool_holds_images_compactly_and_is_kept_for_the_same_clients() -> None:
    """The pool of a stack keeps the images as uint8 (standardised when a batch is gathered), and a
    round of the same clients reuses it."""
    sizes = [5, 7]
    datas = _clients(sizes, compact=True)
    s = LocalSettings(epochs=1, batch_size=4, lr=0.1, momentum=0.0, weight_decay=0.0, drop_last=False,
                      augment=Augmentation(crop_flip=True), num_classes=10)
    ws = Workspace(model=None)
    draws = _Batches(ws, datas, sizes, s, [torch.Generator() for _ in sizes])
    assert isinstance(draws.pool.x, Images) and draws.pool.x.data.dtype == torch.uint8
    assert _Batches(ws, list(datas), sizes, s, [torch.Generator() for _ in sizes]).pool is draws.pool


def _image_run(tmp_path, overrides: list[str], trainer, monkeypatch=None, streamed: bool = False):
    """Rounds of the small CNN on 3 clients of random uint8 CIFAR-shaped images (held compactly)
    with crop + flip; ``streamed``: the batches drawn client by client instead of planned."""
    config = image_clients_config(tmp_path, [20, 13, 17], overrides)  # unequal: short batches, clients leaving early
    fed = build_federation(config.data, config.data_seed)
    gen = torch.Generator().manual_seed(1)
    for client in fed.clients:
        raw = torch.randint(0, 256, (len(client.train), 3, 32, 32), dtype=torch.uint8, generator=gen)
        client.train = Split(Images(raw, MEAN, STD), client.train.y)
    fed = dataclasses.replace(fed, augment=Augmentation(crop_flip=True))
    if streamed:
        monkeypatch.setattr(augment, "pooled", lambda _: False)
    s = simulation.setup(config, fed, resolve(config.algorithm, config.terms), trainer)
    for rnd in range(config.train.rounds):
        simulation.run_round(s, rnd)
    if streamed:
        monkeypatch.undo()
    return s.server.global_state


SCHEDULE_KEYS = {"epochs": ["train.rounds=1", "train.local_epochs=2"],
                 "steps": ["train.rounds=1", "train.local_steps=5"]}


@pytest.mark.parametrize("schedule", sorted(SCHEDULE_KEYS))
def test_augmented_image_runs_agree(tmp_path, monkeypatch, schedule: str) -> None:
    """Whole rounds with crop + flip on compact images: planned and streamed batches give the same
    weights bitwise (each trainer), and the vectorized trainer agrees with the simulation one as
    un-augmented runs do (``test_vectorized.test_cnn_with_batchnorm_matches_simulation``: BatchNorm
    over batches of 8 amplifies the two trainers' float32 rounding, here to ~3e-4 after a round)."""
    keys = SCHEDULE_KEYS[schedule]
    stacked = _image_run(tmp_path, keys, lockstep_update)
    alone = _image_run(tmp_path, keys, simulation.train_in_turn)
    for trainer, planned in ((lockstep_update, stacked), (simulation.train_in_turn, alone)):
        streamed = _image_run(tmp_path, keys, trainer, monkeypatch, streamed=True)
        for k, v in planned.items():
            assert torch.equal(v, streamed[k]), k
    for k, v in alone.items():
        torch.testing.assert_close(stacked[k], v, atol=1e-3, rtol=1e-3, msg=k)


def test_layout_is_a_function_of_the_device() -> None:
    """channels_last and cuDNN's autotuner are on for CUDA only; the layout helpers change strides
    alone, and only of convolutional models and 4-D batches."""
    assert devices.channels_last("cuda") and not devices.channels_last("cpu")
    x = torch.randn(2, 3, 4, 5)
    laid = devices.batch_layout(x, True)
    assert laid.is_contiguous(memory_format=torch.channels_last) and torch.equal(laid, x)
    assert devices.batch_layout(x, False) is x
    flat = torch.randn(2, 3)
    assert devices.batch_layout(flat, True) is flat
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    assert devices.laid_out(conv, True)[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert devices.laid_out(torch.nn.Linear(3, 2), True).weight.is_contiguous()


def _recording(stacked, seen: list):
    """``_Batches.stacked`` that also appends what it returns to ``seen``."""
    def record(self, *args):
        seen.append(stacked(self, *args))
        return seen[-1]
    return record


def test_channels_last_trains_the_same_weights(tmp_path, monkeypatch) -> None:
    """The channels_last code path forced on the CPU (model and one client's batches): the same
    weights as the default layout, in float64, for a client alone and for a stack."""
    rng = np.random.default_rng(0)
    arrays = {}
    for i, n in enumerate([12, 9]):
        arrays[f"client{i}_train_x"] = rng.standard_normal((n, 3, 24, 24), dtype=np.float32)
        arrays[f"client{i}_train_y"] = rng.integers(0, 4, n).astype(np.int64)
    np.savez(tmp_path / "images.npz", **arrays)
    config = fedlatent.load_config(None, [
        'data.dataset="arrays"', f'data.path="{tmp_path / "images.npz"}"', 'data.partition="given"',
        'model.arch="cnn"', "train.rounds=1", "train.batch_size=4", "train.lr=0.01"])
    for trainer in (simulation.train_in_turn, lockstep_update):
        contiguous, _ = _rounds(config, trainer, float64=True)
        seen: list[tuple[torch.Tensor, torch.Tensor]] = []
        with monkeypatch.context() as patch:
            patch.setattr(devices, "CHANNELS_LAST", frozenset({"cpu"}))
            patch.setattr(_Batches, "stacked", _recording(_Batches.stacked, seen))
            laid, _ = _rounds(config, trainer, float64=True)
        conv = next(m for m in laid.model.modules() if isinstance(m, torch.nn.Conv2d))
        assert conv.weight.is_contiguous(memory_format=torch.channels_last)
        one = trainer is simulation.train_in_turn  # a client alone: its 4-D batch channels_last
        assert seen and all(x[0].is_contiguous(memory_format=torch.channels_last) == one for x, _ in seen)
        for k, v in contiguous.server.global_state.items():
            assert laid.server.global_state[k].is_contiguous()
            # float64: the two layouts' convolutions sum in different orders (which, depends on the CPU's
            # kernels: 1.7e-12 apart after a round on one host), a wrong layout by O(1)
            torch.testing.assert_close(laid.server.global_state[k], v, rtol=1e-9, atol=1e-10, msg=k)
