#!/usr/bin/env bash
# Every synchronous pipeline mode on one model, stage-driven against
# coordinator-driven, interleaved in one run: for each round, each mode runs
# with --ahead 8 (the default, stage-driven) and --ahead 1
# (coordinator-driven) back to back. Prints one row per run (samples/s and
# each stage's peak live states, weight versions and state bytes, as
# axon-run reports them), then the median samples/s per mode and ahead.
#
#   scripts/pipe_modes.sh [BUILD] [ROUNDS] [axon-run train arguments...]
# defaults: build 3 --model resnet20 --dataset fashion-mnist --local 4
#           --microbatches 4 --batch 32 --steps 40
# PIPE_MODES overrides the mode list (default: sequential gpipe 1f1b
# interleaved zb-h1 zbv).
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
shift $(($# > 2 ? 2 : $#))
args=("$@")
if ((${#args[@]} == 0)); then
  args=(--model resnet20 --dataset fashion-mnist --local 4 --microbatches 4
        --batch 32 --steps 40)
fi
modes=${PIPE_MODES:-"sequential gpipe 1f1b interleaved zb-h1 zbv"}
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
printf '%-12s %5s %9s  %s\n' mode ahead samples/s \
  "stages: [stage agent busy, peak states, versions, state]"
for r in $(seq 1 "$rounds"); do
  for m in $modes; do
    for a in 8 1; do
      log=$("$build/axon-run" train "${args[@]}" --mode "$m" --ahead "$a" \
            --eval-limit 250 --quiet 2>&1) || { echo "$log" >&2; exit 1; }
      sps=$(grep -o 'samples_per_s=[0-9.]*' <<<"$log" | cut -d= -f2)
      st=$(grep '^stages:' <<<"$log" | sed 's/^stages: //;s/peak states/s/g;s/versions/v/g;s/state /mem /g')
      printf '%-12s %5s %9s  %s\n' "$m" "$a" "$sps" "$st"
      echo "$m $a $sps" >>"$rows"
    done
  done
done
echo "# median samples/s over $rounds rounds: mode, --ahead 8, --ahead 1, ratio"
for m in $modes; do
  med() { awk -v m="$m" -v a="$1" '$1 == m && $2 == a {print $3}' "$rows" |
          sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
  s=$(med 8) c=$(med 1)
  awk -v m="$m" -v s="$s" -v c="$c" \
    'BEGIN {printf "%-12s %9.1f %9.1f %6.3f\n", m, s, c, s / c}'
done
