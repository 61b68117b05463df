#!/usr/bin/env bash
# Runs every libFuzzer harness of tests/fuzz for SECONDS seconds each on a
# scratch copy of its seed corpus (new inputs never land in the repository),
# with ASan and UBSan (built in; UBSan aborts on the first report, leaks
# are reported at exit). Prints each harness's executions, exec/s and
# crashes, then a total line; exits 1 if any harness crashed, leaked or
# hit undefined behaviour. Crash inputs are kept under BUILD/fuzz-artifacts.
#   scripts/fuzz.sh BUILD SECONDS [HARNESS...]
set -uo pipefail
build=${1:?usage: fuzz.sh BUILD SECONDS [HARNESS...]}
secs=${2:?usage: fuzz.sh BUILD SECONDS [HARNESS...]}
shift 2
src=$(cd "$(dirname "$0")/.." && pwd)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(bulk_frame codec rref join http config stage_msg sched_text)
scratch=$(mktemp -d "${TMPDIR:-/tmp}/axon-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
arts="$build/fuzz-artifacts"
mkdir -p "$arts"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"
total=0
failed=0
for t in "${targets[@]}"; do
  bin="$build/tests/fuzz/fuzz_$t"
  if [ ! -x "$bin" ]; then
    echo "fuzz: $t: no harness at $bin (make fuzz builds them)"
    failed=$((failed + 1))
    continue
  fi
  mkdir -p "$scratch/$t"
  cp "$src/tests/fuzz/corpus/$t/"* "$scratch/$t/" 2>/dev/null
  dict=()
  [ -f "$src/tests/fuzz/$t.dict" ] && dict=(-dict="$src/tests/fuzz/$t.dict")
  log="$scratch/$t.log"
  "$bin" -max_total_time="$secs" -max_len=65536 -timeout=25 \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$arts/$t-" \
    "${dict[@]}" "$scratch/$t" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  execs=${execs:-0}
  crashes=0
  if [ $rc -ne 0 ]; then
    crashes=1
    failed=$((failed + 1))
    echo "fuzz: $t failed (exit $rc); the report:"
    grep -E "ERROR|SUMMARY|runtime error|invariant failed|^ +#[0-9]+ " "$log" | head -30
    ls "$arts/$t-"* 2>/dev/null | sed 's/^/fuzz: input kept: /'
  fi
  total=$((total + execs))
  printf 'fuzz: %-10s %12s executions %8s exec/s  %d crashes\n' \
    "$t" "$execs" "${rate:-0}" "$crashes"
done
printf 'fuzz: total      %12s executions in %d harnesses, %d failed\n' \
  "$total" "${#targets[@]}" "$failed"
[ $failed -eq 0 ]
