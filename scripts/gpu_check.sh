#!/usr/bin/env bash
# Checks and benchmarks axon's CUDA backend on a GPU host, from the bundle
# that scripts/gpu_bundle.sh made on the build host (no build here: the GPU
# host lacks axon's Debian libraries). Run from a copy of the repository
# with gpu-bundle/ in it:
#
#   scripts/gpu_check.sh [--memcheck] [--no-tests] [--no-bench]
#                        [--tests GLOB] [--budget SEC] [--steps N]
#                        [--bundle DIR] [--force]
#
# Steps, each under `timeout` and all within --budget seconds (default
# 480; a step that no longer fits is skipped and says so):
#  1. the host: nvidia-smi, glibc, python3's torch;
#  2. the bundle: every program and library resolves (ldd with
#     gpu-bundle/env.sh), lists what is missing and stops if anything is;
#     cuDNN's dlopen'ed parts are looked for too;
#  3. no GPU: says so and exits 2 (nothing below runs; --force runs on,
#     to try this script itself on a machine without one);
#  4. the CUDA parity tests, bin/test_cuda_* (exit 0 pass, 77 skip; --tests
#     picks by name, e.g. 'test_cuda_[be]*'), each under compute-sanitizer
#     --tool memcheck with --memcheck (slow: pick a few per call); one of
#     parity_tests (below) that the glob selects but the bundle lacks (a
#     bundle older than the test) counts as a failure;
#  5. benchmarks, axon next to PyTorch (python3 runs without the bundle's
#     libraries): ResNet20 batch 128 and BERT L=3 H=768 A=12 FF=3072
#     seq=128 (batch 8 and 32) training steps, FP32 and TF32; GPT L=4
#     H=768 A=12 FF=3072 seq=256 vocab=50257 batch 8, FP32 and bf16 (torch:
#     bf16 autocast; skipped, and said so, while axon-bench train has no
#     GPT batches); the N=4096 GEMM, FP32 and TF32, axon's backend vs raw
#     cuBLAS vs torch.mm;
#  6. a summary: tests, every result line, axon/torch ratios.
# Output goes to stdout and, when $OUT is set (a directory collected after
# the run), to $OUT/gpu_check.log, with the summary also in
# $OUT/gpu_summary.txt. Exit status: 0 all good; 1 a test or benchmark
# failed; 2 no GPU or no bundle; 3 libraries missing.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bundle=$root/gpu-bundle
memcheck=0 tests=1 bench=1 budget=480 steps=20 warmup=3 force=0
test_glob='test_cuda_*'
# The parity tests a current bundle holds: blas (gemm, vector ops, the
# allocator), elem (activations, dropout), dnn (conv, batch norm, pooling),
# nlp (layer norm, cross-entropy and its correct count, masked softmax,
# embedding), bf16 (casts, gemm_bf16), attn (fused causal attention, GPT's
# kernel, training and decoding shapes), models and pipeline (whole
# models, multi-process placement).
parity_tests=(test_cuda_attn test_cuda_bf16 test_cuda_blas test_cuda_dnn
  test_cuda_elem test_cuda_models test_cuda_nlp test_cuda_pipeline)

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

while (($#)); do
  case "$1" in
    --memcheck) memcheck=1 ;;
    --no-tests) tests=0 ;;
    --no-bench) bench=0 ;;
    --tests) test_glob=$2; shift ;;
    --budget) budget=$2; shift ;;
    --steps) steps=$2; shift ;;
    --bundle) bundle=$(cd "$2" && pwd); shift ;;
    --force) force=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done

start=$SECONDS
# The environment the host had, for python3 and compute-sanitizer: the
# bundle's Debian libraries must not shadow the host's. A command prefix
# (timeout runs programs, not shell functions).
if [[ -n ${LD_LIBRARY_PATH+x} ]]; then
  host_env=(env PYTHONUNBUFFERED=1 "LD_LIBRARY_PATH=$LD_LIBRARY_PATH")
else
  host_env=(env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1)
fi
summary=$(mktemp)
failures=0
trap 'rm -f "$summary" "$summary".*' EXIT

section() { printf '\n==== %s  [t=%ds]\n' "$*" $((SECONDS - start)); }
note() { echo "$*" | tee -a "$summary"; }

# Seconds a step may take: its own limit, cut to what is left of the budget
# (0 when under 10 s are left).
step_limit() {
  local left=$((budget - (SECONDS - start)))
  ((left < 10)) && { echo 0; return; }
  echo $(($1 < left ? $1 : left))
}

# bounded LIMIT CMD...: runs CMD under timeout; prints how it ended and
# returns its status (124 on timeout, 125 when skipped for the budget).
bounded() {
  local lim t0 rc=0
  lim=$(step_limit "$1")
  shift
  if ((lim == 0)); then
    echo "SKIPPED (budget of ${budget}s spent): $*"
    return 125
  fi
  t0=$SECONDS
  timeout -k 10 "$lim" "$@" || rc=$?
  if ((rc == 124 || rc == 137)); then
    echo "TIMEOUT after ${lim}s: $*"
  fi
  echo "-- exit $rc in $((SECONDS - t0))s"
  return $rc
}

host_info() {
  section "host"
  echo "date: $(date -u +%FT%TZ)  kernel: $(uname -r)  cpus: $(nproc)"
  echo "glibc: $(getconf GNU_LIBC_VERSION 2>/dev/null || echo '?')"
  has_gpu=0
  if command -v nvidia-smi >/dev/null; then
    if timeout 30 nvidia-smi; then
      timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
        --format=csv || true
      has_gpu=1
    else
      echo "nvidia-smi failed: no usable GPU"
    fi
  else
    echo "nvidia-smi: not installed"
  fi
  "${host_env[@]}" timeout 60 python3 -c 'import torch; print("python3 torch", torch.__version__,
    "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
    "cudnn", torch.backends.cudnn.version() if torch.cuda.is_available() else None)' 2>&1 ||
    echo "python3: no usable torch"
}

# Compares version strings: 0 when $1 >= $2.
version_ge() { [[ $(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1) == "$2" ]]; }

check_bundle() {
  section "bundle: $bundle"
  if [[ ! -f $bundle/env.sh ]]; then
    echo "gpu_check: no bundle at $bundle: run scripts/gpu_bundle.sh BUILD_DIR on the"
    echo "build host (Debian 12, CUDA build) and carry gpu-bundle to this one"
    return 2
  fi
  sed -n '1,/^# packed/p' "$bundle/MANIFEST" 2>/dev/null || true
  # A copy may lose the execute bits.
  local f
  for f in "$bundle"/bin/*; do [[ -x $f ]] || chmod +x "$f" || true; done
  local need have
  need=$(sed -n 's/^glibc=//p' "$bundle/REQUIRES" 2>/dev/null || true)
  have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  if [[ -n $need && -n $have ]] && ! version_ge "$have" "$need"; then
    echo "gpu_check: this host's glibc $have is older than the $need the bundle needs"
    return 3
  fi
}

check_libs() {
  section "libraries (LD_LIBRARY_PATH from env.sh)"
  echo "CUDA/cuDNN folders found: ${AXON_GPU_LIBDIRS:-none}"
  local f res missing=0 lib d found dirs
  for f in "$bundle"/bin/* "$bundle"/lib/*; do
    if ! res=$(ldd "$f" 2>&1); then
      echo "ldd failed on $f: $res"
      missing=1
      continue
    fi
    if grep -q 'not found' <<<"$res"; then
      echo "MISSING for ${f#"$bundle"/}:"
      grep 'not found' <<<"$res" | sed 's/^/    /'
      missing=1
    fi
  done
  echo "the CUDA backend (libaxon_cuda, loaded by libaxon on demand) and axon-bench resolve to:"
  ldd "$bundle"/lib/libaxon_cuda.so.* "$bundle/bin/axon-bench" |
    grep -E 'libcud|libcublas|libstdc|libgomp|libopenblas' | sort -u | sed 's/^/    /' || true
  # cuDNN 9 loads its engines with dlopen: ldd does not list them.
  for lib in libcudnn_graph.so.9 libcudnn_ops.so.9 libcudnn_cnn.so.9 \
    libcudnn_engines_precompiled.so.9 libcudnn_heuristic.so.9 libcuda.so.1; do
    found=""
    IFS=: read -ra dirs <<<"$LD_LIBRARY_PATH"
    for d in "${dirs[@]}"; do [[ -e $d/$lib ]] && { found=$d/$lib; break; }; done
    if [[ -z $found ]] && ldconfig -p 2>/dev/null | grep -F "$lib " >/dev/null; then
      found="(ld.so cache)"
    fi
    echo "dlopen target $lib: ${found:-NOT FOUND (cuDNN/driver calls may fail)}"
  done
  if ((missing)); then
    echo "gpu_check: libraries are missing (above); add their folder to LD_LIBRARY_PATH"
    echo "or pack them on the build host (scripts/gpu_bundle.sh)"
    return 3
  fi
  echo "all programs and libraries resolve"
}

sanitizer() {
  local s
  for s in "$(command -v compute-sanitizer || true)" /usr/local/cuda/bin/compute-sanitizer \
    /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [[ -n $s && -x $s ]] && { echo "$s"; return; }
  done
}

run_tests() {
  local t name rc cs=""
  for name in "${parity_tests[@]}"; do
    # shellcheck disable=SC2053  # a glob on purpose
    if [[ $name == $test_glob && ! -x $bundle/bin/$name ]]; then
      note "test $name: MISSING from the bundle (rebuild, rerun gpu_bundle.sh)"
      failures=$((failures + 1))
    fi
  done
  if ((memcheck)); then
    cs=$(sanitizer)
    [[ -n $cs ]] || { note "compute-sanitizer not found: tests run without memcheck"; memcheck=0; }
  fi
  for t in "$bundle"/bin/test_cuda_*; do
    name=${t##*/}
    # shellcheck disable=SC2053  # a glob on purpose
    [[ $name == $test_glob ]] || continue
    rc=0
    if ((memcheck)); then
      section "test $name (compute-sanitizer memcheck)"
      # The sanitizer runs with the host's libraries, the test with the
      # bundle's (env passes them on; the sanitizer follows the exec).
      # API errors are reported except in test_cuda_blas, which provokes
      # one on purpose (alloc_oom: cudaMalloc's out of memory, which axon
      # returns as AX_ENOMEM).
      local api=()
      [[ $name == test_cuda_blas ]] && api=(--report-api-errors no)
      bounded 300 "${host_env[@]}" "$cs" --tool memcheck --error-exitcode 99 \
        "${api[@]}" env LD_LIBRARY_PATH="$LD_LIBRARY_PATH" "$t" || rc=$?
    else
      section "test $name"
      bounded 180 "$t" || rc=$?
    fi
    case $rc in
      0) note "test $name: PASS" ;;
      77) note "test $name: SKIP (no GPU seen)" ;;
      125) note "test $name: SKIPPED (budget)" ;;
      124 | 137) note "test $name: TIMEOUT"; failures=$((failures + 1)) ;;
      99) note "test $name: MEMCHECK ERRORS"; failures=$((failures + 1)) ;;
      *) note "test $name: FAIL (exit $rc)"; failures=$((failures + 1)) ;;
    esac
  done
}

# bench KEY LIMIT CMD...: runs one benchmark, keeps its result line (the
# one with samples_per_s or tflops) in the summary under KEY.
bench() {
  local key=$1 lim=$2 rc=0 line
  shift 2
  section "bench $key: $*"
  bounded "$lim" "$@" >"$summary.out" 2>&1 || rc=$?
  cat "$summary.out"
  line=$(grep -E 'samples_per_s=|tflops=|ratio=' "$summary.out" | tr '\n' ' ' || true)
  if ((rc == 0)) && [[ -n $line ]]; then
    note "$key | $line"
  elif ((rc == 125)); then
    note "$key | SKIPPED (budget)"
  else
    note "$key | FAILED (exit $rc)"
    failures=$((failures + 1))
  fi
}

run_bench() {
  local ab="$bundle/bin/axon-bench" tb="$root/scripts/torch_train_bench.py"
  local gb="$root/scripts/torch_gemm_bench.py" th
  local tr=(--steps "$steps" --warmup "$warmup")
  local bert_cfg=layers=3,hidden=768,heads=12,ff=3072,seq=128
  local bert_t=(--model bert --layers 3 --hidden 768 --heads 12 --ff 3072 --seq 128)
  th=$(nproc)
  bench "gemm.fp32.axon" 120 "$ab" gemm --device cuda:0 --size 4096
  bench "gemm.fp32.torch" 120 "${host_env[@]}" python3 "$gb" --device cuda --size 4096
  bench "gemm.tf32.axon" 120 "$ab" gemm --device cuda:0 --size 4096 --tf32
  bench "gemm.tf32.torch" 120 "${host_env[@]}" python3 "$gb" --device cuda --size 4096 --tf32

  bench "resnet20.b128.fp32.axon" 150 "$ab" train --model resnet20 --batch 128 \
    --device cuda:0 "${tr[@]}"
  bench "resnet20.b128.fp32.torch" 150 "${host_env[@]}" python3 "$tb" --model resnet20 \
    --batch 128 --device cuda --threads "$th" "${tr[@]}"
  bench "resnet20.b128.fp32bench.axon" 150 env AXON_CUDNN_BENCHMARK=1 "$ab" train \
    --model resnet20 --batch 128 --device cuda:0 "${tr[@]}"
  bench "resnet20.b128.fp32bench.torch" 150 "${host_env[@]}" python3 "$tb" --model resnet20 \
    --batch 128 --device cuda --threads "$th" --cudnn-benchmark "${tr[@]}"
  bench "resnet20.b128.tf32bench.axon" 150 env AXON_TF32=1 AXON_CUDNN_BENCHMARK=1 "$ab" \
    train --model resnet20 --batch 128 --device cuda:0 "${tr[@]}"
  bench "resnet20.b128.tf32bench.torch" 150 "${host_env[@]}" python3 "$tb" --model resnet20 \
    --batch 128 --device cuda --threads "$th" --cudnn-benchmark --tf32 "${tr[@]}"

  local b
  for b in 8 32; do
    bench "bert.b$b.fp32.axon" 150 "$ab" train --model bert --model-config "$bert_cfg" \
      --batch "$b" --device cuda:0 "${tr[@]}"
    bench "bert.b$b.fp32.torch" 150 "${host_env[@]}" python3 "$tb" "${bert_t[@]}" --batch "$b" \
      --device cuda --threads "$th" "${tr[@]}"
  done
  bench "bert.b32.tf32.axon" 150 env AXON_TF32=1 "$ab" train --model bert \
    --model-config "$bert_cfg" --batch 32 --device cuda:0 "${tr[@]}"
  bench "bert.b32.tf32.torch" 150 "${host_env[@]}" python3 "$tb" "${bert_t[@]}" --batch 32 \
    --device cuda --threads "$th" --tf32 "${tr[@]}"
  bench "bert.b32.fp32.torch-sdpa" 150 "${host_env[@]}" python3 "$tb" "${bert_t[@]}" --batch 32 \
    --device cuda --threads "$th" --attn sdpa "${tr[@]}"

  # GPT (dropout 0, axon's default) in fp32 and in bf16 (axon's
  # --precision bf16, torch's bf16 autocast).
  local gpt_cfg=layers=4,hidden=768,heads=12,ff=3072,seq=256,vocab=50257
  local gpt_t=(--model gpt --layers 4 --hidden 768 --heads 12 --ff 3072 --seq 256
    --vocab 50257 --dropout 0)
  local p flag
  for p in fp32 bf16; do
    flag=()
    [[ $p == bf16 ]] && flag=(--bf16)
    if "$ab" train --help 2>&1 | grep -q 'gpt'; then
      bench "gpt.b8.$p.axon" 150 "$ab" train --model gpt --model-config "$gpt_cfg" \
        --batch 8 --device cuda:0 --precision "$p" "${tr[@]}"
    else
      note "gpt.b8.$p.axon | SKIPPED (axon-bench train has no --model gpt batches yet)"
    fi
    bench "gpt.b8.$p.torch" 150 "${host_env[@]}" python3 "$tb" "${gpt_t[@]}" --batch 8 \
      --device cuda --threads "$th" "${flag[@]}" "${tr[@]}"
  done
}

# axon/torch ratios of samples_per_s (train) and tflops (gemm) per pair.
ratios() {
  awk -F' \\| ' '
    function val(s, k,   m) { return match(s, k "=[0-9.]+") ? substr(s, RSTART + length(k) + 1, RLENGTH - length(k) - 1) : "" }
    NF == 2 {
      n = split($1, p, "."); impl = p[n]; base = $1; sub("\\.[^.]*$", "", base)
      v = val($2, "samples_per_s"); if (v == "") v = val($2, "tflops")
      if (v != "") { r[base, impl] = v; if (!(base in seen)) { seen[base] = 1; order[++k] = base } }
    }
    END {
      for (i = 1; i <= k; i++) {
        b = order[i]
        if (r[b, "axon"] != "" && r[b, "torch"] != "")
          printf "ratio %-28s axon %10s  torch %10s  axon/torch %.2f\n", b, r[b, "axon"], r[b, "torch"], r[b, "axon"] / r[b, "torch"]
      }
    }' "$summary"
}

main() {
  echo "gpu_check: $(date -u +%FT%TZ) budget=${budget}s memcheck=$memcheck tests=$tests bench=$bench"
  host_info
  check_bundle || return $?
  # shellcheck source=/dev/null
  . "$bundle/env.sh"
  check_libs || return $?
  if ((!has_gpu && !force)); then
    section "no GPU"
    echo "gpu_check: no GPU on this host (nvidia-smi absent or failing): the bundle"
    echo "resolves; run this on a GPU host for the tests and benchmarks"
    return 2
  fi
  ((tests)) && run_tests
  ((bench)) && run_bench
  section "summary"
  cat "$summary"
  ratios
  echo "gpu_check: $failures failure(s) in $((SECONDS - start))s"
  ((failures == 0))
}

if [[ -n ${OUT:-} ]]; then
  mkdir -p "$OUT"
  rc=0
  main 2>&1 | tee "$OUT/gpu_check.log" || rc=$?
  { cat "$summary"; ratios; } >"$OUT/gpu_summary.txt" 2>/dev/null || true
  exit $rc
fi
main
