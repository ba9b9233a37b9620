#!/usr/bin/env bash
# One lease of a CUDA device, one command: (a) `fedlatent bench --throughput` on the device, at the
# default precision (auto: bf16 where the device has it) and in fp32; (b) benchmarks/full_scale_cifar10.sh
# with the time left. Everything goes under the lease folder and resumes from it: keep it between leases
# (or PACK it and UNPACK it in the next) and the next lease skips the throughput tables already there
# and continues the full-scale runs from their checkpoints.
#
#   benchmarks/gpu_lease.sh [LEASE] [ARCHIVE]     (default $OUT/lease where OUT is set, else runs/lease;
#                                                  data/cifar10-jpeg.tar.gz)
#
# It runs from a bare copy of the working tree, as a device machine receives it: fedlatent from this
# checkout's src/ (no install), the archive from an ignored path of the checkout that the call carries
# (data/ is ignored: copy ../shared/data/cifar10-jpeg.tar.gz there; ../shared does not travel).
# First it checks what it needs — the Python, `import fedlatent`, a CUDA device where DEVICE is cuda,
# the archive (or its extracted tree), the pack to UNPACK — and names in one line what is missing
# (exit 2), before a second of the budget is spent. Then:
# LEASE/environment.txt   date, commit, nvidia-smi, torch and Python versions (appended each lease)
# LEASE/bench_auto.txt    the throughput table (and .json: the raw timings), precision auto; bench_fp32.* in fp32
# LEASE/compile_stacked.txt  torch.compile of the stacked step's forward against eager (benchmarks/compile_stacked.py;
#                       and .json; at most 240 s, once per LEASE; COMPILE=0 skips it, SMOKE=1 too unless COMPILE=1)
# LEASE/profile_round.txt  one round of fedlatent and one epoch of the bare loop under torch.profiler
#                       (benchmarks/profile_round.py; and .json; at most 120 s, once per LEASE; PROFILE=0 skips it)
# LEASE/runs/<step>/    the full-scale sweeps (checkpoints, metrics, summaries; comparison.md when finished)
# LEASE/tables/<step>.md  paper beside fedlatent per row, with .csv (per-round metrics) and .json (history)
# LEASE/lease.log       everything the commands printed
# The archive is extracted under SCRATCH (default /tmp/fedlatent-lease), outside LEASE, and decoded
# once into the decoded-image cache before the runs start.
# Across leases of the device tool, whose next call starts on a fresh machine and which brings back only
# a few files of $OUT (benchmarks/README.md, "Resuming across leases"): UNPACK=DIR first restores LEASE
# from the packed state in DIR (carried into the call), PACK=DIR last packs what the next lease needs
# into DIR (default $OUT/state where OUT is set; PACK= turns it off; benchmarks/lease_state.py) in at
# most PACK_MIB MiB (default: the 64 MiB the device tool carries into a call, less this tree and the
# archive, which travel with the pack next time, less 2 MiB) in files of at most 16 MiB, PACK_SECONDS of
# the budget kept for it (default 60). The pack is made on every exit — a failed step or bench, an
# interrupt — never skipped; where LEASE lies under $OUT it is then replaced by the pack and SUMMARY.txt
# (the tables, readable as they come back), so that what the device tool returns is what the next lease
# needs. A step whose state does not fit is named and left out, and the script exits 3.
# Environment: BUDGET (seconds for the whole command, default 540: a device command may run 600 s),
# PYTHON (default python3), DEVICE (default cuda), BENCH=1 (time the throughput again), COMMIT (the
# commit to name where the copy of the tree has no git folder: COMMIT=$(git rev-parse --short HEAD)), and the full-scale
# script's STEPS, JOBS, SMOKE (SMOKE=1 DEVICE=cpu checks this script on a CPU in a few minutes).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
outside=${OUT:-}  # the device tool's folder of files that come back (unset elsewhere)
out=${1:-${outside:+$outside/lease}}; out=${out:-runs/lease}
archive=${2:-data/cifar10-jpeg.tar.gz}
budget=${BUDGET:-540}
device=${DEVICE:-cuda}
python=${PYTHON:-python3}
scratch=${SCRATCH:-/tmp/fedlatent-lease}
pack=${PACK-${outside:+$outside/state}}
steps=${STEPS:-feduv_a0.01 feduv_a1 feddecorr ditto_table1 ditto_table2}
start=$(date +%s)
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's fedlatent

# what the lease needs, checked before anything runs; one line names all that is missing
missing=()
if ! command -v "$python" > /dev/null; then
  missing+=("PYTHON=$python: not found")
elif ! why=$("$python" -c "import fedlatent.cli" 2>&1); then
  missing+=("import fedlatent with $python: $(printf '%s\n' "$why" | tail -n 1)")
elif [[ $device == cuda* ]] && ! "$python" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2> /dev/null; then
  smi=$(nvidia-smi -L 2> /dev/null | head -n 1)
  missing+=("DEVICE=$device: torch sees no CUDA device (nvidia-smi -L: ${smi:-nothing})")
fi
if [ -n "$steps" ] && [ ! -d "$scratch/cifar10-jpeg" ] && [ ! -f "$archive" ]; then
  missing+=("the CIFAR-10 archive $archive (copy ../shared/data/cifar10-jpeg.tar.gz to data/ and name it in the call's carry)")
fi
if [ -n "${UNPACK:-}" ] && [ ! -f "$UNPACK/index.json" ]; then
  missing+=("UNPACK=$UNPACK: no index.json (name the folder of the last lease's state in the call's carry)")
fi
if [ "${#missing[@]}" -gt 0 ]; then
  printf 'lease: cannot start: %s\n' "$(IFS=';'; echo "${missing[*]}" | sed 's/;/; /g')" >&2
  exit 2
fi

mkdir -p "$out" "$scratch"
out=$(cd "$out" && pwd)
if [ -n "${UNPACK:-}" ]; then  # before the log is opened: the packed lease.log is the one appended to
  "$python" "$here/lease_state.py" unpack "$UNPACK" "$out" || exit 2
fi
keep=0
if [ -n "$pack" ]; then
  keep=${PACK_SECONDS:-60}
  if [ -z "${PACK_MIB:-}" ]; then  # what travels into the next call beside the pack: this tree and the archive
    tree=$(cd "$root" && du -sb --exclude=./runs --exclude=./data --exclude=./.git --exclude=./.venv . | cut -f1)
    packed_archive=$(stat -c %s "$archive" 2> /dev/null || echo 0)
    PACK_MIB=$(( 64 - (tree + packed_archive) / 1048576 - 2 ))
    if [ "$PACK_MIB" -lt 4 ]; then PACK_MIB=4; fi  # a tree this large leaves the pack no room: the next call's carry says so
  fi
fi
fedlatent="$scratch/fedlatent"
printf '#!/bin/sh\nexec "%s" -m fedlatent.cli "$@"\n' "$(command -v "$python")" > "$fedlatent"
chmod +x "$fedlatent"
exec > >(tee -a "$out/lease.log") 2>&1
failed=0  # the first failing part's exit status
fail() { echo "lease: $1 (exit $2)" >&2; [ "$failed" != 0 ] || failed=$2; }

finish() {  # on every exit: the pack for the next lease, then the lease's status
  trap - EXIT INT TERM
  local rc=0
  echo "lease: $(( $(date +%s) - start )) s of $budget; outputs under $out"
  if [ -n "$pack" ]; then
    # shellcheck disable=SC2086  # the steps, one word each, in their order of priority
    "$python" "$here/lease_state.py" pack "$out" "$pack" --steps $steps --total-mib "$PACK_MIB" || rc=$?
    if [ "$rc" != 0 ]; then echo "lease: the state for the next lease is incomplete (exit $rc; see above)" >&2; fi
    if [ -n "$outside" ] && [ -f "$pack/index.json" ] && [[ $out == "$(cd "$outside" && pwd)"/* ]]; then
      summary "$outside/SUMMARY.txt"
      rm -rf "$out"  # what comes back is the pack (and the summary): the device tool returns 8 files
    fi
  fi
  [ "$failed" = 0 ] || exit "$failed"
  exit "$rc"
}
summary() {  # the lease's tables in one file, readable where the pack is not unpacked
  {
    tail -n 3 "$out/environment.txt"
    for f in "$out"/bench_auto.txt "$out"/bench_fp32.txt "$out"/profile_round.txt "$out"/compile_stacked.txt \
        "$out"/tables/*.md; do
      [ -f "$f" ] && { echo; echo "== ${f#"$out"/}"; cat "$f"; }
    done
  } > "$1" 2> /dev/null
}
trap finish EXIT
trap 'fail "interrupted" 130; exit 130' INT TERM

{
  echo "== lease $(date -u +%Y-%m-%dT%H:%M:%SZ), commit ${COMMIT:-$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$python" -c "import platform, torch; print('python', platform.python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda)"
} >> "$out/environment.txt"
tail -n 3 "$out/environment.txt"
left() { echo $(( budget - ($(date +%s) - start) )); }
for precision in auto fp32; do
  if [ -f "$out/bench_$precision.json" ] && [ "${BENCH:-0}" != 1 ]; then
    echo "bench ($precision): kept from an earlier lease ($out/bench_$precision.txt)"; continue
  fi
  smoke=(); if [ "${SMOKE:-0}" = 1 ]; then smoke=(--samples 2 --reps 1); fi
  t=$(( $(left) - 60 - keep ))
  if [ "$t" -le 60 ]; then echo "bench ($precision): no time left"; continue; fi
  if timeout --signal=INT --kill-after=15 "$t" "$fedlatent" bench --throughput --device "$device" --precision "$precision" \
      "${smoke[@]}" --json "$out/bench_$precision.json" > "$out/bench_$precision.tmp"; then
    mv "$out/bench_$precision.tmp" "$out/bench_$precision.txt" && cat "$out/bench_$precision.txt"
  else
    fail "bench ($precision): did not finish" $?; rm -f "$out/bench_$precision.json"
  fi
done
# a measurement script's table, once per LEASE (kept from an earlier lease unless BENCH=1), when ENABLED is 1:
# at most CAP seconds and only with more than MIN left; a failure is reported and does not fail the lease
measure() {  # NAME LABEL ENABLED CAP MIN SCRIPT ARGS...
  local name=$1 label=$2 enabled=$3 cap=$4 min=$5 script=$6 t; shift 6
  if [ -f "$out/$name.json" ] && [ "${BENCH:-0}" != 1 ]; then
    echo "$label: kept from an earlier lease ($out/$name.txt)"; return
  fi
  [ "$enabled" = 1 ] || return 0
  t=$(( $(left) - 120 - keep )); if [ "$t" -gt "$cap" ]; then t=$cap; fi
  if [ "$t" -le "$min" ]; then echo "$label: no time left"; return; fi
  if timeout --signal=INT --kill-after=15 "$t" "$python" "$here/$script" --device "$device" "$@" \
      --json "$out/$name.json" > "$out/$name.tmp"; then
    mv "$out/$name.tmp" "$out/$name.txt" && cat "$out/$name.txt"
  else
    echo "$label: did not finish in $t s (exit $?)"; rm -f "$out/$name.json"
  fi
}
# where a round's time goes (torch.profiler: top operators, kernel launches, the device's busy time and
# the host-side gaps), fedlatent's round beside the bare loop's epoch: the reason when the goal is missed
smoke=(); if [ "${SMOKE:-0}" = 1 ]; then smoke=(--samples 2); fi
measure profile_round "profile (one round)" "${PROFILE:-1}" 120 30 profile_round.py "${smoke[@]}"
# torch.compile of the stacked step's forward against eager (a measurement: fedlatent has no switch for it);
# not in SMOKE mode unless COMPILE=1 (minutes of tracing on a CPU)
smoke=(); if [ "${SMOKE:-0}" = 1 ]; then smoke=(--samples 2 --reps 1 --backend aot_eager); fi
measure compile_stacked "compile (stacked step)" "${COMPILE:-$(( ${SMOKE:-0} != 1 ))}" 240 60 compile_stacked.py \
  "${smoke[@]}"
if [ -n "$steps" ]; then
  BUDGET=$(( $(left) - 10 - keep )) STEPS=$steps DEVICE=$device FEDLATENT=$fedlatent PYTHON=$python DATA=$scratch \
    RESULTS=$out/tables bash "$here/full_scale_cifar10.sh" "$archive" "$out/runs" || fail "the full-scale steps failed" $?
fi
