#!/usr/bin/env bash
# GPT training steps, axon against PyTorch, fp32 against bf16 mixed
# precision, on this CPU (docs/BENCHMARKS.md has the figures):
#
#   scripts/gpt_bench.sh [BUILD_DIR] [ROUNDS]      (build, 3)
#
# Each round runs, one after the other in one process each, with the same
# model, batch and threads: axon fp32, axon bf16 (axon-bench train
# --precision), PyTorch fp32 and PyTorch under bf16 autocast
# (scripts/torch_train_bench.py --bf16), then axon-bench peak (the CPU's
# fp32 and bf16 multiply-add peak on the same threads). The rounds
# interleave the four so that a shared machine's load falls on all of them
# alike. The summary takes each one's median over the rounds, and prints
#
#   - axon bf16 / axon fp32 in samples/s, and in peak resident memory;
#   - axon fp32 / PyTorch fp32 and axon bf16 / PyTorch bf16 in samples/s;
#     each speed ratio is taken within every round (the two runs next to
#     each other) and the median and range over the rounds are given, from
#     the wall clock and from the CPU time per step (which time others ran
#     on the cores does not inflate);
#   - each run's GEMM GFLOP/s (the FLOPs of a step that
#     agents/axon_bench_flops.c derives, the same count for both sides) as
#     a share of the peak of its arithmetic (fp32 runs of the fp32 peak,
#     bf16 runs of the bf16 peak): from the wall clock against the best
#     wall-clock peak on the same threads over the rounds, and from the CPU
#     time per thread (cpu_s_per_step / threads) against the best CPU-time
#     peak. Preemption by other work does not count in CPU time, but a
#     thread spinning at a barrier for a preempted one does.
#
# The commands run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed from
# their environment (a machine that sets them slows OpenBLAS's kernel
# choice); nothing else changes. The model and budget (environment):
# GPT_BENCH_CONFIG (layers, hidden, heads, ff, vocab of the model),
# GPT_BENCH_SEQ, GPT_BENCH_BATCH, GPT_BENCH_THREADS, GPT_BENCH_DROPOUT
# (both sides), GPT_BENCH_STEPS timed steps after GPT_BENCH_WARMUP. The
# logs go to GPT_BENCH_OUT as NAME.rROUND.log; GPT_BENCH_SUMMARY=1 runs
# nothing and summarises the ROUNDS rounds of logs already there (rounds of
# several invocations pool when their logs are numbered on).
set -uo pipefail
build=${1:-build}
rounds=${2:-3}
bench="$build/axon-bench"
[ -x "$bench" ] || { echo "gpt_bench: no $bench (build first)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
python=${GPT_BENCH_PYTHON:-/usr/bin/python3}
L=4 H=768 A=12 F=3072 V=50257
eval "$(echo "${GPT_BENCH_CONFIG:-layers=4,hidden=768,heads=12,ff=3072,vocab=50257}" |
  tr ',' '\n' | sed -n 's/^layers=/L=/p; s/^hidden=/H=/p; s/^heads=/A=/p;
                         s/^ff=/F=/p; s/^vocab=/V=/p')"
T=${GPT_BENCH_SEQ:-256}
B=${GPT_BENCH_BATCH:-8}
threads=${GPT_BENCH_THREADS:-2}
drop=${GPT_BENCH_DROPOUT:-0.1}
steps=${GPT_BENCH_STEPS:-2}
warmup=${GPT_BENCH_WARMUP:-1}
out=${GPT_BENCH_OUT:-gpt-bench-out}
mkdir -p "$out"
clean=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
mconf="layers=$L,hidden=$H,heads=$A,ff=$F,vocab=$V,dropout=$drop"
common=(--seq "$T" --batch "$B" --threads "$threads" --steps "$steps"
        --warmup "$warmup")

# One run of config $1 in round $2: its output line into $out.
run_one() {
  local what=$1 r=$2 log="$out/$1.r$2.log"
  case $what in
  axon_fp32 | axon_bf16)
    "${clean[@]}" "$bench" train --model gpt --model-config "$mconf" \
      --precision "${what#axon_}" "${common[@]}" >"$log" 2>&1 ;;
  torch_fp32 | torch_bf16)
    "${clean[@]}" "$python" "$here/torch_train_bench.py" --model gpt \
      --layers "$L" --hidden "$H" --heads "$A" --ff "$F" --vocab "$V" \
      --dropout "$drop" "${common[@]}" \
      $([ "$what" = torch_bf16 ] && echo --bf16) >"$log" 2>&1 ;;
  peak)
    "${clean[@]}" "$bench" peak --threads "$threads" >"$log" 2>&1 ;;
  esac || echo "gpt_bench: $what failed in round $r (see $log)" >&2
}

# The value of key $2 on the result line of log $1.
field() { sed -n "s/.*[ :]$2=\([-0-9.e+]*\).*/\1/p" "$1" | tail -1; }

# The median of the numbers on stdin.
median() { sort -g | awk '{v[NR] = $1} END {if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }

runs="axon_fp32 axon_bf16 torch_fp32 torch_bf16"
echo "gpt_bench: L=$L H=$H heads=$A ff=$F vocab=$V seq=$T batch=$B" \
  "threads=$threads dropout=$drop steps=$steps warmup=$warmup rounds=$rounds"
echo "gpt_bench: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs"
for r in $(seq 1 "$rounds"); do
  if [ "${GPT_BENCH_SUMMARY:-0}" != 1 ]; then
    cut -d' ' -f1-3 /proc/loadavg >"$out/load.r$r.log"
    echo "round $r: load average $(cat "$out/load.r$r.log") before it"
  fi
  for what in $runs peak; do
    [ "${GPT_BENCH_SUMMARY:-0}" = 1 ] || run_one "$what" "$r"
    if [ "$what" = peak ]; then
      printf 'round %d %-10s fp32 %s bf16 %s GFLOP/s\n' "$r" peak \
        "$(grep 'kind=fp32' "$out/peak.r$r.log" | grep "threads=$threads " | field /dev/stdin gflops)" \
        "$(grep 'kind=bf16' "$out/peak.r$r.log" | grep "threads=$threads " | field /dev/stdin gflops)"
    else
      printf 'round %d %-10s %8s samples/s %6s MB peak RSS\n' "$r" "$what" \
        "$(field "$out/$what.r$r.log" samples_per_s)" \
        "$(field "$out/$what.r$r.log" peak_rss_mb)"
    fi
  done
done

# Medians, the FLOPs of a step (axon's count) and the best peaks.
declare -A sps rss cpu
for what in $runs; do
  sps[$what]=$(for r in $(seq 1 "$rounds"); do field "$out/$what.r$r.log" samples_per_s; done | median)
  rss[$what]=$(for r in $(seq 1 "$rounds"); do field "$out/$what.r$r.log" peak_rss_mb; done | median)
  cpu[$what]=$(for r in $(seq 1 "$rounds"); do field "$out/$what.r$r.log" cpu_s_per_step; done | median)
done
flop=$(for r in $(seq 1 "$rounds"); do field "$out/axon_fp32.r$r.log" gemm_gflop_per_step; done | median)
best_peak() { # kind, key: the best over the rounds on the bench's threads
  for r in $(seq 1 "$rounds"); do
    grep "kind=$1" "$out/peak.r$r.log" | grep "threads=$threads " | field /dev/stdin "$2"
  done | sort -g | tail -1
}
peak_fp32=$(best_peak fp32 gflops) cpeak_fp32=$(best_peak fp32 cpu_gflops)
peak_bf16=$(best_peak bf16 gflops) cpeak_bf16=$(best_peak bf16 cpu_gflops)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a > 0 && b > 0) printf "%.2f", a / b; else printf "n/a"}'; }
share() { # samples/s, wall peak, CPU s per step, CPU-time peak
  awk -v s="$1" -v p="$2" -v c="$3" -v q="$4" -v f="$flop" -v b="$B" -v t="$threads" \
    'BEGIN {if (s > 0 && p > 0 && f > 0) printf "wall %.1f GFLOP/s = %.1f%% of %.1f", f * s / b, 100 * f * s / b / p, p; else printf "n/a";
            if (c > 0 && q > 0 && f > 0) printf "; CPU time %.1f GFLOP/s = %.1f%% of %.1f", f / (c / t), 100 * f / (c / t) / q, q}'
}
echo
echo "gpt_bench: medians over $rounds rounds; GEMM work $flop GFLOP per step"
for what in $runs; do
  p=$peak_fp32 q=$cpeak_fp32
  [[ $what == *bf16 ]] && p=$peak_bf16 q=$cpeak_bf16
  printf '  %-10s %8s samples/s %6s MB  %s\n' "$what" "${sps[$what]}" \
    "${rss[$what]}" "$(share "${sps[$what]}" "$p" "${cpu[$what]}" "$q")"
done
# The speed of $1 over $2 within each round, wall clock (samples/s) or
# CPU time (cpu_s_per_step, the other way up): "median (min-max)".
paired() {
  for r in $(seq 1 "$rounds"); do
    if [ "$3" = wall ]; then
      ratio "$(field "$out/$1.r$r.log" samples_per_s)" "$(field "$out/$2.r$r.log" samples_per_s)"
    else
      ratio "$(field "$out/$2.r$r.log" cpu_s_per_step)" "$(field "$out/$1.r$r.log" cpu_s_per_step)"
    fi
    echo
  done | grep -v n/a | sort -g | awk '{v[NR] = $1} END {if (NR) printf "%.2f (%.2f-%.2f)", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[1], v[NR]; else printf "n/a"}'
}
speed() { echo "wall $(paired "$1" "$2" wall), CPU time $(paired "$1" "$2" cpu)"; }
echo "  axon bf16 / axon fp32 speed:   $(speed axon_bf16 axon_fp32) (goal >= 1.6)"
echo "  axon bf16 / axon fp32 peak memory: $(ratio "${rss[axon_bf16]}" "${rss[axon_fp32]}") (goal <= 0.6)"
echo "  axon fp32 / torch fp32 speed:  $(speed axon_fp32 torch_fp32) (goal >= 1.5)"
echo "  axon bf16 / torch bf16 speed:  $(speed axon_bf16 torch_bf16) (goal >= 1.5)"
echo "  torch bf16 / torch fp32 speed: $(speed torch_bf16 torch_fp32)"
echo "  torch bf16 / torch fp32 peak memory: $(ratio "${rss[torch_bf16]}" "${rss[torch_fp32]}")"
echo "  axon fp32 / torch fp32 peak memory: $(ratio "${rss[axon_fp32]}" "${rss[torch_fp32]}")"
