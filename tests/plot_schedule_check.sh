#!/usr/bin/env bash
# test_plot_schedule: the pictures of a schedule. axon-run schedule
# draws a mode's simulated timeline into a PNG and as a text grid; a tiny
# emulated run (the "sleep" model: fixed-time blocks) writes a trace that
# scripts/plot_trace.sh draws into a PNG; scripts/plot_trace.sh refuses a
# missing trace with exit 2. Exit 77 (skipped) without gnuplot.
#   tests/plot_schedule_check.sh SOURCE BUILD
set -euo pipefail
src=${1:?usage: plot_schedule_check.sh SOURCE BUILD}
bin=${2:?usage: plot_schedule_check.sh SOURCE BUILD}
command -v gnuplot >/dev/null || { echo "plot_schedule_check: no gnuplot: skipped"; exit 77; }
fail() { echo "plot_schedule_check: FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d /tmp/axon-plot-schedule.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
run=$bin/axon-run
png() { [[ $(head -c 8 "$1" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]]; }

# The simulated picture and grid of a mode.
"$run" schedule --mode zb-h1 --stages 4 --micro 8 --grid \
  --plot "$tmp/sim.png" >"$tmp/grid.txt" 2>"$tmp/err" || { cat "$tmp/err" >&2; fail "schedule"; }
png "$tmp/sim.png" || fail "sim.png is not a PNG"
[[ $(grep -c '^rank [0-3] |' "$tmp/grid.txt") == 4 ]] || fail "grid: $(cat "$tmp/grid.txt")"
grep -q '^rank 0 |0F0 ' "$tmp/grid.txt" || fail "grid: rank 0 does not start with 0F0"
grep -q '3W7' "$tmp/grid.txt" || fail "grid: no 3W7"

# A real (emulated) run's trace, drawn the same way.
"$run" train --model sleep --model-config blocks=4,fwd_ms=2,bwd_ms=4 \
  --dataset synthetic --data-config shape=16,classes=10,examples=256 \
  --stages 4 --emulate --mode zb-h1 --microbatches 8 --steps 2 --batch 32 \
  --eval-limit 32 --trace "$tmp/trace.json" >"$tmp/train.log" 2>&1 ||
  { cat "$tmp/train.log" >&2; fail "axon-run train --trace"; }
out=$(AXON_RUN=$run bash "$src/scripts/plot_trace.sh" "$tmp/trace.json" "$tmp/trace.png" \
  --skip 1 --grid --width 400 2>"$tmp/err") || { cat "$tmp/err" >&2; fail "plot_trace.sh"; }
[[ $out == *"plot_trace: $tmp/trace.png"* ]] || fail "plot_trace.sh said '$out'"
png "$tmp/trace.png" || fail "trace.png is not a PNG"
# Mini-batch 1 of 4 stages x 8 micro-batches: F, I and W of each, and a STEP.
[[ $(grep -c '^rank [0-3] |' <<<"$out") == 4 ]] || fail "trace grid: $out"
grep -q '3W15' <<<"$out" || fail "trace grid: no 3W15: $out"

rc=0
AXON_RUN=$run bash "$src/scripts/plot_trace.sh" "$tmp/missing.json" "$tmp/bad.png" 2>"$tmp/err" || rc=$?
[[ $rc == 2 ]] || fail "missing trace: exit $rc, want 2"
[[ ! -e $tmp/bad.png ]] || fail "missing trace: wrote a PNG anyway"
echo "plot_schedule_check: ok"
