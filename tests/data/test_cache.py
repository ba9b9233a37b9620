"""The decoded-image cache (fedlatent.data.cache): a tree is decoded once and memory-mapped after;
a changed tree or other parameters are a new entry; off, unwritable and full caches never fail a
load; ``fedlatent cache`` lists and clears; the stored structure comes back as it went in. Every
test points FEDLATENT_CACHE_DIR at a folder of its own."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedlatent.cli import main
from fedlatent.config import DataConfig
from fedlatent.data import cache
from fedlatent.data.readers import _common
from fedlatent.data.registry import DATASETS
from fedlatent.data.sources import Pool
from fedlatent.data.types import ImageSet


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("FEDLATENT_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The image files decoded since the test began or the list was cleared (the readers' one
    decoding function, watched; a reader may open a file twice, so compare sets)."""
    seen: list[Path] = []
    real = _common.read_image

    def counted(path, *args, **kwargs):
        seen.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(_common, "read_image", counted)
    return seen


def _solid(path: Path, value: int, size: int = 8) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (size, size), (value, 255 - value, 3)).save(path)


def _tree(root: Path) -> Path:
    """train/a (3 images), train/b (2), test/a (1), test/b (1): 7 solid 8×8 PNGs."""
    value = 10
    for split, counts in (("train", {"a": 3, "b": 2}), ("test", {"a": 1, "b": 1})):
        for name, n in counts.items():
            for i in range(n):
                _solid(root / split / name / f"{i}.png", value)
                value += 10
    return root


def _files(root: Path) -> set[Path]:
    """Every visible image of a tree."""
    return {p for p in root.rglob("*.png") if not p.name.startswith(".")}


def _load(root: Path, **data: object) -> Pool:
    return DATASETS.get("image_folder").build(DataConfig(dataset="image_folder", root=str(root), **data), 0)


def _entries() -> list[str]:
    return [p.name for p, _ in cache.entries()]


def test_the_first_load_decodes_and_stores_later_loads_memory_map(tmp_path: Path, cache_dir: Path, decodes,
                                                                   monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    root = _tree(tmp_path / "tree")
    first = _load(root)
    assert set(decodes) == _files(root) and len(_files(root)) == 7 and len(_entries()) == 1
    entry = cache_dir / "decoded" / _entries()[0]
    assert (entry / "tree.json").is_file() and list(entry.glob("*.npy"))
    assert not isinstance(first.x, np.memmap)
    assert "decoded once" in capsys.readouterr().err

    def refuse(*args, **kwargs):
        raise AssertionError("decoded although the tree is in the cache")

    monkeypatch.setattr(_common, "read_image", refuse)
    second = _load(root)
    err = capsys.readouterr().err
    assert "read from the cache" in err and str(entry) in err
    for key in ("x", "y", "test_x", "test_y"):
        np.testing.assert_array_equal(getattr(second, key), getattr(first, key), err_msg=key)
        assert getattr(second, key).dtype == getattr(first, key).dtype
    assert isinstance(second.x, np.memmap) and isinstance(second.test_x, np.memmap)
    assert second.num_classes == first.num_classes == 2
    assert _entries() == [entry.name]
    second.x[:] = 0  # copy on write: a run that changes its arrays does not change the entry
    np.testing.assert_array_equal(_load(root).x, first.x)


def _touch_later(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


def test_a_changed_tree_or_other_parameters_are_a_new_entry(tmp_path: Path, cache_dir: Path, decodes) -> None:
    root = _tree(tmp_path / "tree")
    base = _load(root)
    assert len(_entries()) == 1

    decodes.clear()  # a file rewritten (new content, later mtime)
    changed = root / "train" / "a" / "0.png"
    _solid(changed, 250)
    _touch_later(changed)
    modified = _load(root)
    assert set(decodes) == _files(root) and len(_entries()) == 2
    assert modified.x[0, 0, 0, 0] == 250 and base.x[0, 0, 0, 0] != 250

    decodes.clear()  # a file added
    _solid(root / "train" / "b" / "9.png", 99)
    added = _load(root)
    assert set(decodes) == _files(root) and len(_files(root)) == 8 and len(_entries()) == 3 and len(added.y) == len(base.y) + 1

    decodes.clear()  # a file removed
    (root / "train" / "a" / "1.png").unlink()
    removed = _load(root)
    assert set(decodes) == _files(root) and len(_files(root)) == 7 and len(_entries()) == 4 and len(removed.y) == len(base.y)

    decodes.clear()  # only the modification time
    _touch_later(root / "test" / "b" / "0.png")
    _load(root)
    assert set(decodes) == _files(root) and len(_entries()) == 5

    decodes.clear()  # another image_size
    resized = _load(root, image_size=16)
    assert set(decodes) == _files(root) and len(_entries()) == 6 and resized.x.shape[1:] == (3, 16, 16)

    decodes.clear()  # nothing changed: every variant is read back, none decoded
    assert _load(root, image_size=16).x.shape[1:] == (3, 16, 16)
    np.testing.assert_array_equal(_load(root).x, removed.x)
    assert decodes == [] and len(_entries()) == 6


def test_the_same_tree_read_as_another_data_set_is_another_entry(tmp_path: Path, cache_dir: Path) -> None:
    root = tmp_path / "tree"
    for split, name in (("train", "cat"), ("train", "ship"), ("test", "cat")):
        _solid(root / split / name / "0.png", 40, size=32)
    generic = _load(root)
    cifar = DATASETS.get("cifar10").build(DataConfig(dataset="cifar10", root=str(root)), 0)
    assert generic.y.tolist() == [0, 1] and cifar.y.tolist() == [3, 8]  # not each other's labels
    assert len(_entries()) == 2
    calls = []
    for what in ("reader_one", "reader_two", "reader_one"):  # same folder and parameters, another reader
        cache.decoded(what, "the tree", root, {}, lambda w=what: calls.append(w) or [w])
    assert calls == ["reader_one", "reader_two"] and len(_entries()) == 4


def test_hidden_files_are_neither_read_nor_fingerprinted(tmp_path: Path, cache_dir: Path, decodes) -> None:
    """macOS copies carry ``._name.png`` files that are no images; hidden files are skipped by the
    reader and by the fingerprint alike (else the cache could return a tree the reader reads otherwise)."""
    root = _tree(tmp_path / "tree")
    (root / "train" / "a" / "._0.png").write_bytes(b"\x00\x05\x16\x07AppleDouble")
    _solid(root / "train" / "b" / ".hidden.png", 200)
    pool = _load(root)
    assert len(pool.y) == 5 and 200 not in pool.x[:, 0, 0, 0] and set(decodes) == _files(root)
    decodes.clear()
    (root / "train" / "b" / ".hidden.png").unlink()
    _load(root)
    assert decodes == [] and len(_entries()) == 1


def test_off_writes_nothing_and_decodes_every_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decodes,
                                                   capsys) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("FEDLATENT_CACHE_DIR", "off")
    monkeypatch.chdir(tmp_path)  # "off" is no folder name either
    root = _tree(tmp_path / "tree")
    first = _load(root)
    assert set(decodes) == _files(root)
    decodes.clear()
    second = _load(root)
    assert set(decodes) == _files(root)
    np.testing.assert_array_equal(first.x, second.x)
    assert not isinstance(second.x, np.memmap)
    assert list(home.iterdir()) == []
    assert cache.cache_root() is None and cache.entries() == []
    capsys.readouterr()
    assert main(["cache"]) == 0 and "off" in capsys.readouterr().out
    assert main(["cache", "--clear"]) == 0 and "off" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "tree"]


def test_an_unwritable_cache_folder_does_not_fail_the_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           decodes, capsys) -> None:
    root = _tree(tmp_path / "tree")
    blocker = tmp_path / "a-file"
    blocker.write_text("the cache folder cannot be made below a file (root may write anywhere else)")
    monkeypatch.setenv("FEDLATENT_CACHE_DIR", str(blocker / "cache"))
    first = _load(root)
    decodes.clear()
    second = _load(root)
    assert set(decodes) == _files(root) and first.x.shape == (5, 3, 8, 8)  # decoded again: nothing was stored
    np.testing.assert_array_equal(first.x, second.x)
    assert blocker.is_file() and cache.entries() == []
    err = capsys.readouterr().err
    assert "could not be written" in err and "later runs read the cache" not in err


def test_a_full_disk_leaves_no_partial_entry(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                             decodes) -> None:
    root = _tree(tmp_path / "tree")
    real_save = np.save
    calls = []

    def full(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:  # the first array is written, the second finds the disk full
            raise OSError(28, "No space left on device")
        return real_save(path, *args, **kwargs)

    monkeypatch.setattr(cache.np, "save", full)
    pool = _load(root)
    assert len(pool.y) == 5 and len(calls) == 2
    assert list((cache_dir / "decoded").iterdir()) == []  # nor the staging folder
    monkeypatch.setattr(cache.np, "save", real_save)
    decodes.clear()
    _load(root)  # decoded again, stored this time
    assert set(decodes) == _files(root) and len(_entries()) == 1


def test_the_cache_command_lists_and_clears(tmp_path: Path, cache_dir: Path, capsys) -> None:
    assert main(["cache"]) == 0
    assert "0 decoded data set(s)" in capsys.readouterr().out
    _load(_tree(tmp_path / "tree"))
    (name,) = _entries()
    capsys.readouterr()
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert name in out and "1 decoded data set(s)" in out and str(cache_dir / "decoded") in out
    assert main(["cache", "--clear"]) == 0
    assert "deleted 1" in capsys.readouterr().out
    assert cache.entries() == [] and not (cache_dir / "decoded").exists()
    assert main(["cache"]) == 0 and "0 decoded data set(s)" in capsys.readouterr().out


def _same(a: object, b: object, where: str = "value") -> None:
    """Equal, and of the same container types all the way down."""
    if isinstance(a, ImageSet):
        assert type(b) is ImageSet, where
        for name in ("x", "y", "class_names", "domain", "domain_names"):
            _same(getattr(a, name), getattr(b, name), f"{where}.{name}")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, where
        np.testing.assert_array_equal(a, b, err_msg=where)
    elif isinstance(a, (list, tuple)):
        assert type(b) is type(a) and len(b) == len(a), where
        for i, (u, v) in enumerate(zip(a, b)):
            _same(u, v, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert type(b) is dict and list(b) == list(a), where  # keys and their order
        for k in a:
            _same(a[k], b[k], f"{where}[{k!r}]")
    else:
        assert type(b) is type(a) and b == a, (where, a, b)


def test_the_stored_structure_comes_back_as_it_went_in(tmp_path: Path, cache_dir: Path) -> None:
    rng = np.random.default_rng(0)
    domains = ImageSet(rng.integers(0, 256, (4, 3, 5, 5), dtype=np.uint8), np.array([0, 2, 1, 2]),
                       ["dog", "elephant", "house"], np.array([1, 0, 0, 1]), ["art", "photo"])
    plain = ImageSet(np.zeros((2, 1, 3, 3), np.uint8), np.array([1, 0]), [], None, [])
    value = (domains, None, [plain, (None, "x", 3, 2.5, True), []],
             {"b": np.arange(6, dtype=np.int64).reshape(2, 3), "a": {"deep": [np.float32(1.5) * np.ones(2, np.float32)]},
              "n": None, "empty": ()})
    folder = tmp_path / "source"
    folder.mkdir()
    (folder / "data.bin").write_bytes(b"1")
    calls = []

    def read():
        calls.append(1)
        return value

    stored = cache.decoded("roundtrip", "the test values in", folder, {"size": 5}, read)
    assert stored is value and len(_entries()) == 1
    again = cache.decoded("roundtrip", "the test values in", folder, {"size": 5}, read)
    assert len(calls) == 1 and again is not value
    _same(value, again)
    assert isinstance(again[0].x, np.memmap)
    cache.decoded("roundtrip", "the test values in", folder, {"size": 6}, read)  # other parameters
    assert len(calls) == 2 and len(_entries()) == 2


def test_lines_wait_for_the_federation_and_vanish_with_an_error(capsys) -> None:
    """The cache's stderr line is held while a federation is built: an error found after the data
    are read (say a partition that cannot be made) is then the one line the CLI prints."""
    with cache.lines_held():
        cache._say("inner")
        assert capsys.readouterr().err == ""
    assert capsys.readouterr().err == "fedlatent: inner\n"
    with pytest.raises(ValueError):
        with cache.lines_held():
            cache._say("dropped")
            raise ValueError
    assert capsys.readouterr().err == ""
    with cache.lines_held():
        with cache.lines_held():
            cache._say("nested")
        assert capsys.readouterr().err == ""  # the outer block holds it on
    assert capsys.readouterr().err == "fedlatent: nested\n"
