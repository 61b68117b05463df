#!/usr/bin/env bash
# Pipeline speed-up benchmark: ResNet20 on Fashion-MNIST, K local
# agents pinned one per core (AXON_PIN_AGENTS=1, one compute thread each),
# the same split for every mode; samples/s of each mode and its ratio to
# sequential, measured back to back in one run, ROUNDS times interleaved;
# and each mode against one process training the same model with the same
# total threads (K) and the mode's unit size (the mini-batch for sequential
# and pipedream, a micro-batch of BATCH/8 for gpipe), in the same rounds.
#
#   scripts/pipe_speedup.sh [BUILD_DIR] [K] [STEPS] [BATCH] [ROUNDS]
set -euo pipefail
build=${1:-build}
K=${2:-2}
steps=${3:-40}
batch=${4:-64}
rounds=${5:-2}
modes=(sequential pipedream gpipe)
declare -A sum one
for m in "${modes[@]}"; do sum[$m]=0; one[$m]=0; done
unit() { [[ $1 == gpipe ]] && echo $((batch / 8)) || echo "$batch"; }
# samples/s of one process with K threads at batch $1
single() {
  AXON_THREADS=$K "$build/axon-run" train --model resnet20 \
    --dataset fashion-mnist --steps "$steps" --batch "$1" --eval-limit 500 \
    --quiet 2>&1 | grep -o 'samples_per_s=[0-9.]*' | cut -d= -f2
}
for r in $(seq 1 "$rounds"); do
  for m in "${modes[@]}"; do
    out=$(AXON_PIN_AGENTS=1 "$build/axon-run" train --model resnet20 \
      --dataset fashion-mnist --local "$K" --mode "$m" --microbatches 8 \
      --steps "$steps" --batch "$batch" --eval-limit 500 --quiet 2>&1)
    sps=$(grep -o 'samples_per_s=[0-9.]*' <<<"$out" | cut -d= -f2)
    busy=$(grep '^stages:' <<<"$out" | grep -o 'busy [0-9]*%' | tr '\n' ' ')
    echo "round $r $m: $sps samples/s, $busy"
    sum[$m]=$(awk -v a="${sum[$m]}" -v b="$sps" 'BEGIN{print a+b}')
    ssp=$(single "$(unit "$m")")
    echo "round $r one process, $K threads, batch $(unit "$m"): $ssp samples/s"
    one[$m]=$(awk -v a="${one[$m]}" -v b="$ssp" 'BEGIN{print a+b}')
  done
done
for m in "${modes[@]}"; do
  awk -v m="$m" -v a="${sum[$m]}" -v s="${sum[sequential]}" -v r="$rounds" \
    -v o="${one[$m]}" -v u="$(unit "$m")" -v k="$K" \
    'BEGIN{printf "%-10s %8.1f samples/s  %.2fx sequential  %.2fx one process" \
      " (%d threads, batch %d)\n", m, a/r, a/s, a/o, k, u}'
done
