#!/usr/bin/env bash
# Draws a real run's trace as the schedule's rank x time grid, in the
# colours and layout of the timing model's pictures (axon-run
# schedule --plot), so the measured and the simulated schedule
# compare side by side:
#   scripts/plot_trace.sh TRACE.json OUT.png [OPTIONS]
# TRACE.json: axon-run train --trace FILE (the stages' compute events).
# OPTIONS go to axon-run schedule: --skip N (leave out the first N
# mini-batches, e.g. the warm-up), --batches N (draw N of them), --grid
# (the text grid too), --mode M --stages K [--chunks V] (the ranks of a
# chunked mode's stages; without, the stages are grouped by their agents,
# or drawn one per row in an emulated run). AXON_RUN names the axon-run
# binary (default: build/axon-run of this checkout, else the PATH's).
# PLOT_TERM and PLOT_SIZE ("W,H") change the output as for plot_run.sh.
# Exit 2 on bad arguments or an unreadable trace, 3 when gnuplot is
# missing.
set -euo pipefail
usage() { echo "usage: plot_trace.sh TRACE.json OUT.png [schedule options]" >&2; exit 2; }
(($# >= 2)) || usage
trace=$1 out=$2
shift 2
[[ -s $trace ]] || { echo "plot_trace: $trace: no such file or empty" >&2; exit 2; }
command -v gnuplot >/dev/null ||
  { echo "plot_trace: gnuplot is not installed (apt-get install gnuplot-nox): no plot" >&2; exit 3; }
here=$(cd "$(dirname "$0")/.." && pwd)
run=${AXON_RUN:-$here/build/axon-run}
[[ -x $run ]] || run=$(command -v axon-run) ||
  { echo "plot_trace: no axon-run (build it, or set AXON_RUN)" >&2; exit 2; }
rc=0
"$run" schedule --trace "$trace" --plot "$out" "$@" || rc=$?
((rc == 0)) || { [[ $rc == 3 ]] && exit 3; exit 2; }
echo "plot_trace: $out"
