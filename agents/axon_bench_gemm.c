/* axon-bench gemm: the backend's gemm (kernels/backend-impl.h) on one
 * product, against raw cublasSgemm on a CUDA device, and gemm_bf16 next to
 * it with --dtype bf16.
 *
 *   axon-bench gemm [--device DEV] [--size N | --mnk M,N,K] [--trans XY]
 *                   [--batch B] [--dtype f32|bf16] [--iters N]
 *                   [--repeat R] [--threads N] [--tf32]
 *
 * C = op(A) op(B) (--trans: N or T for A then B, default NN) with op(A)
 * M x K, op(B) K x N and C M x N f32 (default M = N = K = 4096), B of them
 * at dense strides (--batch, default 1), on DEV (cpu or cuda:N; default
 * cpu); A and B random N(0, 1), C poisoned with NaN first. After warm-up
 * products, each of R repeats (default 3) times --iters products (default
 * 20 on CUDA, 3 on the CPU) between two ax_device_synchronize calls; the
 * median repeat's mean time per product is printed with TFLOP/s and
 * GFLOP/s = 2 M N K B / time, best_gflops from the fastest repeat, and
 * cpu_gflops, the median from the process's CPU time divided by the
 * threads (on a loaded machine preemption does not count there; on
 * several threads it assumes they shared the work evenly). Then 64 entries of C
 * are checked against float64 dot products on the host: the error of an entry
 * is |c - ref| over sum_k |a_ik b_kj|, and the run fails (exit 1) when the
 * largest exceeds 1e-4 (FP32 sums, bf16 included) or 4e-3 (TF32), or an entry
 * is not finite.
 *
 * --dtype bf16 rounds A and B to bf16 values and times gemm_bf16 on their
 * bf16 copies after the f32 gemm on the same values, printing both and the
 * speed ratio. On the CPU each line also gives the share of this CPU's
 * peak at the same thread count (axon-bench peak: fp32 FMA for gemm,
 * vdpbf16ps for gemm_bf16).
 *
 * --tf32 sets AXON_TF32=1 for the backend (the CUDA gemm reads it per
 * call); without it AXON_TF32 is set to 0, so the mode printed is the mode
 * run. The CPU backend has no TF32 and ignores it.
 *
 * On a CUDA device the same square f32 product (--size, NN, batch 1) is
 * then timed through axi_cuda_bench_cublas (kernels/cuda/cuda_bench.cu:
 * its own handle and stream, CUDA events) with the same iters and
 * repeats, and the ratio of the two times is printed (axon / cuBLAS; 1.00
 * means no overhead). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agents/axon_bench_local.h"
#include "agents/axon_bench_peak.h"
#include "axon/kernels/backend-impl.h"
#include "axon/kernels/bf16.h"
#include "axon/kernels/clock.h"
#include "axon/kernels/rng.h"
#include "axon/kernels/tensor.h"

#define GEMM_MAX_REPEAT 32
#define GEMM_CHECKS 64

typedef struct gemm_args {
  ax_device dev;
  int m, n, k, ta, tb, batch, iters, repeat, threads, tf32, bf16;
} gemm_args;

static int parse_shape(const char *opt, const char *arg, gemm_args *a) {
  char x = 0, y = 0;
  if (!strcmp(opt, "mnk") && sscanf(arg, "%d,%d,%d", &a->m, &a->n, &a->k) == 3)
    return 0;
  if (!strcmp(opt, "trans") && sscanf(arg, "%c%c", &x, &y) == 2 &&
      strchr("NT", x) && strchr("NT", y)) {
    a->ta = x == 'T';
    a->tb = y == 'T';
    return 0;
  }
  if (!strcmp(opt, "dtype") && (!strcmp(arg, "f32") || !strcmp(arg, "bf16"))) {
    a->bf16 = !strcmp(arg, "bf16");
    return 0;
  }
  fprintf(stderr, "axon-bench gemm: bad --%s %s\n", opt, arg);
  return 2;
}

static int parse_args(int argc, char **argv, gemm_args *a) {
  static const struct option opts[] = {
      {"device", 1, 0, 'd'}, {"size", 1, 0, 'n'},    {"iters", 1, 0, 'i'},
      {"repeat", 1, 0, 'r'}, {"threads", 1, 0, 't'}, {"tf32", 0, 0, 'f'},
      {"mnk", 1, 0, 'M'},    {"trans", 1, 0, 'T'},   {"batch", 1, 0, 'b'},
      {"dtype", 1, 0, 'D'},  {"help", 0, 0, 'h'},    {0, 0, 0, 0}};
  *a = (gemm_args){AX_CPU, 4096, 4096, 4096, 0, 0, 1, 0, 3, 0, 0, 0};
  int c, li = 0;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, &li)) != -1) {
    switch (c) {
    case 'd':
      if (ax_device_parse(optarg, &a->dev) != AX_OK) {
        fprintf(stderr, "axon-bench gemm: %s\n", ax_errmsg());
        return 2;
      }
      break;
    case 'n':
      a->m = a->n = a->k = atoi(optarg);
      break;
    case 'i':
      a->iters = atoi(optarg);
      break;
    case 'r':
      a->repeat = atoi(optarg);
      break;
    case 't':
      a->threads = atoi(optarg);
      break;
    case 'f':
      a->tf32 = 1;
      break;
    case 'b':
      a->batch = atoi(optarg);
      break;
    case 'M':
    case 'T':
    case 'D':
      if (parse_shape(opts[li].name, optarg, a))
        return 2;
      break;
    case 'h':
      printf("usage: axon-bench gemm [--device cpu|cuda:N] [--size N | --mnk "
             "M,N,K] [--trans NN|NT|TN|TT] [--batch B] [--dtype f32|bf16] "
             "[--iters N] [--repeat R] [--threads N] [--tf32]\n");
      return 1;
    default:
      return 2;
    }
  }
  if (a->iters == 0)
    a->iters = a->dev.type == AX_DEV_CUDA ? 20 : 3;
  if (a->m < 1 || a->n < 1 || a->k < 1 || a->m > 32768 || a->n > 32768 ||
      a->k > 32768 || a->batch < 1 || a->iters < 1 || a->repeat < 1 ||
      a->repeat > GEMM_MAX_REPEAT) {
    fprintf(stderr,
            "axon-bench gemm: need sizes in [1, 32768], --batch >= 1, "
            "--iters >= 1 and 1 <= --repeat <= %d\n",
            GEMM_MAX_REPEAT);
    return 2;
  }
  return 0;
}

/* The operands: host f32 copies of A and B (bf16 values with --dtype
 * bf16), and on the device A, B and C in f32, A and B in bf16 too. */
typedef struct operands {
  size_t na, nb, nc;
  float *ha, *hb;
  ax_tensor *a, *b, *c, *a16, *b16;
} operands;

/* A 1-D tensor of the n values v (dtype f32 or, rounded, bf16) on dev. */
static ax_tensor *to_device(const float *v, size_t n, int bf16, ax_device dev) {
  int64_t shape[1] = {(int64_t)n};
  ax_tensor *h = ax_tensor_new(bf16 ? AX_BF16 : AX_F32, 1, shape, AX_CPU);
  if (!h)
    return NULL;
  for (size_t i = 0; i < n; i++)
    if (bf16)
      ax_bf16(h)[i] = ax_bf16_from_f32(v[i]);
    else
      ax_f32(h)[i] = v[i];
  ax_tensor *d = ax_tensor_to(h, dev);
  ax_tensor_release(h);
  return d;
}

static float *rand_host(size_t n, uint64_t seed, int bf16) {
  float *v = malloc(n * sizeof *v);
  ax_rng r;
  ax_rng_seed(&r, seed);
  for (size_t i = 0; v && i < n; i++)
    v[i] = bf16 ? ax_bf16_round((float)ax_rng_normal(&r))
                : (float)ax_rng_normal(&r);
  return v;
}

static int make_operands(const gemm_args *g, operands *o) {
  *o =
      (operands){(size_t)g->batch * g->m * g->k, (size_t)g->batch * g->k * g->n,
                 (size_t)g->batch * g->m * g->n};
  o->ha = rand_host(o->na, 1, g->bf16);
  o->hb = rand_host(o->nb, 2, g->bf16);
  if (!o->ha || !o->hb)
    return ax_seterr(AX_ENOMEM, "gemm: no memory for the operands");
  int64_t cs[1] = {(int64_t)o->nc};
  o->a = to_device(o->ha, o->na, 0, g->dev);
  o->b = to_device(o->hb, o->nb, 0, g->dev);
  o->c = ax_tensor_new(AX_F32, 1, cs, g->dev);
  if (g->bf16) {
    o->a16 = to_device(o->ha, o->na, 1, g->dev);
    o->b16 = to_device(o->hb, o->nb, 1, g->dev);
  }
  if (!o->a || !o->b || !o->c || (g->bf16 && (!o->a16 || !o->b16)))
    return AX_ENOMEM;
  return AX_OK;
}

static void free_operands(operands *o) {
  free(o->ha);
  free(o->hb);
  ax_tensor_release(o->a);
  ax_tensor_release(o->b);
  ax_tensor_release(o->c);
  ax_tensor_release(o->a16);
  ax_tensor_release(o->b16);
}

static int run_gemm(ax_backend *be, const gemm_args *g, const operands *o,
                    int bf16, int count) {
  const int lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
  const long sa = (long)g->m * g->k, sb = (long)g->k * g->n,
             sc = (long)g->m * g->n;
  for (int i = 0; i < count; i++)
    AX_TRY(bf16 ? AX_K(be, gemm_bf16, g->ta, g->tb, g->m, g->n, g->k, 1.0f,
                       ax_bf16(o->a16), AX_BF16, lda, sa, ax_bf16(o->b16),
                       AX_BF16, ldb, sb, 0.0f, ax_f32(o->c), g->n, sc, g->batch)
                : AX_K(be, gemm, g->ta, g->tb, g->m, g->n, g->k, 1.0f,
                       ax_f32(o->a), lda, sa, ax_f32(o->b), ldb, sb, 0.0f,
                       ax_f32(o->c), g->n, sc, g->batch));
  return AX_OK;
}

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Over the repeats, of the mean seconds per product: the median of the
 * wall clock (sec[0]), of the CPU time per thread (sec[1]), and the
 * shortest wall clock (sec[2]). */
static int time_backend(const gemm_args *g, ax_backend *be, const operands *o,
                        int bf16, double sec[3]) {
  double t[GEMM_MAX_REPEAT], c[GEMM_MAX_REPEAT];
  AX_TRY(ax_tensor_fill(o->c, NAN));
  AX_TRY(run_gemm(be, g, o, bf16, g->dev.type == AX_DEV_CUDA ? 3 : 1));
  AX_TRY(ax_device_synchronize(g->dev));
  for (int r = 0; r < g->repeat; r++) {
    double t0 = ax_clock_s(), c0 = cpu_seconds();
    AX_TRY(run_gemm(be, g, o, bf16, g->iters));
    AX_TRY(ax_device_synchronize(g->dev));
    t[r] = (ax_clock_s() - t0) / g->iters;
    sec[2] = r == 0 || t[r] < sec[2] ? t[r] : sec[2];
    c[r] = (cpu_seconds() - c0) / g->iters / ax_cpu_threads();
  }
  sec[0] = axi_bench_median(t, g->repeat);
  sec[1] = axi_bench_median(c, g->repeat);
  return AX_OK;
}

/* Largest error of GEMM_CHECKS entries of C against float64 dot products,
 * each relative to sum_k |a_ik b_kj|; INFINITY when one is not finite. */
static int check_result(const gemm_args *g, const operands *o, double *worst) {
  float *hc = malloc(o->nc * sizeof *hc);
  int rc = hc ? ax_tensor_read(o->c, hc, o->nc * sizeof *hc)
              : ax_seterr(AX_ENOMEM, "gemm check: no memory");
  const size_t m = g->m, n = g->n, k = g->k;
  ax_rng r;
  ax_rng_seed(&r, 99);
  *worst = 0.0;
  for (int s = 0; rc == AX_OK && s < GEMM_CHECKS; s++) {
    size_t z = (size_t)ax_rng_below(&r, (uint64_t)g->batch);
    size_t i = (size_t)ax_rng_below(&r, (uint64_t)m);
    size_t j = (size_t)ax_rng_below(&r, (uint64_t)n);
    const float *a = o->ha + z * m * k, *b = o->hb + z * k * n;
    double ref = 0.0, mag = 0.0;
    for (size_t p = 0; p < k; p++) {
      double x = g->ta ? a[p * m + i] : a[i * k + p];
      double y = g->tb ? b[j * k + p] : b[p * n + j];
      ref += x * y;
      mag += fabs(x * y);
    }
    double got = hc[z * m * n + i * n + j];
    double e =
        isfinite(got) ? fabs(got - ref) / (mag > 0 ? mag : 1.0) : INFINITY;
    if (e > *worst)
      *worst = e;
  }
  free(hc);
  return rc;
}

/* Times one implementation (f32 gemm or gemm_bf16), checks it and prints
 * its line; *sec gets its wall and CPU seconds, *ok whether it passed. */
static int bench_one(const gemm_args *g, ax_backend *be, const operands *o,
                     int bf16, double sec[3], int *ok) {
  double worst = 0.0, tol = g->tf32 && !bf16 ? 4e-3 : 1e-4;
  AX_TRY(time_backend(g, be, o, bf16, sec));
  AX_TRY(check_result(g, o, &worst));
  double flops = 2.0 * g->m * g->n * (double)g->k * g->batch;
  double gf = flops / sec[0] / 1e9, cgf = flops / sec[1] / 1e9;
  double bgf = flops / sec[2] / 1e9;
  char dname[16], share[96] = "";
  ax_device_str(g->dev, dname, sizeof dname);
  axi_peak p;
  if (g->dev.type == AX_DEV_CPU &&
      axi_bench_peak(bf16 ? AXI_PEAK_BF16 : AXI_PEAK_FP32, ax_cpu_threads(), 3,
                     &p) == AX_OK)
    snprintf(share, sizeof share,
             " peak_gflops=%.1f peak_share=%.0f%% cpu_peak_share=%.0f%%",
             p.gflops, 100.0 * gf / p.gflops, 100.0 * cgf / p.cpu_gflops);
  *ok = worst <= tol;
  printf("bench gemm: impl=axon dtype=%s device=%s m=%d n=%d k=%d trans=%c%c "
         "batch=%d iters=%d repeat=%d tf32=%d threads=%d ms=%.3f "
         "tflops=%.2f gflops=%.1f best_gflops=%.1f cpu_gflops=%.1f%s "
         "max_err=%.2e check=%s\n",
         bf16 ? "bf16" : "f32", dname, g->m, g->n, g->k, g->ta ? 'T' : 'N',
         g->tb ? 'T' : 'N', g->batch, g->iters, g->repeat, g->tf32,
         ax_cpu_threads(), 1e3 * sec[0], gf / 1e3, gf, bgf, cgf, share, worst,
         *ok ? "ok" : "FAILED");
  fflush(stdout);
  return AX_OK;
}

static int bench_cublas(const gemm_args *g, double *sec) {
  double t[GEMM_MAX_REPEAT];
  for (int r = 0; r < g->repeat; r++)
    AX_TRY(axi_cuda_bench_cublas(g->dev.index, g->n, g->iters, g->tf32, &t[r]));
  *sec = axi_bench_median(t, g->repeat);
  return AX_OK;
}

static int gemm_run(const gemm_args *g) {
  setenv("AXON_TF32", g->tf32 ? "1" : "0", 1);
  ax_cpu_set_threads(g->threads);
  ax_backend *be = NULL;
  AX_TRY(ax_backend_get(g->dev, &be));
  operands o;
  double f32[3] = {0}, b16[3] = {0}, ref = 0.0;
  int ok = 1, ok16 = 1;
  int rc = make_operands(g, &o);
  if (rc == AX_OK)
    rc = bench_one(g, be, &o, 0, f32, &ok);
  if (rc == AX_OK && g->bf16)
    rc = bench_one(g, be, &o, 1, b16, &ok16);
  free_operands(&o);
  AX_TRY(rc);
  if (g->bf16)
    printf("bench gemm: bf16/f32 speed=%.2fx best_speed=%.2fx "
           "cpu_speed=%.2fx\n",
           f32[0] / b16[0], f32[2] / b16[2], f32[1] / b16[1]);
  const int square =
      g->m == g->n && g->n == g->k && !g->ta && !g->tb && g->batch == 1;
  if (g->dev.type == AX_DEV_CUDA && square) {
    char dname[16];
    ax_device_str(g->dev, dname, sizeof dname);
    AX_TRY(bench_cublas(g, &ref));
    printf("bench gemm: impl=cublas device=%s n=%d iters=%d repeat=%d tf32=%d "
           "ms=%.3f tflops=%.2f\n",
           dname, g->n, g->iters, g->repeat, g->tf32, 1e3 * ref,
           2.0 * g->n * (double)g->n * g->n / ref / 1e12);
    printf("bench gemm: axon/cublas time ratio=%.3f\n", f32[0] / ref);
  }
  fflush(stdout);
  if (!ok || !ok16)
    return ax_seterr(AX_EINTERNAL, "gemm result check failed (max error "
                                   "over the tolerance, or not finite)");
  return AX_OK;
}

int ax_bench_gemm_main(int argc, char **argv) {
  gemm_args g;
  int prc = parse_args(argc, argv, &g);
  if (prc != 0)
    return prc == 1 ? 0 : prc;
  int rc = gemm_run(&g);
  if (rc != AX_OK) {
    fprintf(stderr, "axon-bench gemm: %s: %s\n", ax_strerror(rc), ax_errmsg());
    return 1;
  }
  return 0;
}
