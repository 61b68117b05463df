#!/usr/bin/env bash
# Draws an axon-run CSV as a PNG with gnuplot:
#   scripts/plot_run.sh CSV OUT.png [LOG]
# CSV is either a pipeline's per-step metrics (axon-run --local/--stages
# ... --csv: step, wall_s, samples_per_s, loss, bubble, busy_K, ...) or a
# single-process loss curve (--csv: step, epoch, loss, lr, samples_per_s).
# Panels: the training loss and samples/s against the step; for a pipeline
# also each stage's busy fraction and bubble (1 - busy) against the step.
# LOG (optional): axon-run's output; its test accuracy ("test_accuracy=X%"
# of the summary line, or the last "test accuracy X%") goes in the title.
# PLOT_TERM (default pngcairo; "png" draws a smaller file) and PLOT_SIZE
# ("W,H") change the output.
# Exit 2 on bad arguments or an unknown CSV, 3 when gnuplot is missing.
set -euo pipefail
usage() { echo "usage: plot_run.sh CSV OUT.png [LOG]" >&2; exit 2; }
[[ $# -eq 2 || $# -eq 3 ]] || usage
csv=$1 out=$2 log=${3:-}
[[ -s $csv ]] || { echo "plot_run: $csv: no such file or empty" >&2; exit 2; }
command -v gnuplot >/dev/null ||
  { echo "plot_run: gnuplot is not installed (apt-get install gnuplot-nox): no plot" >&2; exit 3; }
header=$(head -n1 "$csv")
rows=$(($(wc -l <"$csv") - 1))
((rows >= 1)) || { echo "plot_run: $csv has no data rows" >&2; exit 2; }
IFS=, read -r -a cols <<<"$header"
has() { local c; for c in "${cols[@]}"; do [[ $c == "$1" ]] && return 0; done; return 1; }
for c in step loss samples_per_s; do
  has "$c" || { echo "plot_run: $csv: no '$c' column (header: $header)" >&2; exit 2; }
done
stages=0
while has "busy_$stages"; do stages=$((stages + 1)); done

title="axon-run: $(basename "$csv"), $rows steps"
if [[ -n $log ]]; then
  [[ -r $log ]] || { echo "plot_run: $log: cannot read" >&2; exit 2; }
  acc=$(grep -o 'test_accuracy=[0-9.]*%' "$log" | tail -n1 | cut -d= -f2 || true)
  [[ -n $acc ]] || acc=$(grep -o 'test accuracy [0-9.]*%' "$log" | tail -n1 | awk '{print $3}' || true)
  [[ -n $acc ]] && title="$title, test accuracy $acc"
fi
((stages > 0)) && title="$title, $stages stages"

layout="1,2" size="1200,450"
((stages > 0)) && layout="2,2" size="1200,800"
gnuplot <<GP
set terminal ${PLOT_TERM:-pngcairo} size ${PLOT_SIZE:-$size} noenhanced font ",10"
set output "$out"
set datafile separator ","
set key autotitle columnhead
set grid
set xlabel "step"
set multiplot layout $layout title "$title"
set title "training loss"
plot "$csv" using "step":"loss" with lines lw 1.5 notitle
set title "samples/s"
plot "$csv" using "step":"samples_per_s" with lines lw 1.5 notitle
if ($stages > 0) {
  set title "busy fraction per stage"
  set yrange [0:1]
  set key outside right
  plot for [k=0:$stages-1] "$csv" using "step":(column(sprintf("busy_%d", k))) \
    with lines lw 1.2 title sprintf("stage %d", k)
  set title "bubble (1 - busy) per stage"
  plot for [k=0:$stages-1] "$csv" using "step":(1 - column(sprintf("busy_%d", k))) \
    with lines lw 1.2 title sprintf("stage %d", k)
}
unset multiplot
GP
what="$rows steps"
((stages > 0)) && what="$what, $stages stages"
echo "plot_run: $out ($what)"
