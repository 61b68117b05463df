/* bf16 on the CPU: the casts, and gemm_bf16's argument checks and choice
 * between the AVX512-BF16 kernel (cpu_bf16_gemm.c) and the fallback.
 *
 * The casts give exactly kernels/bf16.h's scalar results (round to nearest
 * even, NaN kept a quiet NaN): the AVX-512 loops do the same integer
 * arithmetic on 16 lanes at once (vcvtneps2bf16 is not used, since it
 * flushes denormals to zero).
 *
 * Either operand may be f32 (rounded to bf16 as it is read) or bf16. The
 * fallback converts op(A) and op(B) of each batch entry to f32 values of
 * bf16 (an f32 operand rounded to bf16 and back) and runs the f32 gemm
 * (OpenBLAS sgemm). A product of two bf16 values is
 * exact in f32, so both paths compute f32 sums of the exact products and
 * meet the same error bound (tests/test_kernel_bf16.c derives it).
 * AXON_BF16_GEMM=fallback, read at every call, forces the fallback on a CPU
 * with AVX512-BF16 (the tests run both paths on one machine). */
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/bf16.h"
#include "axon/kernels/cpu/bf16_x86-impl.h"
#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/error.h"

#if AXI_BF16_X86
#define T512 __attribute__((target("avx512f")))
#endif

/* Elements per task of the parallel casts (a multiple of 16). */
#define CAST_CHUNK 8192

#if AXI_BF16_X86
/* n a multiple of 16. */
T512 static void f32_to_bf16_512(size_t n, const float *x, uint16_t *y) {
  for (size_t i = 0; i < n; i += 16) {
    __m512i r = axi_bf16_round_hi512(_mm512_loadu_si512(x + i));
    _mm256_storeu_si256((__m256i *)(y + i),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
  }
}

/* y = f32(bf16(x)), n a multiple of 16. */
T512 static void round_f32_512(size_t n, const float *x, float *y) {
  const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
  for (size_t i = 0; i < n; i += 16)
    _mm512_storeu_si512(
        y + i,
        _mm512_and_si512(axi_bf16_round_hi512(_mm512_loadu_si512(x + i)), hi));
}

/* n a multiple of 16. */
T512 static void bf16_to_f32_512(size_t n, const uint16_t *x, float *y) {
  for (size_t i = 0; i < n; i += 16) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(x + i));
    _mm512_storeu_si512(y + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}
#endif

/* The vector part of a cast of n elements: how many of the first elements
 * the AVX-512 loops may take (a multiple of 16; 0 without AVX-512). */
static size_t vector_part(size_t n) {
  return AXI_BF16_X86 && axi_gemm512_available() ? n & ~(size_t)15 : 0;
}

static void cast_f32_bf16_seq(size_t n, const float *x, uint16_t *y) {
  size_t nv = vector_part(n);
#if AXI_BF16_X86
  if (nv)
    f32_to_bf16_512(nv, x, y);
#endif
  for (size_t i = nv; i < n; i++)
    y[i] = ax_bf16_from_f32(x[i]);
}

static void round_f32_seq(size_t n, const float *x, float *y) {
  size_t nv = vector_part(n);
#if AXI_BF16_X86
  if (nv)
    round_f32_512(nv, x, y);
#endif
  for (size_t i = nv; i < n; i++)
    y[i] = ax_bf16_round(x[i]);
}

static void cast_bf16_f32_seq(size_t n, const uint16_t *x, float *y) {
  size_t nv = vector_part(n);
#if AXI_BF16_X86
  if (nv)
    bf16_to_f32_512(nv, x, y);
#endif
  for (size_t i = nv; i < n; i++)
    y[i] = ax_bf16_to_f32(x[i]);
}

int axi_cpu_cast_f32_bf16(ax_backend *be, size_t n, const float *x,
                          uint16_t *y) {
  (void)be;
  size_t chunks = (n + CAST_CHUNK - 1) / CAST_CHUNK;
#pragma omp parallel for num_threads(ax_cpu_threads()) if (chunks > 8)
  for (size_t t = 0; t < chunks; t++) {
    size_t i = t * CAST_CHUNK, len = n - i < CAST_CHUNK ? n - i : CAST_CHUNK;
    cast_f32_bf16_seq(len, x + i, y + i);
  }
  return AX_OK;
}

int axi_cpu_cast_bf16_f32(ax_backend *be, size_t n, const uint16_t *x,
                          float *y) {
  (void)be;
  size_t chunks = (n + CAST_CHUNK - 1) / CAST_CHUNK;
#pragma omp parallel for num_threads(ax_cpu_threads()) if (chunks > 8)
  for (size_t t = 0; t < chunks; t++) {
    size_t i = t * CAST_CHUNK, len = n - i < CAST_CHUNK ? n - i : CAST_CHUNK;
    cast_bf16_f32_seq(len, x + i, y + i);
  }
  return AX_OK;
}

/* y (rows, cols) dense = the bf16 values of x (rows, cols) with leading
 * dimension ld: a bf16 x widened, an f32 x rounded to bf16 and back. */
static void cast_matrix(int rows, int cols, const void *x, ax_dtype dt, long ld,
                        float *y) {
#pragma omp parallel for num_threads(ax_cpu_threads()) if ((long)rows * cols > \
                                                           65536)
  for (int r = 0; r < rows; r++) {
    float *yr = y + (size_t)r * cols;
    if (dt == AX_F32)
      round_f32_seq((size_t)cols, (const float *)x + r * ld, yr);
    else
      cast_bf16_f32_seq((size_t)cols, (const uint16_t *)x + r * ld, yr);
  }
}

/* The fallback: each batch entry's operands as f32 bf16 values, then the
 * f32 gemm with dense leading dimensions. */
static int gemm_bf16_fallback(ax_backend *be, int ta, int tb, int m, int n,
                              int k, float alpha, const void *a, ax_dtype at,
                              int lda, long sa, const void *b, ax_dtype bt,
                              int ldb, long sb, float beta, float *c, int ldc,
                              long sc, int batch) {
  const int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  size_t na = (size_t)ar * ac, nb = (size_t)br * bc;
  float *fa = malloc((na + nb) * sizeof *fa);
  if (!fa)
    return ax_seterr(AX_ENOMEM, "gemm_bf16: no memory for f32 operands");
  float *fb = fa + na;
  int rc = AX_OK;
  for (int z = 0; rc == AX_OK && z < batch; z++) {
    if (z == 0 || sa != 0)
      cast_matrix(ar, ac, axi_bf16_elem_at(a, at == AX_F32, z * sa), at, lda,
                  fa);
    if (z == 0 || sb != 0)
      cast_matrix(br, bc, axi_bf16_elem_at(b, bt == AX_F32, z * sb), bt, ldb,
                  fb);
    rc = axi_cpu_gemm(be, ta, tb, m, n, k, alpha, fa, ac > 0 ? ac : 1, 0, fb,
                      bc > 0 ? bc : 1, 0, beta, c + z * sc, ldc, 0, 1);
  }
  free(fa);
  return rc;
}

/* C = beta * C for every batch entry (alpha == 0 or k == 0); beta == 0
 * writes zeros whatever C held. */
static void scale_c(int m, int n, float beta, float *c, int ldc, long sc,
                    int batch) {
  for (int z = 0; z < batch; z++)
    for (int i = 0; i < m; i++) {
      float *ci = c + z * sc + (long)i * ldc;
      for (int j = 0; j < n; j++)
        ci[j] = beta == 0.0f ? 0.0f : beta * ci[j];
    }
}

int axi_cpu_gemm_bf16(ax_backend *be, int ta, int tb, int m, int n, int k,
                      float alpha, const void *a, ax_dtype at, int lda, long sa,
                      const void *b, ax_dtype bt, int ldb, long sb, float beta,
                      float *c, int ldc, long sc, int batch) {
  if ((at != AX_F32 && at != AX_BF16) || (bt != AX_F32 && bt != AX_BF16))
    return ax_seterr(AX_EDTYPE, "gemm_bf16: %s x %s operands",
                     ax_dtype_name(at), ax_dtype_name(bt));
  if (m < 0 || n < 0 || k < 0 || batch < 0)
    return ax_seterr(AX_EINVAL, "gemm_bf16: negative size");
  if (lda < (ta ? m : k) || ldb < (tb ? k : n) || ldc < n)
    return ax_seterr(AX_EINVAL,
                     "gemm_bf16: leading dimension shorter than a row "
                     "(lda %d, ldb %d, ldc %d)",
                     lda, ldb, ldc);
  if (m == 0 || n == 0 || batch == 0)
    return AX_OK;
  if (k == 0 || alpha == 0.0f) {
    scale_c(m, n, beta, c, ldc, sc, batch);
    return AX_OK;
  }
  const char *env = getenv("AXON_BF16_GEMM");
  int forced = env && strcmp(env, "fallback") == 0;
  if (!forced && axi_bf16_gemm_available())
    return axi_bf16_gemm_avx512(ta, tb, m, n, k, alpha, a, at, lda, sa, b, bt,
                                ldb, sb, beta, c, ldc, sc, batch);
  return gemm_bf16_fallback(be, ta, tb, m, n, k, alpha, a, at, lda, sa, b, bt,
                            ldb, sb, beta, c, ldc, sc, batch);
}
