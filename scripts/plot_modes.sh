#!/usr/bin/env bash
# The pictures of every mode of the mode table at K = 4 ranks, M = 8
# micro-batches (chunked modes: 2 stages per rank), drawn from the timing
# model with F = I = W = 1 (a whole B = 2) and STEP = 0.25:
#   scripts/plot_modes.sh [DOCS_DIR]
# writes DOCS_DIR/schedules/MODE.png (900 x 300) for each mode that
# `axon-run train --help` lists (the table's names, so a new mode joins by
# itself) and rewrites, in DOCS_DIR/MODES.md, the part between the markers
# "<!-- schedule pictures -->" and "<!-- end of schedule pictures -->"
# (the pictures) and between "<!-- schedule grid -->" and
# "<!-- end of schedule grid -->" (the text grid of GRID_MODE, zb-h1 by
# default). DOCS_DIR: docs/ of this checkout. AXON_RUN names the axon-run
# binary (default: build/axon-run of this checkout). A mode that cannot
# be drawn is named and the exit status is 1; 3 when gnuplot is missing.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
docs=${1:-$here/docs}
run=${AXON_RUN:-$here/build/axon-run}
[[ -x $run ]] || { echo "plot_modes: no $run (build it, or set AXON_RUN)" >&2; exit 2; }
command -v gnuplot >/dev/null ||
  { echo "plot_modes: gnuplot is not installed (apt-get install gnuplot-nox)" >&2; exit 3; }
K=4 M=8 costs=(--t-f 1 --t-b 1 --t-w 1 --t-step 0.25)
modes=$("$run" train --help | sed -n 's/^ *--mode MODE *\([^ ]*\).*/\1/p' | tr '|' ' ')
[[ -n $modes ]] || { echo "plot_modes: no mode list in axon-run train --help" >&2; exit 2; }
mkdir -p "$docs/schedules"
pics="" failed=""
for m in $modes; do
  if PLOT_SIZE=${PLOT_SIZE:-900,300} "$run" schedule --mode "$m" --stages $K --micro $M \
      "${costs[@]}" --plot "$docs/schedules/$m.png" 2>"$docs/schedules/.err"; then
    pics+="![$m](schedules/$m.png)"$'\n\n'
  else
    failed+=" $m"
    sed 's/^/  /' "$docs/schedules/.err" >&2
  fi
done
rm -f "$docs/schedules/.err"
grid_mode=${GRID_MODE:-zb-h1}
grid=$("$run" schedule --mode "$grid_mode" --stages $K --micro $M "${costs[@]}" --grid)
# Replaces the lines between two marker lines of MODES.md with a file's.
splice() {
  local begin=$1 end=$2 body=$3 md=$docs/MODES.md
  grep -qF -- "$begin" "$md" && grep -qF -- "$end" "$md" ||
    { echo "plot_modes: $md has no '$begin' ... '$end'" >&2; exit 2; }
  awk -v b="$begin" -v e="$end" -v f="$body" '
    $0 == b { print; while ((getline l < f) > 0) print l; skip = 1; next }
    $0 == e { skip = 0 }
    !skip' "$md" >"$md.new"
  mv "$md.new" "$md"
}
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
printf '%s' "$pics" >"$tmp"
splice "<!-- schedule pictures -->" "<!-- end of schedule pictures -->" "$tmp"
{ echo '```'; echo "$grid"; echo '```'; } >"$tmp"
splice "<!-- schedule grid -->" "<!-- end of schedule grid -->" "$tmp"
echo "plot_modes: $(echo $modes | wc -w) modes into $docs/schedules${failed:+; not drawn:$failed}"
[[ -z $failed ]]
