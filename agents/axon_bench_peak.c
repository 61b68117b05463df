/* axon-bench peak: this CPU's arithmetic peak, measured by multiply-add
 * loops that nothing but the arithmetic units can slow down.
 *
 *   axon-bench peak [--threads N] [--repeat R]
 *
 * Each thread runs 2^23 steps of PEAK_ACC independent multiply-adds into
 * PEAK_ACC vector accumulators (more than an FMA's latency times its
 * throughput, so the units never wait for a result), once on one thread
 * (the peak per core) and once on N threads (default: every online CPU),
 * and each best of R runs (default 5) is printed in GFLOP/s, from the wall
 * clock and from the process's CPU time (which a loaded machine's
 * preemption does not inflate).
 *
 * What one instruction counts, a multiply-add being two flops:
 *  - fp32: vfmadd231ps on a zmm register (AVX-512) is 16 lanes x 1
 *    multiply-add = 32 flops; on a ymm register (AVX2 + FMA, used without
 *    AVX-512), 16 flops.
 *  - bf16: vdpbf16ps on a zmm register (AVX512-BF16) multiplies 32 pairs of
 *    bf16 and adds each lane's two products to its f32 accumulator: 16
 *    lanes x 2 multiply-adds = 64 flops. It exists only with AVX512-BF16;
 *    without it the bf16 line says so.
 * The GEMMs count the same way: 2 m n k flops per product, whatever the
 * instructions. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "agents/axon_bench_peak.h"
#include "axon/kernels/clock.h"
#include "axon/kernels/cpu/cpu.h"

#define PEAK_ACC 12
#define PEAK_STEPS (1L << 23)

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* Each loop returns the sum of its accumulators, so that none is dead. */
__attribute__((target("avx512f"), noinline)) static float fp32_zmm(long n) {
  const __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(1e-6f);
  __m512 acc[PEAK_ACC];
  for (int i = 0; i < PEAK_ACC; i++)
    acc[i] = _mm512_set1_ps((float)i);
  for (long t = 0; t < n; t++)
#pragma GCC unroll 12
    for (int i = 0; i < PEAK_ACC; i++)
      acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  for (int i = 1; i < PEAK_ACC; i++)
    acc[0] = _mm512_add_ps(acc[0], acc[i]);
  return _mm512_reduce_add_ps(acc[0]);
}

__attribute__((target("avx2,fma"), noinline)) static float fp32_ymm(long n) {
  const __m256 x = _mm256_set1_ps(1.0f), y = _mm256_set1_ps(1e-6f);
  __m256 acc[PEAK_ACC];
  for (int i = 0; i < PEAK_ACC; i++)
    acc[i] = _mm256_set1_ps((float)i);
  for (long t = 0; t < n; t++)
#pragma GCC unroll 12
    for (int i = 0; i < PEAK_ACC; i++)
      acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  float out[8], s = 0.0f;
  for (int i = 1; i < PEAK_ACC; i++)
    acc[0] = _mm256_add_ps(acc[0], acc[i]);
  _mm256_storeu_ps(out, acc[0]);
  for (int i = 0; i < 8; i++)
    s += out[i];
  return s;
}

__attribute__((target("avx512f,avx512bf16"), noinline)) static float
bf16_zmm(long n) {
  /* bf16 1.0 times bf16 2^-24 in every pair */
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80);
  const __m512bh y = (__m512bh)_mm512_set1_epi16(0x3380);
  __m512 acc[PEAK_ACC];
  for (int i = 0; i < PEAK_ACC; i++)
    acc[i] = _mm512_set1_ps((float)i);
  for (long t = 0; t < n; t++)
#pragma GCC unroll 12
    for (int i = 0; i < PEAK_ACC; i++)
      acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
  for (int i = 1; i < PEAK_ACC; i++)
    acc[0] = _mm512_add_ps(acc[0], acc[i]);
  return _mm512_reduce_add_ps(acc[0]);
}

/* The loop for kind on this CPU and its flops per instruction, or NULL. */
static float (*pick_loop(int kind, int *flops, const char **inst))(long) {
  __builtin_cpu_init();
  if (kind == AXI_PEAK_BF16) {
    *flops = 64;
    *inst = "vdpbf16ps-zmm";
    return axi_bf16_gemm_available() ? bf16_zmm : NULL;
  }
  if (__builtin_cpu_supports("avx512f")) {
    *flops = 32;
    *inst = "vfmadd231ps-zmm";
    return fp32_zmm;
  }
  *flops = 16;
  *inst = "vfmadd231ps-ymm";
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
             ? fp32_ymm
             : NULL;
}
#else
static float (*pick_loop(int kind, int *flops, const char **inst))(long) {
  *flops = 0;
  *inst = "none";
  return NULL;
}
#endif

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int axi_bench_peak(int kind, int threads, int repeat, axi_peak *out) {
  int flops = 0;
  const char *inst = NULL;
  float (*loop)(long) = pick_loop(kind, &flops, &inst);
  if (!loop)
    return ax_seterr(AX_EUNSUPPORTED, "this CPU has no %s",
                     kind == AXI_PEAK_BF16 ? "AVX512-BF16 (vdpbf16ps)"
                                           : "AVX-512 or AVX2 FMA");
  const double work = (double)flops * PEAK_ACC * PEAK_STEPS * threads;
  volatile float sink = 0.0f;
  *out = (axi_peak){0.0, 0.0};
  for (int r = 0; r < repeat; r++) {
    double t0 = 0.0, t1 = 0.0, c0 = cpu_seconds();
#pragma omp parallel num_threads(threads)
    {
#pragma omp single
      t0 = ax_clock_s();
      float s = loop(PEAK_STEPS);
#pragma omp barrier
#pragma omp single
      t1 = ax_clock_s();
#pragma omp critical
      sink += s;
    }
    double cpu = cpu_seconds() - c0, g = work / (t1 - t0) / 1e9;
    double gc = work / (cpu / threads) / 1e9;
    if (g > out->gflops)
      out->gflops = g;
    if (gc > out->cpu_gflops)
      out->cpu_gflops = gc;
  }
  return AX_OK;
}

/* Prints one measured line (or why there is none). */
static int print_peak(int kind, int threads, int repeat) {
  int flops = 0;
  const char *inst = NULL;
  (void)pick_loop(kind, &flops, &inst);
  const char *name = kind == AXI_PEAK_BF16 ? "bf16" : "fp32";
  axi_peak p;
  int rc = axi_bench_peak(kind, threads, repeat, &p);
  if (rc != AX_OK) {
    printf("bench peak: kind=%s threads=%d unsupported (%s)\n", name, threads,
           ax_errmsg());
    return rc;
  }
  printf("bench peak: kind=%s inst=%s flops_per_inst=%d threads=%d "
         "gflops=%.1f per_core=%.1f cpu_gflops=%.1f\n",
         name, inst, flops, threads, p.gflops, p.gflops / threads,
         p.cpu_gflops);
  fflush(stdout);
  return AX_OK;
}

int ax_bench_peak_main(int argc, char **argv) {
  static const struct option opts[] = {{"threads", 1, 0, 't'},
                                       {"repeat", 1, 0, 'r'},
                                       {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
  int threads = (int)sysconf(_SC_NPROCESSORS_ONLN), repeat = 5, c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 't':
      threads = atoi(optarg);
      break;
    case 'r':
      repeat = atoi(optarg);
      break;
    case 'h':
      printf("usage: axon-bench peak [--threads N] [--repeat R]\n");
      return 0;
    default:
      return 2;
    }
  }
  if (threads < 1 || repeat < 1) {
    fprintf(stderr, "axon-bench peak: need --threads >= 1, --repeat >= 1\n");
    return 2;
  }
  int ok = 0;
  for (int kind = AXI_PEAK_FP32; kind <= AXI_PEAK_BF16; kind++) {
    ok |= print_peak(kind, 1, repeat) == AX_OK;
    if (threads > 1)
      ok |= print_peak(kind, threads, repeat) == AX_OK;
  }
  return ok ? 0 : 1;
}
