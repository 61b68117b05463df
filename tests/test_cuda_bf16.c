/* The CUDA bf16 kernels against the CPU backend: the f32 <-> bf16 casts
 * (bit for bit, NaN, infinities, subnormals and rounding ties included)
 * and gemm_bf16 (cuBLAS, bf16 inputs, f32 sums) within a stated tolerance.
 * Skipped (exit 77) without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "axon/kernels/bf16.h"
#include "cuda_testutil.h"
#include "harness.h"

/* ---- casts ----------------------------------------------------------------
 */

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* f32 -> bf16 on both backends, bit for bit, over n bit patterns: the
 * special ones first (quiet, signalling and negative NaNs, infinities,
 * zeros, the largest float (rounds to infinity), subnormals, exact ties of
 * both parities, one ulp either side of a tie), then random patterns. */
static void cast_f32_bf16_parity(void **state) {
  static const uint32_t special[] = {
      0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7fbfffffu, 0xff800001u,
      0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u, 0x7f7fffffu,
      0xff7fffffu, 0x00000001u, 0x807fffffu, 0x00008000u, 0x00018000u,
      0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0xbf808000u,
      0x7f7f8000u, 0x7f7e8000u, 0x4b7fff80u, 0x33800000u};
  const size_t ns = sizeof special / sizeof special[0], n = ns + 1000003;
  float *x = malloc(n * 4);
  uint16_t *ref = malloc(n * 2), *got = malloc(n * 2);
  ax_rng r;
  ax_rng_seed(&r, 1);
  for (size_t i = 0; i < n; i++)
    x[i] = from_bits(i < ns ? special[i] : (uint32_t)ax_rng_u64(&r));
  float *dx = ct_up(x, n * 4);
  uint16_t *dy = ct_up(NULL, n * 2);
  AX_ASSERT_OK(AX_K(ct_cpu(), cast_f32_bf16, n, x, ref));
  AX_ASSERT_OK(AX_K(ct_gpu(), cast_f32_bf16, n, dx, dy));
  ct_down(got, dy, n * 2);
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &x[i], 4);
    if (got[i] != ref[i])
      fail_msg("cast_f32_bf16[%zu] of 0x%08x: 0x%04x, CPU 0x%04x", i,
               (unsigned)u, got[i], ref[i]);
    if (ref[i] != ax_bf16_from_f32(x[i]))
      fail_msg("CPU cast_f32_bf16[%zu] is not ax_bf16_from_f32", i);
  }
  AX_ASSERT_OK(AX_K(ct_gpu(), cast_f32_bf16, 0, NULL, NULL));
  ct_free(dx), ct_free(dy);
  free(x), free(ref), free(got);
}

/* bf16 -> f32 over all 65536 patterns: exact on both backends. */
static void cast_bf16_f32_parity(void **state) {
  const size_t n = 65536;
  uint16_t *x = malloc(n * 2);
  float *ref = malloc(n * 4);
  for (size_t i = 0; i < n; i++)
    x[i] = (uint16_t)i;
  uint16_t *dx = ct_up(x, n * 2);
  float *dy = ct_up(NULL, n * 4);
  AX_ASSERT_OK(AX_K(ct_cpu(), cast_bf16_f32, n, x, ref));
  AX_ASSERT_OK(AX_K(ct_gpu(), cast_bf16_f32, n, dx, dy));
  ct_check_exact("cast_bf16_f32", dy, ref, n * 4);
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &ref[i], 4);
    if (u != (uint32_t)i << 16)
      fail_msg("CPU cast_bf16_f32 of 0x%04zx: 0x%08x", i, (unsigned)u);
  }
  ct_free(dx), ct_free(dy);
  free(x), free(ref);
}

/* ---- gemm_bf16 ------------------------------------------------------------
 */

typedef struct gemm_case {
  int ta, tb, m, n, k, batch, pad; /* pad: extra leading-dimension columns */
  float alpha, beta;
} gemm_case;

/* n random bf16 values: N(0, 1) values, kept in *f32, rounded. */
static uint16_t *rand_bf16(uint64_t seed, size_t n, float **f32) {
  float *f = ct_randn(seed, n, 1);
  uint16_t *h = malloc(n * 2 + 2);
  for (size_t i = 0; i < n; i++)
    h[i] = ax_bf16_from_f32(f[i]);
  *f32 = f;
  return h;
}

/* Tolerance: the products of bf16 values are exact in f32 on both sides;
 * only the f32 sums differ (order, and the tensor cores' accumulation),
 * ~k * 2^-24 for k products of N(0, 1) values. 4e-6 k is over 60x that;
 * rtol 1e-4 as the f32 gemm's. The GPU runs with A, B or both given as
 * f32 (their bf16 roundings are the CPU's operands) as well, under the
 * same bound. */
static void check_gemm_bf16(gemm_case g, uint64_t seed) {
  int lda = (g.ta ? g.m : g.k) + g.pad, rows_a = g.ta ? g.k : g.m;
  int ldb = (g.tb ? g.k : g.n) + g.pad, rows_b = g.tb ? g.n : g.k;
  int ldc = g.n + g.pad;
  long sa = (long)rows_a * lda, sb = (long)rows_b * ldb, sc = (long)g.m * ldc;
  size_t na = (size_t)sa * g.batch, nb = (size_t)sb * g.batch,
         nc = (size_t)sc * g.batch;
  float *fa, *fb;
  uint16_t *a = rand_bf16(seed, na, &fa), *b = rand_bf16(seed + 1, nb, &fb);
  float *c = ct_randn(seed + 2, nc, 1), *got = malloc(nc * 4 + 4);
  uint16_t *da = ct_up(a, na * 2), *db = ct_up(b, nb * 2);
  float *dfa = ct_up(fa, na * 4), *dfb = ct_up(fb, nb * 4);
  AX_ASSERT_OK(AX_K(ct_cpu(), gemm_bf16, g.ta, g.tb, g.m, g.n, g.k, g.alpha, a,
                    AX_BF16, lda, sa, b, AX_BF16, ldb, sb, g.beta, c, ldc, sc,
                    g.batch));
  float *c0 = ct_randn(seed + 2, nc, 1);
  for (int f = 0; f < 4; f++) { /* bit 0: A f32, bit 1: B f32 */
    float *dc = ct_up(c0, nc * 4);
    AX_ASSERT_OK(AX_K(ct_gpu(), gemm_bf16, g.ta, g.tb, g.m, g.n, g.k, g.alpha,
                      f & 1 ? (const void *)dfa : da, f & 1 ? AX_F32 : AX_BF16,
                      lda, sa, f & 2 ? (const void *)dfb : db,
                      f & 2 ? AX_F32 : AX_BF16, ldb, sb, g.beta, dc, ldc, sc,
                      g.batch));
    ct_down(got, dc, nc * 4);
    ct_free(dc);
    char what[160];
    snprintf(what, sizeof what,
             "gemm_bf16 ta=%d tb=%d %dx%dx%d batch %d pad %d f32 operands %d",
             g.ta, g.tb, g.m, g.n, g.k, g.batch, g.pad, f);
    double atol = 1e-5 + 4e-6 * g.k * fabs(g.alpha) + 1e-6 * fabs(g.beta);
    ct_expect_close(what, got, c, nc, atol, 1e-4);
  }
  ct_free(da), ct_free(db), ct_free(dfa), ct_free(dfb);
  free(a), free(b), free(fa), free(fb), free(c), free(c0), free(got);
}

static void gemm_bf16_parity(void **state) {
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      gemm_case small = {ta, tb, 5, 7, 3, 1, 0, 1.0f, 0.0f};
      check_gemm_bf16(small, 10);
      /* odd sizes, padded leading dimensions, alpha and beta */
      gemm_case odd = {ta, tb, 37, 53, 19, 1, 3, 0.7f, -1.3f};
      check_gemm_bf16(odd, 20);
      gemm_case batched = {ta, tb, 33, 24, 40, 3, 2, -0.5f, 1.0f};
      check_gemm_bf16(batched, 30);
    }
  gemm_case big = {0, 1, 512, 512, 768, 2, 0, 1.0f, 0.5f};
  check_gemm_bf16(big, 40);
}

/* Empty sizes are no-ops, negative ones AX_EINVAL, as for gemm; an
 * operand neither f32 nor bf16 is AX_EDTYPE. */
static void gemm_bf16_edges(void **state) {
  uint16_t h[12] = {0};
  uint16_t *d = ct_up(h, sizeof h);
  float *c = ct_up(NULL, 64);
  AX_ASSERT_OK(AX_K(ct_gpu(), gemm_bf16, 0, 0, 0, 3, 2, 1.0f, d, AX_BF16, 2, 0,
                    d, AX_BF16, 3, 0, 0.0f, c, 3, 0, 1));
  AX_ASSERT_ERR(AX_K(ct_gpu(), gemm_bf16, 0, 0, -1, 3, 2, 1.0f, d, AX_BF16, 2,
                     0, d, AX_BF16, 3, 0, 0.0f, c, 3, 0, 1),
                AX_EINVAL);
  AX_ASSERT_ERR(AX_K(ct_gpu(), gemm_bf16, 0, 0, 1, 3, 2, 1.0f, d, AX_I32, 2, 0,
                     d, AX_BF16, 3, 0, 0.0f, c, 3, 0, 1),
                AX_EDTYPE);
  /* k == 0: C = beta * C */
  float ones[4] = {1, 2, 3, 4}, got[4];
  float *c2 = ct_up(ones, sizeof ones);
  AX_ASSERT_OK(AX_K(ct_gpu(), gemm_bf16, 0, 0, 2, 2, 0, 1.0f, d, AX_BF16, 0, 0,
                    d, AX_BF16, 2, 0, 2.0f, c2, 2, 0, 1));
  ct_down(got, c2, sizeof got);
  for (int i = 0; i < 4; i++)
    assert_true(got[i] == 2.0f * ones[i]);
  ct_free(d), ct_free(c), ct_free(c2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(cast_f32_bf16_parity),
      cmocka_unit_test(cast_bf16_f32_parity),
      cmocka_unit_test(gemm_bf16_parity),
      cmocka_unit_test(gemm_bf16_edges),
  };
  return AX_CUDA_TEST_MAIN(tests);
}
