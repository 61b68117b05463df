#!/usr/bin/env bash
# A/B benchmark of two builds on local pipeline training, interleaved:
# for each round and each case, build A then build B run the same
# `axon-run train --local K` command; prints samples/s and the peak
# resident memory (RSS, sampled every 50 ms) of each stage agent.
#
#   scripts/pipe_ab.sh BUILD_A BUILD_B ROUNDS "CASE" ["CASE" ...]
# where CASE is the axon-run arguments after `train`, e.g.
#   "--model resnet20 --dataset fashion-mnist --local 2 --mode gpipe
#    --microbatches 8 --steps 40 --batch 64"
# PIPE_AB_ARGS_A / PIPE_AB_ARGS_B: more arguments for A's / B's runs only,
# to compare two settings of one build (BUILD_A = BUILD_B), e.g.
#   PIPE_AB_ARGS_A="--sum-order tree" PIPE_AB_ARGS_B="--sum-order chain"
set -euo pipefail
a=$1 b=$2 rounds=$3
shift 3
run_one() { # build, args -> "samples/s rss0 rss1 ..." (MiB)
  local build=$1
  shift
  local log
  log=$(mktemp)
  AXON_PIN_AGENTS=${AXON_PIN_AGENTS:-1} "$build/axon-run" train "$@" \
    --eval-limit "${PIPE_AB_EVAL:-250}" --quiet >"$log" 2>&1 &
  local pid=$! peaks=""
  declare -A peak=()
  while kill -0 "$pid" 2>/dev/null; do
    while read -r rss name; do
      [[ -n "$name" ]] || continue
      ((rss > ${peak[$name]:-0})) && peak[$name]=$rss
    done < <(ps --ppid "$pid" -o rss=,args= 2>/dev/null |
             sed -n 's/^ *\([0-9]*\) .*--name \([^ ]*\).*/\1 \2/p')
    sleep 0.05
  done
  wait "$pid" || { cat "$log" >&2; rm -f "$log"; return 1; }
  for n in $(printf '%s\n' "${!peak[@]}" | sort); do
    peaks+=" $n=$((peak[$n] / 1024))"
  done
  echo "$(grep -o 'samples_per_s=[0-9.]*' "$log" | cut -d= -f2)${peaks}"
  rm -f "$log"
}
for r in $(seq 1 "$rounds"); do
  for c in "$@"; do
    # shellcheck disable=SC2086
    ra=$(run_one "$a" $c ${PIPE_AB_ARGS_A:-})
    # shellcheck disable=SC2086
    rb=$(run_one "$b" $c ${PIPE_AB_ARGS_B:-})
    echo "round $r | $c"
    echo "  A $ra"
    echo "  B $rb"
  done
done
