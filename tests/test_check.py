"""``fedlatent check CONFIG|SPEC``: validates as ``run`` and a sweep do before training (the data's
labels and counts, ``--no-data`` without them), creating no folder; prints every resolved key of a
configuration, or a spec's common keys and one row per cell with the keys that differ; any error is
one line and exit code 2, the line ``run`` prints."""
from __future__ import annotations

from pathlib import Path

import pytest

from fedlatent.cli import main
from fedlatent.config import load_config, show_value
from fedlatent.experiment.studies import reproduce
from fedlatent.methods import flat_settings

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture
def empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory, so that a folder the command made would show."""
    folder = tmp_path / "cwd"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.setenv("FEDLATENT_CACHE_DIR", str(tmp_path / "cache"))
    return folder


def _settings(out: str) -> dict[str, str]:
    return {k.strip(): v.strip() for k, _, v in (line.partition(" = ") for line in out.splitlines()[1:])}


def test_a_config_prints_every_resolved_key_and_makes_nothing(empty_cwd: Path, capsys: pytest.CaptureFixture) -> None:
    path = CONFIGS / "feduv" / "cifar100_a0.01.toml"  # its CIFAR-100 is not on the test machines
    assert main(["check", str(path), "--no-data"]) == 0
    settings = _settings(capsys.readouterr().out)
    expected = flat_settings(load_config(path))
    assert settings == {k: show_value(v) for k, v in expected.items()}  # every key, values as resolved
    assert (settings["model.stem"], settings["train.batch_size"], settings["algorithm.lam"]) == ("imagenet_nopool", "128", "25.0")
    assert settings["algorithm.hinge"] == "hinge"  # a preset default the file does not write
    assert list(empty_cwd.iterdir()) == [] and not (empty_cwd.parent / "cache").exists()


def test_set_applies_before_validation(empty_cwd: Path, capsys: pytest.CaptureFixture) -> None:
    path = CONFIGS / "rxrx1" / "ditto.toml"
    assert main(["check", str(path), "--set", "train.lr=0.5", "--no-data"]) == 0
    assert _settings(capsys.readouterr().out)["train.lr"] == "0.5"


def test_a_spec_by_name_prints_common_keys_and_a_row_per_cell(empty_cwd: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["check", "ditto_table2", "--no-data"]) == 0
    out = capsys.readouterr().out
    study = reproduce.load_spec("ditto_table2")
    head, _, table = out.partition("one row per cell:\n")
    assert f"{len(study.cells)} valid cells" in head
    assert "  data.val_fraction" in head and "= 0.0" in head  # common to every cell: in the header
    lines = table.strip().splitlines()
    columns = [c.strip() for c in lines[0].strip("|").split("|")]
    assert columns[0] == "cell" and {"train.lr", "algorithm.lam", "algorithm.mu", "data.dataset",
                                     "model.softmax_output"} <= set(columns)
    assert "data.val_fraction" not in columns  # the same everywhere: not a column
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")] for r in lines[2:]}
    assert len(rows) == len(study.cells)
    row = rows["setting-isic2019_method-ditto+mmdd_seed-2021"]  # Table 3: lr 1e-3, λ 1.0, μ 1.0
    assert [row[columns.index(k)] for k in ("train.lr", "algorithm.lam", "algorithm.mu")] == ["0.001", "1.0", "1.0"]
    softmax = columns.index("model.softmax_output")  # the release's model output per data set
    assert (row[softmax], rows["setting-synthetic05_method-ditto+mmdd_seed-2021"][softmax]) == ("false", "true")
    assert list(empty_cwd.iterdir()) == []


def test_a_study_file_and_a_tier(empty_cwd: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["check", str(CONFIGS / "studies" / "digits_fedavg_feddecorr.toml")]) == 0
    assert "valid cells" in capsys.readouterr().out
    assert main(["check", "spherefed_table3", "--tier", "quick"]) == 0
    assert "(quick tier)" in capsys.readouterr().out


@pytest.mark.parametrize("args, says", [
    (["BAD_KEY"], "unknown key train.lr2"),
    (["feduv_table1", "--set", "model.nope=1"], "model.nope"),
    (["no_such_spec"], "neither a file nor a spec name"),
    (["CONFIG", "--tier", "quick"], "--tier quick applies to a spec"),
    # what run checks before reading data, check checks too: a key the model cannot satisfy, whatever the policy
    (["DIGITS", "--set", "algorithm.name=ditto_cosine", "--set", "algorithm.depth=9"], "cosine.depth = 9"),
    (["DIGITS", "--set", "algorithm.name=ditto_cosine", "--set", "algorithm.depth=9", "--set",
      "train.on_client_error=drop"], "cosine.depth = 9"),
    (["DIGITS", "--set", "backend=vectorized", "--set", "train.compile=true"],
     "train.compile = true (compiled forward): honoured on backend"),
    (["feduv_table1", "--set", "algorithm.name=ditto_cosine", "--set", "algorithm.depth=40"], "cell "),
])
def test_errors_are_one_line_exit_2_and_make_nothing(args: list[str], says: str, empty_cwd: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    bad = empty_cwd.parent / "bad.toml"
    bad.write_text("[train]\nlr2 = 1\n")
    args = [{"BAD_KEY": str(bad), "CONFIG": str(CONFIGS / "ditto" / "release_ditto.toml"),
             "DIGITS": str(CONFIGS / "digits_fedavg.toml")}.get(a, a) for a in args]
    assert main(["check", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedlatent: error:") and says in err[0], err
    assert list(empty_cwd.iterdir()) == []


def test_every_spec_checks(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's acceptance: ``fedlatent check`` on each spec prints its cells' settings and exits 0
    (``--no-data``: the specs' data sets are not on the test machines). The specs' 1304 model-fit checks build
    25 distinct meta-device models: each is built once here (most of the
    test's time was rebuilding the same MobileNets and ResNets), every cell still checked against it."""
    from fedlatent.experiment.runner import validation

    built: dict[str, object] = {}
    real_build = validation.build_model

    def build_once(model, input_shape, num_classes, dataset):
        key = repr((model, tuple(input_shape), num_classes, dataset))
        if key not in built:
            built[key] = real_build(model, input_shape, num_classes, dataset)
        return built[key]

    monkeypatch.setattr(validation, "build_model", build_once)
    for name in reproduce.spec_names():
        assert main(["check", name, "--no-data"]) == 0, name
        assert "valid cells" in capsys.readouterr().out


def test_the_backends_the_schema_declares_are_the_ones_a_run_has() -> None:
    """``backend``'s allowed values are declared once (the configuration's schema): each but
    ``auto`` is a backend a run can hand its rounds to, and a value set in code after loading is
    refused by the validation in one line."""
    import dataclasses

    from fedlatent.config import load_config
    from fedlatent.errors import ConfigError
    from fedlatent.experiment.runner.single import BACKENDS
    from fedlatent.experiment.runner.validation import BACKEND_NAMES, validate

    assert set(BACKEND_NAMES) == {"auto", *BACKENDS}
    config = dataclasses.replace(load_config(None, []), backend="ray")
    with pytest.raises(ConfigError, match=r"^backend = 'ray': allowed values are auto, simulation, vectorized, flower$"):
        validate(config)


DIGITS = str(CONFIGS / "digits_fedavg.toml")


@pytest.mark.parametrize("sets, says", [
    (["data.partition=shards", "data.classes_per_client=20"],
     "data.classes_per_client = 20: the data set has only 10 classes"),
    (["data.num_clients=5000"], "data.num_clients = 5000: more clients than the 1437 training samples"),
    (["data.dataset=cifar10", "data.root=/nonexistent"], "data.root = '/nonexistent': folder not found"),
    (["data.partition=dirichlet", "data.alpha=0.05", "data.num_clients=30", "data.min_size=5"],
     "no Dirichlet partition with every client holding >= 5 samples"),
    (["train.min_clients=11"], "train.min_clients = 11: more than the 10 clients sampled per round"),
    (["train.batch_size=500", "train.drop_last=true"],  # every client of digits' 10 holds fewer than 500
     "train.batch_size = 500 with train.drop_last = true: client"),
    (["data.holdout_clients=2"], "data.holdout_clients: held-out client(s)"),  # no local_test_fraction
])
def test_check_refuses_what_run_refuses_in_the_same_line(sets: list[str], says: str, empty_cwd: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    """What a run refuses once it has read its data, ``check`` refuses with the same line, exit 2,
    and neither leaves a folder behind."""
    overrides = [a for s in sets for a in ("--set", s)]
    assert main(["check", DIGITS, *overrides]) == 2
    checked = capsys.readouterr().err.strip().splitlines()
    assert main(["run", DIGITS, *overrides, "--out", str(empty_cwd / "run"), "--no-progress"]) == 2
    ran = capsys.readouterr().err.strip().splitlines()
    assert checked == ran and len(checked) == 1 and says in checked[0], (checked, ran)
    assert list(empty_cwd.iterdir()) == []
    assert main(["check", DIGITS, *overrides, "--no-data"]) == 0  # a refusal only the data can make


@pytest.mark.parametrize("sets", [["data.val_fraction=0.1", "data.local_test_fraction=0.2"],
                                  ["data.partition=dirichlet", "data.alpha=0.3", "data.local_test_fraction=0.15"]])
def test_the_outline_counts_each_clients_samples_as_the_federation_splits_them(sets: list[str]) -> None:
    """``check`` judges batch sizes and held-out test splits on the outline's counts: they are the
    built federation's, client by client."""
    from fedlatent.data.federation import build_federation, outline
    config = load_config(Path(DIGITS), sets)
    built = build_federation(config.data, config.data_seed)
    assert outline(config.data, config.data_seed).client_sizes == tuple(
        (len(c.train), len(c.test) if c.test is not None else 0) for c in built.clients)


def test_drop_last_with_a_batch_every_client_fills_is_accepted(empty_cwd: Path) -> None:
    assert main(["check", DIGITS, "--set", "train.batch_size=64", "--set", "train.drop_last=true"]) == 0


def test_check_accepts_the_valid_digits_configuration(empty_cwd: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["check", DIGITS]) == 0
    assert "a valid configuration" in capsys.readouterr().out
    assert list(empty_cwd.iterdir()) == []


def _png(path: Path, side: int) -> None:
    from PIL import Image
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (side, side), (10, 20, 30)).save(path)


def test_an_image_tree_is_checked_from_its_listing(tmp_path: Path, empty_cwd: Path, capsys: pytest.CaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """An image-folder tree's partition is checked from its listing: no image is decoded (but the
    first, whose size is the input shape when ``data.image_size`` is unset), no cache written."""
    from fedlatent.data import readers
    from fedlatent.data.readers import image_folders
    root = tmp_path / "tree"
    for split, count in (("train", 6), ("test", 2)):
        for label in ("a", "b", "c"):
            for i in range(count):
                _png(root / split / label / f"{i}.png", 4)
    decoded: list[int] = []
    real = readers.read_images
    for module in (readers, image_folders):
        monkeypatch.setattr(module, "read_images",
                            lambda paths, *a, **k: decoded.append(len(paths)) or real(paths, *a, **k))
    base = [DIGITS, "--set", "data.dataset=image_folder", "--set", f"data.root={root}"]
    assert main(["check", *base, "--set", "data.num_clients=3"]) == 0
    assert main(["check", *base, "--set", "data.num_clients=19"]) == 2
    assert "data.num_clients = 19: more clients than the 18 training samples" in capsys.readouterr().err
    assert decoded == [1, 1] and not (empty_cwd.parent / "cache").exists()


def test_a_study_gets_the_data_checks_and_reads_shared_data_once(tmp_path: Path, empty_cwd: Path,
                                                                 capsys: pytest.CaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Every cell of a study is checked against its data, the failing cell named; cells that share
    their data set read it once."""
    from fedlatent.data.registry import DATASETS
    entry = DATASETS.get("digits")
    loads: list[str] = []
    monkeypatch.setattr(entry, "build", lambda cfg, seed, real=entry.build: loads.append(cfg.dataset) or real(cfg, seed))
    study = tmp_path / "study.toml"
    study.write_text(f'''title = "clients"
base = "{DIGITS}"
[grid]
"data.num_clients" = [10, 2000]
"train.lr" = [0.05, 0.1]
''')
    assert main(["check", str(study)]) == 2
    err = capsys.readouterr().err
    assert "data.num_clients = 2000: more clients than the 1437 training samples" in err and "cell " in err
    assert loads == ["digits"]  # the cells with 10 clients and the first with 2,000 read it once
    assert main(["check", str(study), "--no-data"]) == 0
