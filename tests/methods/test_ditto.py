"""Ditto and its feature-drift constraints (cosine, MK-MMD, MMD-D): behaviour against independent
references (plain local SGD, λ → ∞), β's constraints, checkpoint/resume, and end-to-end runs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import fedlatent
from fedlatent.backends import simulation
from fedlatent.data.federation import build_federation
from fedlatent.errors import ConfigError
from fedlatent.federated.client import PERSONAL, prefixed
from fedlatent.federated.trainer.schedule import batches
from fedlatent.losses.mmd_d import mmd_d
from fedlatent.methods import resolve
from fedlatent.methods.ditto import MkMmd, refresh_due
from fedlatent.methods.parts import ClientRound, TermContext
from fedlatent.methods.registry import build_part
from fedlatent.models.base import ModelOutput
from fedlatent.models.mlp import MLP
from fedlatent.seeding import LOCAL_TRAINING, derive_seed


def small_config(name: str = "ditto", rounds: int = 2, **algorithm):
    """4 Synthetic(0.5, 0.5) clients × 200 samples (128 train), the paper's 60 → 20 → 10 MLP."""
    config = fedlatent.load_config(None, [
        "seed=3", 'data.dataset="synthetic"', 'data.partition="given"', "data.num_clients=4",
        "data.samples_per_client=200", "data.synthetic_alpha=0.5", "data.synthetic_beta=0.5",
        'model.arch="mlp"', "model.hidden=[20]", f"train.rounds={rounds}", "train.local_epochs=1",
        "train.batch_size=10", "train.lr=0.05", "train.momentum=0.9", "train.weight_decay=0.001"])
    config.algorithm = {"name": name, **algorithm}
    return config


def train_rounds(config):
    """Run the simulation backend's rounds in process; returns its Setup and the global state at
    the start of the last round."""
    fed = build_federation(config.data, config.data_seed)
    s = simulation.setup(config, fed, resolve(config.algorithm, config.terms))
    last_start = None
    for rnd in range(config.train.rounds):
        last_start = {k: v.clone() for k, v in s.server.global_state.items()}
        simulation.run_round(s, rnd)
    return s, last_start


def test_lambda_zero_without_constraint_is_independent_local_training() -> None:
    config = small_config("ditto", rounds=3, lam=0.0)
    config.train.local_epochs = 2
    s, _ = train_rounds(config)
    t = config.train
    initial = simulation.make_model(config, s.federation, s.spec)
    for cid, client in enumerate(s.federation.clients):
        model = MLP(60, [20], 10)
        model.load_state_dict(initial.state_dict())
        for rnd in range(t.rounds):  # the backend's batch order; a fresh optimiser every round
            generator = torch.Generator().manual_seed(derive_seed(config.seed, LOCAL_TRAINING, rnd, cid))
            opt = torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
            for _ in range(t.local_epochs):
                for idx in batches(len(client.train), t.batch_size, t.drop_last, generator):
                    opt.zero_grad()
                    F.cross_entropy(model(client.train.x[idx]).logits, client.train.y[idx]).backward()
                    opt.step()
        personal = prefixed(s.client_states[cid], PERSONAL)
        for name, value in model.state_dict().items():
            torch.testing.assert_close(personal[name], value, rtol=0, atol=1e-6)
    # and the personal models are not the global one (the comparison above is not vacuous)
    assert not torch.allclose(prefixed(s.client_states[0], PERSONAL)["classifier.weight"],
                              s.server.global_state["classifier.weight"])


def _distance(a: dict, b: dict) -> float:
    return float(torch.sqrt(sum(((a[k] - b[k]) ** 2).sum() for k in b if k.endswith(("weight", "bias")))))


def test_large_lambda_keeps_the_personal_model_at_the_global_one() -> None:
    distances = {}
    for lam in (0.0, 100.0):  # lr·λ = 1: each step lands at w̄ − lr·(∇task + wd·w), ‖w_L − w̄‖ ≈ ‖∇‖/λ
        config = small_config("ditto", rounds=2, lam=lam)
        config.train.momentum, config.train.local_epochs, config.train.lr = 0.0, 3, 0.01
        s, start = train_rounds(config)
        distances[lam] = np.mean([_distance(prefixed(state, PERSONAL), start) for state in s.client_states])
    norm = float(torch.sqrt(sum((v ** 2).sum() for v in start.values())))
    assert distances[100.0] < 0.1 * distances[0.0]
    assert distances[100.0] < 0.02 * norm


def _round(state: dict, model=None) -> ClientRound:
    return ClientRound(0, model or MLP(60, [20], 10), {}, state, {}, 0.01, 100, 4, 400, 0.9)


def _ctx(personal: torch.Tensor, global_: torch.Tensor, rc: ClientRound) -> TermContext:
    logits = torch.zeros(len(personal), 10)
    return TermContext(ModelOutput(logits, personal), torch.zeros(len(personal), dtype=torch.long), {}, {},
                       ModelOutput(logits, global_), None, 10, rc.state, {}, rc.scratch)


@pytest.mark.parametrize("kernel", ["paper", "official"])
def test_mk_mmd_beta_after_refresh_is_a_non_uniform_distribution(kernel: str) -> None:
    part = build_part({"name": "mk_mmd", "beta_every": 1, "beta_batches": 3, "kernel": kernel}, "terms")
    state: dict = {}
    rc = _round(state)
    part.begin(rc)
    uniform = state["mk_mmd.beta.z"].clone()
    torch.testing.assert_close(uniform, torch.full((19,), 1 / 19))
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.randn(10, 20, generator=g, requires_grad=True)
        y = 0.3 * torch.randn(10, 20, generator=g) + 1.5  # clearly different features
        loss = part.loss(_ctx(x, y, rc))
    beta = state["mk_mmd.beta.z"]
    assert beta.shape == (19,) and bool((beta >= 0).all())
    assert float(beta.sum()) == pytest.approx(1.0, abs=1e-5)
    assert float((beta - uniform).abs().max()) > 0.05
    assert loss.requires_grad and float(loss.detach()) > 0
    assert rc.metrics["personal_beta_refreshes"] == 3 and rc.metrics["personal_beta_seconds"] > 0


@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
def test_mmd_d_term_uses_the_kernel_as_trained(estimator: str) -> None:
    """The term of every step equals mmd_d under the client's kernel as it is at that step: the
    stacked weights the part reuses between steps are renewed when the kernel is trained."""
    part = build_part({"name": "mmd_d", "kernel_every": 2, "kernel_batches": 2, "kernel_lr": 0.05,
                       "estimator": estimator}, "terms")
    rc = _round({})
    part.begin(rc)
    g = torch.Generator().manual_seed(3)
    seen = []
    for _ in range(4):
        x = torch.randn(10, 20, generator=g)
        y = 0.5 * torch.randn(10, 20, generator=g) + 1.0
        got = part.loss(_ctx(x, y, rc))
        kernel = rc.scratch["mmd_d"].kernels["z"]
        seen.append(kernel.featurizer[0].weight.clone())
        torch.testing.assert_close(got, mmd_d(x, y, kernel, semantics="paper", estimator=estimator))
    assert not torch.equal(seen[0], seen[2]) and torch.equal(seen[0], seen[1])


def test_mk_mmd_beta_every_zero_keeps_uniform_and_state_survives_begin() -> None:
    part = build_part({"name": "mk_mmd", "beta_every": 0}, "terms")
    state = {"mk_mmd.beta.z": torch.arange(19.0) / 171.0}  # a β from an earlier round
    rc = _round(state)
    part.begin(rc)
    x, y = torch.randn(10, 20), torch.randn(10, 20) + 1
    part.loss(_ctx(x, y, rc))
    torch.testing.assert_close(state["mk_mmd.beta.z"], torch.arange(19.0) / 171.0)


def test_refresh_schedule_and_release_window() -> None:
    assert [t for t in range(1, 50) if refresh_due(t, 20, False)] == [1, 21, 41]
    assert [t for t in range(1, 50) if refresh_due(t, 20, True)] == [2, 22, 42]  # step 1 uses the old β
    assert [t for t in range(1, 4) if refresh_due(t, 1, False)] == [1, 2, 3]
    assert not any(refresh_due(t, 0, False) for t in range(1, 50))
    release = build_part({"name": "mk_mmd", "beta_batches": 50, "release_off_by_one": True}, "terms")
    assert isinstance(release, MkMmd) and release.window == 51


def test_depth_reads_the_model_tap_names_and_bad_keys_are_config_errors() -> None:
    model = MLP(60, [32, 16, 8], 10)  # taps hidden2, hidden1 (deepest first); z is the 8-d output
    part = build_part({"name": "cosine", "depth": 3}, "terms")
    part.begin(_round({}, model))
    assert part.layers == ("z", "hidden2", "hidden1") and part.taps == {"hidden2", "hidden1"}
    with pytest.raises(ConfigError, match="depth = 4"):
        build_part({"name": "cosine", "depth": 4}, "terms").begin(_round({}, model))
    with pytest.raises(ConfigError, match="kernel"):
        build_part({"name": "mk_mmd", "kernel": "gaussian"}, "terms")
    with pytest.raises(ConfigError, match="not a feature"):
        build_part({"name": "mmd_d", "layers": ["conv9"]}, "terms").begin(_round({}, model))
    with pytest.raises(ConfigError, match="beta_every"):
        resolve({"name": "ditto_mkmmd", "beta_every": -1})


@pytest.mark.parametrize("name, key, algorithm", [
    ("ditto_mkmmd", "mk_mmd.beta.z", {"beta_every": 5, "beta_batches": 4, "stale_first_step": True}),
    ("ditto_mmdd", "mmd_d.kernel.z.featurizer.0.weight", {"kernel_every": 5, "kernel_batches": 4}),
])
def test_constraint_state_survives_checkpoint_and_resume(tmp_path: Path, monkeypatch, crash_at_round_2,
                                                         name: str, key: str, algorithm) -> None:
    config = small_config(name, rounds=3, **algorithm)
    with pytest.raises(KeyboardInterrupt):  # crash_at_round_2: killed after two of the three rounds
        fedlatent.run(config, tmp_path / "resumed")
    monkeypatch.undo()
    final_full = fedlatent.run(config, tmp_path / "full")["final"]
    final_resumed = fedlatent.run(config, tmp_path / "resumed", resume=True)["final"]

    def states(run: str):
        from fedlatent.federated.state import load_checkpoint
        return load_checkpoint(tmp_path / run / "checkpoints", config.data.num_clients)

    g1, _, clients1, _ = states("full")
    g2, _, clients2, _ = states("resumed")
    for k in g1:
        torch.testing.assert_close(g1[k], g2[k], rtol=0, atol=0)
    for c1, c2 in zip(clients1, clients2):
        assert key in c1 and set(c1) == set(c2)
        for k in c1:
            torch.testing.assert_close(c1[k], c2[k], rtol=0, atol=0)
    assert final_full["personalized_accuracy"] == final_resumed["personalized_accuracy"]
    if name == "ditto_mkmmd":  # β moved away from uniform, so losing it would change the resumed run
        assert float((clients1[0][key] - 1 / 19).abs().max()) > 1e-3


def personal_accuracies_by_hand(config, out: Path) -> tuple[list[float], list[float]]:
    """Each client's personal model (from the run's last checkpoint) on its test split, and the
    rate of its training split's most frequent label there: argmax and counts by hand."""
    from fedlatent.federated.state import load_checkpoint
    from fedlatent.models import build_model
    fed = build_federation(config.data, config.data_seed)
    _, _, clients, _ = load_checkpoint(out / "checkpoints", len(fed.clients))
    model = build_model(config.model, fed.input_shape, fed.num_classes, fed.name).eval()
    accuracies, majority = [], []
    for client, state in zip(fed.clients, clients):
        model.load_state_dict(prefixed(state, PERSONAL))
        with torch.no_grad():
            predicted = model(client.test.x).logits.argmax(1)
        accuracies.append(float((predicted == client.test.y).double().mean()))
        most = int(torch.bincount(client.train.y, minlength=fed.num_classes).argmax())
        majority.append(float((client.test.y == most).double().mean()))
    return accuracies, majority


@pytest.mark.parametrize("name", ["ditto", "ditto_cosine", "ditto_mkmmd", "ditto_mmdd"])
def test_presets_run_end_to_end_on_synthetic(tmp_path: Path, name: str) -> None:
    """End to end, the reported personalised accuracy and majority baseline are those of the
    clients' checkpointed personal models, counted by hand."""
    config = small_config(name)
    summary = fedlatent.run(config, tmp_path / name)
    final = summary["final"]
    assert summary["rounds_completed"] == 2
    accuracies, majority = personal_accuracies_by_hand(config, tmp_path / name)
    assert [row["accuracy"] for row in final["per_client"]] == pytest.approx(accuracies, abs=1e-12)
    assert final["personalized_accuracy"] == pytest.approx(float(np.mean(accuracies)), abs=1e-12)
    assert final["majority_baseline_accuracy"] == pytest.approx(float(np.mean(majority)), abs=1e-12)
    metrics = (tmp_path / name / "metrics.jsonl").read_text()
    term = {"ditto_cosine": "term_cosine", "ditto_mkmmd": "term_mk_mmd", "ditto_mmdd": "term_mmd_d"}.get(name)
    if term:
        assert term in metrics
    assert ("personal_beta_seconds" in metrics) == (name == "ditto_mkmmd")


def test_constraint_alone_on_an_arrays_file(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {}
    for i in range(3):
        for split, n in (("train", 60), ("test", 20)):
            arrays[f"client{i}_{split}_x"] = (rng.normal(i, 1.0, (n, 12))).astype(np.float32)
            arrays[f"client{i}_{split}_y"] = rng.integers(0, 3, n).astype(np.int64)
    path = tmp_path / "tiny.npz"
    np.savez(path, **arrays)
    config = fedlatent.load_config(None, [
        'data.dataset="arrays"', f'data.path="{path}"', 'data.partition="given"', "model.hidden=[8]",
        "model.softmax_output=true", "train.rounds=2", "train.batch_size=10", "train.lr=0.05"])
    config.algorithm = {"name": "ditto_mkmmd", "lam": 0.0, "mu": 1.0, "kernel": "official", "normalize": True,
                        "beta_every": 2, "beta_batches": 2, "release_off_by_one": True, "stale_first_step": True,
                        "eps": 1e-5, "quadruples": "paired"}
    final = fedlatent.run(config, tmp_path / "run")["final"]
    accuracies, majority = personal_accuracies_by_hand(config, tmp_path / "run")
    assert final["personalized_accuracy"] == pytest.approx(float(np.mean(accuracies)), abs=1e-12)
    assert final["majority_baseline_accuracy"] == pytest.approx(float(np.mean(majority)), abs=1e-12)


def test_deep_kernel_initialisation_follows_the_run_seed() -> None:
    def initial_kernel(seed: int, client: int) -> dict:
        part = build_part({"name": "mmd_d"})
        rc = ClientRound(client, MLP(60, [20], 10), {}, {}, {}, 0.01, 100, 4, 400, 0.9, seed=seed)
        part.begin(rc)
        return {k: v.clone() for k, v in part.kernel_for(rc, "z", torch.zeros(2, 20)).state_dict().items()}

    same = initial_kernel(1, 0)
    for k, v in initial_kernel(1, 0).items():
        torch.testing.assert_close(v, same[k], rtol=0, atol=0)
    for other in (initial_kernel(2, 0), initial_kernel(1, 1)):
        assert not torch.equal(other["featurizer.0.weight"], same["featurizer.0.weight"])


def test_mk_mmd_first_r_fixed_kernels_is_their_mean_mmd() -> None:
    """Figure 3 (right) of the Ditto+MMD paper: the first r kernels, each weighted 1/r, never re-solved."""
    part = build_part({"name": "mk_mmd", "fixed_kernels": 5, "beta_every": 1, "beta_batches": 1}, "terms")
    state: dict = {}
    rc = _round(state)
    part.begin(rc)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(8, 20, generator=g), 0.5 * torch.randn(8, 20, generator=g) + 1.0
        loss = part.loss(_ctx(x, y, rc))
    xd, yd = x.double(), y.double()
    by_hand = 0.0
    for e in (-3.5, -3.25, -3.0, -2.75, -2.5):  # γ_j = 2^e, k = exp(−γ‖a − b‖²), biased estimator
        kxx, kyy, kxy = (torch.exp(-(2.0 ** e) * torch.cdist(a, b) ** 2) for a, b in ((xd, xd), (yd, yd), (xd, yd)))
        by_hand += (kxx.mean() + kyy.mean() - 2 * kxy.mean()).item() / 5
    assert float(loss) == pytest.approx(by_hand, rel=1e-4)
    assert state["mk_mmd.beta.z"].tolist() == pytest.approx([0.2] * 5 + [0.0] * 14)
    assert "personal_beta_refreshes" not in rc.metrics
    with pytest.raises(ConfigError, match="fixed_kernels"):
        build_part({"name": "mk_mmd", "fixed_kernels": 20}, "terms")
