/* gemm_bf16 on AVX512-BF16: vdpbf16ps (_mm512_dpbf16_ps) multiplies 16
 * pairs of bf16 values of two registers and adds each pair's two exact
 * products to one f32 lane. So both operands are packed as pairs of
 * consecutive k ("dwords": element 2q in the low half, 2q + 1 in the high
 * half; an odd k's last pair is completed with a zero):
 *
 *  - B: slivers of NR = 16 * NV columns over the whole k, pair q of column
 *    j at dword q * NR + j of its sliver, so one step of k loads NV
 *    vectors. Packed once per call (per batch entry, once when stride_b is
 *    0) by all threads before any product.
 *  - A: slivers of MR rows over KC values of k, pair q of row i at dword
 *    q * MR + i, each broadcast to a whole register. Packed block by block
 *    (MC rows by KC) into each thread's own buffer.
 *
 * The micro-kernel keeps an MR x NR tile of C in MR * NV registers (24 of
 * the 32) over the KC / 2 pairs of one block of k. The blocks follow the
 * usual layout: one B sliver (KC x NR, 24 KiB) stays in L1 while the MC
 * rows of A (MC x KC, L2) pass over it. Units of work are (batch entry,
 * MC rows, a run of slivers); OpenMP hands them out dynamically.
 *
 * Summation order: every C element is the f32 sum, in k order, of its KC
 * blocks (C = alpha * block0 + beta * C, then C += alpha * block), each
 * block summed by one register lane pair after pair. KC is a constant and
 * which thread computes a unit never changes its arithmetic, so results do
 * not depend on the thread count or schedule.
 *
 * vdpbf16ps treats denormal inputs as zero and flushes denormal results to
 * zero (its DAZ/FTZ are fixed), unlike the fallback; bf16.h's casts keep
 * denormals, so inputs under 2^-126 in magnitude lose their products. */
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

enum {
  MR = 12, /* rows of a micro-tile */
  NV = 2,  /* vectors of 16 columns in a micro-tile */
  NR = 16 * NV,
  KC = 384,    /* values of k per block (even) */
  MC_MAX = 192 /* rows of A per unit at most (a multiple of MR) */
};

int axi_bf16_gemm_available(void) {
  static int avail = -1;
  if (avail < 0) {
    __builtin_cpu_init();
    avail = __builtin_cpu_supports("avx512f") &&
            __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("avx512bf16");
  }
  return avail;
}

#define TBF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define TBF16_INLINE TBF16 __attribute__((always_inline)) static inline

/* The call's operands and the partition of C into units. */
typedef struct bgemm {
  int ta, tb, m, n, k, lda, ldb, ldc;
  long sa, sb, sc;
  float alpha, beta;
  const uint16_t *a, *b;
  float *c;
  uint32_t *bpack; /* packed B, per batch entry or one for all */
  size_t bsize;    /* dwords of packed B per batch entry */
  int nsl;         /* slivers of B (ceil(n / NR)) */
  int mc, nmb;     /* rows per unit, units along m */
  int scount, nsb; /* slivers per unit, units along n */
} bgemm;

/* Pairs along a row: out[q * w + r] = (x[r][2q], x[r][2q + 1]) where
 * element (r, p) is x[r * ld + p]; rows r >= rows and values p >= kv are 0. */
TBF16 static void pack_rows(int w, int rows, int kv, const uint16_t *x, long ld,
                            uint32_t *out) {
  const int np = (kv + 1) / 2, full = kv / 2;
  for (int r = 0; r < w; r++) {
    uint32_t *o = out + r;
    if (r >= rows) {
      for (int q = 0; q < np; q++)
        o[q * w] = 0;
      continue;
    }
    const uint16_t *xr = x + r * ld;
    for (int q = 0; q < full; q++) {
      uint32_t d;
      memcpy(&d, xr + 2 * q, sizeof d);
      o[q * w] = d;
    }
    if (full < np)
      o[full * w] = xr[2 * full];
  }
}

/* Pairs down a column: out[q * w + r] = (x[2q][r], x[2q + 1][r]) where
 * element (p, r) is x[p * ld + r]; columns r >= cols and rows p >= kv are
 * 0. */
TBF16 static void pack_cols(int w, int cols, int kv, const uint16_t *x, long ld,
                            uint32_t *out) {
  const int np = (kv + 1) / 2;
  for (int q = 0; q < np; q++) {
    const uint16_t *x0 = x + 2 * q * ld, *x1 = x0 + ld;
    const int two = 2 * q + 1 < kv;
    uint32_t *o = out + q * w;
    for (int r = 0; r < w; r += 16) {
      const int left = cols - r;
      const __mmask16 mk = left >= 16  ? (__mmask16)0xffff
                           : left <= 0 ? (__mmask16)0
                                       : (__mmask16)((1u << left) - 1u);
      __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, x0 + r));
      __m512i hi =
          two ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, x1 + r))
              : _mm512_setzero_si512();
      __m512i d = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
      if (w - r >= 16)
        _mm512_storeu_si512(o + r, d);
      else
        _mm512_mask_storeu_epi32(o + r, (__mmask16)((1u << (w - r)) - 1u), d);
    }
  }
}

/* One micro-tile: C[0, mr) x [0, nr) of an MR x NR tile from np pairs of A
 * (a: MR dwords per pair) and B (b: NR dwords per pair, 64-byte aligned).
 * first: C = alpha * sum + beta * C (C not read when beta is 0); else
 * C += alpha * sum. */
TBF16_INLINE void micro(int np, const uint32_t *a, const uint32_t *b, float *c,
                        long ldc, int mr, int nr, float alpha, float beta,
                        int first) {
  __m512 acc[MR][NV];
#pragma GCC unroll 12
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++)
      acc[i][v] = _mm512_setzero_ps();
  for (int q = 0; q < np; q++) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++)
      bv[v] = (__m512bh)_mm512_load_si512(b + q * NR + 16 * v);
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
      __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[q * MR + i]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++)
        acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 12
  for (int i = 0; i < MR; i++) {
    if (i >= mr)
      break;
    float *ci = c + i * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
      const int left = nr - 16 * v;
      if (left <= 0)
        break;
      const __mmask16 mk =
          left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
      __m512 r = _mm512_mul_ps(acc[i][v], va);
      if (!first)
        r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mk, ci + 16 * v));
      else if (beta != 0.0f)
        r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk, ci + 16 * v), r);
      _mm512_mask_storeu_ps(ci + 16 * v, mk, r);
    }
  }
}

/* Packs sliver s of batch entry z's B (all of k). */
TBF16 static void pack_b(const bgemm *g, int z, int s) {
  const uint16_t *b = g->b + z * g->sb;
  const int j0 = s * NR, cols = g->n - j0 < NR ? g->n - j0 : NR;
  uint32_t *out = g->bpack + z * g->bsize + (size_t)s * ((g->k + 1) / 2) * NR;
  if (g->tb)
    pack_rows(NR, cols, g->k, b + (long)j0 * g->ldb, g->ldb, out);
  else
    pack_cols(NR, cols, g->k, b + j0, g->ldb, out);
}

/* Unit u: batch entry, rows [i0, i0 + mc), slivers [s0, s0 + scount). */
TBF16 static void run_unit(const bgemm *g, long u, uint32_t *apack) {
  const int z = (int)(u / ((long)g->nmb * g->nsb));
  const int ib = (int)(u / g->nsb % g->nmb), jb = (int)(u % g->nsb);
  const int i0 = ib * g->mc, rows = g->m - i0 < g->mc ? g->m - i0 : g->mc;
  const int s0 = jb * g->scount;
  const int s1 = s0 + g->scount < g->nsl ? s0 + g->scount : g->nsl;
  const uint16_t *a = g->a + z * g->sa;
  const uint32_t *bp = g->bpack + (g->sb ? z * g->bsize : 0);
  const size_t bsl = (size_t)((g->k + 1) / 2) * NR; /* dwords per sliver */
  float *c = g->c + z * g->sc + (long)i0 * g->ldc;
  for (int p0 = 0; p0 < g->k; p0 += KC) {
    const int kc = g->k - p0 < KC ? g->k - p0 : KC, np = (kc + 1) / 2;
    for (int i = 0; i < rows; i += MR) {
      const int mr = rows - i < MR ? rows - i : MR;
      uint32_t *ap = apack + (size_t)(i / MR) * np * MR;
      if (g->ta)
        pack_cols(MR, mr, kc, a + (long)p0 * g->lda + i0 + i, g->lda, ap);
      else
        pack_rows(MR, mr, kc, a + (long)(i0 + i) * g->lda + p0, g->lda, ap);
    }
    for (int s = s0; s < s1; s++) {
      const uint32_t *bs = bp + s * bsl + (size_t)(p0 / 2) * NR;
      const int nr = g->n - s * NR < NR ? g->n - s * NR : NR;
      for (int i = 0; i < rows; i += MR)
        micro(np, apack + (size_t)(i / MR) * np * MR, bs,
              c + (long)i * g->ldc + s * NR, g->ldc,
              rows - i < MR ? rows - i : MR, nr, g->alpha, g->beta, p0 == 0);
    }
  }
}

/* Splits C into units: rows in nearly equal runs of at most MC_MAX (a
 * multiple of MR), and the slivers too when there are fewer than four units
 * per thread. */
static void partition(bgemm *g, int batch, int threads) {
  int nmb = (g->m + MC_MAX - 1) / MC_MAX;
  int mc = (g->m + nmb - 1) / nmb;
  g->mc = (mc + MR - 1) / MR * MR;
  g->nmb = (g->m + g->mc - 1) / g->mc;
  long units = (long)batch * g->nmb, want = 4L * threads;
  int nsb = units >= want ? 1 : (int)((want + units - 1) / units);
  if (nsb > g->nsl)
    nsb = g->nsl;
  g->scount = (g->nsl + nsb - 1) / nsb;
  g->nsb = (g->nsl + g->scount - 1) / g->scount;
}

int axi_bf16_gemm_avx512(int ta, int tb, int m, int n, int k, float alpha,
                         const uint16_t *a, int lda, long sa, const uint16_t *b,
                         int ldb, long sb, float beta, float *c, int ldc,
                         long sc, int batch) {
  bgemm g = {ta, tb, m, n, k, lda, ldb, ldc, sa, sb, sc, alpha, beta, a, b, c};
  const int threads = ax_cpu_threads();
  g.nsl = (n + NR - 1) / NR;
  g.bsize = (size_t)g.nsl * NR * ((k + 1) / 2);
  partition(&g, batch, threads);
  const int nbp = sb ? batch : 1; /* B packs */
  const size_t abytes = ((size_t)g.mc * KC * 2 + 63) & ~(size_t)63;
  g.bpack = aligned_alloc(64, (size_t)nbp * g.bsize * 4);
  uint8_t *apack = aligned_alloc(64, abytes * threads);
  if (!g.bpack || !apack) {
    free(g.bpack);
    free(apack);
    return ax_seterr(AX_ENOMEM, "gemm_bf16: no memory for packed operands");
  }
  const long units = (long)batch * g.nmb * g.nsb, bjobs = (long)nbp * g.nsl;
  const double flops = 2.0 * m * n * k * batch;
#pragma omp parallel num_threads(threads) if (flops > 2e6)
  {
#ifdef _OPENMP
    uint32_t *ap = (uint32_t *)(apack + abytes * omp_get_thread_num());
#else
    uint32_t *ap = (uint32_t *)apack;
#endif
#pragma omp for schedule(static)
    for (long t = 0; t < bjobs; t++)
      pack_b(&g, (int)(t / g.nsl), (int)(t % g.nsl));
#pragma omp for schedule(dynamic, 1)
    for (long u = 0; u < units; u++)
      run_unit(&g, u, ap);
  }
  free(g.bpack);
  free(apack);
  return AX_OK;
}

#else /* not x86-64: gemm_bf16 always takes the fallback */

int axi_bf16_gemm_available(void) { return 0; }

int axi_bf16_gemm_avx512(int ta, int tb, int m, int n, int k, float alpha,
                         const uint16_t *a, int lda, long sa, const uint16_t *b,
                         int ldb, long sb, float beta, float *c, int ldc,
                         long sc, int batch) {
  return ax_seterr(AX_EUNSUPPORTED, "gemm_bf16: no AVX512-BF16 kernel");
}
#endif
