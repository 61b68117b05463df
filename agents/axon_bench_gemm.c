/* axon-bench gemm: the backend's gemm (kernels/backend-impl.h) on one
 * square product, against raw cublasSgemm on a CUDA device.
 *
 *   axon-bench gemm [--device DEV] [--size N] [--iters N] [--repeat R]
 *                   [--threads N] [--tf32]
 *
 * C = A B with A, B, C of N x N f32 (default 4096) on DEV (cpu or cuda:N;
 * default cpu), A and B random, C poisoned with NaN first. After warm-up
 * products, each of R repeats (default 3) times --iters products
 * (default 20 on CUDA, 3 on the CPU) between two ax_device_synchronize
 * calls; the median repeat's mean time per product is printed with
 * TFLOP/s = 2 N^3 / time. Then 64 entries of C are checked against float64
 * dot products on the host: the error of an entry is |c - ref| over
 * sum_k |a_ik b_kj|, and the run fails (exit 1) when the largest exceeds
 * 1e-4 (FP32) or 4e-3 (TF32), or an entry is not finite.
 *
 * --tf32 sets AXON_TF32=1 for the backend (the CUDA gemm reads it per
 * call); without it AXON_TF32 is set to 0, so the mode printed is the mode
 * run. The CPU backend has no TF32 and ignores it.
 *
 * On a CUDA device the same product is then timed through
 * axi_cuda_bench_cublas (kernels/cuda/cuda_bench.cu: its own handle and
 * stream, CUDA events) with the same iters and repeats, and the ratio of
 * the two times is printed (axon / cuBLAS; 1.00 means no overhead). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "axon/kernels/clock.h"
#include "axon/kernels/rng.h"
#include "axon/kernels/tensor.h"

#define GEMM_MAX_REPEAT 32
#define GEMM_CHECKS 64

typedef struct gemm_args {
  ax_device dev;
  int n, iters, repeat, threads, tf32;
} gemm_args;

static int parse_args(int argc, char **argv, gemm_args *a) {
  static const struct option opts[] = {
      {"device", 1, 0, 'd'},  {"size", 1, 0, 'n'},
      {"iters", 1, 0, 'i'},   {"repeat", 1, 0, 'r'},
      {"threads", 1, 0, 't'}, {"tf32", 0, 0, 'f'},
      {"help", 0, 0, 'h'},    {0, 0, 0, 0}};
  *a = (gemm_args){AX_CPU, 4096, 0, 3, 0, 0};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'd':
      if (ax_device_parse(optarg, &a->dev) != AX_OK) {
        fprintf(stderr, "axon-bench gemm: %s\n", ax_errmsg());
        return 2;
      }
      break;
    case 'n':
      a->n = atoi(optarg);
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
    case 'h':
      printf("usage: axon-bench gemm [--device cpu|cuda:N] [--size N] "
             "[--iters N] [--repeat R] [--threads N] [--tf32]\n");
      return 1;
    default:
      return 2;
    }
  }
  if (a->iters == 0)
    a->iters = a->dev.type == AX_DEV_CUDA ? 20 : 3;
  if (a->n < 1 || a->n > 32768 || a->iters < 1 || a->repeat < 1 ||
      a->repeat > GEMM_MAX_REPEAT) {
    fprintf(stderr,
            "axon-bench gemm: need 1 <= --size <= 32768, --iters >= 1 and "
            "1 <= --repeat <= %d\n",
            GEMM_MAX_REPEAT);
    return 2;
  }
  return 0;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* An n x n f32 tensor of N(0, 1) values from seed, on dev. */
static ax_tensor *rand_matrix(int n, uint64_t seed, ax_device dev) {
  int64_t shape[2] = {n, n};
  ax_tensor *h = ax_tensor_new(AX_F32, 2, shape, AX_CPU);
  if (!h)
    return NULL;
  ax_rng r;
  ax_rng_seed(&r, seed);
  for (size_t i = 0; i < ax_tensor_numel(h); i++)
    ax_f32(h)[i] = (float)ax_rng_normal(&r);
  ax_tensor *d = ax_tensor_to(h, dev);
  ax_tensor_release(h);
  return d;
}

static int run_gemm(ax_backend *be, int n, const ax_tensor *a,
                    const ax_tensor *b, ax_tensor *c, int count) {
  for (int i = 0; i < count; i++)
    AX_TRY(AX_K(be, gemm, 0, 0, n, n, n, 1.0f, ax_f32(a), n, 0, ax_f32(b), n, 0,
                0.0f, ax_f32(c), n, 0, 1));
  return AX_OK;
}

/* Median over the repeats of the mean seconds per product. */
static int time_backend(const gemm_args *g, ax_backend *be, const ax_tensor *a,
                        const ax_tensor *b, ax_tensor *c, double *sec) {
  double t[GEMM_MAX_REPEAT];
  AX_TRY(run_gemm(be, g->n, a, b, c, g->dev.type == AX_DEV_CUDA ? 3 : 1));
  AX_TRY(ax_device_synchronize(g->dev));
  for (int r = 0; r < g->repeat; r++) {
    double t0 = ax_clock_s();
    AX_TRY(run_gemm(be, g->n, a, b, c, g->iters));
    AX_TRY(ax_device_synchronize(g->dev));
    t[r] = (ax_clock_s() - t0) / g->iters;
  }
  *sec = median(t, g->repeat);
  return AX_OK;
}

/* Largest error of GEMM_CHECKS entries of c against float64 dot products,
 * each relative to sum_k |a_ik b_kj|; INFINITY when one is not finite. */
static int check_result(int n, const ax_tensor *a, const ax_tensor *b,
                        const ax_tensor *c, double *worst) {
  size_t bytes = (size_t)n * n * sizeof(float);
  float *ha = malloc(bytes), *hb = malloc(bytes), *hc = malloc(bytes);
  int rc =
      ha && hb && hc ? AX_OK : ax_seterr(AX_ENOMEM, "gemm check: no memory");
  if (rc == AX_OK)
    rc = ax_tensor_read(a, ha, bytes);
  if (rc == AX_OK)
    rc = ax_tensor_read(b, hb, bytes);
  if (rc == AX_OK)
    rc = ax_tensor_read(c, hc, bytes);
  ax_rng r;
  ax_rng_seed(&r, 99);
  *worst = 0.0;
  for (int s = 0; rc == AX_OK && s < GEMM_CHECKS; s++) {
    size_t i = (size_t)ax_rng_below(&r, (uint64_t)n);
    size_t j = (size_t)ax_rng_below(&r, (uint64_t)n);
    double ref = 0.0, mag = 0.0;
    for (size_t k = 0; k < (size_t)n; k++) {
      double p = (double)ha[i * n + k] * hb[k * n + j];
      ref += p;
      mag += fabs(p);
    }
    double got = hc[i * n + j];
    double e =
        isfinite(got) ? fabs(got - ref) / (mag > 0 ? mag : 1.0) : INFINITY;
    if (e > *worst)
      *worst = e;
  }
  free(ha);
  free(hb);
  free(hc);
  return rc;
}

static double tflops(int n, double sec) {
  return 2.0 * n * (double)n * n / sec / 1e12;
}

static int bench_cublas(const gemm_args *g, double *sec) {
  double t[GEMM_MAX_REPEAT];
  for (int r = 0; r < g->repeat; r++)
    AX_TRY(axi_cuda_bench_cublas(g->dev.index, g->n, g->iters, g->tf32, &t[r]));
  *sec = median(t, g->repeat);
  return AX_OK;
}

static int gemm_run(const gemm_args *g) {
  setenv("AXON_TF32", g->tf32 ? "1" : "0", 1);
  ax_cpu_set_threads(g->threads);
  ax_backend *be = NULL;
  AX_TRY(ax_backend_get(g->dev, &be));
  int64_t shape[2] = {g->n, g->n};
  ax_tensor *a = rand_matrix(g->n, 1, g->dev);
  ax_tensor *b = rand_matrix(g->n, 2, g->dev);
  ax_tensor *c = ax_tensor_new(AX_F32, 2, shape, g->dev);
  int rc = a && b && c ? AX_OK : AX_ENOMEM;
  if (rc == AX_OK)
    rc = ax_tensor_fill(c, NAN);
  double sec = 0.0, worst = 0.0, ref = 0.0;
  if (rc == AX_OK)
    rc = time_backend(g, be, a, b, c, &sec);
  if (rc == AX_OK)
    rc = check_result(g->n, a, b, c, &worst);
  ax_tensor_release(a);
  ax_tensor_release(b);
  ax_tensor_release(c);
  if (rc != AX_OK)
    return rc;
  char dname[16];
  ax_device_str(g->dev, dname, sizeof dname);
  double tol = g->tf32 ? 4e-3 : 1e-4;
  printf("bench gemm: impl=axon device=%s n=%d iters=%d repeat=%d tf32=%d "
         "threads=%d ms=%.3f tflops=%.2f max_err=%.2e check=%s\n",
         dname, g->n, g->iters, g->repeat, g->tf32, ax_cpu_threads(), 1e3 * sec,
         tflops(g->n, sec), worst, worst <= tol ? "ok" : "FAILED");
  if (g->dev.type == AX_DEV_CUDA) {
    AX_TRY(bench_cublas(g, &ref));
    printf("bench gemm: impl=cublas device=%s n=%d iters=%d repeat=%d tf32=%d "
           "ms=%.3f tflops=%.2f\n",
           dname, g->n, g->iters, g->repeat, g->tf32, 1e3 * ref,
           tflops(g->n, ref));
    printf("bench gemm: axon/cublas time ratio=%.3f\n", sec / ref);
  }
  fflush(stdout);
  if (!(worst <= tol))
    return ax_seterr(AX_EINTERNAL,
                     "gemm result check failed: max error %.2e > %.0e", worst,
                     tol);
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
