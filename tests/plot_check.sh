#!/usr/bin/env bash
# test_plot: scripts/plot_run.sh draws a pipeline metrics CSV and a loss
# curve CSV (small ones written here, in axon-run's formats) into PNGs, and
# refuses an empty file, a CSV without the columns and a missing one with
# exit 2. Exit 77 (skipped) without gnuplot.
#   tests/plot_check.sh SOURCE
set -euo pipefail
src=${1:?usage: plot_check.sh SOURCE}
command -v gnuplot >/dev/null || { echo "plot_check: no gnuplot: skipped"; exit 77; }
fail() { echo "plot_check: FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d /tmp/axon-plot.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
plot=$src/scripts/plot_run.sh

{
  echo "step,wall_s,samples,samples_per_s,loss,lr,bubble,coord_bytes,busy_0,busy_1,peak_mem_0,peak_mem_1,live_stash_0,live_stash_1"
  for s in $(seq 0 29); do
    echo "$s,0.1,32,$((300 + s)),$(awk "BEGIN{print 2.3 - $s * 0.05}"),0.05,0.3,1000,0.7,0.6,100,100,2,1"
  done
} >"$tmp/pipe.csv"
{
  echo "step,epoch,loss,lr,samples_per_s"
  for s in $(seq 1 30); do echo "$s,0,$(awk "BEGIN{print 2.3 - $s * 0.05}"),0.01,$((1000 + s))"; done
} >"$tmp/loss.csv"
echo "summary: model=mlp steps=30 test_accuracy=81.25% samples_per_s=300" >"$tmp/log.txt"

png() { [[ $(head -c 8 "$1" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]]; }
out=$(bash "$plot" "$tmp/pipe.csv" "$tmp/pipe.png" "$tmp/log.txt") || fail "pipeline CSV"
[[ $out == *"30 steps, 2 stages"* ]] || fail "pipeline CSV: '$out' (want 30 steps, 2 stages)"
png "$tmp/pipe.png" || fail "pipe.png is not a PNG"
out=$(bash "$plot" "$tmp/loss.csv" "$tmp/loss.png") || fail "loss CSV"
[[ $out == *"30 steps"* ]] || fail "loss CSV: '$out'"
png "$tmp/loss.png" || fail "loss.png is not a PNG"

: >"$tmp/empty.csv"
echo "a,b,c" >"$tmp/other.csv"
echo "1,2,3" >>"$tmp/other.csv"
for bad in "$tmp/empty.csv" "$tmp/other.csv" "$tmp/missing.csv"; do
  rc=0
  bash "$plot" "$bad" "$tmp/bad.png" 2>"$tmp/err" || rc=$?
  [[ $rc == 2 ]] || fail "$bad: exit $rc, want 2"
  [[ -s $tmp/err ]] || fail "$bad: no message"
  [[ ! -e $tmp/bad.png ]] || fail "$bad: wrote a PNG anyway"
done
echo "plot_check: ok"
