"""Clients that never train (``data.holdout_clients``): which ones (a seeded draw, the partition
untouched), that their data never reach a client update (poisoned with NaN, the training is the same
to the byte), their evaluation (the global model's accuracy by hand, each new-client rule by a float64
hand loop), the refusals (exit 2, one line) and, with none held out, the numbers of the code before."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.func import functional_call
from torch.nn import functional as F

import fedlatent
from fedlatent.backends import simulation
from fedlatent.cli import main
from fedlatent.config import ModelConfig, holdout_count
from fedlatent.data import holdout
from fedlatent.data.federation import build_federation
from fedlatent.data.types import ClientData, Split
from fedlatent.errors import ConfigError
from fedlatent.experiment.runner import single
from fedlatent.experiment.runner.validation import check_holdout
from fedlatent.federated import driver
from fedlatent.federated.trainer.schedule import batches
from fedlatent.federated.finetune import batchnorm_statistics
from fedlatent.federated.personal import client_model
from fedlatent.federated.round import round_lr
from fedlatent.federated.state import load_checkpoint
from fedlatent.methods import resolve
from fedlatent.methods.parts import MethodSpec
from fedlatent.methods.program import PROGRAMS, ClientProgram
from fedlatent.models import build_model
from fedlatent.seeding import HOLDOUT, derive_seed
from tests.code_before import checkpoint_digests, runs_before_and_now

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "configs" / "digits_fedavg.toml"
BEFORE = "fca04b1"  # main before data.holdout_clients


def digits(*extra: str):
    """6 Dirichlet clients of digits with test splits, 2 held out, a 64 → 16 MLP, 2 rounds."""
    return fedlatent.load_config(None, [
        "seed=4", 'data.dataset="digits"', 'data.partition="dirichlet"', "data.alpha=0.5", "data.num_clients=6",
        "data.local_test_fraction=0.2", "model.hidden=[16]", "train.rounds=2", "train.batch_size=16",
        "train.threads=1", "data.holdout_clients=2", *extra])


def synthetic(algorithm: dict, *extra: str):
    """4 Synthetic(0.5, 0.5) clients × 200 samples (with test splits), 1 held out, a 60 → 20 MLP."""
    config = fedlatent.load_config(None, [
        "seed=3", 'data.dataset="synthetic"', 'data.partition="given"', "data.num_clients=4",
        "data.samples_per_client=200", "data.synthetic_alpha=0.5", "data.synthetic_beta=0.5", "model.hidden=[20]",
        "train.rounds=2", "train.batch_size=10", "train.lr=0.05", "train.momentum=0.9", "data.holdout_clients=1",
        *extra])
    return dataclasses.replace(config, algorithm=algorithm)


def run(config, out: Path, **kwargs) -> dict:
    return single.run(config, out, echo=None, figures=False, **kwargs)


# which clients --------------------------------------------------------------------------------------------------

def test_the_draw_is_a_function_of_the_seed_and_leaves_the_partition_as_it_was() -> None:
    draws = [holdout.held_out(10, 3, seed=s) for s in range(20)]
    assert draws == [holdout.held_out(10, 3, seed=s) for s in range(20)]
    assert all(d == sorted(set(d)) and len(d) == 3 and 0 <= d[0] and d[-1] < 10 for d in draws)
    assert len({tuple(d) for d in draws}) > 5  # other seeds, other clients
    config = digits()
    assert holdout.holdout_ids(config, 6) == holdout.held_out(6, 2, seed=derive_seed(4, HOLDOUT))
    assert holdout.holdout_ids(dataclasses.replace(config, seed=5), 6) != holdout.holdout_ids(config, 6) or \
        holdout.holdout_ids(dataclasses.replace(config, seed=6), 6) != holdout.holdout_ids(config, 6)
    ids = holdout.holdout_ids(config, 6)
    fed, _ = single.prepare(config)
    assert sorted(fed.new_clients) == [4, 5] and len(fed.clients) == 4  # numbered after the clients that train
    assert fed.held_out == tuple(ids) and fed.partition_size == 6
    raw = dataclasses.replace(config.data, normalize=False)  # the samples as partitioned, whatever standardises them
    held, full = (build_federation(d, config.data_seed) for d in (raw, dataclasses.replace(raw, holdout_clients=0)))
    kept = [c for i, c in enumerate(full.clients) if i not in ids]  # the others, in partition order
    for split in ("train", "val", "test"):
        for a, b in zip(list(held.clients) + [held.new_clients[i] for i in (4, 5)], kept + [full.clients[i] for i in ids]):
            x, y = getattr(a, split), getattr(b, split)
            assert (x is None) == (y is None) and (x is None or (torch.equal(x.x, y.x) and torch.equal(x.y, y.y)))
    assert torch.equal(held.test.x, full.test.x)
    assert torch.equal(fed.test.x, build_federation(config.data, config.data_seed).test.x)


def test_the_standardisation_reads_the_training_clients_samples_alone(monkeypatch) -> None:
    """The inputs' mean and std come from the samples of the clients that train: the held-out
    clients' indices never reach the standardiser (nor, with none held out, is any left out)."""
    from fedlatent.data import federation as fed_module
    seen: dict[str, list] = {"standardised": [], "clients": []}
    standardiser, split_fractions = fed_module._standardiser, fed_module.P.split_fractions

    def standardise(cfg, x, idx):
        seen["standardised"].append(np.sort(idx))
        return standardiser(cfg, x, idx)

    def fractions(idx, *args, **kwargs):
        seen["clients"].append(np.sort(idx))
        return split_fractions(idx, *args, **kwargs)
    monkeypatch.setattr(fed_module, "_standardiser", standardise)
    monkeypatch.setattr(fed_module.P, "split_fractions", fractions)
    config = digits()
    fed = build_federation(config.data, config.data_seed)
    new, kept = list(fed.held_out), holdout.kept(6, fed.held_out)
    for pid in range(6):  # each client's indices cut as it is built, in partition order
        fed.clients[kept.index(pid)] if pid in kept else fed.new_clients[4 + new.index(pid)]
    [used], clients = seen["standardised"], seen["clients"]
    assert len(clients) == 6 and len(new) == 2
    assert np.array_equal(used, np.sort(np.concatenate([c for i, c in enumerate(clients) if i not in new])))
    assert not set(used.tolist()) & set(np.concatenate([clients[i] for i in new]).tolist())
    seen["standardised"], seen["clients"] = [], []
    plain = digits("data.holdout_clients=0")
    list(build_federation(plain.data, plain.data_seed).clients)
    assert np.array_equal(seen["standardised"][0], np.sort(np.concatenate(seen["clients"])))


def _counted_draws(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every held-out draw (:func:`holdout.held_out`) from now on: how many clients it drew from."""
    draws: list[int] = []
    draw = holdout.held_out
    monkeypatch.setattr(holdout, "held_out", lambda n, count, *, seed: draws.append(n) or draw(n, count, seed=seed))
    return draws


@pytest.mark.parametrize("source", ["pool", "given"])
def test_the_held_out_clients_are_drawn_once_where_the_federation_is_built(source: str, monkeypatch) -> None:
    """A run's preparation (the build, its checks, the hold-out) draws the held-out clients once, in
    the build, for a pool as for a data set with its own clients; ``fedlatent check``'s outline once too."""
    config = digits() if source == "pool" else synthetic({"name": "fedavg"})
    n = int(config.data.num_clients)
    draws = _counted_draws(monkeypatch)
    fed, _ = single.prepare(config)
    assert draws == [n] and fed.held_out == tuple(holdout.held_out(n, len(fed.new_clients), seed=derive_seed(
        config.data_seed, HOLDOUT)))
    del draws[:]
    built = build_federation(config.data, config.data_seed)  # alone: already split
    assert draws == [n] and len(built.clients) == n - len(built.new_clients) and built.held_out == fed.held_out
    assert sorted(built.new_clients) == list(range(len(built.clients), n))
    del draws[:]
    from fedlatent.experiment.runner.validation import validate_data
    validate_data(config, resolve(config.algorithm, config.terms))
    assert draws == [n]


def _by_hand(clients) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature (per channel, in [0, 1] units for compact images) mean and std in float64 of every
    sample of ``clients``: their training, validation and test splits (each client's part of the pool)."""
    from fedlatent.data.compact import Images
    parts = [s.x.data.numpy() / 255.0 if isinstance(s.x, Images) else s.x.numpy().astype(np.float64)
             for c in clients for s in (c.train, c.val, c.test) if s is not None]
    x = np.concatenate(parts)
    axes = (0, 2, 3) if x.ndim == 4 else (0,)
    return x.mean(axis=axes), np.maximum(x.std(axis=axes), 1e-6)


def test_the_build_alone_standardises_with_the_training_clients_statistics(tmp_path: Path) -> None:
    """``build_federation`` returns the split federation, standardised with the mean and std of the
    training clients' samples (a float64 reference by hand over their raw samples), not the partition's:
    flat features (digits) and compact uint8 images (an image folder)."""
    from tests.data.test_image_folder import _random_tree
    from fedlatent.data.compact import Images
    _random_tree(tmp_path, {"train": {"a": 14, "b": 14}})
    images = fedlatent.load_config(None, [
        "data.dataset='image_folder'", f"data.root='{tmp_path}'", "data.num_clients=4", "model.arch='cnn'",
        "data.test_fraction=0.25", "data.local_test_fraction=0.3", "data.holdout_clients=1"])
    for config in (digits(), images):
        fed = build_federation(config.data, config.data_seed)
        raw = build_federation(dataclasses.replace(config.data, normalize=False), config.data_seed)
        assert fed.held_out == raw.held_out and len(fed.new_clients) == holdout_count(
            config.data.holdout_clients, int(config.data.num_clients)) and len(fed.clients) == len(raw.clients)
        mean, std = _by_hand(raw.clients)
        everyone = _by_hand([*raw.clients, *raw.new_clients.values()])
        assert not np.allclose(everyone[0], mean, rtol=1e-3, atol=0)  # the held-out samples would move it
        got_mean, got_std = (np.asarray(v, dtype=np.float64).reshape(-1) for v in (fed.augment.mean, fed.augment.std))
        np.testing.assert_allclose(got_mean, mean, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(got_std, std, rtol=1e-6, atol=1e-7)
        for a, b in zip([*fed.clients, *fed.new_clients.values()], [*raw.clients, *raw.new_clients.values()]):
            x = a.train.x
            if isinstance(x, Images):  # compact images: the raw pixels, standardised per batch by these statistics
                assert torch.equal(x.data, b.train.x.data)
                np.testing.assert_array_equal(x.mean.numpy().reshape(-1), got_mean.astype(np.float32))
            else:
                expected = (b.train.x.numpy() - got_mean.astype(np.float32)) / got_std.astype(np.float32)
                np.testing.assert_array_equal(x.numpy(), expected)


@pytest.mark.parametrize("value, clients, count", [(0.25, 8, 2), (0.3, 10, 3), (0.05, 10, 1), (3.0, 10, 3),
                                                   (1.0, 2, 1), (0.5, 3, 1)])
def test_a_fraction_rounds_down_to_at_least_one_and_a_count_is_itself(value, clients, count) -> None:
    assert holdout_count(value, clients) == count


# never trained --------------------------------------------------------------------------------------------------

def _poisoned(split):
    """``data.holdout.split`` whose held-out clients' samples are all NaN (and recorded)."""
    held: dict[int, ClientData] = {}

    def poison(s: Split | None) -> Split | None:
        return None if s is None else Split(torch.full_like(s.x, math.nan), s.y)

    def wrapped(federation, ids):
        out = split(federation, ids)
        held.update({cid: ClientData(*(poison(getattr(c, k)) for k in ("train", "val", "test")))
                     for cid, c in out.new_clients.items()})
        return dataclasses.replace(out, new_clients=dict(held))
    return wrapped, held


def _record(run_dir: Path) -> tuple[list[dict], dict]:
    """A run's metrics lines without clocks and new-client figures, and its last checkpoint's digests."""
    lines = [{k: v for k, v in json.loads(line).items() if not k.startswith(("time_", "new_client"))}
             for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return lines, checkpoint_digests(run_dir)


@pytest.mark.parametrize("backend", ["simulation", "vectorized"])
def test_a_held_out_clients_data_never_reach_a_client_update(backend: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Ditto (a personal model trained for each new client at every evaluation, from the same workspace the
    rounds train in): with the held-out clients' samples NaN, every metrics line and checkpoint byte of the
    training is as with their true samples, and no split of theirs is handed to the trainer."""
    config = digits('algorithm.name="ditto"', f'backend="{backend}"', "train.rounds=3")
    handed: list[Split] = []

    def trainer(ws, global_state, datas, spec, rcs, settings, generators):
        handed.extend(datas)
        return single.TRAINERS[backend](ws, global_state, datas, spec, rcs, settings, generators)

    clean = run(config, tmp_path / "clean", trainer=trainer)
    wrapped, held = _poisoned(holdout.split)
    monkeypatch.setattr(holdout, "split", wrapped)
    poisoned = run(config, tmp_path / "poisoned", trainer=trainer)
    assert sorted(held) == clean["final"]["new_clients"] and len(handed) == 2 * 3 * 4
    assert _record(tmp_path / "poisoned") == _record(tmp_path / "clean")
    assert not any(torch.isnan(d.x).any() for d in handed)
    assert poisoned["final"]["accuracy"] == clean["final"]["accuracy"]
    assert math.isnan(poisoned["final"]["new_client_loss"]) and not math.isnan(clean["final"]["new_client_loss"])


def test_the_census_and_weights_count_the_training_clients_alone() -> None:
    """The server's clients, the FedAvg total and the DP sampling rate's m/N are those of the clients that train."""
    config = digits("train.participation=0.5")
    fed, spec = single.prepare(config)
    s = simulation.setup(config, fed, spec)
    tasks = driver.plan_round(s.server, config, 0, s.train_sizes)
    assert len(s.train_sizes) == 4 and tasks[0].num_clients == 4 and len(tasks) == 2
    assert tasks[0].total_samples == sum(len(c.train) for c in fed.clients)
    assert all(t.client_id < 4 for t in tasks)


# evaluated -----------------------------------------------------------------------------------------------------

def test_new_client_accuracy_is_the_final_global_model_on_their_test_splits(tmp_path: Path) -> None:
    config = digits('backend="simulation"', 'eval.personalized="never"')
    summary = run(config, tmp_path / "run")
    final = summary["final"]
    ids = holdout.holdout_ids(config, 6)
    assert final["new_clients"] == [4, 5] and final["new_client_partition_ids"] == ids
    assert "new_client_personal_mean" not in final
    fed = build_federation(config.data, config.data_seed)
    spec = resolve(config.algorithm, config.terms)
    model = simulation.make_model(config, fed, spec)
    loaded = load_checkpoint(tmp_path / "run" / "checkpoints", 4)
    assert loaded is not None
    model.load_state_dict(loaded[0])
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for j in range(len(ids)):
            test = fed.new_clients[4 + j].test
            correct += int((model(test.x).logits.argmax(1) == test.y).sum())
            total += len(test)
    assert final["new_client_accuracy"] == correct / total
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["new_client_accuracy"] == correct / total


def _adapted(config) -> tuple[simulation.Setup, int, dict[str, torch.Tensor], object]:
    """The run's rounds with one of its clients held out (the one the seed draws); the held-out
    client's weights under the program's new-client rule and the settings they trained with."""
    fed, spec = single.prepare(config)
    s = simulation.setup(config, fed, spec)
    for rnd in range(config.train.rounds):
        simulation.run_round(s, rnd)
    [cid] = fed.new_clients
    settings = simulation.settings(s, round_lr(config.train, config.train.rounds - 1), spec.personalization.epochs)
    model = client_model(s.workspace, spec, {}, s.server.global_state, cid, fed.new_clients[cid].train, settings,
                         torch.Generator().manual_seed(derive_seed(config.seed, HOLDOUT, cid)), new=True)
    return s, cid, {k: v.detach().clone() for k, v in model.state_dict().items()}, settings


def hand_tuned(s: simulation.Setup, cid: int, names: set[str], settings, epochs: int,
               pull: float = 0.0, steps: int = 0) -> dict[str, torch.Tensor]:
    """SGD with momentum in float64 on the new client's training split from the global weights, the
    parameters ``names`` trained, (pull/2)‖v − w̄‖² added: the batches drawn as the client's; only
    the first ``steps`` batches where > 0."""
    model = simulation.make_model(s.config, s.federation, s.spec).double()
    start = {k: v.double() for k, v in s.server.global_state.items()}
    params = {n: start[n].clone().requires_grad_(n in names) for n, _ in model.named_parameters()}
    trained = [params[n] for n in sorted(names)]
    opt = torch.optim.SGD(trained, lr=settings.lr, momentum=settings.momentum)
    train = s.federation.new_clients[cid].train
    generator = torch.Generator().manual_seed(derive_seed(s.config.seed, HOLDOUT, cid))
    drawn = [idx for _ in range(epochs) for idx in batches(len(train), settings.batch_size, settings.drop_last,
                                                            generator)]
    for idx in drawn[:steps] if steps else drawn:
        opt.zero_grad()
        loss = F.cross_entropy(functional_call(model, params, (train.x[idx].double(),)).logits, train.y[idx])
        if pull:
            loss = loss + pull / 2 * sum((params[n] - start[n]).square().sum() for n in sorted(names))
        loss.backward()
        opt.step()
    return {n: p.detach() for n, p in params.items()}


def _close(state: dict[str, torch.Tensor], hand: dict[str, torch.Tensor]) -> None:
    for name, value in hand.items():
        torch.testing.assert_close(state[name], value.float(), rtol=0, atol=2e-5, msg=name)


def test_a_rounds_line_has_the_global_model_on_new_clients_and_the_final_block_their_rule(tmp_path: Path) -> None:
    """The rule trains on each new client's split: once, in the final evaluation, not every round."""
    final = run(digits('backend="simulation"', 'algorithm.name="fedbabu"'), tmp_path / "run")["final"]
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("new_client_accuracy" in x and not any(k.startswith("new_client_personal") for k in x) for x in lines)
    assert "new_client_personal_mean" in final and len(final["new_per_client"]) == 2


def test_finetune_rule_is_sgd_of_every_parameter_from_the_global_model() -> None:
    s, cid, state, settings = _adapted(synthetic({"name": "fedavg", "finetune_epochs": 2}))
    names = {n for n, _ in s.workspace.model.named_parameters()}
    _close(state, hand_tuned(s, cid, names, settings, 2))
    assert any(not torch.equal(state[n], s.server.global_state[n]) for n in names)


def test_fedper_rule_trains_the_personal_layers_alone_from_the_global_ones() -> None:
    s, cid, state, settings = _adapted(synthetic({"name": "fedper"}))
    head = {"classifier.weight", "classifier.bias"}
    _close(state, hand_tuned(s, cid, head, settings, 1))
    for name, value in s.server.global_state.items():
        if name not in head:
            assert torch.equal(state[name], value), name


def test_ditto_rule_trains_a_personal_model_pulled_towards_the_global_one() -> None:
    s, cid, state, settings = _adapted(synthetic({"name": "ditto", "lam": 0.5}))
    names = {n for n, _ in s.workspace.model.named_parameters()}
    _close(state, hand_tuned(s, cid, names, settings, 1, pull=0.5))
    without = hand_tuned(s, cid, names, settings, 1)
    assert any((without[n].float() - state[n]).abs().max() > 1e-4 for n in names)  # the pull matters


def test_apfl_rule_mixes_the_global_model_with_its_fine_tuned_copy_by_the_initial_alpha() -> None:
    s, cid, state, settings = _adapted(synthetic({"name": "apfl", "alpha": 0.25}))
    names = {n for n, _ in s.workspace.model.named_parameters()}
    tuned = hand_tuned(s, cid, names, settings, 1)
    glob = s.server.global_state
    _close(state, {n: 0.25 * tuned[n] + 0.75 * glob[n].double() for n in names})


def test_perfedavg_rule_is_one_plain_step_at_alpha_from_the_global_model() -> None:
    s, cid, state, settings = _adapted(synthetic({"name": "perfedavg", "alpha": 0.03}, "train.momentum=0"))
    names = {n for n, _ in s.workspace.model.named_parameters()}
    plain = dataclasses.replace(settings, lr=0.03, momentum=0.0)
    _close(state, hand_tuned(s, cid, names, plain, 1, steps=1))
    assert any(not torch.equal(state[n], s.server.global_state[n]) for n in names)


def test_pfedme_rule_solves_the_personal_problem_from_the_global_model() -> None:
    s, cid, state, settings = _adapted(synthetic({"name": "pfedme", "lam": 2.0, "personal_lr": 0.02}, "train.momentum=0"))
    names = {n for n, _ in s.workspace.model.named_parameters()}
    _close(state, hand_tuned(s, cid, names, dataclasses.replace(settings, lr=0.02, momentum=0.0), 1, pull=2.0))


def test_fedala_rule_is_its_first_round_of_local_training_from_the_global_model() -> None:
    s, cid, state, settings = _adapted(synthetic({"name": "fedala"}))
    names = {n for n, _ in s.workspace.model.named_parameters()}
    _close(state, hand_tuned(s, cid, names, settings, 1))


class Recorded:
    """A tune that records how it was called and returns its start."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, start, scope, pull=0.0, steps=0, lr=0.0, plain=False, statistics=False):
        self.calls.append((sorted(scope) if not isinstance(scope, str) else scope, statistics))
        return start


def test_fedbn_rule_estimates_the_statistics_of_the_batchnorm_layers_it_keeps_and_fedper_none() -> None:
    model = build_model(ModelConfig(arch="cnn"), (3, 32, 32), 4, "cifar10")
    parameters, state = [n for n, _ in model.named_parameters()], model.state_dict()
    for name, statistics in (("fedbn", True), ("fedper", False)):
        tune = Recorded()
        resolve({"name": name}).personalization.adapted_new(parameters, state, tune)
        [(scope, estimated)] = tune.calls
        assert estimated is statistics, name
        assert scope and all(n in parameters for n in scope)


def test_batchnorm_statistics_are_the_average_of_the_batches_mean_and_unbiased_variance() -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="cnn"), (3, 32, 32), 3, "cifar10")
    split = Split(torch.randn(23, 3, 32, 32) * 2 + 1, torch.zeros(23, dtype=torch.long))
    model.eval()
    norm = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    inputs: list[torch.Tensor] = []
    hook = norm.register_forward_pre_hook(lambda _m, args: inputs.append(args[0].detach().double()))
    batchnorm_statistics(model, split, batch_size=10)  # batches of 10, 10 and 3
    hook.remove()
    assert len(inputs) == 3 and not model.training and norm.momentum == 0.1
    means = torch.stack([x.mean((0, 2, 3)) for x in inputs])
    variances = torch.stack([x.var((0, 2, 3), unbiased=True) for x in inputs])
    torch.testing.assert_close(norm.running_mean.double(), means.mean(0), rtol=0, atol=1e-5)
    torch.testing.assert_close(norm.running_var.double(), variances.mean(0), rtol=0, atol=1e-5)
    assert int(norm.num_batches_tracked) == 3


def test_the_report_rows_are_the_rule_models_on_the_test_splits() -> None:
    config = synthetic({"name": "fedbabu", "finetune_epochs": 1})
    s, cid, state, _ = _adapted(config)
    tallies, rows = s.new_clients(s.server.global_state, True)
    model = simulation.make_model(config, s.federation, s.spec)
    model.load_state_dict(state)
    model.eval()
    test = s.federation.new_clients[cid].test
    with torch.no_grad():
        assert rows[0]["accuracy"] == float((model(test.x).logits.argmax(1) == test.y).double().mean())
    assert list(tallies) == [cid] and int(tallies[cid].count.sum()) == len(test)
    assert torch.equal(s.workspace.model.state_dict()["classifier.weight"], s.server.global_state["classifier.weight"])


# refused -------------------------------------------------------------------------------------------------------

class NoRule(ClientProgram):
    """A personalising program that states no new-client rule."""

    personalizes = True


def test_a_personalising_program_without_a_rule_of_its_own_has_none() -> None:
    assert NoRule.new_client_rule is None
    assert all(PROGRAMS[name].new_client_rule for name in ("none", "finetune", "partial", "ditto", "apfl",
                                                            "perfedavg", "pfedme", "fedala"))
    spec = MethodSpec("norule", personalization=NoRule())
    with pytest.raises(ConfigError, match="no rule for a client that never trained"):
        check_holdout(digits(), spec)
    check_holdout(digits('eval.personalized="never"'), spec)  # the global model alone needs no rule


def _sets(*overrides: str) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


HOLDOUT_CASES = [
    (("data.holdout_clients=2.5",), "data.holdout_clients = 2.5: a fraction in (0, 1) or a whole number"),
    (("data.holdout_clients=-0.5",), "data.holdout_clients = -0.5: must be >= 0"),
    (("data.holdout_clients=10",), "holds out 10 of the 10 clients"),
    (("data.holdout_clients=12",), "holds out 12 of the 10 clients"),
    (('data.num_clients="auto"', "data.holdout_clients=0.2"), "needs a fixed data.num_clients"),
    (("data.holdout_clients=9", "train.min_clients=2"), "train.min_clients = 2: more than the 1 clients"),
    (("data.holdout_clients=2",), "data.local_test_fraction > 0"),
]


@pytest.mark.parametrize("overrides, message", HOLDOUT_CASES, ids=[c[1][:30] for c in HOLDOUT_CASES])
def test_bad_holdout_exits_2_with_one_line_and_no_run_directory(overrides, message, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["run", str(DIGITS), "--set", "train.rounds=1", "--no-progress", *_sets(*overrides),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedlatent: error:") and message in lines[0], err
    assert not out.exists()


@pytest.mark.parametrize("overrides, message", [HOLDOUT_CASES[i] for i in (0, 4, 5)])
def test_fedlatent_check_refuses_them_too(overrides, message, capsys) -> None:
    assert main(["check", str(DIGITS), *_sets(*overrides)]) == 2
    assert message in capsys.readouterr().err


# none held out -------------------------------------------------------------------------------------------------

SCRIPT = """
import sys
from pathlib import Path
import torch
import fedlatent
from fedlatent.experiment.runner import single
torch.set_num_threads(1)
out = Path(sys.argv[1])
for name in ("fedavg", "apfl"):
    for backend in ("simulation", "vectorized"):
        config = fedlatent.load_config(None, [
            "seed=4", 'data.dataset="digits"', 'data.partition="dirichlet"', "data.alpha=0.5",
            "data.num_clients=4", "data.local_test_fraction=0.2", "model.hidden=[16]", "train.rounds=2",
            "train.batch_size=16", "train.momentum=0.9", "train.threads=1", f'algorithm.name="{name}"',
            f'backend="{backend}"'])
        single.run(config, out / f"{name}-{backend}", echo=None, figures=False)
"""


@pytest.mark.slow
def test_no_client_held_out_gives_the_numbers_and_folders_of_the_code_before(tmp_path: Path) -> None:
    old_runs, new_runs = runs_before_and_now(BEFORE, SCRIPT, tmp_path)
    names = sorted(p.name for p in old_runs.iterdir())
    assert names == ["apfl-simulation", "apfl-vectorized", "fedavg-simulation", "fedavg-vectorized"]
    for name in names:
        old, new = old_runs / name, new_runs / name
        assert (new / "config.toml").read_text() == (old / "config.toml").read_text(), name  # same folder digest
        assert _record(new) == _record(old), name
        final = [{k: v for k, v in json.loads((d / "summary.json").read_text())["final"].items() if "seconds" not in k}
                 for d in (old, new)]
        assert final[1] == final[0], name
        assert not any(k.startswith("new_client") for k in final[1])
    assert np.isfinite(final[1]["accuracy"])
