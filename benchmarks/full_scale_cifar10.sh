#!/usr/bin/env bash
# Every CIFAR-10 headline row of the seed papers on real CIFAR-10 at the papers' full setting, on one
# CUDA device, in a fixed budget of wall time, resumable across short leases of the device.
#
#   benchmarks/full_scale_cifar10.sh [ARCHIVE] [OUT]     (default data/cifar10-jpeg.tar.gz, runs/full_scale)
#
# The archive's default is inside the checkout (data/ is ignored): copy ../shared/data/cifar10-jpeg.tar.gz
# there, and a device machine, which receives the working tree and the ignored paths a call carries but
# not ../shared, finds it where the call's `carry` put it.
#
# 1. extracts the archive (the image-folder tree cifar10-jpeg/{train,test}/<class>/) into DATA and
#    decodes it once into the decoded-image cache (benchmarks/decode_once.py), before the JOBS runs
#    started together would each decode it;
# 2. runs the steps named in STEPS, in this order of priority, each a `fedlatent reproduce` of the
#    spec's full tier (all 50,000 images, the paper's model, rounds and local epochs) into OUT/<step>:
#      feduv_pair             FedAvg and FedUV alone of feduv_a0.01 (not in the default STEPS): the pair
#                             whose state, ~9 MiB packed mid-run, travels between leases beside the
#                             archive (MOON's eleven models do not: benchmarks/README.md)
#      feduv_a0.01, feduv_a1  FedUV supplement Table 2 (α = 0.01) and 3 (α = 1.0): FedAvg, FedProx μ 0.001,
#                             MOON μ 1, FedUV μ 0.5 λ C/4 (spec feduv_supp_table2; small CNN at the
#                             paper's widths, 10 clients, 100 rounds × 10 local epochs; seed 0)
#      feddecorr              FedDecorr Table 1's CIFAR-10 rows, α = 0.05, 0.1, 0.5 and IID: FedAvg ±
#                             FedDecorr (spec feddecorr_table1; MobileNetV2, 100 rounds × 10 local
#                             epochs); seed 0 of the spec's 0-2 (one seed of 8 rows is already ~4·10⁸
#                             sample passes)
#      ditto_table1, ditto_table2  the Ditto + MMD paper's CIFAR-10 rows, α = 0.1, 0.5, 5 (specs
#                             ditto_table1: each constraint alone; ditto_table2: Ditto + a constraint;
#                             the paper's ConvNet, 5 clients, 10 rounds × 5 local epochs; seeds 2021-2023)
#    the clients trained in lockstep (backend = "vectorized"), JOBS runs of a step at once (default 4:
#    the rows of a step advance together; the small models leave most of a large GPU idle);
# 3. after each step, finished or stopped by the budget, benchmarks/full_scale_table.py writes
#    RESULTS/<step>.md (paper beside fedlatent: the last round reached, the mean of the last five
#    rounds every row reached, rounds reached of planned, seeds, device, commit, date), RESULTS/<step>.csv
#    (every run's per-round metrics) and RESULTS/<step>.json (the history of updates).
# Every step runs under `timeout` within BUDGET seconds in all (default 840, i.e. 14 minutes; SIGINT at
# its end, SIGKILL 20 s later if the runs have not stopped by then); a step
# that runs out leaves its runs' checkpoints, and the same command with the same OUT continues them
# (fedlatent reproduce --out resumes a stopped sweep: finished runs are kept, the others resume from
# their last checkpoint). A finished step's comparison is also in OUT/<step>/comparison.md.
# Environment: BUDGET, DEVICE (default cuda), JOBS, STEPS (default the five after feduv_pair, in the order above),
# DATA (where the archive is extracted, default OUT), RESULTS (default results/real_images/full_scale),
# FEDLATENT (the command, default fedlatent), PYTHON (runs the table script, default python),
# SMOKE=1 (a few images a class, one round, each step's first setting and seed: to check the script on a CPU).
# The runs train at train.precision's default, "auto": bf16 on a CUDA device that has it (recorded in
# each run's config.toml).
set -euo pipefail
archive=${1:-data/cifar10-jpeg.tar.gz}
out=${2:-runs/full_scale}
budget=${BUDGET:-840}
device=${DEVICE:-cuda}
jobs=${JOBS:-4}
steps=${STEPS:-feduv_a0.01 feduv_a1 feddecorr ditto_table1 ditto_table2}
data=${DATA:-$out}
results=${RESULTS:-results/real_images/full_scale}
fedlatent=${FEDLATENT:-fedlatent}
python=${PYTHON:-python}
here=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
known="feduv_pair feduv_a0.01 feduv_a1 feddecorr ditto_table1 ditto_table2"
for s in $steps; do
  case " $known " in *" $s "*) ;; *) echo "STEPS: unknown step '$s' (known: $known)" >&2; exit 2 ;; esac
done
mkdir -p "$out" "$data"
if [ ! -d "$data/cifar10-jpeg" ]; then
  [ -f "$archive" ] || { echo "archive $archive: not found (copy ../shared/data/cifar10-jpeg.tar.gz to data/; on a device machine, name it in carry)" >&2; exit 2; }
  tar xzf "$archive" -C "$data"
fi
"$python" "$here/decode_once.py" cifar10 "$data/cifar10-jpeg"
extra=(--set "train.device=\"$device\"" --set 'backend="vectorized"')
smoke=0
if [ "${SMOKE:-0}" = 1 ]; then
  smoke=1
  extra+=(--set train.rounds=1 --set train.local_epochs=1 --set data.train_per_class=20 --set data.test_per_class=10)
fi
failed=0
left() { echo $(( budget - ($(date +%s) - start) )); }
step() {  # step NAME SPEC SETTINGS METHODS SEEDS: those cells of SPEC (METHODS "": all) into OUT/NAME, then its table
  local name=$1 spec=$2 settings=$3 methods=$4 seeds=$5 rc=0 t
  case " $steps " in *" $name "*) ;; *) return 0 ;; esac
  if [ "$smoke" = 1 ]; then settings=${settings%%,*}; seeds=${seeds%%,*}; fi  # the first setting and seed
  local only=(--only "setting=$settings" --only "seed=$seeds")
  if [ -n "$methods" ]; then only+=(--only "method=$methods"); fi
  t=$(( $(left) - 50 ))  # 30 s kept for the table, 20 for timeout's grace before SIGKILL
  if [ "$t" -le 30 ]; then echo "$name: no time left"; return 0; fi
  echo "$name: $t s left"
  timeout --signal=INT --kill-after=20 "$t" "$fedlatent" reproduce "$spec" --data-root "$data/cifar10-jpeg" "${only[@]}" \
    "${extra[@]}" --jobs "$jobs" --out "$out/$name" || rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then  # the budget ran out (137: killed after the grace)
    echo "$name: stopped after $(( $(date +%s) - start )) s (run the script again with the same OUT to continue)"
  elif [ "$rc" != 0 ]; then
    echo "$name: fedlatent reproduce failed (exit $rc); the next steps still run" >&2; [ "$failed" != 0 ] || failed=$rc
  fi
  "$python" "$here/full_scale_table.py" "$out/$name" --out "$results" || { echo "$name: the table failed" >&2; [ "$failed" != 0 ] || failed=1; }
}
feduv=fedavg,fedprox-mu0.001,moon-mu1,feduv-mu0.5-lamC4
cifar10=cifar10-a0.1,cifar10-a0.5,cifar10-a5
step feduv_pair feduv_supp_table2 cifar10-a0.01 fedavg,feduv-mu0.5-lamC4 0
step feduv_a0.01 feduv_supp_table2 cifar10-a0.01 "$feduv" 0
step feduv_a1 feduv_supp_table2 cifar10-a1 "$feduv" 0
step feddecorr feddecorr_table1 cifar10-a0.05,cifar10-a0.1,cifar10-a0.5,cifar10-iid fedavg,fedavg+decorr 0
step ditto_table1 ditto_table1 "$cifar10" "" 2021,2022,2023
step ditto_table2 ditto_table2 "$cifar10" "" 2021,2022,2023
echo "wall $(( $(date +%s) - start )) s; tables: $results/<step>.md"
exit "$failed"  # the first failed step's exit status (0: none failed)
