"""Per-FedAvg (``methods.perfedavg``): α = 0 on whole batches trains FedAvg exactly, float64 hand loops
of two rounds (first-order and Hessian-free, the Hessian as an explicit matrix) with the one-step
adaptation at evaluation, the batch's parts, resume, bad keys."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.func import functional_call, hessian
from torch.nn import functional as F

from fedlatent.backends import simulation
from fedlatent.cli import main
from fedlatent.federated.client import Workspace
from fedlatent.federated.trainer.schedule import batches
from fedlatent.federated.personal import client_model
from fedlatent.seeding import FINETUNE, LOCAL_TRAINING, derive_seed
from tests.methods.resume import resumed_equals_uninterrupted
from tests.methods.test_apfl import CONFIG, TRAINERS, _rounds
from tests.methods.test_ditto import small_config
from tests.methods.test_pfedme import _plain


@pytest.mark.parametrize("variant", ["fo", "hf"])
@pytest.mark.parametrize("backend", sorted(TRAINERS))
def test_alpha_zero_on_whole_batches_trains_fedavg_exactly(backend: str, variant: str) -> None:
    """With β = train.lr under plain SGD (the step Per-FedAvg requires) α = 0 is FedAvg's step."""
    fedavg, fedavg_lines, _ = _rounds(_plain(small_config("fedavg"), 0.05), TRAINERS[backend])
    per, per_lines, _ = _rounds(_plain(small_config("perfedavg", alpha=0.0, variant=variant, split_batch=False,
                                                    beta=0.05), 0.05), TRAINERS[backend])
    for k, v in fedavg.server.global_state.items():
        torch.testing.assert_close(per.server.global_state[k], v, rtol=0, atol=0)
    assert [line["train_loss"] for line in per_lines] == [line["train_loss"] for line in fedavg_lines]


def _parts(idx: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """The batch's consecutive parts, rows ⌊i·n/p⌋ … ⌊(i + 1)·n/p⌋ − 1; each whole when n < 2p."""
    n = len(idx)
    return [idx] * parts if n < 2 * parts else [idx[i * n // parts:(i + 1) * n // parts] for i in range(parts)]


def _hand_loop(config, s, initial: dict, alpha: float, variant: str, beta: float) -> dict:
    """Algorithm 1 in float64 with plain SGD at β (its own key, not train.lr), from the values before the step:
    w̃ = w − α∇f(w; D); FO: w −= β∇f(w̃; D'); HF: w −= β(I − α∇²f(w; D''))∇f(w̃; D'), the Hessian
    the explicit matrix of the flattened weights; the global model the sample-weighted mean."""
    t = config.train
    model = simulation.make_model(config, s.federation, s.spec).double()
    names = [n for n, _ in model.named_parameters()]
    shapes = [initial[n].shape for n in names]
    sizes = [len(c.train) for c in s.federation.clients]

    def unflat(flat: torch.Tensor) -> dict:
        return dict(zip(names, (v.reshape(shape) for v, shape in zip(flat.split([sh.numel() for sh in shapes]),
                                                                           shapes))))

    def loss(flat: torch.Tensor, x, y) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, unflat(flat), (x,)).logits, y)

    def grad(flat, x, y):
        return torch.func.grad(loss)(flat, x, y)

    w_bar = torch.cat([initial[n].flatten() for n in names])
    for rnd in range(t.rounds):
        trained = []
        for cid, client in enumerate(s.federation.clients):
            w = w_bar.clone()
            generator = torch.Generator().manual_seed(derive_seed(config.seed, LOCAL_TRAINING, rnd, cid))
            for idx in batches(len(client.train), t.batch_size, t.drop_last, generator):
                data = [(client.train.x[p].double(), client.train.y[p]) for p in _parts(idx, 3 if variant == "hf" else 2)]
                adapted = w - alpha * grad(w, *data[0])
                v = grad(adapted, *data[1])
                if variant == "hf":
                    v = v - alpha * hessian(loss)(w, *data[2]) @ v
                w = w - beta * v
            trained.append(w)
        w_bar = sum(w * (n / sum(sizes)) for w, n in zip(trained, sizes))
    return unflat(w_bar)


@pytest.mark.parametrize("variant", ["fo", "hf"])
@pytest.mark.parametrize("backend", sorted(TRAINERS))
def test_two_rounds_match_a_float64_hand_loop(backend: str, variant: str) -> None:
    config = small_config("perfedavg", alpha=0.3, variant=variant, beta=0.2)
    config.model.hidden = [4]  # the Hessian of the flattened weights: 294 × 294
    config.train.momentum, config.train.weight_decay, config.train.lr = 0.0, 0.0, 0.5  # β = 0.2, not train.lr
    s, _, initial = _rounds(config, TRAINERS[backend], float64=True)
    expected = _hand_loop(config, s, initial, 0.3, variant, 0.2)
    for k, v in expected.items():
        torch.testing.assert_close(s.server.global_state[k], v, rtol=0, atol=1e-10)
    fo = _hand_loop(config, s, initial, 0.3, "fo", 0.2)  # the Hessian term moves the weights (not vacuous)
    if variant == "hf":
        assert max(float((fo[k] - v).abs().max()) for k, v in expected.items()) > 1e-6
    # evaluated after one plain step at rate α on a batch of its training split
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        # the run's rule would decay the weights and step at the round's rate: the adaptation does neither
        settings = replace(simulation.settings(s, 5.0, 3), weight_decay=0.1, momentum=0.9)
        for cid, client in enumerate(s.federation.clients):
            model = client_model(Workspace(s.workspace.model), s.spec, s.client_states[cid], s.server.global_state,
                                 cid, client.train, settings,
                                 torch.Generator().manual_seed(derive_seed(config.seed, FINETUNE, cid)))
            idx = batches(len(client.train), config.train.batch_size, config.train.drop_last,
                          torch.Generator().manual_seed(derive_seed(config.seed, FINETUNE, cid)))[0]
            leaves = {k: v.clone().requires_grad_(True) for k, v in expected.items()}
            task = F.cross_entropy(functional_call(model, leaves, (client.train.x[idx].double(),)).logits,
                                   client.train.y[idx])
            grads = torch.autograd.grad(task, list(leaves.values()))
            for (k, v), g in zip(expected.items(), grads):
                torch.testing.assert_close(model.state_dict()[k], v - 0.3 * g, rtol=0, atol=1e-10)
    finally:
        torch.set_default_dtype(before)


def test_the_batch_parts_are_consecutive_and_a_short_batch_is_whole() -> None:
    """The step's parts on the vectorized backend, where clients' batches of different sizes share a
    padded step (row weights pick each member's part) or one size is sliced; a batch that would
    leave a part of one sample is each part whole."""
    from fedlatent.federated.trainer.step import GroupStep as _GroupStep

    class _R:
        class s:
            lr = 0.1
        data = None
        rcs = [None] * 3

    x = torch.arange(3 * 5, dtype=torch.float64).reshape(3, 5, 1)  # a batch of 3 in halves: 1 and 2 rows
    padded = _GroupStep(_R, None, [0, 1, 2], [5, 4, 3], x, x[..., 0].long(),
                        torch.tensor([[1.0] * 5, [1.0] * 4 + [0.0], [1.0] * 3 + [0.0] * 2]), None, None, None, {},
                        torch.arange(3), None, False)
    halves = [padded.part(i, 2) for i in range(2)]
    assert halves[0].row_weights.tolist() == [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]
    assert halves[1].row_weights.tolist() == [[0, 0, 1, 1, 1], [0, 0, 1, 1, 0], [1, 1, 1, 0, 0]]
    assert halves[1].sizes == [3, 2, 3]
    whole = _GroupStep(_R, None, [0, 1, 2], [6, 6, 6], x6 := torch.arange(18.0).reshape(3, 6, 1), x6[..., 0].long(),
                       None, None, None, None, {}, torch.arange(3), None, False)
    thirds = [whole.part(i, 3) for i in range(3)]
    assert [p.x[0, :, 0].tolist() for p in thirds] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert whole.part(0, 1) is whole and whole.part(2, 4) is whole  # 6 rows in quarters: a part of one


@pytest.mark.slow
def test_resume_reproduces_the_uninterrupted_run(tmp_path: Path, monkeypatch, crash_at_round_2) -> None:
    resumed_equals_uninterrupted(_plain(small_config("perfedavg", rounds=3, variant="hf"), 0.05), tmp_path, monkeypatch)


@pytest.mark.parametrize("setting, key", [('algorithm.variant="so"', "algorithm.variant"),
                                          ("algorithm.alpha=-0.1", "algorithm.alpha"),
                                          ("algorithm.split_batch=2", "algorithm.split_batch")])
def test_a_bad_key_exits_2_in_one_line_before_any_folder(setting: str, key: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["run", str(CONFIG), "--no-progress", "--set", 'algorithm.name="perfedavg"',
                 "--set", setting, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and key in err and not out.exists()


@pytest.mark.parametrize("name", ["perfedavg", "pfedme"])
@pytest.mark.parametrize("sets, named", [(["train.momentum=0.9"], "train.momentum = 0.9"),
                                         (["train.momentum=0", "train.weight_decay=0.01"], "train.weight_decay = 0.01"),
                                         (["train.momentum=0", 'train.optimizer="adam"'], "train.optimizer = 'adam'")])
def test_a_step_other_than_plain_sgd_is_refused_naming_the_key(name: str, sets: list[str], named: str,
                                                               tmp_path: Path, capsys) -> None:
    """The papers' global-model step is plain SGD: a momentum, a weight decay or another optimiser
    would make it another method (pFedMe's personal models then end below its global model)."""
    out = tmp_path / "run"
    overrides = [a for s in [f'algorithm.name="{name}"', *sets] for a in ("--set", s)]
    assert main(["run", str(CONFIG), "--no-progress", *overrides, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"fedlatent: error: {named}") and "plain SGD" in err
    assert not out.exists()
    assert main(["check", str(CONFIG), *overrides[:2], "--set", "train.momentum=0", "--set", "train.weight_decay=0"]) == 0


def test_the_changed_defaults_are_their_sources_values() -> None:
    """Per-FedAvg's β is the pFedMe repository's (its Per-FedAvg MNIST command: --beta 0.001), FedALA's
    threshold the paper's (the FedALA release's README: 0.01 in the paper; its ALA.py defaults to 0.1)."""
    from fedlatent.methods import resolve
    assert resolve({"name": "perfedavg"}, []).personalization.beta == 0.001
    assert resolve({"name": "fedala"}, []).personalization.threshold == 0.01
    assert resolve({"name": "fedala", "threshold": 0.1}, []).personalization.threshold == 0.1  # the release's


@pytest.mark.parametrize("name", ["perfedavg", "pfedme"])
def test_fp16_is_refused_in_one_line_before_any_folder(name: str, tmp_path: Path, capsys) -> None:
    """Their inner gradients are taken without fp16's loss scaling: refused, never silently underflowing."""
    out = tmp_path / "run"
    assert main(["run", str(CONFIG), "--no-progress", "--set", f'algorithm.name="{name}"',
                 "--set", 'train.precision="fp16"', "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "inner gradients" in err and "train.precision" in err and not out.exists()
