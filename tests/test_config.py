"""Configuration: defaults, ``--set`` overrides, TOML round trip, one clear error per bad input."""
from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

import fedlatent
from fedlatent.config import (LATER_KEYS, DataConfig, EvalConfig, ModelConfig, RunConfig, ServerConfig, TrainConfig,
                              apply_overrides, from_dict, load_config, to_dict, to_toml)
from fedlatent.errors import ConfigError, UserInputError
from fedlatent.methods import resolve


def _write(tmp_path: Path, text: str, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- defaults

def test_defaults_load_and_match_the_documented_contract() -> None:
    config = load_config()
    assert isinstance(config, RunConfig)
    assert config == RunConfig()
    # the names ARCHITECTURE.md promises, with their defaults
    assert (config.seed, config.backend) == (0, "auto")
    assert (config.data.dataset, config.data.partition, config.data.alpha, config.data.clients(),
            config.data.root) == ("digits", "iid", 0.5, 10, "data")
    assert config.data.num_clients == "auto"  # unset: the data's own count (one per domain), else 10
    assert config.model.arch == "mlp"
    t = config.train
    assert (t.rounds, t.local_epochs, t.batch_size, t.lr, t.momentum, t.weight_decay, t.participation) == \
        (20, 1, 32, 0.05, 0.0, 0.0, 1.0)
    assert config.algorithm == {"name": "fedavg"}
    assert config.eval.every == 1
    assert config.data_seed == 0
    # every field of every section has a default and a doc line
    for section in (DataConfig, ModelConfig, TrainConfig, ServerConfig, EvalConfig):
        for f in dataclasses.fields(section):
            assert f.metadata.get("doc"), f"{section.__name__}.{f.name} has no doc"


def test_fedlatent_exports_load_config() -> None:
    assert fedlatent.load_config is load_config


def test_defaults_are_not_shared_between_instances() -> None:
    a, b = load_config(), load_config()
    a.model.hidden.append(7)
    a.algorithm["mu"] = 1.0
    assert b.model.hidden == [128]
    assert b.algorithm == {"name": "fedavg"}


def test_file_values_are_read(digits_config: Path) -> None:
    config = load_config(digits_config)
    assert config.train.momentum == 0.9
    assert config.train.rounds == 20
    assert config.data.num_clients == 10
    assert config.algorithm["name"] == "fedavg"


# ---------------------------------------------------------------- overrides

def test_num_clients_is_a_count_or_auto() -> None:
    """Left out, data.num_clients is "auto": the data's own count, else (a pool) DEFAULT_CLIENTS."""
    from fedlatent.config import DEFAULT_CLIENTS
    assert load_config(None).data.num_clients == "auto"
    assert load_config(None).data.clients() == DEFAULT_CLIENTS == 10
    assert load_config(None, ['data.num_clients="auto"']).data.clients() == 10
    assert load_config(None, ["data.num_clients=auto"]).data.num_clients == "auto"   # a bare word on --set
    assert load_config(None, ["data.num_clients=7"]).data.clients() == 7


def test_overrides_parse_toml_values() -> None:
    config = load_config(None, [
        "seed=7",
        "train.rounds=3",             # int
        "train.lr=1e-2",              # float
        "train.weight_decay=1",       # an int where a float is expected becomes a float
        'data.dataset="arrays"', 'data.partition="given"',
        'data.path="quoted \\"x\\".npz"',  # a TOML string with escapes
        "model.hidden=[64, 32]",      # list
        "data.augment=true",          # bool
        "algorithm.name=fedprox",
        "algorithm.mu=0.1",
    ])
    assert config.seed == 7 and type(config.seed) is int
    assert config.train.rounds == 3 and type(config.train.rounds) is int
    assert config.train.lr == 0.01
    assert config.train.weight_decay == 1.0 and type(config.train.weight_decay) is float
    assert config.data.path == 'quoted "x".npz'
    assert config.model.hidden == [64, 32]
    assert config.data.augment is True
    assert config.algorithm == {"name": "fedprox", "mu": 0.1}
    unquoted = load_config(None, ['data.dataset="cifar10"', "data.root=some/folder"])  # → taken as a string
    assert unquoted.data.root == "some/folder"
    assert config.data_seed == 7


def test_overrides_win_over_the_file_and_leave_other_keys(digits_config: Path) -> None:
    config = load_config(digits_config, ["train.rounds=2", "data.num_clients=4"])
    assert config.train.rounds == 2
    assert config.data.num_clients == 4
    assert config.train.momentum == 0.9          # from the file, untouched
    assert config.model.hidden == [128]


def test_later_override_wins_and_input_is_not_mutated() -> None:
    raw = {"train": {"rounds": 5}}
    out = apply_overrides(raw, ["train.rounds=6", "train.rounds=8", "data.alpha=0.1"])
    assert out == {"train": {"rounds": 8}, "data": {"alpha": 0.1}}
    assert raw == {"train": {"rounds": 5}}


def test_data_seed_overrides_the_run_seed() -> None:
    assert load_config(None, ["seed=3"]).data_seed == 3
    assert load_config(None, ["seed=3", "data.seed=11"]).data_seed == 11


@pytest.mark.parametrize("text", ["train.rounds", "=3", "train..rounds=3", "train.=3"])
def test_malformed_override_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="--set"):
        load_config(None, [text])


def test_override_below_a_value_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="alpha"):
        load_config(None, ["data.alpha.x=1"])


# ---------------------------------------------------------------- round trip

def _nondefault_config(tmp_path: Path) -> RunConfig:
    text = """
seed = 12
backend = "simulation"

[data]
dataset = "cifar10"
partition = "dirichlet"
alpha = 0.05
num_clients = 7
root = 'C:\\data\\fl "set"'
min_size = 3
balance = false
val_fraction = 0.1
local_test_fraction = 0.2
augment = true
normalize = false
seed = 99

[model]
arch = "resnet18"
projector = 128
norm = "group"

[train]
rounds = 3
lr = 0.001
momentum = 0.9
weight_decay = 1e-5
participation = 0.3
lr_schedule = "cosine"
lr_min = 1e-4

[algorithm]
name = "fedprox"
mu = 0.25

[[terms]]
name = "prox"
mu = 0.5

[server]
optimizer = "adam"
lr = 0.02
tau = 1e-9

[eval]
every = 2
personalized = "never"
"""
    return load_config(_write(tmp_path, text))


def test_to_toml_round_trip_of_a_nondefault_config(tmp_path: Path) -> None:
    config = _nondefault_config(tmp_path)
    # the file really was read (not silently defaulted)
    assert config.data.root == 'C:\\data\\fl "set"'
    assert config.terms == [{"name": "prox", "mu": 0.5}]
    assert config.server.tau == 1e-9
    assert config.model.options == {"norm": "group", "first_stride": 1, "stem": "cifar"}  # a model's own keys, written flat in [model]
    text = to_toml(config)
    back = load_config(_write(tmp_path, text, "resolved.toml"))
    assert back == config
    assert to_dict(back) == to_dict(config)
    assert to_toml(back) == text          # a fixed point: what the resume check compares


def test_to_toml_round_trip_of_defaults(tmp_path: Path) -> None:
    config = load_config()
    text = to_toml(config)
    assert load_config(_write(tmp_path, text)) == config
    # fully resolved: every key of every section is written out, but the keys added later at their
    # defaults (config.LATER_KEYS: the folders of runs written before them keep their digest and stay
    # resumable)
    parsed = tomllib.loads(text)
    for name in ("data", "model", "train", "server", "eval"):
        fields = {f.name for f in dataclasses.fields(getattr(config, name))} - {"options"}
        fields -= {key for section, key in LATER_KEYS if section == name}
        assert set(parsed[name]) == fields | set(getattr(getattr(config, name), "options", {}))
    private = load_config(None, ["privacy.clip_norm=1.0", "privacy.noise_multiplier=1.0"])
    assert not {"randomness", "over_bound", "accountant", "distributed"} & set(tomllib.loads(to_toml(private))["privacy"])
    secret = load_config(None, ["privacy.clip_norm=1.0", "privacy.noise_multiplier=1.0", 'privacy.randomness="secret"',
                                'train.client_sampling="poisson"'])
    assert tomllib.loads(to_toml(secret))["privacy"]["randomness"] == "secret"
    assert load_config(_write(tmp_path, to_toml(secret))) == secret
    held = load_config(None, ["data.num_clients=10", "data.holdout_clients=0.2"])
    assert tomllib.loads(to_toml(held))["data"]["holdout_clients"] == 0.2
    assert load_config(_write(tmp_path, to_toml(held))) == held
    sampled = load_config(None, ["eval.clients=300", "eval.final_clients=50"])
    assert tomllib.loads(to_toml(sampled))["eval"] == {**tomllib.loads(text)["eval"], "clients": 300,
                                                       "final_clients": 50}
    assert load_config(_write(tmp_path, to_toml(sampled))) == sampled


def test_to_toml_round_trip_of_strings_with_control_characters(tmp_path: Path) -> None:
    config = load_config(None, ['data.dataset="arrays"', 'data.partition="given"', 'data.path="a\\tb\\nc\\\\d\\"e"'])
    assert config.data.path == 'a\tb\nc\\d"e'
    assert load_config(_write(tmp_path, to_toml(config))) == config


# ---------------------------------------------------------------- errors

BAD = [
    # (overrides, text that must appear in the message)
    (["model2.arch=mlp"], "model2"),                         # unknown section
    (["colour=1"], "colour"),                                # unknown top-level key
    (["train.epochs=3"], "train.epochs"),                    # unknown key
    (["data.num_client=3"], "data.num_client"),
    (["data.num_clients=0"], 'data.num_clients = 0: must be >= 1, or "auto"'),  # no magic 0
    (['data.num_clients="some"'], 'data.num_clients = \'some\': expected an integer, or "auto"'),
    (["train.rounds=\"ten\""], "train.rounds"),              # wrong type
    (["train.rounds=2.5"], "train.rounds"),
    (["train.lr=true"], "train.lr"),
    (["data.augment=1"], "data.augment"),
    (["model.hidden=64"], "model.hidden"),
    (["model.hidden=[0]"], "model.hidden"),
    (["model.hidden=[]"], "model.hidden"),
    (["seed=1.5"], "seed"),
    (["seed=-5"], "seed"),                                   # numpy seeds are non-negative ...
    (["seed=4294967296"], "seed"),                           # ... and < 2**32 for the legacy generator
    (["data.seed=-2"], "data.seed"),
    (["data.seed=4294967296"], "data.seed"),
    (["backend=\"gpu\""], "backend"),
    (["data.alpha=0"], "data.alpha"),                        # alpha <= 0
    (["data.alpha=-0.5"], "data.alpha"),
    (["train.participation=0"], "train.participation"),      # participation 0 or > 1
    (["train.participation=1.5"], "train.participation"),
    (["data.num_clients=-1"], "data.num_clients"),           # num_clients < 0 (0 = the data's own)
    (["data.num_clients=-3"], "data.num_clients"),
    (["data.dataset=\"mnist\""], "data.dataset"),            # unknown data set
    (["data.partition=\"random\""], "data.partition"),
    (["model.arch=\"vit\""], "model.arch"),
    (["server.lr=-0.5"], "server.lr"),                       # negative server lr other than -1
    (["server.lr=0"], "server.lr"),
    (["server.optimizer=\"lamb\""], "server.optimizer"),
    (["train.lr=0"], "train.lr"),
    (["data.test_fraction=0.95"], "data.test_fraction"),
    (["data.dataset=\"arrays\"", "data.partition=\"given\""], "data.path"),
    (["data.dataset=\"synthetic\"", "data.partition=\"dirichlet\""], "data.partition"),
    (["data.val_fraction=0.5", "data.local_test_fraction=0.5"], "data.val_fraction"),
    (["algorithm.name=3"], "algorithm.name"),
]


@pytest.mark.parametrize("overrides,key", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_input_is_one_config_error_naming_the_key(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    message = str(info.value)
    assert key in message
    assert "\n" not in message
    assert isinstance(info.value, UserInputError)


def test_server_lr_minus_one_means_default() -> None:
    assert load_config(None, ["server.lr=-1"]).server.lr == -1.0
    assert load_config(None, ["server.lr=0.5"]).server.lr == 0.5


def test_boundaries_that_are_allowed() -> None:
    config = load_config(None, ["train.participation=1", "data.num_clients=1", 'data.partition="dirichlet"',
                                "data.alpha=1e-6",
                                "seed=4294967295", "data.seed=-1"])
    assert (config.train.participation, config.data.num_clients, config.data.alpha) == (1.0, 1, 1e-6)
    assert (config.seed, config.data_seed) == (2**32 - 1, 2**32 - 1)


def test_errors_from_a_file_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key mdl\b"):
        load_config(_write(tmp_path, "[mdl]\narch = 'mlp'\n"))
    with pytest.raises(ConfigError, match=r"eval\.evry"):
        load_config(_write(tmp_path, "[eval]\nevry = 2\n"))
    with pytest.raises(ConfigError, match=r"\[data\]"):
        load_config(_write(tmp_path, "data = 3\n"))


def test_missing_file_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")
    bad = _write(tmp_path, "[train\nrounds = 3\n", "broken.toml")
    with pytest.raises(ConfigError, match="broken.toml"):
        load_config(bad)


def test_malformed_terms_are_rejected() -> None:
    with pytest.raises(ConfigError, match="terms"):
        from_dict({"terms": [{"mu": 1.0}]})
    with pytest.raises(ConfigError, match="terms"):
        from_dict({"terms": {"name": "prox"}})


# method keys are checked by the method registry (config.py knows no methods)

def test_bad_algorithm_name_is_a_config_error() -> None:
    config = load_config(None, ["algorithm.name=fedsgdx"])
    with pytest.raises(ConfigError, match="algorithm.name") as info:
        resolve(config.algorithm, config.terms)
    assert "fedsgdx" in str(info.value)


def test_unknown_algorithm_key_is_a_config_error() -> None:
    config = load_config(None, ["algorithm.name=fedprox", "algorithm.mux=0.1"])
    with pytest.raises(ConfigError, match=r"algorithm\.mux"):
        resolve(config.algorithm, config.terms)
    # the right key is accepted and typed
    ok = load_config(None, ["algorithm.name=fedprox", "algorithm.mu=1"])
    assert resolve(ok.algorithm, ok.terms).name == "fedprox"


@pytest.mark.parametrize("overrides,key", [
    (["algorithm.name=fedprox", "algorithm.mu=\"big\""], "algorithm.mu"),
    (["algorithm.name=fedprox", "algorithm.mu=-0.1"], "algorithm.mu"),
    (["algorithm.name=fedavg", "algorithm.mu=0.1"], "algorithm.mu"),
])
def test_bad_algorithm_values_are_config_errors(overrides: list[str], key: str) -> None:
    config = load_config(None, overrides)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        resolve(config.algorithm, config.terms)


def test_bad_algorithm_fails_run_before_touching_the_output(tmp_path: Path) -> None:
    config = load_config(None, ["algorithm.name=fedprox", "algorithm.mux=0.1"])
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"algorithm\.mux"):
        fedlatent.run(config, out)
    assert not out.exists()
