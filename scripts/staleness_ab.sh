#!/usr/bin/env bash
# Compares the staleness corrections (--staleness none|predict|pipemare,
# runtime/pipeline/stage/staleness.h) on one seed: the same pipeline run three
# times on Fashion-MNIST, printing a Markdown table of the mean training
# loss of the last 100 steps, the test accuracy and the throughput (noisy
# on a shared machine).
#
#   scripts/staleness_ab.sh [BUILD_DIR]
#
# Environment: STALE_AB_MODEL (mlp), STALE_AB_MODEL_CONFIG (for the MLP:
# widths=784/512/256/128/10, four blocks; empty for other models), STALE_AB_MODE (pipedream), STALE_AB_K
# (4), STALE_AB_STEPS (1875: one epoch at batch 32), STALE_AB_LR (0.05,
# SGD with momentum 0.9), STALE_AB_SEED (1), STALE_AB_EVAL (eval limit, all).
set -euo pipefail
build=${1:-build}
model=${STALE_AB_MODEL:-mlp}
mcfg_default=
[ "$model" = mlp ] && mcfg_default=widths=784/512/256/128/10
mcfg=${STALE_AB_MODEL_CONFIG-$mcfg_default}
mode=${STALE_AB_MODE:-pipedream}
K=${STALE_AB_K:-4}
steps=${STALE_AB_STEPS:-1875}
lr=${STALE_AB_LR:-0.05}
seed=${STALE_AB_SEED:-1}
extra=()
[ -n "${STALE_AB_EVAL:-}" ] && extra+=(--eval-limit "$STALE_AB_EVAL")
[ -n "$mcfg" ] && extra+=(--model-config "$mcfg")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "| $mode K=$K, $model${mcfg:+ ($mcfg)}, fashion-mnist, $steps steps, batch 32, sgd lr=$lr momentum=0.9, seed $seed | loss (last 100 steps) | test accuracy | samples/s |"
echo "|---|---|---|---|"
for s in none predict pipemare; do
  out=$("$build/axon-run" train --model "$model" --dataset fashion-mnist \
    --local "$K" --mode "$mode" --staleness "$s" --steps "$steps" \
    --batch 32 --optim "opt=sgd,lr=$lr,momentum=0.9" --seed "$seed" \
    "${extra[@]}" --quiet --csv "$tmp/$s.csv" 2>&1 | grep '^summary:')
  loss=$(awk -F, 'NR > 1 { l[NR] = $5 } END { n = 0; s = 0;
    for (i = NR - 99; i <= NR; i++) if (i > 1) { s += l[i]; n++ }
    printf "%.4f", s / n }' "$tmp/$s.csv")
  acc=$(sed -n 's/.*test_accuracy=\([^ ]*\).*/\1/p' <<<"$out")
  sps=$(sed -n 's/.*samples_per_s=\([^ ]*\).*/\1/p' <<<"$out")
  echo "| $s | $loss | $acc | $sps |"
done
