#!/bin/sh
# Checkpoint overhead: ResNet20 over K=4 local agents, a
# checkpoint every 50 steps, runs with and without checkpoints interleaved
# (ROUNDS pairs per mode). The cost of a run with checkpoints is its
# training time (for the async modes it includes the drain at each cut)
# plus the time of the checkpoints; the overhead is that over the training
# time of the run without. Prints one line per run and a summary per mode.
#   BIN=build STEPS=200 ROUNDS=2 MODES="1f1b pipedream" BATCH=32 scripts/ckpt_cost.sh
set -e
BIN=${BIN:-build}
STEPS=${STEPS:-200}
ROUNDS=${ROUNDS:-2}
MODES=${MODES:-"1f1b pipedream"}
BATCH=${BATCH:-32}
EVERY=${EVERY:-50}
DIR=$(mktemp -d /tmp/axon-ckpt-cost-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
run() { # mode, with (0/1) -> prints "ms_per_step ckpt_ms_per_step"
  rm -rf "$DIR/ck"
  extra=""
  [ "$2" = 1 ] && extra="--checkpoint-dir $DIR/ck --checkpoint-every $EVERY"
  "$BIN/axon-run" train --local 4 --mode "$1" --model resnet20 \
    --dataset synthetic --data-config shape=1/32/32,classes=10,examples=8192 \
    --steps "$STEPS" --batch "$BATCH" --eval-limit 32 --quiet $extra \
    >"$DIR/out" 2>&1
  ms=$(sed -n 's/.*ms_per_step=\([0-9.]*\).*/\1/p' "$DIR/out")
  ck=$(sed -n 's/.*checkpoints took [0-9.]* s, \([0-9.]*\) ms per step.*/\1/p' "$DIR/out")
  echo "$ms ${ck:-0}"
}
for mode in $MODES; do
  : >"$DIR/rounds"
  for r in $(seq "$ROUNDS"); do
    set -- $(run "$mode" 0); t0=$1
    set -- $(run "$mode" 1); t1=$1; c1=$2
    echo "$mode round $r: without $t0 ms/step; with $t1 ms/step + $c1 ms/step of checkpoints"
    echo "$t0 $t1 $c1" >>"$DIR/rounds"
  done
  # Means, and the median of the rounds' overheads (robust to a round that
  # another program on the machine slowed down).
  med=$(awk '{ print 100 * ($2 + $3 - $1) / $1 }' "$DIR/rounds" | sort -g |
        awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  awk -v m="$mode" -v med="$med" '{ a += $1; b += $2 + $3; c += $3 }
    END { printf "%s: %.1f ms/step without, %.1f with (%.2f of it writing checkpoints, %.2f%%); overhead: mean %.2f%%, median %.2f%%\n",
                 m, a / NR, b / NR, c / NR, 100 * c / a, 100 * (b - a) / a, med }' "$DIR/rounds"
done
