"""Every method preset on an accelerator against the same run on the CPU: does it run there, and
does it give the CPU's numbers up to float rounding?

For each preset (``fedlatent.methods.PRESETS``) and each backend that accepts it, two rounds of 4
IID digits clients (MLP 64-128-10) run once on the CPU and once on ``--device``; reported: the
largest absolute difference between the two global models (float32 kernels differ between the
devices, so ~1e-6 to 1e-4 is rounding; a wrong device placement fails outright or differs by far
more), or the error. Then whole runs (``fedlatent.experiment.run``: every diagnostic, figures,
checkpoints, the final calibration) of ``--full`` presets on the device, reporting their accuracy
beside the CPU run's. The backends' random draws are made by seeded CPU generators, so both
devices see the same batches.

    python benchmarks/device_check.py --device cuda
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
from fedlatent.backends import simulation  # noqa: E402
from fedlatent.federated.trainer import unsupported  # noqa: E402
from fedlatent.config import load_config  # noqa: E402
from fedlatent.experiment.runner.single import run  # noqa: E402
from fedlatent.methods import PRESETS, resolve  # noqa: E402

DIGITS = ['data.dataset="digits"', 'data.partition="iid"', "data.num_clients=4", 'model.arch="mlp"',
          "model.hidden=[128]", "train.batch_size=32", "train.lr=0.05", "train.momentum=0.9"]


def final_state(method: str, backend: str, device: str) -> dict[str, torch.Tensor]:
    """The global model after two rounds of ``method`` on ``backend`` and ``device``."""
    config = load_config(None, [*DIGITS, f"algorithm.name={method}", f'train.device="{device}"', *C.NO_EVAL])
    setup = simulation.setup(config, C.federation_for(config), resolve(config.algorithm, config.terms),
                             trainer=C.TRAINERS[backend])
    for rnd in range(2):
        simulation.run_round(setup, rnd)
    return {k: v.detach().cpu() for k, v in setup.server.global_state.items()}


def whole_run(method: str, device: str, out: Path) -> float:
    """Test accuracy of a whole 3-round run of ``method`` on ``device`` with every diagnostic."""
    config = load_config(None, [*DIGITS, f"algorithm.name={method}", f'train.device="{device}"', "train.rounds=3",
                                'diagnostics.which=["collapse", "classifier", "alignment", "uniformity", '
                                '"per_class", "tsne", "data"]', "diagnostics.every=3"])
    return float(run(config, out, echo=None)["final"]["accuracy"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--methods", default="", help="comma-separated presets (default: all)")
    parser.add_argument("--full", default="fedavg,ccvr,spherefed,feduv,ditto_mmdd",
                        help="presets also run whole on the device (empty: none)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    methods = args.methods.split(",") if args.methods else sorted(PRESETS)
    rows, failures = [], 0
    for method in methods:
        probe = load_config(None, [*DIGITS, f"algorithm.name={method}"])
        for backend in C.TRAINERS:
            if backend == "vectorized" and unsupported(resolve(probe.algorithm, probe.terms)):
                continue
            try:
                cpu, dev = final_state(method, backend, "cpu"), final_state(method, backend, args.device)
                diff = max(float((cpu[k].double() - dev[k].double()).abs().max()) for k in cpu)
                rows.append([method, backend, f"{diff:.1e}", "ok" if diff < 1e-3 else "DIFFERS"])
                failures += diff >= 1e-3
            except Exception as error:  # noqa: BLE001 - the table names every failure, the trace goes to stderr
                traceback.print_exc()
                rows.append([method, backend, "", f"FAILED: {type(error).__name__}: {str(error).splitlines()[0][:80]}"])
                failures += 1
            print(f"  {method} {backend}: {rows[-1][3]}", file=sys.stderr, flush=True)
    print(f"two rounds on {args.device} against the CPU, max |Δ| of the global model\n"
          + C.table(["method", "backend", "max |Δ|", "result"], rows))
    full = [m for m in args.full.split(",") if m]
    if full:
        whole = []
        with tempfile.TemporaryDirectory(prefix="fedlatent-device-") as tmp:
            for method in full:
                try:
                    accs = [whole_run(method, d, Path(tmp) / f"{method}-{side}") for side, d in (("cpu", "cpu"), ("device", args.device))]
                    whole.append([method, f"{accs[0]:.4f}", f"{accs[1]:.4f}", "ok"])
                except Exception as error:  # noqa: BLE001
                    traceback.print_exc()
                    whole.append([method, "", "", f"FAILED: {type(error).__name__}: {str(error).splitlines()[0][:80]}"])
                    failures += 1
                print(f"  whole {method}: {whole[-1][3]}", file=sys.stderr, flush=True)
        print("whole runs (auto backend, every diagnostic, figures), test accuracy\n"
              + C.table(["method", "cpu", args.device, "result"], whole))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
