/* The CPU backend's bf16 kernels: the casts bit for bit against
 * kernels/bf16.h, and gemm_bf16 against a float64 reference on both of its
 * paths (the AVX512-BF16 kernel where the CPU has it, and the f32 fallback
 * forced by AXON_BF16_GEMM=fallback), including thread-count independence,
 * and with f32 operands bit for bit as with their bf16 roundings.
 *
 * The tolerance of gemm_bf16. Its inputs are bf16 values, whose 8-bit
 * significands multiply exactly into f32's 24 bits, so every product
 * a_ip * b_pj is exact (the inputs here are normal numbers of moderate size:
 * no overflow, no underflow). What remains is the f32 summation of the k
 * exact products, and then alpha * s + beta * c. Any order of summing k
 * terms (left to right in blocks, a tree, two products per vdpbf16ps lane
 * step), each addition rounded to nearest, errs by at most
 * gamma_(k-1) * sum_p |a_ip b_pj|, gamma_j = j u / (1 - j u), u = 2^-24
 * (Higham, Accuracy and Stability of Numerical Algorithms, 4.2). The
 * blocked kernel adds one rounding per block of k (C += alpha * block) and
 * the final alpha and beta terms add three more, each covered by one more
 * u on the same magnitudes. So the check is
 *   |c - ref| <= (k + 4) u (1 + 1e-3) (|alpha| sum_p |a_ip b_pj| +
 *                                      |beta c0_ij|)
 * with 1e-3 covering the gamma's denominator for k < 10^4. The float64
 * reference itself errs by far less (2^-53 per step). */
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "axon/kernels/bf16.h"
#include "axon/kernels/cpu/cpu.h"
#include "harness.h"

static uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* f32 -> bf16 on special values, ties, denormals and random bit patterns,
 * at lengths that exercise the vector loop, its scalar tail and the
 * parallel chunks. */
static void cast_f32_bf16_exact(void **state) {
  (void)state;
  ax_backend *be = ax_backend_of(AX_CPU);
  static const uint32_t special[] = {
      0x00000000, 0x80000000, 0x7f800000, 0xff800000, /* zeros, infinities */
      0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, /* NaNs, signalling */
      0x7fbfffff, 0x7f8f0000, 0xffffffff, 0x7fff8000, /* NaN payloads */
      0x00000001, 0x80000001, 0x007fffff, 0x807fffff, /* denormals */
      0x00008000, 0x00018000, 0x00007fff, 0x00010000, /* denormal ties */
      0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001, /* ties at 1 */
      0xbf808000, 0xbf818000, 0x7f7f8000, 0x7f7fffff, /* to infinity */
      0xff7f8000, 0x00800000, 0x3f800000, 0x4b7fffff};
  const size_t nspecial = sizeof special / sizeof special[0];
  const size_t lens[] = {1, 15, 16, 17, 33, 1000, 200003};
  ax_rng r;
  ax_rng_seed(&r, 11);
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
    size_t n = lens[li];
    float *x = malloc(n * sizeof *x);
    uint16_t *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++)
      x[i] = u2f(i < nspecial ? special[(i + li) % nspecial]
                              : (uint32_t)ax_rng_u64(&r));
    AX_ASSERT_OK(AX_K(be, cast_f32_bf16, n, x, y));
    for (size_t i = 0; i < n; i++)
      if (y[i] != ax_bf16_from_f32(x[i]))
        fail_msg("n %zu, x[%zu] = 0x%08x: 0x%04x, expected 0x%04x", n, i,
                 f2u(x[i]), y[i], ax_bf16_from_f32(x[i]));
    free(x);
    free(y);
  }
}

/* bf16 -> f32 on all 65536 bit patterns (twice over, for the parallel
 * chunks), compared as bits so that NaNs count. */
static void cast_bf16_f32_exact(void **state) {
  (void)state;
  ax_backend *be = ax_backend_of(AX_CPU);
  const size_t n = 2 * 65536 + 5;
  uint16_t *x = malloc(n * sizeof *x);
  float *y = malloc(n * sizeof *y);
  for (size_t i = 0; i < n; i++)
    x[i] = (uint16_t)(i * 40503u);
  AX_ASSERT_OK(AX_K(be, cast_bf16_f32, n, x, y));
  for (size_t i = 0; i < n; i++)
    if (f2u(y[i]) != f2u(ax_bf16_to_f32(x[i])))
      fail_msg("x[%zu] = 0x%04x: 0x%08x", i, x[i], f2u(y[i]));
  AX_ASSERT_OK(AX_K(be, cast_bf16_f32, n - 3, x + 3, y));
  for (size_t i = 0; i < n - 3; i++)
    assert_int_equal(f2u(y[i]), (uint32_t)x[i + 3] << 16);
  free(x);
  free(y);
}

/* One gemm_bf16 case: sizes, transposes, padding of the leading
 * dimensions, batch, alpha and beta (nan_c: C starts as NaN, beta 0). */
typedef struct gcase {
  int m, n, k, ta, tb, pad, batch, shared_b;
  float alpha, beta;
  int nan_c;
} gcase;

typedef struct gdata {
  int lda, ldb, ldc;
  long sa, sb, sc;
  size_t na, nb; /* elements of a and b */
  uint16_t *a, *b;
  float *c0, *c, *ref, *mag;
} gdata;

static uint16_t rand_bf16(ax_rng *r) {
  return ax_bf16_from_f32((float)ax_rng_normal(r));
}

/* Operands and the float64 reference (and the error bound's magnitude) of
 * case g. */
static void make_case(const gcase *g, uint64_t seed, gdata *d) {
  ax_rng r;
  ax_rng_seed(&r, seed);
  const int ar = g->ta ? g->k : g->m, ac = g->ta ? g->m : g->k;
  const int br = g->tb ? g->n : g->k, bc = g->tb ? g->k : g->n;
  d->lda = ac + g->pad;
  d->ldb = bc + g->pad;
  d->ldc = g->n + g->pad;
  d->sa = (long)ar * d->lda + g->pad;
  d->sb = g->shared_b ? 0 : (long)br * d->ldb + g->pad;
  d->sc = (long)g->m * d->ldc + g->pad;
  size_t na = (size_t)d->sa * g->batch + 1, nb = (size_t)br * d->ldb + 1,
         nc = (size_t)d->sc * g->batch;
  if (!g->shared_b)
    nb += (size_t)d->sb * g->batch;
  d->na = na;
  d->nb = nb;
  d->a = malloc(na * sizeof *d->a);
  d->b = malloc(nb * sizeof *d->b);
  d->c0 = malloc(nc * sizeof *d->c0);
  d->c = malloc(nc * sizeof *d->c);
  d->ref = malloc(nc * sizeof *d->ref);
  d->mag = malloc(nc * sizeof *d->mag);
  for (size_t i = 0; i < na; i++)
    d->a[i] = rand_bf16(&r);
  for (size_t i = 0; i < nb; i++)
    d->b[i] = rand_bf16(&r);
  for (size_t i = 0; i < nc; i++)
    d->c0[i] = g->nan_c ? NAN : (float)ax_rng_normal(&r);
  for (int z = 0; z < g->batch; z++)
    for (int i = 0; i < g->m; i++)
      for (int j = 0; j < g->n; j++) {
        const uint16_t *a = d->a + z * d->sa, *b = d->b + z * d->sb;
        double s = 0.0, mag = 0.0;
        for (int p = 0; p < g->k; p++) {
          double x = ax_bf16_to_f32(g->ta ? a[(long)p * d->lda + i]
                                          : a[(long)i * d->lda + p]);
          double y = ax_bf16_to_f32(g->tb ? b[(long)j * d->ldb + p]
                                          : b[(long)p * d->ldb + j]);
          s += x * y;
          mag += fabs(x * y);
        }
        size_t o = z * d->sc + (size_t)i * d->ldc + j;
        double c0 = g->beta == 0.0f ? 0.0 : (double)g->beta * d->c0[o];
        d->ref[o] = (float)(g->alpha * s + c0);
        d->mag[o] = (float)(fabs(g->alpha) * mag + fabs(c0));
      }
}

static void free_case(gdata *d) {
  free(d->a);
  free(d->b);
  free(d->c0);
  free(d->c);
  free(d->ref);
  free(d->mag);
}

/* Runs case g and checks C against the bound of the file's comment; the
 * padding between rows and batch entries must be left as it was. */
static void run_case(const gcase *g, const gdata *d) {
  ax_backend *be = ax_backend_of(AX_CPU);
  size_t nc = (size_t)d->sc * g->batch;
  memcpy(d->c, d->c0, nc * sizeof *d->c);
  AX_ASSERT_OK(AX_K(be, gemm_bf16, g->ta, g->tb, g->m, g->n, g->k, g->alpha,
                    d->a, AX_BF16, d->lda, d->sa, d->b, AX_BF16, d->ldb, d->sb,
                    g->beta, d->c, d->ldc, d->sc, g->batch));
  const double u = 1.0 / 16777216.0;
  for (int z = 0; z < g->batch; z++)
    for (int i = 0; i < g->m; i++)
      for (int j = 0; j < d->ldc; j++) {
        size_t o = z * d->sc + (size_t)i * d->ldc + j;
        if (j >= g->n) { /* padding: untouched */
          assert_memory_equal(&d->c[o], &d->c0[o], sizeof(float));
          continue;
        }
        double tol = (g->k + 4) * u * 1.001 * d->mag[o];
        if (!(fabs((double)d->c[o] - d->ref[o]) <= tol))
          fail_msg("m %d n %d k %d ta %d tb %d batch %d alpha %g beta %g: "
                   "c[%d][%d][%d] = %.9g, expected %.9g (tolerance %.3g)",
                   g->m, g->n, g->k, g->ta, g->tb, g->batch, g->alpha, g->beta,
                   z, i, j, d->c[o], d->ref[o], tol);
      }
}

/* Sizes around the kernel's tiles (12 x 32), its k block (384) and odd k,
 * splits of m and n into units, in every transpose, padded, batched. */
static const gcase cases[] = {
    {1, 1, 1, 0, 0, 0, 1, 0, 1.0f, 0.0f, 0},
    {5, 7, 3, 0, 0, 1, 2, 0, 2.0f, 0.5f, 0},
    {12, 32, 2, 0, 0, 0, 1, 0, 1.0f, 0.0f, 1},
    {13, 33, 3, 0, 0, 3, 3, 0, 1.0f, 1.0f, 0},
    {25, 65, 384, 0, 0, 2, 2, 1, -0.75f, 0.0f, 1},
    {193, 47, 385, 0, 0, 1, 1, 0, 1.0f, -1.5f, 0},
    {37, 100, 769, 0, 0, 0, 2, 0, 0.5f, 0.0f, 0},
    {200, 70, 31, 0, 0, 5, 1, 1, 1.0f, 0.0f, 0},
    {400, 17, 64, 0, 0, 0, 1, 0, 1.0f, 2.0f, 0},
    {3, 500, 40, 0, 0, 7, 2, 0, 1.0f, 0.0f, 1},
    {11, 31, 1, 0, 0, 0, 4, 1, 1.0f, 1.0f, 0},
};

static void gemm_cases(void) {
  const int ncases = (int)(sizeof cases / sizeof cases[0]);
  for (int ci = 0; ci < ncases; ci++)
    for (int t = 0; t < 4; t++) {
      gcase g = cases[ci];
      g.ta = t & 1;
      g.tb = t >> 1;
      gdata d;
      make_case(&g, 100 + ci * 4 + t, &d);
      run_case(&g, &d);
      free_case(&d);
    }
}

/* An f32 operand for h (n elements, `rows` rows of `cols` with leading
 * dimension ld, `batch` matrices `stride` apart): random values (every
 * fifth a rounding tie, every eleventh a denormal, every thirteenth a
 * denormal that rounds to a normal bf16), NaN wherever the GEMM must not
 * read; h's same elements become their bf16 roundings. Every third value
 * of stored row 0 (edge 1) or column 0 (edge 2) is a special one (NaN,
 * infinity, rounding to infinity), so that they reach one row or column
 * of C only. */
static float *f32_operand(uint16_t *h, size_t n, int rows, int cols, int ld,
                          long stride, int batch, int edge, ax_rng *r) {
  static const uint32_t special[] = {
      0x7fc00001u, 0x7f800001u, 0xffc12345u, 0x7f800000u, 0xff800000u,
      0x7f7fffffu, 0xff7f8000u, 0x7f7f7fffu, 0x80000000u, 0x3f808000u};
  const int nspecial = (int)(sizeof special / sizeof special[0]);
  float *f = malloc(n * sizeof *f);
  for (size_t i = 0; i < n; i++)
    f[i] = u2f(0x7fc00000u);
  for (int z = 0; z < batch; z++)
    for (int i = 0; i < rows; i++)
      for (int j = 0; j < cols; j++) {
        size_t o = z * stride + (size_t)i * ld + j;
        uint32_t u = f2u((float)ax_rng_normal(r));
        if (o % 5 == 0)
          u = (u & 0xffff0000u) | 0x8000u;
        else if (o % 11 == 0)
          u = (u & 0x8000ffffu) | 0x3000u;
        else if (o % 13 == 0) /* rounds up to the least normal bf16 */
          u = (u & 0x80000000u) | 0x007fc000u;
        if ((edge == 1 && i == 0 && j % 3 == 0) ||
            (edge == 2 && j == 0 && i % 3 == 0))
          u = special[(i + j) / 3 % nspecial];
        f[o] = u2f(u);
        h[o] = ax_bf16_from_f32(f[o]);
      }
  return f;
}

/* gemm_bf16 on every case and transpose with A, B or both given as f32:
 * the bits of the same call on their bf16 roundings (kernels/bf16.h),
 * on whichever path AXON_BF16_GEMM selects. */
static void f32_cases(void) {
  ax_backend *be = ax_backend_of(AX_CPU);
  const int ncases = (int)(sizeof cases / sizeof cases[0]);
  for (int ci = 0; ci < ncases; ci++)
    for (int t = 0; t < 4; t++) {
      gcase g = cases[ci];
      g.ta = t & 1;
      g.tb = t >> 1;
      gdata d;
      make_case(&g, 500 + ci * 4 + t, &d);
      ax_rng r;
      ax_rng_seed(&r, 900 + ci * 4 + t);
      float *fa = f32_operand(d.a, d.na, g.ta ? g.k : g.m, g.ta ? g.m : g.k,
                              d.lda, d.sa, g.batch, g.ta ? 2 : 1, &r);
      float *fb =
          f32_operand(d.b, d.nb, g.tb ? g.n : g.k, g.tb ? g.k : g.n, d.ldb,
                      d.sb, g.shared_b ? 1 : g.batch, g.tb ? 1 : 2, &r);
      size_t nc = (size_t)d.sc * g.batch;
      float *want = malloc(nc * sizeof *want);
      memcpy(want, d.c0, nc * sizeof *want);
      AX_ASSERT_OK(AX_K(be, gemm_bf16, g.ta, g.tb, g.m, g.n, g.k, g.alpha, d.a,
                        AX_BF16, d.lda, d.sa, d.b, AX_BF16, d.ldb, d.sb, g.beta,
                        want, d.ldc, d.sc, g.batch));
      for (int f = 1; f < 4; f++) {
        const void *a = f & 1 ? (const void *)fa : d.a;
        const void *b = f & 2 ? (const void *)fb : d.b;
        memcpy(d.c, d.c0, nc * sizeof *d.c);
        AX_ASSERT_OK(AX_K(be, gemm_bf16, g.ta, g.tb, g.m, g.n, g.k, g.alpha, a,
                          f & 1 ? AX_F32 : AX_BF16, d.lda, d.sa, b,
                          f & 2 ? AX_F32 : AX_BF16, d.ldb, d.sb, g.beta, d.c,
                          d.ldc, d.sc, g.batch));
        if (memcmp(d.c, want, nc * sizeof *want) != 0)
          fail_msg("case %d ta %d tb %d, f32 %s: not the bits of bf16 "
                   "operands",
                   ci, g.ta, g.tb,
                   f == 1   ? "A"
                   : f == 2 ? "B"
                            : "A and B");
      }
      free(want);
      free(fa);
      free(fb);
      free_case(&d);
    }
}

/* The AVX512-BF16 kernel (skipped, with a note, on a CPU without it). */
static void gemm_fast(void **state) {
  (void)state;
  if (!axi_bf16_gemm_available()) {
    print_message("no AVX512-BF16 on this CPU: the fast path is not run\n");
    return;
  }
  unsetenv("AXON_BF16_GEMM");
  gemm_cases();
  f32_cases();
}

/* The f32 fallback, forced. */
static void gemm_fallback(void **state) {
  (void)state;
  setenv("AXON_BF16_GEMM", "fallback", 1);
  gemm_cases();
  f32_cases();
  unsetenv("AXON_BF16_GEMM");
}

/* alpha 0 and k 0 give beta * C without reading A or B (NaN there); beta 0
 * overwrites NaN in C; negative sizes, short rows and operands neither f32
 * nor bf16 are refused. */
static void gemm_degenerate(void **state) {
  (void)state;
  ax_backend *be = ax_backend_of(AX_CPU);
  uint16_t a[6], b[6];
  for (int i = 0; i < 6; i++)
    a[i] = b[i] = 0x7fc0; /* NaN */
  float c[4] = {1.0f, 2.0f, NAN, 4.0f};
  AX_ASSERT_OK(AX_K(be, gemm_bf16, 0, 0, 2, 2, 3, 0.0f, a, AX_BF16, 3, 0, b,
                    AX_BF16, 2, 0, 2.0f, c, 2, 0, 1));
  assert_true(c[0] == 2.0f && c[1] == 4.0f && isnan(c[2]) && c[3] == 8.0f);
  AX_ASSERT_OK(AX_K(be, gemm_bf16, 0, 0, 2, 2, 0, 1.0f, a, AX_BF16, 1, 0, b,
                    AX_BF16, 2, 0, 0.0f, c, 2, 0, 1));
  for (int i = 0; i < 4; i++)
    assert_true(c[i] == 0.0f);
  AX_ASSERT_ERR(AX_K(be, gemm_bf16, 0, 0, -1, 2, 3, 1.0f, a, AX_BF16, 3, 0, b,
                     AX_BF16, 2, 0, 0.0f, c, 2, 0, 1),
                AX_EINVAL);
  AX_ASSERT_ERR(AX_K(be, gemm_bf16, 0, 0, 2, 2, 3, 1.0f, a, AX_BF16, 2, 0, b,
                     AX_BF16, 2, 0, 0.0f, c, 2, 0, 1),
                AX_EINVAL);
  AX_ASSERT_ERR(AX_K(be, gemm_bf16, 0, 0, 2, 2, 3, 1.0f, a, AX_I32, 3, 0, b,
                     AX_BF16, 2, 0, 0.0f, c, 2, 0, 1),
                AX_EDTYPE);
}

/* The AVX512-BF16 kernel's products on 1 and 2 threads are the same bits
 * (the fallback is OpenBLAS sgemm, whose partition among threads changes
 * its sums, as the f32 gemm's does). */
static void gemm_threads(void **state) {
  (void)state;
  if (!axi_bf16_gemm_available())
    return;
  const gcase shapes[] = {{300, 200, 900, 0, 0, 1, 1, 0, 1.0f, 0.5f, 0},
                          {7, 1000, 129, 1, 1, 0, 3, 0, 1.0f, 0.0f, 0}};
  const int prev = ax_cpu_threads();
  for (int s = 0; s < 2; s++) {
    gdata d;
    make_case(&shapes[s], 7 + s, &d);
    size_t nc = (size_t)d.sc * shapes[s].batch;
    float *one = malloc(nc * sizeof *one);
    ax_cpu_set_threads(1);
    run_case(&shapes[s], &d);
    memcpy(one, d.c, nc * sizeof *one);
    ax_cpu_set_threads(2);
    run_case(&shapes[s], &d);
    assert_memory_equal(one, d.c, nc * sizeof *one);
    free(one);
    free_case(&d);
  }
  ax_cpu_set_threads(prev);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(cast_f32_bf16_exact),
      cmocka_unit_test(cast_bf16_f32_exact),
      cmocka_unit_test(gemm_fast),
      cmocka_unit_test(gemm_fallback),
      cmocka_unit_test(gemm_degenerate),
      cmocka_unit_test(gemm_threads),
  };
  return AX_TEST_MAIN(tests);
}
