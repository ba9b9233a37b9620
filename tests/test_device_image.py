"""fedlatent on a lent GPU machine's image, which lacks some packages installed here (quadprog, Flower,
dp-accounting, …; ``tests/device_image/sitecustomize.py`` hides them from a child process): every
command imports, and MK-MMD's test-power weights — quadprog's problem — are solved by the SLSQP
fallback to the same β. The whole lease script under the same conditions is the dry run in
``tests/test_full_scale_script.py``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlatent.losses.mmd import optimize_kernel_weights

ROOT = Path(__file__).resolve().parents[1]
HIDING = ROOT / "tests" / "device_image"


def _child(code: str, timeout: float = 300) -> str:
    """``code`` run by this interpreter with the device image's missing packages hidden; its stdout."""
    env = {**os.environ, "PYTHONPATH": f"{HIDING}{os.pathsep}{ROOT / 'src'}", "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def _problem(k: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Estimates m̂ (some negative) and a positive-definite covariance Q, in float64."""
    rng = np.random.default_rng(3)
    a = rng.normal(size=(k, k))
    return torch.tensor(rng.normal(0.2, 0.5, size=k)), torch.tensor(a @ a.T / k + 0.1 * np.eye(k))


def test_the_hidden_packages_cannot_be_imported_and_fedlatent_still_imports() -> None:
    out = _child("import importlib, json\n"
                 "hidden = []\n"
                 "for name in ('quadprog', 'flwr', 'dp_accounting'):\n"
                 "    try: importlib.import_module(name)\n"
                 "    except ModuleNotFoundError: hidden.append(name)\n"
                 "import fedlatent, fedlatent.cli, fedlatent.losses, fedlatent.experiment.tooling.throughput\n"
                 "print(json.dumps(hidden))")
    assert json.loads(out.splitlines()[-1]) == ["quadprog", "flwr", "dp_accounting"]


def test_without_quadprog_the_test_power_weights_are_slsqps_and_equal_quadprogs() -> None:
    m, q = _problem()
    exact = optimize_kernel_weights(m, q).tolist()  # quadprog, installed here
    out = _child("import json, torch\n"
                 "from fedlatent.losses import mmd\n"
                 "assert mmd._quadprog_module() is None\n"
                 f"m, q = torch.tensor({m.tolist()}, dtype=torch.float64), torch.tensor({q.tolist()}, dtype=torch.float64)\n"
                 "print(json.dumps(mmd.optimize_kernel_weights(m, q).tolist()))")
    fallback = json.loads(out.splitlines()[-1])
    assert np.allclose(fallback, exact, atol=1e-5) and abs(sum(fallback) - 1.0) < 1e-9


@pytest.mark.slow
def test_without_quadprog_a_ditto_mkmmd_round_trains_through_slsqp(tmp_path: Path) -> None:
    out = _child("import json, fedlatent\n"
                 "from fedlatent.losses import mmd\n"
                 "calls = []\n"
                 "solve = mmd._slsqp\n"
                 "mmd._slsqp = lambda mt, at: (calls.append(1), solve(mt, at))[1]\n"
                 "cfg = fedlatent.load_config('configs/digits_fedavg.toml', ['algorithm.name=\"ditto_mkmmd\"', "
                 "'train.rounds=1', 'data.num_clients=3'])\n"
                 f"s = fedlatent.run(cfg, {str(tmp_path / 'run')!r}, progress=False)\n"
                 "print(json.dumps([len(calls), s['final']['accuracy']]))")
    calls, accuracy = json.loads(out.splitlines()[-1])
    assert calls > 0 and 0.0 <= accuracy <= 1.0
