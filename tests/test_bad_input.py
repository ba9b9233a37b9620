"""The bad-input corpus: every case exits 2 with one line naming the key or file, no traceback,
and leaves no run directory behind (the errors are found before training starts)."""
from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from PIL import Image

from fedlatent.cli import main

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "configs" / "digits_fedavg.toml"
FAST = ["--set", "train.rounds=1", "--no-progress"]


def _sets(*overrides: str) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def _npz(tmp: Path, **change: object) -> Path:
    """A valid two-client arrays file with ``change`` applied (None removes a key)."""
    rng = np.random.default_rng(0)
    arrays: dict[str, object] = {}
    for i in range(2):
        arrays[f"client{i}_train_x"] = rng.normal(size=(20, 4)).astype(np.float32)
        arrays[f"client{i}_train_y"] = rng.integers(0, 3, 20)
    for key, value in change.items():
        if value is None:
            del arrays[key]
        else:
            arrays[key] = value
    path = tmp / "fed.npz"
    np.savez(path, **arrays)
    return path


def _arrays(path: Path) -> list[str]:
    return _sets("data.dataset=arrays", "data.partition=given", f"data.path={path}")


def _nan_features(tmp: Path) -> Path:
    x = np.zeros((20, 4), np.float32)
    x[3, 1] = np.nan
    return _npz(tmp, client1_train_x=x)


def _toml(tmp: Path, text: str) -> Path:
    path = tmp / "bad.toml"
    path.write_text(text)
    return path


def _not_utf8(tmp: Path) -> Path:
    path = tmp / "bad.toml"
    path.write_bytes(b"seed = \xff\n")
    return path


def _cifar_with_code(tmp: Path) -> Path:
    """A CIFAR-10 folder whose first batch is a pickle that would run a command when unpickled."""
    folder = tmp / "cifar-10-batches-py"
    folder.mkdir()
    marker = tmp / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (folder / "data_batch_1").write_bytes(pickle.dumps({b"data": Exploit(), b"labels": [0]}, protocol=2))
    return tmp


def _image(path: Path, size: tuple[int, int] = (8, 8)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (40, 80, 120)).save(path)
    return path


def _tree(tmp: Path, *extra: str) -> Path:
    """An image-folder tree of 8×8 PNGs: train/{airplane,cat}/0.png and the ``extra`` files."""
    for rel in ("train/airplane/0.png", "train/cat/0.png", *extra):
        _image(tmp / rel)
    return tmp


def _image_folder(root: Path, dataset: str = "image_folder") -> list[str]:
    return _sets(f"data.dataset={dataset}", f"data.root={root}")


def _broken_image(tmp: Path) -> Path:
    """A file with an image suffix that is no image."""
    path = _tree(tmp) / "train" / "cat" / "1.png"
    path.write_bytes(b"not a PNG")
    return path


def _domain_tree(tmp: Path) -> Path:
    for domain in ("art", "photo", "sketch"):
        for name in ("dog", "house"):
            _image(tmp / domain / name / "0.png")
            _image(tmp / domain / name / "1.png")
    return tmp


def _hf(tmp: Path, *overrides: str, write: bool = True, **change: object) -> list[str]:
    """The keys choosing the Hugging Face data set at ``tmp``: tests/test_huggingface.py's standard one
    written there as parquet files with ``change`` applied to its columns, or (``write`` False) ``tmp``
    as it is. Skipped without the datasets package (its absence is tested in tests/test_huggingface.py)."""
    pytest.importorskip("datasets")
    from tests.test_huggingface import standard
    root = standard(tmp, **change) if write else tmp
    return _sets("data.dataset=huggingface", f"data.root={root}", *overrides)


Case = Callable[[Path], tuple[list[str], str]]

# each case: (id, tmp_path -> (arguments after "run", text the error line must contain))
CASES: list[tuple[str, Case]] = [
    # ranges
    ("rounds-0", lambda t: ([str(DIGITS), *_sets("train.rounds=0")], "train.rounds")),
    ("clients-negative", lambda t: ([str(DIGITS), *_sets("data.num_clients=-1")], "data.num_clients")),
    ("batch-0", lambda t: ([str(DIGITS), *_sets("train.batch_size=0")], "train.batch_size")),
    ("lr-negative", lambda t: ([str(DIGITS), *_sets("train.lr=-0.1")], "train.lr")),
    ("lr-0", lambda t: ([str(DIGITS), *_sets("train.lr=0")], "train.lr")),
    ("alpha-0", lambda t: ([str(DIGITS), *_sets("data.alpha=0")], "data.alpha")),
    ("alpha-negative", lambda t: ([str(DIGITS), *_sets("data.alpha=-0.5")], "data.alpha")),
    ("participation-0", lambda t: ([str(DIGITS), *_sets("train.participation=0")], "train.participation")),
    ("participation-above-1", lambda t: ([str(DIGITS), *_sets("train.participation=1.5")], "train.participation")),
    ("momentum-above-1", lambda t: ([str(DIGITS), *_sets("train.momentum=1.5")], "train.momentum")),
    ("eval-every-0", lambda t: ([str(DIGITS), *_sets("eval.every=0")], "eval.every")),
    ("seed-negative", lambda t: ([str(DIGITS), *_sets("seed=-1")], "seed")),
    ("min-clients-negative", lambda t: ([str(DIGITS), *_sets("train.min_clients=-1")], "train.min_clients")),
    ("state-memory-nonsense", lambda t: ([str(DIGITS), *_sets('train.client_state_memory="lots"')],
                                         "train.client_state_memory")),
    ("state-memory-0", lambda t: ([str(DIGITS), *_sets("train.client_state_memory=0")], "train.client_state_memory")),
    ("state-memory-below-one-state", lambda t: ([str(DIGITS), *_sets('algorithm.name="scaffold"',
                                                                      'train.client_state_memory="1KiB"')],
                                                "below one client's state")),
    ("min-clients-above-sampled", lambda t: ([str(DIGITS), *_sets("train.min_clients=6", "train.participation=0.5")],
                                             "train.min_clients")),
    ("too-many-clients", lambda t: ([str(DIGITS), *_sets("data.num_clients=5000")], "data.num_clients")),
    # types
    ("rounds-float", lambda t: ([str(DIGITS), *_sets("train.rounds=2.5")], "train.rounds")),
    ("rounds-string", lambda t: ([str(DIGITS), *_sets('train.rounds="ten"')], "train.rounds")),
    ("bool-as-int", lambda t: ([str(DIGITS), *_sets("data.balance=1")], "data.balance")),
    ("hidden-zero", lambda t: ([str(DIGITS), *_sets("model.hidden=[0]")], "model.hidden")),
    ("section-not-a-table", lambda t: ([str(_toml(t, "[data]\ndataset = 'digits'\n")), *_sets("train=5")], "train")),
    # unknown names
    ("unknown-key", lambda t: ([str(DIGITS), *_sets("train.epochs=3")], "train.epochs")),
    ("unknown-section", lambda t: ([str(DIGITS), *_sets("optim.lr=0.1")], "optim")),
    ("unknown-method", lambda t: ([str(DIGITS), *_sets("algorithm.name=nosuch")], "algorithm.name")),
    ("unknown-method-key", lambda t: ([str(DIGITS), *_sets("algorithm.name=fedprox", "algorithm.mux=0.1")],
                                      "algorithm.mux")),
    ("unknown-term", lambda t: ([str(_toml(t, "[[terms]]\nname = 'nosuch'\n"))], "nosuch")),
    ("unknown-backend", lambda t: ([str(DIGITS), *_sets("backend=nosuch")], "backend")),
    ("backend-simulation-cannot-secaggplus", lambda t: ([str(DIGITS), *_sets("privacy.secure_aggregation=secaggplus")],
                                                        "(SecAgg+): honoured on backend = 'flower' only")),
    # keys the model cannot satisfy: found on its shape before the run starts, not in a client's round
    ("constraint-depth-beyond-the-model", lambda t: ([str(DIGITS), *_sets("algorithm.name=ditto_cosine",
                                                                         "algorithm.depth=9")], "cosine.depth = 9")),
    ("constraint-depth-beyond-the-model-drop-policy",
     lambda t: ([str(DIGITS), *_sets("algorithm.name=ditto_cosine", "algorithm.depth=9",
                                     "train.on_client_error=drop")], "cosine.depth = 9")),
    ("constraint-layer-not-in-the-model", lambda t: ([str(DIGITS), *_sets("algorithm.name=ditto_mkmmd",
                                                                         'algorithm.layers=["hidden7"]')], "hidden7")),
    ("decov-groups-beyond-z", lambda t: ([str(DIGITS), *_sets("algorithm.name=structured_decov",
                                                             "algorithm.groups=200")], "algorithm.groups")),
    ("orthogonal-head-wider-than-z", lambda t: ([str(DIGITS), *_sets("algorithm.head_init=orthogonal",
                                                                    "model.hidden=[4]")], "algorithm.head_init")),
    ("unknown-dataset", lambda t: ([str(DIGITS), *_sets("data.dataset=mnist")], "data.dataset")),
    ("unknown-nonfinite-policy", lambda t: ([str(DIGITS), *_sets("train.on_nonfinite=retry")], "train.on_nonfinite")),
    ("unknown-error-policy", lambda t: ([str(DIGITS), *_sets("train.on_client_error=retry")], "train.on_client_error")),
    ("device-not-a-device", lambda t: ([str(DIGITS), *_sets("train.device=gpu0")], "train.device")),
    ("device-unsupported-type", lambda t: ([str(DIGITS), *_sets("train.device=xla")], "train.device")),
    ("device-cuda-index-absent", lambda t: ([str(DIGITS), *_sets('train.device="cuda:99"')], "train.device")),
    # the configuration file and --set syntax
    ("malformed-toml", lambda t: ([str(_toml(t, "[train\nrounds = 3\n"))], "bad.toml")),
    ("missing-config", lambda t: ([str(t / "nope.toml")], "nope.toml")),
    ("config-is-a-folder", lambda t: ([str(t)], "is a folder")),
    ("config-not-utf8", lambda t: ([str(_not_utf8(t))], "bad.toml")),
    ("set-without-equals", lambda t: ([str(DIGITS), "--set", "train.rounds"], "train.rounds")),
    ("set-without-key", lambda t: ([str(DIGITS), "--set", "=5"], "--set")),
    ("set-empty-path-part", lambda t: ([str(DIGITS), "--set", "train..rounds=1"], "train..rounds")),
    ("set-below-a-value", lambda t: ([str(DIGITS), "--set", "train.lr.x=1"], "lr")),
    # arrays files
    ("arrays-without-path", lambda t: ([str(DIGITS), *_sets("data.dataset=arrays", "data.partition=given")],
                                       "data.path")),
    ("arrays-missing-file", lambda t: ([str(DIGITS), *_arrays(t / "none.npz")], "none.npz")),
    ("arrays-path-is-folder", lambda t: ([str(DIGITS), *_arrays(t)], "data.path")),
    ("arrays-not-npz", lambda t: ([str(DIGITS), *_arrays(_toml(t, "not an archive"))], "bad.toml")),
    ("arrays-missing-key", lambda t: ([str(DIGITS), *_arrays(_npz(t, client1_train_y=None))], "client1_train_y")),
    ("arrays-mismatched-lengths", lambda t: ([str(DIGITS), *_arrays(_npz(t, client0_train_y=np.zeros(7, int)))],
                                             "client0_train_x")),
    ("arrays-nan-features", lambda t: ([str(DIGITS), *_arrays(_nan_features(t))], "client1_train_x")),
    ("arrays-inf-features", lambda t: ([str(DIGITS), *_arrays(_npz(t, client0_train_x=np.full((20, 4), np.inf)))],
                                       "client0_train_x")),
    ("arrays-float-labels", lambda t: ([str(DIGITS), *_arrays(_npz(t, client0_train_y=np.zeros(20)))],
                                       "client0_train_y")),
    ("arrays-string-labels", lambda t: ([str(DIGITS), *_arrays(_npz(t, client0_train_y=np.array(["a"] * 20)))],
                                        "client0_train_y")),
    ("arrays-negative-labels", lambda t: ([str(DIGITS), *_arrays(_npz(t, client1_train_y=-np.ones(20, int)))],
                                          "client1_train_y")),
    ("arrays-out-of-range-labels", lambda t: ([str(DIGITS), *_arrays(_npz(t, client1_train_y=np.full(20, 10**9)))],
                                              "fed.npz")),
    ("arrays-ragged-features", lambda t: ([str(DIGITS), *_arrays(_npz(t, client1_train_x=np.zeros((20, 5))))],
                                          "client1_train_x")),
    ("arrays-1d-features", lambda t: ([str(DIGITS), *_arrays(_npz(t, client0_train_x=np.zeros(20)))],
                                      "client0_train_x")),
    ("arrays-empty-client", lambda t: ([str(DIGITS), *_arrays(_npz(t, client1_train_x=np.zeros((0, 4)),
                                                                   client1_train_y=np.zeros(0, int)))],
                                       "client1_train_x")),
    ("arrays-object-array", lambda t: ([str(DIGITS), *_arrays(_npz(t, client0_train_x=np.array([{}] * 20)))],
                                       "data.path")),
    # image folders
    ("root-missing", lambda t: ([str(DIGITS), *_sets("data.dataset=domains", f"data.root={t / 'nope'}")], "data.root")),
    ("root-is-a-file", lambda t: ([str(DIGITS), *_sets("data.dataset=cifar10", f"data.root={DIGITS}")], "data.root")),
    ("domains-empty", lambda t: ([str(DIGITS), *_sets("data.dataset=domains", f"data.root={t}")], "data.root")),
    ("cifar-folder-missing", lambda t: ([str(DIGITS), *_sets("data.dataset=cifar10", f"data.root={t}")],
                                       "cifar-10-batches-py")),
    ("stl10-folder-missing", lambda t: ([str(DIGITS), *_sets("data.dataset=stl10", f"data.root={t}")], "stl10_binary")),
    ("tree-without-train", lambda t: ([str(DIGITS), *_image_folder(_image(t / "test" / "cat" / "0.png").parents[2])],
                                      str(t / "train"))),
    ("tree-test-class-not-in-train", lambda t: ([str(DIGITS), *_image_folder(_tree(t, "test/zebra/0.png"))],
                                                str(t / "test" / "zebra"))),
    ("tree-unreadable-image", lambda t: ([str(DIGITS), *_image_folder(_broken_image(t).parents[2])],
                                         str(t / "train" / "cat" / "1.png"))),
    ("tree-sizes-differ", lambda t: ([str(DIGITS), *_image_folder(_tree(t, "train/cat/1.png")),
                                      *_sets("data.image_size=0")],
                                     str(_image(t / "train" / "cat" / "1.png", (8, 9))))),
    ("tree-test-size-differs", lambda t: ([str(DIGITS), *_image_folder(_tree(t, "test/cat/0.png"))],
                                          str(_image(t / "test" / "cat" / "0.png", (16, 16))))),
    ("tree-not-square", lambda t: ([str(DIGITS), *_image_folder(_tree(t))],
                                   str(_image(t / "train" / "airplane" / "0.png", (8, 12))))),
    ("cifar10-tree-unknown-class", lambda t: ([str(DIGITS), *_image_folder(_tree(t, "train/zebra/0.png"), "cifar10")],
                                              str(t / "train" / "zebra"))),
    ("domains-num-clients-differs", lambda t: ([str(DIGITS), *_sets("data.dataset=domains", "data.partition=domains",
                                                                    f"data.root={_domain_tree(t)}",
                                                                    "data.num_clients=2")],
                                               "data.num_clients = 2")),
    ("cifar-pickle-with-code", lambda t: ([str(DIGITS), *_sets("data.dataset=cifar10",
                                                               f"data.root={_cifar_with_code(t)}")], "data_batch_1")),
    # Hugging Face datasets
    ("hf-root-missing", lambda t: ([str(DIGITS), *_hf(t / "nope", write=False)], "data.root")),
    ("hf-root-neither-layout", lambda t: ([str(DIGITS), *_hf(t, write=False)], "save_to_disk")),
    ("hf-column-missing", lambda t: ([str(DIGITS), *_hf(t, "data.image_column=pixels")], "its columns: image")),
    ("hf-split-missing", lambda t: ([str(DIGITS), *_hf(t, "data.train_split=training")], "its splits: test, train")),
    ("hf-test-split-missing", lambda t: ([str(DIGITS), *_hf(t, "data.test_split=validation")], "data.test_split")),
    ("hf-text-column", lambda t: ([str(DIGITS), *_hf(t, "data.image_column=caption", caption=lambda n: ["a cat"] * n)],
                                  "neither images")),
    ("hf-float-labels", lambda t: ([str(DIGITS), *_hf(t, label=lambda n: [0.5] * n)], "not integer class labels")),
    ("hf-string-labels", lambda t: ([str(DIGITS), *_hf(t, label=lambda n: ["cat"] * n)], "not integer class labels")),
    ("hf-negative-labels", lambda t: ([str(DIGITS), *_hf(t, label=lambda n: [-1] * n)], "the label -1")),
    ("hf-no-label-column", lambda t: ([str(DIGITS), *_hf(t, label=None)], "data.label_column")),
    ("hf-image-size-for-arrays", lambda t: ([str(DIGITS), *_hf(t, "data.image_column=v", "data.image_size=16",
                                                               v=lambda n: [[0.0, 1.0]] * n)], "data.image_size")),
    # the output folder
    ("out-is-a-file", lambda t: ([str(DIGITS), "--out", str(DIGITS)], "--out")),
    ("out-parent-missing", lambda t: ([str(DIGITS), "--out", str(t / "a" / "b")], "--out")),
    ("resume-nothing", lambda t: ([str(DIGITS), "--resume"], "--resume")),
]


@pytest.mark.parametrize("make", [c for _, c in CASES], ids=[i for i, _ in CASES])
def test_bad_input_exits_2_with_one_line_and_no_run_directory(make: Case, tmp_path: Path, capsys) -> None:
    data = tmp_path / "data"
    data.mkdir()
    args, names = make(data)
    out = tmp_path / "run"
    if "--out" not in args:
        args = [*args, "--out", str(out)]
    assert main(["run", *FAST, *args]) == 2  # the case's own --set comes last and wins
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedlatent: error:"), err
    assert "Traceback" not in err
    assert names in lines[0], (names, lines[0])
    assert not out.exists()
    assert not (data / "pwned").exists()                # a pickle that runs code was refused, not run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= 40 and len({i for i, _ in CASES}) == len(CASES)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc (unwritable even for root)")
def test_unwritable_out_exits_2(capsys) -> None:
    assert main(["run", str(DIGITS), "--out", "/proc/fedlatent-run", *FAST]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "--out /proc/fedlatent-run" in line and "cannot write" in line


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(["run", str(DIGITS), "--out", str(out), *FAST]) == 0
    return out


@pytest.mark.parametrize("extra,names", [
    ([], "--resume"),                                                 # a run already there, no --resume
    (["--resume", "--set", "train.lr=0.1"], "configuration differs"),  # --resume with another config
])
def test_bad_use_of_an_existing_run_changes_nothing(finished_run: Path, capsys, extra: list[str], names: str) -> None:
    before = {p: p.read_bytes() for p in sorted(finished_run.rglob("*")) if p.is_file()}
    capsys.readouterr()
    assert main(["run", str(DIGITS), "--out", str(finished_run), *FAST, *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and names in lines[0]
    assert {p: p.read_bytes() for p in sorted(finished_run.rglob("*")) if p.is_file()} == before


SUBPROCESS_CASES = ["malformed-toml", "arrays-nan-features", "out-is-a-file"]  # in CASES order


@pytest.mark.slow
@pytest.mark.parametrize("make", [c for i, c in CASES if i in SUBPROCESS_CASES], ids=SUBPROCESS_CASES)
def test_console_entry_point_gives_the_same_single_line(make: Case, tmp_path: Path) -> None:
    """The real process: exit status 2 and one stderr line, no traceback from the interpreter."""
    args, names = make(tmp_path)
    out = tmp_path / "run"
    if "--out" not in args:
        args = [*args, "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-m", "fedlatent.cli", "run", *FAST, *args],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == ""
    assert not out.exists()


def test_unreadable_data_exits_2_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Permissions cannot be taken from root (the test machines' user), so the refusals are simulated."""
    from fedlatent.data import sources

    root = tmp_path / "images"
    root.mkdir()
    monkeypatch.setattr(sources.os, "access", lambda path, mode: Path(path) != root)
    out = tmp_path / "run"
    assert main(["run", *FAST, str(DIGITS), *_sets("data.dataset=domains", f"data.root={root}"), "--out", str(out)]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and f"data.root = '{root}': not readable" in line

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "fed.npz"))

    monkeypatch.setattr(sources.np, "load", denied)
    assert main(["run", *FAST, str(DIGITS), *_arrays(_npz(tmp_path)), "--out", str(out)]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "data.path" in line and "fed.npz" in line and "Permission denied" in line
    assert not out.exists()


def test_folders_under_runs_are_created_but_elsewhere_a_missing_parent_is_refused(tmp_path: Path, monkeypatch,
                                                                                   capsys) -> None:
    """A fresh clone has no runs/: `--out runs/a/b` makes it (where runs go by default), while a
    mistyped path elsewhere is one line and exit 2."""
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(DIGITS), "--no-progress", *_sets("train.rounds=1"), "--out", "runs/a/b"]) == 0
    assert (tmp_path / "runs" / "a" / "b" / "summary.json").is_file()
    capsys.readouterr()
    assert main(["run", str(DIGITS), "--no-progress", *_sets("train.rounds=1"), "--out", "results/a/b"]) == 2
    assert "its parent folder results/a does not exist" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("overrides,message", [
    (["algorithm.name=ditto_cosine", "algorithm.depth=9"], "cosine.depth = 9: this model has 1 constrainable"),
    (["algorithm.name=ditto_mmdd", 'algorithm.layers=["z", "hidden7"]'], "mmd_d.layers: 'hidden7' is not a feature"),
    (["algorithm.name=structured_decov", "algorithm.groups=200"], "algorithm.groups = 200 exceeds the 128"),
    (["algorithm.head_init=orthogonal", "model.hidden=[4]"], "algorithm.head_init = 'orthogonal': 10 classes"),
])
def test_keys_the_model_cannot_satisfy_are_refused_by_prepare(overrides: list[str], message: str) -> None:
    """Found on the model's shape by ``prepare``, before ``run`` makes the run's folder; no longer in
    a client's first round, where the failure policy took the error for the client's and "drop"
    ended the run as a success with every client dropped."""
    from fedlatent import load_config
    from fedlatent.errors import ConfigError
    from fedlatent.experiment.runner import single

    with pytest.raises(ConfigError, match=re.escape(message)):
        single.prepare(load_config(DIGITS, overrides))


def test_a_depth_the_model_has_passes_prepare_with_its_layers_resolved() -> None:
    from fedlatent import load_config
    from fedlatent.experiment.runner import single

    _, spec = single.prepare(load_config(DIGITS, ["algorithm.name=ditto_cosine", "algorithm.depth=2",
                                                  "model.hidden=[32, 16]"]))
    (part,) = spec.all_parts()
    assert part.layers == ("z", "hidden1")
