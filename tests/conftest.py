"""Shared test settings: no Flower telemetry nor runtime dependency installation (``uv sync``), one torch
thread (fast and deterministic on few cores), a decoded-image cache of the session's own."""
from __future__ import annotations

import os

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
os.environ.setdefault("MPLBACKEND", "Agg")
# the decoded-image cache of this test session, never the user's (tests of the cache set their own)
import atexit, shutil, tempfile  # noqa: E401,E402
os.environ["FEDLATENT_CACHE_DIR"] = tempfile.mkdtemp(prefix="fedlatent-test-cache-")
atexit.register(shutil.rmtree, os.environ["FEDLATENT_CACHE_DIR"], True)

import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
DIGITS_CONFIG = ROOT / "configs" / "digits_fedavg.toml"


LONG_SKIP = "long (minutes): run with --long or FEDLATENT_LONG_TESTS=1"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", help="also run the tests marked long (minutes each)")


@pytest.hookimpl(tryfirst=True)  # before -m selects: a long test is slow too
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``long`` are ``slow`` as well, and skipped unless ``--long`` (or
    ``FEDLATENT_LONG_TESTS=1``) asks for them: the README's ``pytest`` stays within CI's budget."""
    run_long = config.getoption("--long") or bool(os.environ.get("FEDLATENT_LONG_TESTS"))
    for item in items:
        if item.get_closest_marker("long") is not None:
            item.add_marker(pytest.mark.slow)
            if not run_long:
                item.add_marker(pytest.mark.skip(reason=LONG_SKIP))


# one preset per client program and per kind of state a round carries (controls, prototypes,
# calibration, kernels, kept layers, mixtures, inner steps): the presets a table over every preset runs
# in CI; the rest of such a table is ``long`` (``--long``), each behaviour keeping its test in CI
REPRESENTATIVE_PRESETS = ("fedavg", "scaffold", "fedproto", "spherefed", "ditto_mmdd", "fedbabu", "fedrep", "apfl",
                          "fedala", "perfedavg", "pfedme")


def in_float64(federation):
    """``federation`` with its clients' and global test split's inputs in float64, the clients held
    in a list (a float64 reference run; the clients built when read are float32)."""
    import dataclasses
    from fedlatent.data.types import ClientData, Split

    def double(split):
        return None if split is None else Split(split.x.double(), split.y)
    return dataclasses.replace(federation, test=double(federation.test), clients=[
        ClientData(*(double(getattr(c, name)) for name in ("train", "val", "test"))) for c in federation.clients])


def in_ci_or_long(names, keep=REPRESENTATIVE_PRESETS) -> list:
    """``names`` as pytest parameters, those outside ``keep`` marked ``long``."""
    return [name if name in keep else pytest.param(name, marks=pytest.mark.long) for name in names]


@pytest.fixture
def digits_config() -> Path:
    """The shipped FedAvg-on-digits configuration (10 IID clients, MLP, 20 rounds)."""
    assert DIGITS_CONFIG.is_file(), DIGITS_CONFIG
    return DIGITS_CONFIG


@pytest.fixture
def crash_at_round_2(monkeypatch: pytest.MonkeyPatch):
    """Make the simulation loop (shared by every backend) raise KeyboardInterrupt when it reaches
    round index 2, i.e. a crash after two finished rounds; returns the real ``run_round``."""
    from fedlatent.backends import simulation

    real_round = simulation.run_round

    def crashing(s, rnd):
        if rnd == 2:
            raise KeyboardInterrupt
        return real_round(s, rnd)

    monkeypatch.setattr(simulation, "run_round", crashing)
    return real_round


@pytest.fixture(scope="module")
def no_figures():
    """No figures for the runs of a module (``pytestmark = pytest.mark.usefixtures("no_figures")``)."""
    from fedlatent.experiment.runner import single
    from fedlatent.experiment.runner.figures import NoFigures

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(single, "FigureWorker", lambda *args, **kwargs: NoFigures())
        mp.setattr(single, "start_process", lambda: None)
        yield


@pytest.fixture
def checkpoint_every_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every round's checkpoint written (runs pace them to one a second), for tests that read or
    damage the checkpoint of a round other than the last."""
    from fedlatent.federated import state

    monkeypatch.setattr(state, "CHECKPOINT_SECONDS", 0.0)



@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site built once with ``mkdocs build --strict`` (a build takes about a minute),
    read by every test of the built site; skipped without the ``docs`` extra."""
    for module in ("mkdocs", "mkdocstrings", "material", "latex2mathml"):
        pytest.importorskip(module)
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
    site = tmp_path_factory.mktemp("docs") / "site"
    done = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(site)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    return site
