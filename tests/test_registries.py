"""The open lists of models, data sets and partitions: names and keys checked when a configuration
is loaded, a new component registered from its own file, ``fedlatent config`` listing them."""
from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

from fedlatent.cli import main
from fedlatent.config import load_config, to_toml
from fedlatent.data.federation import build_federation
from fedlatent.data.registry import DATASETS, PARTITIONS
from fedlatent.errors import ConfigError
from fedlatent.models import build_model
from fedlatent.models.registry import MODELS
from fedlatent.registry import Key, Registry


@pytest.mark.parametrize("overrides,needle", [
    (['model.arch="vit"'], "model.arch = 'vit': unknown; allowed values are cifar_convnet, cnn, convnet7"),
    (['data.dataset="mnist"'], "data.dataset = 'mnist': unknown; allowed values are arrays, cifar10"),
    (['data.partition="random"'], "data.partition = 'random': unknown; allowed values are clients_file, dirichlet, domains"),
    (["data.alpha=0.1"], "data.alpha = 0.1 is not read by data.dataset = 'digits' with data.partition = 'iid'"),
    (['data.root="/elsewhere"'], "data.root = '/elsewhere' is not read by data.dataset = 'digits'"),
    (['data.dataset="synthetic"', 'data.partition="given"', 'data.root="/elsewhere"'],
     "data.root = '/elsewhere' is not read by data.dataset = 'synthetic'"),
    (['model.width="paper"'], "model.width = 'paper' is not read by model.arch = 'mlp'; known keys of model.arch = 'mlp': hidden"),
    (['model.arch="cnn"', "model.projector=64"], "model.projector = 64 is not read by model.arch = 'cnn'"),
    (['model.arch="resnet18"', 'model.norm="layer"'], "model.norm = 'layer': allowed values are batch, group"),
    (['model.arch="resnet18"', "model.norm=2"], "model.norm = 2: expected str"),
    (['model.norm="group"'], "unknown key model.norm; known keys of [model]: arch, hidden, softmax_output, weights"),
    (["model.hiden=[3]"], "unknown key model.hiden; did you mean model.hidden? known keys of [model]: arch, hidden"),
    (['data.partion="iid"'], "unknown key data.partion; did you mean data.partition? known keys of [data]: dataset, "
                             "partition, num_clients, test_fraction"),
    (["data.alpah=0.1"], "unknown key data.alpah; did you mean data.alpha? known keys of [data]: dataset"),
    (['data.partition="dirichelt"'], "allowed values are clients_file, dirichlet, domains, given, iid, shards; did you mean "
                                     "'dirichlet'?"),
    (['model.arch="resnet18"', 'model.norm="grup"'], "allowed values are batch, group; did you mean 'group'?"),
    (['data.dataset="synthetic"', 'data.partition="shards"'], "comes with its own clients (use data.partition = "
                                                              "one of given, iid)"),
    (['data.partition="given"'], "data set 'digits' is a pool to partition (use one of clients_file, dirichlet, domains, iid, shards)"),
    (['data.partition="domains"'], "data set 'digits' has no domains (data sets with domains: domains, ham10000)"),
    (['data.dataset="arrays"', 'data.partition="given"'], "data.path: data.dataset = 'arrays' needs it set"),
    (["model.extra={a=1}"], "model.extra must be a value, not a table"),
])
def test_names_and_keys_are_checked_at_load_in_one_line(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_keys_a_component_reads_are_accepted_and_own_keys_resolved() -> None:
    config = load_config(None, ['data.partition="dirichlet"', "data.alpha=0.1", 'model.arch="vgg13"',
                                "model.projector=32"])
    assert config.model.options == {"norm": "batch"}  # the model's own key, default filled in
    assert load_config(None, ['data.dataset="cifar10"', 'data.root="/elsewhere"']).data.root == "/elsewhere"
    assert 'norm = "batch"' in to_toml(config).split("[model]")[1].split("[train]")[0]
    config = load_config(None, ['model.arch="convnet7"', 'model.norm="group"'])
    model = build_model(config.model, (3, 32, 32), 10)
    assert type(model).__name__ == "ConvNet7" and model.classifier.in_features == 1024


def test_every_registered_name_is_documented() -> None:
    for registry in (MODELS, DATASETS, PARTITIONS):
        assert registry.names() and all(e.doc for e in registry.entries())
    assert {"vgg13", "convnet7", "senet18", "cifar_convnet", "mlp", "resnet18"} <= set(MODELS.names())


def test_a_new_component_is_one_module_that_registers_itself(tmp_path, monkeypatch) -> None:
    """A package of component files is discovered on first use; each brings its own keys."""
    package = tmp_path / "extra_models"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tiny.py").write_text(textwrap.dedent('''
        from fedlatent.registry import Key
        from extra_models_registry import REGISTRY

        @REGISTRY.register("tiny", keys={"depth": Key(2, "layers", (1, 2, 3))}, flavour="plain")
        def _tiny(depth):
            """A tiny component."""
            return ["layer"] * depth
    '''))
    (tmp_path / "extra_models_registry.py").write_text(
        "from fedlatent.registry import Registry\nREGISTRY = Registry('model', 'arch', package='extra_models')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from extra_models_registry import REGISTRY  # type: ignore[import-not-found]
    entry = REGISTRY.get("tiny")
    assert entry.doc == "A tiny component." and entry.traits == {"flavour": "plain"}
    assert entry.keys == {"depth": Key(2, "layers", (1, 2, 3))}
    assert entry.build(depth=3) == ["layer"] * 3
    with pytest.raises(ConfigError, match=r"model.arch = 'big': unknown; allowed values are tiny$"):
        REGISTRY.get("big")
    for name in [m for m in sys.modules if m.startswith("extra_models")]:
        monkeypatch.delitem(sys.modules, name)


def test_registering_a_name_twice_is_an_error() -> None:
    registry = Registry("model", "arch", package="fedlatent.models")
    registry.register("x")(lambda: None)
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("x")(lambda: None)


def test_partitions_run_through_the_registry() -> None:
    config = load_config(None, ['data.partition="shards"', "data.classes_per_client=1", "data.num_clients=10"])
    federation = build_federation(config.data, config.data_seed)
    classes = [np.unique(c.train.y.numpy()) for c in federation.clients]
    assert all(len(c) == 1 for c in classes)


def test_fedlatent_config_lists_the_registered_names(capsys) -> None:
    assert main(["config"]) == 0
    text = capsys.readouterr().out
    assert "model.arch:" in text and "data.dataset:" in text and "data.partition:" in text
    assert "  vgg13 " in text and '[projector, norm = "batch"]' in text and "  dirichlet " in text


def test_cli_refuses_an_unknown_model_with_exit_2(tmp_path, capsys) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[model]\narch = "vgg16"\n')
    assert main(["run", str(config), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.arch = 'vgg16'" in err and "vgg13" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides,where", [
    (["train.foo=1"], ("train.foo", "[train]")),
    (["data.foo=1"], ("data.foo", "[data]")),
    (["model.foo=1"], ("model.foo", "[model]")),
    (["algorithm.foo=1"], ("algorithm.foo", "'fedavg'")),
    (['terms=[{name="uniformity", foo=1}]'], ("terms[0].foo", "'uniformity'")),
])
def test_an_unknown_key_reads_the_same_wherever_it_is_declared(overrides: list[str], where: tuple[str, str]) -> None:
    """Sections, a data set's and a model's own keys, a method's and a part's keys: one wording,
    the key in full and whose keys are known."""
    from fedlatent.experiment.runner.validation import validate

    key, owner = where
    with pytest.raises(ConfigError) as info:
        validate(load_config(None, overrides))  # what run and check do before anything else
    assert str(info.value).startswith(f"unknown key {key}; known keys of {owner}: ")


def test_every_registered_name_is_described_by_a_whole_sentence() -> None:
    """``fedlatent config`` lists each data set, partition and model with its docstring's first
    paragraph on one line: never a first line cut mid-sentence."""
    from fedlatent.models.registry import MODELS
    for registry in (DATASETS, PARTITIONS, MODELS):
        for entry in registry.entries():
            assert entry.doc and entry.doc.endswith((".", ")")), (registry.key, entry.name, entry.doc)
            assert "\n" not in entry.doc and "  " not in entry.doc
