#!/usr/bin/env bash
# Kang's convergence study (EPFL MLO, 2019; docs/CONVERGENCE.md), reproduced through
# `axon-run train --emulate` (one process per run, every stage in it, the
# mode's exact math; runtime/pipeline/schedule/emulate.h):
#
#  1. ResNet20 on Fashion-MNIST, SGD with momentum, for every variant in
#     CONV_VARIANTS, K in CONV_KS and learning rate in CONV_LRS (and seed in
#     CONV_SEEDS): test top-1 after every epoch. Writes Kang's table
#     (best top-1 over the epochs, mean +- std over the seeds, at the best
#     learning rate, per variant and K) and PNG plots of test accuracy
#     against epoch and against modelled time (the timing model fed with
#     the measured per-stage costs), one pair per K, each variant at its
#     best learning rate.
#  2. The simplified-BERT divergence count on gcide: every mode in
#     BERT_MODES, learning rate in BERT_LRS and seed in BERT_SEEDS; a run
#     diverged when a training loss is not finite or the run fails with a
#     non-finite value, or when the mean loss of its last BERT_WIN steps is
#     above the mean of its first BERT_WIN steps (it ended worse than it
#     started). Writes Kang's table (diverged runs / runs).
#  3. A byte-level GPT on gcide (--dataset text) for every variant in
#     GPT_VARIANTS, K in GPT_KS, learning rate in GPT_LRS and seed in
#     GPT_SEEDS: validation bits per byte every GPT_EVAL_EVERY steps
#     against wall time and modelled time;
#     a table of mean and spread over the seeds and PNG plots per K
#     (scripts/convergence_gpt.sh, which describes its budget).
#
# A variant is a mode, optionally with a staleness correction:
# "pipedream:predict" runs --mode pipedream --staleness predict. A variant
# whose flags axon-run refuses is skipped with a message (and shown as
# "skipped" in the table).
#
#   scripts/convergence.sh [BUILD_DIR]      (default: build)
#
# Budget (environment, defaults sized for a shared 2-core machine, about
# 40 minutes): CONV_LIMIT training examples (a fixed subset), CONV_EPOCHS
# epochs of batch CONV_BATCH, CONV_EVAL test examples per evaluation;
# BERT_STEPS steps of batch BERT_BATCH for BERT_K stages of BERT_CONFIG.
# Set CONV_SKIP_RESNET=1, CONV_SKIP_BERT=1 or CONV_SKIP_GPT=1 to leave a
# part out (invocations with the same CONV_OUT, one part each, may run at
# once).
# Sequential runs at the first K only and is repeated for the others
# (the same computation; CONV_SEQ_ONCE=0 runs every K).
# Output in CONV_OUT (default conv-out): logs, per-run epoch files,
# resnet_table.md, bert_table.md, acc_epoch_K*.png, acc_time_K*.png, and
# the GPT part's gpt/ folder, gpt_table.md, gpt_bpb_*_K*_lr*.png.
set -uo pipefail
build=${1:-build}
run="$build/axon-run"
[ -x "$run" ] || { echo "convergence: no $run (build first)" >&2; exit 2; }
out=${CONV_OUT:-conv-out}
mkdir -p "$out/runs" "$out/bert"

VARIANTS=${CONV_VARIANTS:-"sequential ddg fr pipedream 2bw pipedream:predict 2bw:predict"}
KS=${CONV_KS:-"2 3 4 6 11"}
LRS=${CONV_LRS:-"0.04 0.16"}
SEEDS=${CONV_SEEDS:-"1"}
LIMIT=${CONV_LIMIT:-2048}
EPOCHS=${CONV_EPOCHS:-2}
BATCH=${CONV_BATCH:-32}
EVAL=${CONV_EVAL:-500}
MOMENTUM=${CONV_MOMENTUM:-0.9}
BERT_MODES=${BERT_MODES:-"sequential ddg fr pipedream"}
BERT_LRS=${BERT_LRS:-"1.5e-4 1e-4 0.5e-4"}
BERT_SEEDS=${BERT_SEEDS:-"1 2 3"}
BERT_STEPS=${BERT_STEPS:-60}
BERT_BATCH=${BERT_BATCH:-16}
BERT_K=${BERT_K:-3}
BERT_WIN=${BERT_WIN:-10}
BERT_CONFIG=${BERT_CONFIG:-"layers=3,hidden=64,heads=4,ff=256,seq=64,vocab=4096"}
BERT_DATA=${BERT_DATA:-"seq=64,vocab=4096,examples=2048"}
NICE=${CONV_NICE:-19}
SEQ_ONCE=${CONV_SEQ_ONCE:-1}

# The axon-run flags of a variant ("mode" or "mode:staleness") at K
# stages; with a third argument M, the micro-batches of every mode that
# splits its mini-batch (gpipe, 1f1b, 2bw).
variant_flags() {
  local mode=${1%%:*} st=""
  [[ $1 == *:* ]] && st=${1#*:}
  local f="--mode $mode"
  [ -n "$st" ] && f="$f --staleness $st"
  if [ -n "${3:-}" ] && [[ " gpipe 1f1b 2bw " == *" $mode "* ]]; then
    f="$f --microbatches $3"
  elif [ "$mode" = 2bw ]; then
    # 2bw needs at least K - 1 micro-batches (mode.h: ax_pipe_min_units).
    f="$f --microbatches $(($2 - 1 > 4 ? $2 - 1 : 4))"
  fi
  echo "$f"
}

# Whether axon-run accepts a variant's flags (a one-step MLP run).
declare -A usable=()
probe_variants() {
  for v in "$@"; do
    [ -n "${usable[$v]:-}" ] && continue
    if "$run" train --emulate --stages 2 $(variant_flags "$v" 2) --model mlp \
        --dataset synthetic --steps 1 --batch 8 --eval-limit 8 --quiet \
        >"$out/probe.log" 2>&1; then
      usable[$v]=1
    else
      echo "convergence: skipping $v: axon-run refuses it: $(grep -m1 axon-run "$out/probe.log")" >&2
    fi
  done
}
probe_variants $VARIANTS

t_start=$(date +%s)
if [ "${CONV_SKIP_RESNET:-0}" != 1 ]; then
  for K in $KS; do
    for v in $VARIANTS; do
      [ -n "${usable[$v]:-}" ] || continue
      for lr in $LRS; do
        for seed in $SEEDS; do
          tag="${v/:/+}_K${K}_lr${lr}_s${seed}"
          [ -s "$out/runs/$tag.epochs" ] && continue # resumable
          # Sequential is the same computation at every K (one full-batch
          # step per mini-batch, tests/test_pipe_oracle.c; the modelled time
          # is the sum of every stage's costs): run at the first K only.
          first="${v/:/+}_K${KS%% *}_lr${lr}_s${seed}"
          if [ "$v" = sequential ] && [ "$SEQ_ONCE" = 1 ] &&
             [ "$tag" != "$first" ] && [ -s "$out/runs/$first.epochs" ]; then
            cp "$out/runs/$first.epochs" "$out/runs/$tag.epochs"
            continue
          fi
          echo "convergence: resnet20 $v K=$K lr=$lr seed=$seed ($(( $(date +%s) - t_start )) s)" >&2
          nice -n "$NICE" "$run" train --emulate --stages "$K" \
            $(variant_flags "$v" "$K") --model resnet20 \
            --dataset fashion-mnist --data-config "pad=1,limit=$LIMIT" \
            --batch "$BATCH" --epochs "$EPOCHS" --eval-limit "$EVAL" \
            --eval-every-epoch --seed "$seed" --quiet \
            --optim "opt=sgd,lr=$lr,momentum=$MOMENTUM,sched=const" \
            >"$out/runs/$tag.log" 2>&1 ||
            echo "convergence: $tag failed (see $out/runs/$tag.log)" >&2
          # epoch accuracy modelled_seconds
          sed -n 's/^epoch: \([0-9]*\) .*test_accuracy=\([0-9.]*\)%.*modelled_seconds=\([-0-9.]*\).*/\1 \2 \3/p' \
            "$out/runs/$tag.log" >"$out/runs/$tag.epochs.tmp"
          mv "$out/runs/$tag.epochs.tmp" "$out/runs/$tag.epochs"
        done
      done
    done
  done
  echo "convergence: resnet20 grid done in $(( $(date +%s) - t_start )) s" >&2

  # Best top-1 per run, then per (variant, K, lr) the mean and std over
  # seeds; the table keeps the learning rate with the best mean.
  {
    echo "| blocks |$(for v in $VARIANTS; do printf ' %s top-1 | lr |' "$v"; done)"
    echo "|---|$(for v in $VARIANTS; do printf -- '---|---|'; done)"
    for K in $KS; do
      row="| $K |"
      for v in $VARIANTS; do
        if [ -z "${usable[$v]:-}" ]; then row="$row skipped | |"; continue; fi
        best=""
        for lr in $LRS; do
          stat=$(for seed in $SEEDS; do
                   f="$out/runs/${v/:/+}_K${K}_lr${lr}_s${seed}.epochs"
                   [ -s "$f" ] && awk 'BEGIN{m=-1} $2>m{m=$2} END{print m}' "$f"
                 done | awk '{s+=$1; q+=$1*$1; n++} END{if(n){m=s/n; v=q/n-m*m; if(v<0)v=0; printf "%.3f %.3f %d", m, sqrt(v), n}}')
          [ -n "$stat" ] || continue
          set -- $stat
          if [ -z "$best" ] || awk "BEGIN{exit !($1 > ${best%% *})}"; then
            best="$1 $2 $3 $lr"
          fi
        done
        if [ -z "$best" ]; then row="$row n/a | |"; continue; fi
        set -- $best
        if [ "$3" -gt 1 ]; then row="$row $1 ± $2 | $4 |"; else row="$row $1 | $4 |"; fi
        echo "$K $v $4" >>"$out/best.tmp"
      done
      echo "$row"
    done
  } >"$out/resnet_table.md"
  mv "$out/best.tmp" "$out/best_lr.txt" 2>/dev/null
  cat "$out/resnet_table.md"

  # Plots: per K, each variant at its best learning rate (first seed).
  if command -v gnuplot >/dev/null; then
    first_seed=${SEEDS%% *}
    for K in $KS; do
      pe="" pt=""
      while read -r k v lr; do
        [ "$k" = "$K" ] || continue
        f="$out/runs/${v/:/+}_K${K}_lr${lr}_s${first_seed}.epochs"
        [ -s "$f" ] || continue
        pe="$pe${pe:+, }'$f' using 1:2 with linespoints title '$v lr $lr'"
        pt="$pt${pt:+, }'$f' using 3:2 with linespoints title '$v lr $lr'"
      done <"$out/best_lr.txt"
      [ -n "$pe" ] || continue
      gnuplot <<EOF
set terminal png size 800,500
set key bottom right
set grid
set ylabel 'test top-1 (%)'
set title 'ResNet20 on Fashion-MNIST, K = $K (emulated)'
set output '$out/acc_epoch_K$K.png'
set xlabel 'epoch'
plot $pe
set output '$out/acc_time_K$K.png'
set xlabel 'modelled time (s)'
plot $pt
EOF
    done
  else
    echo "convergence: no gnuplot (scripts/deps.sh installs gnuplot-nox): no plots" >&2
  fi
fi

if [ "${CONV_SKIP_BERT:-0}" != 1 ]; then
  t_bert=$(date +%s)
  for m in $BERT_MODES; do
    for lr in $BERT_LRS; do
      for seed in $BERT_SEEDS; do
        tag="${m}_lr${lr}_s${seed}"
        [ -s "$out/bert/$tag.verdict" ] && continue
        echo "convergence: bert $m lr=$lr seed=$seed ($(( $(date +%s) - t_bert )) s)" >&2
        nice -n "$NICE" "$run" train --emulate --stages "$BERT_K" --mode "$m" \
          --model bert --model-config "$BERT_CONFIG" --dataset gcide \
          --data-config "$BERT_DATA" --batch "$BERT_BATCH" \
          --steps "$BERT_STEPS" --eval-limit 64 --seed "$seed" --quiet \
          --optim "opt=adamw,lr=$lr,sched=const" --csv "$out/bert/$tag.csv" \
          >"$out/bert/$tag.log" 2>&1
        rc=$?
        # Diverged: a failed run, a non-finite loss, or the last window's
        # mean loss above the first window's.
        verdict=$(awk -F, -v w="$BERT_WIN" -v rc="$rc" '
          NR > 1 { n++; l[n] = $5; if ($5 !~ /^-?[0-9.]+(e[-+]?[0-9]+)?$/) bad = 1 }
          END {
            if (rc != 0 || bad || n < 2 * w) { print "diverged"; exit }
            for (i = 1; i <= w; i++) { a += l[i]; b += l[n - w + i] }
            print (b > a ? "diverged" : "ok"), a / w, b / w
          }' "$out/bert/$tag.csv" 2>/dev/null || echo diverged)
        echo "$verdict" >"$out/bert/$tag.verdict"
      done
    done
  done
  {
    echo "| learning rate |$(for m in $BERT_MODES; do printf ' %s divergence |' "$m"; done)"
    echo "|---|$(for m in $BERT_MODES; do printf -- '---|'; done)"
    for lr in $BERT_LRS; do
      row="| $lr |"
      for m in $BERT_MODES; do
        d=0 n=0
        for seed in $BERT_SEEDS; do
          f="$out/bert/${m}_lr${lr}_s${seed}.verdict"
          [ -s "$f" ] || continue
          n=$((n + 1))
          grep -q '^diverged' "$f" && d=$((d + 1))
        done
        row="$row $d/$n |"
      done
      echo "$row"
    done
  } >"$out/bert_table.md"
  cat "$out/bert_table.md"
  echo "convergence: bert done in $(( $(date +%s) - t_bert )) s" >&2
fi

if [ "${CONV_SKIP_GPT:-0}" != 1 ]; then
  . "$(dirname "$0")/convergence_gpt.sh"
fi
