#!/usr/bin/env bash
# Issue 4's comparison: digits, Dirichlet α = 0.05, 10 clients, 20 rounds, 3 seeds (about 2 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
for method in fedavg feduv feddecorr spherefed freeze ccvr; do
  for seed in 0 1 2; do
    .venv/bin/fedlatent run configs/digits_fedavg.toml --no-progress --out "runs/repr/$method-$seed" \
      --set seed=$seed --set data.partition='"dirichlet"' --set data.alpha=0.05 \
      --set algorithm.name="\"$method\"" > /dev/null
  done
done
.venv/bin/python - <<'PY'
import json, statistics as st
from pathlib import Path
print("| method | accuracy (mean ± std, 3 seeds) | before calibration |")
print("|---|---|---|")
for m in ["fedavg", "feduv", "feddecorr", "spherefed", "freeze", "ccvr"]:
    f = [json.loads(Path(f"runs/repr/{m}-{s}/summary.json").read_text())["final"] for s in range(3)]
    acc = [x["accuracy"] for x in f]
    unc = [x["uncalibrated_accuracy"] for x in f if "uncalibrated_accuracy" in x]
    extra = f"{st.mean(unc):.4f} ± {st.stdev(unc):.4f}" if unc else "-"
    print(f"| {m} | {st.mean(acc):.4f} ± {st.stdev(acc):.4f} | {extra} |")
PY
