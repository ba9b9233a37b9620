#!/usr/bin/env bash
# Real CIFAR-10 at the papers' full setting on one CUDA device, in a fixed budget of wall time.
#
#   benchmarks/full_scale_cifar10.sh [ARCHIVE] [OUT]     (default ../shared/data/cifar10-jpeg.tar.gz, runs/full_scale)
#
# 1. extracts the archive (the image-folder tree cifar10-jpeg/{train,test}/<class>/) and decodes it
#    once into the decoded-image cache;
# 2. runs FedUV supplement Table 2's α = 0.01 FedAvg and FedUV (μ 0.5, λ C/4) rows at the paper's full
#    setting (all 50,000 images, 10 clients, 100 rounds × 10 local epochs, the small CNN at the
#    paper's widths: configs/feduv/stl10_a0.01.toml on CIFAR-10), the clients trained in lockstep;
# 3. with the time left, the same rows at α = 1.0.
# The two rows of a step train at once (JOBS, default 2: two processes share the device; the small
# CNN leaves most of a large GPU idle). Each row is 45 million sample passes: on one H100 a round
# of each row took 33-38 s with both rows at once (results/real_images/feduv_full_scale_h100.md),
# i.e. about an hour for the α = 0.01 step; the runs keep their checkpoints and the same command
# continues them.
# Every step runs under `timeout` within BUDGET seconds (default 840, i.e. 14 minutes); a step
# that runs out leaves its runs' checkpoints, and the same command continues them (a sweep resumes).
# The comparisons (paper beside fedlatent) are in OUT/<step>/comparison.md when a step finishes; a
# step stopped by the budget prints each run's accuracy at the last round it reached (fedlatent report).
# Environment: BUDGET, DEVICE (default cuda), JOBS, SMOKE=1 (a few images and one round, to check the
# script on a CPU).
set -euo pipefail
archive=${1:-../shared/data/cifar10-jpeg.tar.gz}
out=${2:-runs/full_scale}
budget=${BUDGET:-840}
device=${DEVICE:-cuda}
jobs=${JOBS:-2}
fedlatent=${FEDLATENT:-fedlatent}
start=$(date +%s)
mkdir -p "$out"
[ -d "$out/cifar10-jpeg" ] || tar xzf "$archive" -C "$out"
extra=(--set "train.device=\"$device\"" --set 'backend="vectorized"')
if [ "${SMOKE:-0}" = 1 ]; then
  extra+=(--set train.rounds=1 --set train.local_epochs=1 --set data.train_per_class=20 --set data.test_per_class=10)
fi
left() { echo $(( budget - ($(date +%s) - start) )); }
step() {  # step NAME SETTING: FedAvg and FedUV of feduv_supp_table2 at SETTING, in the time left
  local name=$1 setting=$2 t
  t=$(left)
  if [ "$t" -le 30 ]; then echo "$name: no time left"; return 0; fi
  echo "$name: $t s left"
  timeout --signal=INT "$t" "$fedlatent" reproduce feduv_supp_table2 --data-root "$out/cifar10-jpeg" \
    --only "setting=$setting" --only method=fedavg,feduv-mu0.5-lamC4 "${extra[@]}" --jobs "$jobs" --out "$out/$name" \
    || { echo "$name: stopped after $(( $(date +%s) - start )) s (run the script again to continue); so far:"
         "$fedlatent" report "$out/$name" > /dev/null && tail -n +5 "$out/$name/report/report.md"; }
}
step feduv_a0.01 cifar10-a0.01
step feduv_a1 cifar10-a1
echo "wall $(( $(date +%s) - start )) s; comparisons: $out/*/comparison.md"
