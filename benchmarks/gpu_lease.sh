#!/usr/bin/env bash
# One lease of a CUDA device, one command: (a) `fedlatent bench --throughput` on the device, at the
# default precision (auto: bf16 where the device has it) and in fp32; (b) benchmarks/full_scale_cifar10.sh
# with the time left. Everything goes under OUT and resumes from it: keep OUT between leases (bring it
# back, pass it again) and the next lease skips the throughput tables already there and continues the
# full-scale runs from their checkpoints.
#
#   benchmarks/gpu_lease.sh [OUT] [ARCHIVE]     (default runs/lease, ../shared/data/cifar10-jpeg.tar.gz)
#
# OUT/environment.txt   date, commit, nvidia-smi, torch and Python versions (appended each lease)
# OUT/bench_auto.txt    the throughput table (and .json: the raw timings), precision auto; bench_fp32.* in fp32
# OUT/compile_stacked.txt  torch.compile of the stacked step's forward against eager (benchmarks/compile_stacked.py;
#                       and .json; at most 240 s, once per OUT; COMPILE=0 skips it, SMOKE=1 too unless COMPILE=1)
# OUT/runs/<step>/      the full-scale sweeps (checkpoints, metrics, summaries; comparison.md when finished)
# OUT/tables/<step>.md  paper beside fedlatent per row, with .csv (per-round metrics) and .json (history)
# OUT/lease.log         everything the commands printed
# The archive is extracted under SCRATCH (default /tmp/fedlatent-lease), outside OUT.
# Across leases of the device tool, whose next call starts on a fresh machine (benchmarks/README.md,
# "Resuming across leases"): UNPACK=DIR first restores OUT from the packed state in DIR (carried into
# the call), PACK=DIR last packs what the next lease needs into DIR (benchmarks/lease_state.py: at most
# 64 MiB in a few files of at most 16 MiB: the device tool's limits), PACK_SECONDS of the budget kept
# for it (default 60); a step whose state does not fit is named and left out, and the script exits 3.
# Environment: BUDGET (seconds for the whole command, default 540: a device command may run 600 s),
# PYTHON (default python3), DEVICE (default cuda), BENCH=1 (time the throughput again), COMMIT (the
# commit to name where the copy of the tree has no git folder: COMMIT=$(git rev-parse --short HEAD)), and the full-scale
# script's STEPS, JOBS, SMOKE (SMOKE=1 DEVICE=cpu checks this script on a CPU in a few minutes).
set -euo pipefail
out=${1:-runs/lease}
archive=${2:-../shared/data/cifar10-jpeg.tar.gz}
budget=${BUDGET:-540}
device=${DEVICE:-cuda}
python=${PYTHON:-python3}
scratch=${SCRATCH:-/tmp/fedlatent-lease}
here=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
mkdir -p "$out" "$scratch"
out=$(cd "$out" && pwd)
export PYTHONPATH="$here/../src${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's fedlatent
if [ -n "${UNPACK:-}" ]; then  # before the log is opened: the packed lease.log is the one appended to
  "$python" "$here/lease_state.py" unpack "$UNPACK" "$out"
fi
steps=${STEPS:-feduv_a0.01 feduv_a1 feddecorr ditto_table1 ditto_table2}
keep=0; if [ -n "${PACK:-}" ]; then keep=${PACK_SECONDS:-60}; fi
fedlatent="$scratch/fedlatent"
printf '#!/bin/sh\nexec "%s" -m fedlatent.cli "$@"\n' "$(command -v "$python")" > "$fedlatent"
chmod +x "$fedlatent"
exec > >(tee -a "$out/lease.log") 2>&1
{
  echo "== lease $(date -u +%Y-%m-%dT%H:%M:%SZ), commit ${COMMIT:-$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$python" -c "import platform, torch; print('python', platform.python_version(), 'torch', torch.__version__)"
} >> "$out/environment.txt"
tail -n 3 "$out/environment.txt"
left() { echo $(( budget - ($(date +%s) - start) )); }
for precision in auto fp32; do
  if [ -f "$out/bench_$precision.json" ] && [ "${BENCH:-0}" != 1 ]; then
    echo "bench ($precision): kept from an earlier lease ($out/bench_$precision.txt)"; continue
  fi
  smoke=(); if [ "${SMOKE:-0}" = 1 ]; then smoke=(--samples 2 --reps 1); fi
  t=$(( $(left) - 60 ))
  if [ "$t" -le 60 ]; then echo "bench ($precision): no time left"; continue; fi
  timeout --signal=INT "$t" "$fedlatent" bench --throughput --device "$device" --precision "$precision" "${smoke[@]}" \
    --json "$out/bench_$precision.json" > "$out/bench_$precision.tmp" && mv "$out/bench_$precision.tmp" "$out/bench_$precision.txt" \
    && cat "$out/bench_$precision.txt" || { echo "bench ($precision): did not finish"; rm -f "$out/bench_$precision.json"; }
done
# torch.compile of the stacked step's forward against eager (a measurement: fedlatent has no switch for it)
if [ -f "$out/compile_stacked.json" ] && [ "${BENCH:-0}" != 1 ]; then
  echo "compile (stacked step): kept from an earlier lease ($out/compile_stacked.txt)"
elif [ "${COMPILE:-$(( ${SMOKE:-0} != 1 ))}" = 1 ]; then  # not in SMOKE mode unless COMPILE=1 (minutes of tracing on a CPU)
  smoke=(); if [ "${SMOKE:-0}" = 1 ]; then smoke=(--samples 2 --reps 1 --backend aot_eager); fi
  t=$(( $(left) - 120 )); if [ "$t" -gt 240 ]; then t=240; fi
  if [ "$t" -le 60 ]; then echo "compile (stacked step): no time left"; else
    timeout --signal=INT "$t" "$python" "$here/compile_stacked.py" --device "$device" "${smoke[@]}" \
      --json "$out/compile_stacked.json" > "$out/compile_stacked.tmp" && mv "$out/compile_stacked.tmp" "$out/compile_stacked.txt" \
      && cat "$out/compile_stacked.txt" || { echo "compile (stacked step): did not finish in $t s"; rm -f "$out/compile_stacked.json"; }
  fi
fi
BUDGET=$(( $(left) - 10 - keep )) STEPS=$steps DEVICE=$device FEDLATENT=$fedlatent PYTHON=$python DATA=$scratch RESULTS=$out/tables \
  bash "$here/full_scale_cifar10.sh" "$archive" "$out/runs"
echo "lease: $(( $(date +%s) - start )) s of $budget; outputs under $out"
if [ -n "${PACK:-}" ]; then
  rc=0
  # shellcheck disable=SC2086  # the steps, one word each, in their order of priority
  "$python" "$here/lease_state.py" pack "$out" "$PACK" --steps $steps || rc=$?
  if [ "$rc" != 0 ]; then echo "lease: the state for the next lease is incomplete (exit $rc; see above)" >&2; exit "$rc"; fi
fi
