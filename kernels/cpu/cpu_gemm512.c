/* Small single-threaded AVX-512 GEMMs for the convolution kernels.
 *
 * The convolutions of CIFAR ResNets multiply small matrices (16 to 64 output
 * channels, a few hundred pixels), where OpenBLAS spends much of its time
 * packing, and the OpenBLAS of common distributions picks its AVX2 kernels on
 * CPUs it does not know (recent AMD parts), which halves the peak. These two
 * kernels work straight from the caller's row-major operands without packing:
 *
 *  - axi_gemm512_nn: C (m, n) = beta * C + A * B, where row p of B (k, n)
 *    starts at b + p * ldb or, with an offset table, at b + boff[p] (rows
 *    that overlap let a convolution read its input without im2col), and
 *    A (m, k) is read through two strides, so A may be transposed.
 *    axi_gemm512_nn_arows reads row i of A at a + aoff[i] instead. Each
 *    micro-tile is 8 rows by 32 columns: 16 accumulators, one broadcast of A
 *    and two loads of B per step of k. Column tails use masked loads/stores.
 *  - axi_gemm512_nt: C (m, n) += A * B^T with A (m, k) and B (n, k) both
 *    row-major (row j of B at b + j * ldb or b + boff[j]), i.e. dot products
 *    along k (the pixels in a filter gradient).
 *    Each micro-tile is 4 rows of A by 4 rows of B: 16 vector accumulators
 *    along k, reduced horizontally once at the end.
 *
 * Both are deterministic: the order of every sum depends only on the shapes.
 * They are compiled for AVX-512 with a target attribute and must only be
 * called when axi_gemm512_available() is true (never, off x86-64). */
#include "axon/kernels/cpu/cpu.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

int axi_gemm512_available(void) {
  static int avail = -1;
  if (avail < 0) {
    __builtin_cpu_init();
    avail = __builtin_cpu_supports("avx512f") ? 1 : 0;
  }
  return avail;
}

#define T512 __attribute__((target("avx512f"), always_inline)) static inline

/* Mask of the first w (0..16) lanes. */
T512 __mmask16 lane_mask(int w) {
  return w >= 16  ? (__mmask16)0xffff
         : w <= 0 ? (__mmask16)0
                  : (__mmask16)((1u << w) - 1u);
}

/* One micro-tile of axi_gemm512_nn: rows [0, MR) of A, columns [0, w) of
 * B and C with w <= 16 * NV. NV (1 or 2 vectors) and MR are compile-time
 * constants at every call. */
T512 void nn_tile_v(const int NV, const int MR, int w, int k, const float *a,
                    long sam, long sak, const long *aoff, const float *b,
                    long ldb, const long *boff, float beta, float *c,
                    long ldc) {
  const __mmask16 m0 = lane_mask(w), m1 = lane_mask(w - 16);
  __m512 c0[8], c1[8];
  const float *ar[8]; /* row pointers of A when it comes with offsets */
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++) {
    c0[i] = _mm512_setzero_ps();
    c1[i] = _mm512_setzero_ps(); /* dead when NV == 1 */
    ar[i] = aoff ? a + aoff[i] : a;
  }
  for (int p = 0; p < k; p++) {
    const float *bp = b + (boff ? boff[p] : p * ldb);
    __m512 b0 = _mm512_maskz_loadu_ps(m0, bp);
    __m512 b1 = NV == 2 ? _mm512_maskz_loadu_ps(m1, bp + 16) : b0;
    const float *ap = a + p * sak;
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
      __m512 av = _mm512_set1_ps(aoff ? ar[i][p * sak] : ap[i * sam]);
      c0[i] = _mm512_fmadd_ps(av, b0, c0[i]);
      if (NV == 2)
        c1[i] = _mm512_fmadd_ps(av, b1, c1[i]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++) {
    float *ci = c + i * ldc;
    if (beta != 0.0f) {
      c0[i] = _mm512_add_ps(c0[i], _mm512_maskz_loadu_ps(m0, ci));
      if (NV == 2)
        c1[i] = _mm512_add_ps(c1[i], _mm512_maskz_loadu_ps(m1, ci + 16));
    }
    _mm512_mask_storeu_ps(ci, m0, c0[i]);
    if (NV == 2)
      _mm512_mask_storeu_ps(ci + 16, m1, c1[i]);
  }
}

/* A tile of width w <= 32 with one vector of columns when w <= 16 (the
 * narrow last panel of a row), two otherwise. */
T512 void nn_tile(const int MR, int w, int k, const float *a, long sam,
                  long sak, const long *aoff, const float *b, long ldb,
                  const long *boff, float beta, float *c, long ldc) {
  if (w > 16)
    nn_tile_v(2, MR, w, k, a, sam, sak, aoff, b, ldb, boff, beta, c, ldc);
  else
    nn_tile_v(1, MR, w, k, a, sam, sak, aoff, b, ldb, boff, beta, c, ldc);
}

/* Rows [0, mr) with mr < 8 go through a tile of exactly that height. */
#define NN_ARGS w, k, a, sam, sak, aoff, b, ldb, boff, beta, c, ldc
T512 void nn_tail(int mr, int w, int k, const float *a, long sam, long sak,
                  const long *aoff, const float *b, long ldb, const long *boff,
                  float beta, float *c, long ldc) {
  switch (mr) {
  case 7:
    nn_tile(7, NN_ARGS);
    break;
  case 6:
    nn_tile(6, NN_ARGS);
    break;
  case 5:
    nn_tile(5, NN_ARGS);
    break;
  case 4:
    nn_tile(4, NN_ARGS);
    break;
  case 3:
    nn_tile(3, NN_ARGS);
    break;
  case 2:
    nn_tile(2, NN_ARGS);
    break;
  default:
    nn_tile(1, NN_ARGS);
    break;
  }
}

/* The whole product; aoff and boff are either NULL or not at every inlined
 * call, so the compiler builds one loop for each case. */
T512 void nn_all(int m, int n, int k, const float *a, long sam, long sak,
                 const long *aoff, const float *b, long ldb, const long *boff,
                 float beta, float *c, long ldc) {
  /* Column panels of B (k, 32) stay in cache while every row block of A
   * passes over them. */
  for (int j = 0; j < n; j += 32) {
    const int w = n - j < 32 ? n - j : 32;
    int i = 0;
    for (; i + 8 <= m; i += 8)
      nn_tile(8, w, k, aoff ? a : a + i * sam, sam, sak, aoff ? aoff + i : NULL,
              b + j, ldb, boff, beta, c + i * ldc + j, ldc);
    if (i < m)
      nn_tail(m - i, w, k, aoff ? a : a + i * sam, sam, sak,
              aoff ? aoff + i : NULL, b + j, ldb, boff, beta, c + i * ldc + j,
              ldc);
  }
}

__attribute__((target("avx512f"))) void
axi_gemm512_nn(int m, int n, int k, const float *a, long sam, long sak,
               const float *b, long ldb, const long *boff, float beta, float *c,
               long ldc) {
  if (boff)
    nn_all(m, n, k, a, sam, sak, NULL, b, 0, boff, beta, c, ldc);
  else
    nn_all(m, n, k, a, sam, sak, NULL, b, ldb, NULL, beta, c, ldc);
}

__attribute__((target("avx512f"))) void
axi_gemm512_nn_arows(int m, int n, int k, const float *a, const long *aoff,
                     const float *b, long ldb, float beta, float *c, long ldc) {
  nn_all(m, n, k, a, 0, 1, aoff, b, ldb, NULL, beta, c, ldc);
}

/* One micro-tile of axi_gemm512_nt: rows [0, MR) of A against rows [0, NR)
 * of B, both along k; C (MR, NR) += the dot products. */
T512 void nt_tile(const int MR, const int NR, int k, const float *a, long lda,
                  const float *b, long ldb, const long *boff, float *c,
                  long ldc) {
  __m512 acc[4][4];
#pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++)
      acc[i][j] = _mm512_setzero_ps();
  for (int p = 0; p < k; p += 16) {
    const __mmask16 mk = lane_mask(k - p);
    __m512 bv[4];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++)
      bv[j] = _mm512_maskz_loadu_ps(mk, b + (boff ? boff[j] : j * ldb) + p);
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
      __m512 av = _mm512_maskz_loadu_ps(mk, a + i * lda + p);
#pragma GCC unroll 4
      for (int j = 0; j < NR; j++)
        acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++)
      c[i * ldc + j] += _mm512_reduce_add_ps(acc[i][j]);
}

/* Tiles of the edges, where fewer than 4 rows of A or B remain. */
/* The row of B that a tile calls j: B row j0 + j. */
#define NT_B(j0) (boff ? b : b + (j0)*ldb), ldb, (boff ? boff + (j0) : NULL)

__attribute__((target("avx512f"))) static void
nt_edge(int mr, int nr, int k, const float *a, long lda, const float *b,
        long ldb, const long *boff, float *c, long ldc) {
  for (int i = 0; i < mr; i++)
    for (int j = 0; j < nr; j++)
      nt_tile(1, 1, k, a + i * lda, lda, NT_B(j), c + i * ldc + j, ldc);
}

T512 void nt_all(int m, int n, int k, const float *a, long lda, const float *b,
                 long ldb, const long *boff, float *c, long ldc) {
  int i = 0;
  for (; i + 4 <= m; i += 4) {
    int j = 0;
    for (; j + 4 <= n; j += 4)
      nt_tile(4, 4, k, a + i * lda, lda, NT_B(j), c + i * ldc + j, ldc);
    if (j < n)
      nt_edge(4, n - j, k, a + i * lda, lda, NT_B(j), c + i * ldc + j, ldc);
  }
  if (i < m)
    nt_edge(m - i, n, k, a + i * lda, lda, NT_B(0), c + i * ldc, ldc);
}

__attribute__((target("avx512f"))) void
axi_gemm512_nt(int m, int n, int k, const float *a, long lda, const float *b,
               long ldb, const long *boff, float *c, long ldc) {
  if (boff)
    nt_all(m, n, k, a, lda, b, 0, boff, c, ldc);
  else
    nt_all(m, n, k, a, lda, b, ldb, NULL, c, ldc);
}

#else /* not x86-64: the callers always take their OpenBLAS paths */

int axi_gemm512_available(void) { return 0; }

void axi_gemm512_nn(int m, int n, int k, const float *a, long sam, long sak,
                    const float *b, long ldb, const long *boff, float beta,
                    float *c, long ldc) {}

void axi_gemm512_nn_arows(int m, int n, int k, const float *a, const long *aoff,
                          const float *b, long ldb, float beta, float *c,
                          long ldc) {}

void axi_gemm512_nt(int m, int n, int k, const float *a, long lda,
                    const float *b, long ldb, const long *boff, float *c,
                    long ldc) {}
#endif
