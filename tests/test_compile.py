"""``train.compile``: the sequential client step through ``torch.compile`` gives the eager numbers
up to float rounding, and is refused where it cannot work (vectorized backend, no C++ compiler)."""
from __future__ import annotations

import pytest
import torch

import fedlatent
from fedlatent.backends import auto, simulation
from fedlatent.data.federation import build_federation
from fedlatent.errors import ConfigError
from fedlatent.experiment import prepare
from fedlatent.methods import resolve

BASE = ['data.dataset="digits"', 'data.partition="iid"', "data.num_clients=3", 'model.arch="mlp"',
        "model.hidden=[32]", "train.rounds=2", "train.batch_size=64", "train.lr=0.05", "train.momentum=0.9"]


def _run(overrides: list[str]) -> simulation.Setup:
    config = fedlatent.load_config(None, [*BASE, *overrides])
    federation, spec = prepare(config)
    s = simulation.setup(config, federation, spec)
    for rnd in range(config.train.rounds):
        simulation.run_round(s, rnd)
    return s


@pytest.mark.long  # torch.compile's graphs: two minutes on two cores; the refusals below run in CI
def test_compiled_client_step_gives_the_eager_weights() -> None:
    """FedDecorr (a term on the compiled forward's z), two rounds of three clients whose last batch
    is short (two input shapes, so two compiled graphs): the same global weights as eager."""
    torch._dynamo.reset()
    method = ['algorithm.name="feddecorr"']
    eager = _run(method)
    compiled = _run([*method, "train.compile=true"])
    assert eager.workspace.forward is None and compiled.workspace.forward is not None
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the compiled forward ran
    for k, v in eager.server.global_state.items():
        torch.testing.assert_close(compiled.server.global_state[k], v, atol=1e-5, rtol=1e-4, msg=k)
    assert any((compiled.server.global_state[k] != v).any() for k, v in
               simulation.setup(compiled.config, compiled.federation, compiled.spec).server.global_state.items()
               if v.is_floating_point()), "the compiled run did not train"


def test_compile_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError, match="train.compile"):
        fedlatent.load_config(None, [*BASE, 'train.compile="yes"'])


def test_compile_is_refused_on_the_vectorized_backend() -> None:
    with pytest.raises(ConfigError, match=r"train.compile = true \(compiled forward\): honoured on backend = .* not 'vectorized' \(the vectorized backend"):
        prepare(fedlatent.load_config(None, [*BASE, "train.compile=true", 'backend="vectorized"']))


def test_compile_is_refused_without_a_cpp_compiler_on_a_cpu() -> None:
    # torch's own patch, not monkeypatch: monkeypatch's undo deletes the key, which hides it from
    # every later reader of the inductor config (torch.utils._config_module's __delattr__)
    with torch._inductor.config.patch({"cpp.cxx": (None, "no-such-c++-compiler")}):
        with pytest.raises(ConfigError, match="train.compile = true: .*C\\+\\+ compiler.*no-such-c\\+\\+-compiler"):
            prepare(fedlatent.load_config(None, [*BASE, "train.compile=true"]))


def test_auto_keeps_a_compiled_run_on_simulation() -> None:
    """auto would pick vectorized for this MLP run; with train.compile it keeps the compiled path."""
    for extra, expected in (([], "vectorized"), (["train.compile=true"], "simulation")):
        config = fedlatent.load_config(None, [*BASE, "data.num_clients=5", *extra])
        backend, why = auto.choose(config, build_federation(config.data, config.data_seed),
                                   resolve(config.algorithm, config.terms))
        assert backend == expected, extra
    assert "train.compile" in why
