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
 *  - A: slivers of MR rows over one block of k, pair q of row i at dword
 *    q * MR + i, each broadcast to a whole register. Packed block by block
 *    (at most MC_MAX rows) into each thread's own buffer.
 * Pairs along a row of the source (A, or B transposed) are packed by
 * 16 x 16 dword transposes, pairs down a column by widening two rows. An
 * f32 operand is rounded to bf16 as it is loaded for packing, to the bits
 * of ax_bf16_from_f32 (vcvtne2ps2bf16, or axi_bf16_round_hi512 where a
 * load holds a denormal), so the packed panels, and every result, equal
 * those of a bf16 copy made first.
 *
 * The micro-kernel keeps an MR x NR tile of C in MR * NV registers (24 of
 * the 32) over the pairs of one block of k, and prefetches its C tile
 * first. k is cut into equal blocks of at most KC values (one block up to
 * KC), so that a thread's A block (MC_MAX x KC, 192 KiB) and the B sliver
 * in use (KC x NR, 64 KiB) stay in its L2 and C is read and written once
 * per block. Units of work are (batch entry, rows, a run of slivers);
 * OpenMP hands them out dynamically. Measured on an AMD EPYC (Zen 4), one
 * thread: 74-91 % of the vdpbf16ps peak on GPT-2 small's Linear products,
 * 1.8-2.2x OpenBLAS sgemm on the same shapes (docs/BENCHMARKS.md).
 *
 * Summation order: every C element is the f32 sum, in k order, of its
 * blocks (C = alpha * block0 + beta * C, then C += alpha * block), each
 * block summed by one register lane pair after pair. The blocks depend
 * only on k, and which thread computes a unit never changes its
 * arithmetic, so results do not depend on the thread count or schedule.
 *
 * vdpbf16ps treats denormal inputs as zero and flushes denormal results to
 * zero (fixed DAZ/FTZ, checked on Zen 4), unlike the fallback: bf16 inputs
 * under 2^-126 in magnitude lose their products, and partial sums under
 * 2^-126 become 0. */
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "axon/kernels/cpu/bf16_x86-impl.h"
#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/error.h"

#if AXI_BF16_X86

enum {
  MR = 12, /* rows of a micro-tile */
  NV = 2,  /* vectors of 16 columns in a micro-tile */
  NR = 16 * NV,
  KC = 1024,  /* values of k per block at most (even) */
  MC_MAX = 96 /* rows of A per unit at most (a multiple of MR) */
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
  const void *a, *b;
  int af32, bf32; /* operand is f32 (else bf16) */
  float *c;
  uint32_t *bpack; /* packed B, per batch entry or one for all */
  size_t bsize;    /* dwords of packed B per batch entry */
  int nsl;         /* slivers of B (ceil(n / NR)) */
  int mc, nmb;     /* rows per unit, units along m */
  int kc;          /* values of k per block (even) */
  int scount, nsb; /* slivers per unit, units along n */
} bgemm;

/* Mask of the first w (any int) of 16 lanes. */
TBF16_INLINE __mmask16 mask16(int w) {
  return w >= 16  ? (__mmask16)0xffff
         : w <= 0 ? (__mmask16)0
                  : (__mmask16)((1u << w) - 1u);
}

/* Lanes of u (f32 bit patterns) that are denormal. vcvtne2ps2bf16 rounds
 * every other f32 exactly as ax_bf16_from_f32 does (nearest even, NaN
 * quieted the same way) but reads denormals as zero, so loads with a
 * denormal lane take the integer rounding instead. */
TBF16_INLINE __mmask16 denormal(__m512i u) {
  return _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
         _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
}

/* The 32 values x[0 .. 32) as bf16 words, those at or past `left` (>= 1)
 * read as 0: bf16 ones as they are, f32 ones rounded (the upper halves of
 * the rounded lanes, the odd words of the two vectors). */
TBF16_INLINE __m512i load32(const void *x, int f32, int left) {
  if (!f32)
    return _mm512_maskz_loadu_epi16(left >= 32 ? (__mmask32)0xffffffffu
                                               : (__mmask32)((1u << left) - 1u),
                                    x);
  static const uint32_t odd[16] = {0x30001,  0x70005,  0xb0009,  0xf000d,
                                   0x130011, 0x170015, 0x1b0019, 0x1f001d,
                                   0x230021, 0x270025, 0x2b0029, 0x2f002d,
                                   0x330031, 0x370035, 0x3b0039, 0x3f003d};
  const float *f = (const float *)x;
  __m512i lo = _mm512_maskz_loadu_epi32(mask16(left), f);
  __m512i hi = _mm512_maskz_loadu_epi32(mask16(left - 16), f + 16);
  if (!(denormal(lo) | denormal(hi)))
    return (__m512i)_mm512_cvtne2ps_pbh((__m512)hi, (__m512)lo);
  return _mm512_permutex2var_epi16(axi_bf16_round_hi512(lo),
                                   _mm512_loadu_si512(odd),
                                   axi_bf16_round_hi512(hi));
}

/* 16 dwords of pairs (x0[r], x1[r]) for r < 16, lanes outside mk 0; x1
 * NULL reads as 0. */
TBF16_INLINE __m512i load_pairs16(const void *x0, const void *x1, int f32,
                                  __mmask16 mk) {
  if (!f32) {
    __m512i lo = _mm512_cvtepu16_epi32(
        _mm256_maskz_loadu_epi16(mk, (const uint16_t *)x0));
    __m512i hi = x1 ? _mm512_cvtepu16_epi32(
                          _mm256_maskz_loadu_epi16(mk, (const uint16_t *)x1))
                    : _mm512_setzero_si512();
    return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
  }
  /* word 2r: word r (x0), word 2r + 1: word 16 + r (x1) */
  static const uint32_t zip[16] = {0x100000, 0x110001, 0x120002, 0x130003,
                                   0x140004, 0x150005, 0x160006, 0x170007,
                                   0x180008, 0x190009, 0x1a000a, 0x1b000b,
                                   0x1c000c, 0x1d000d, 0x1e000e, 0x1f000f};
  __m512i lo = _mm512_maskz_loadu_epi32(mk, x0);
  __m512i hi = x1 ? _mm512_maskz_loadu_epi32(mk, x1) : _mm512_setzero_si512();
  if (!(denormal(lo) | denormal(hi)))
    return _mm512_permutexvar_epi16(
        _mm512_loadu_si512(zip),
        (__m512i)_mm512_cvtne2ps_pbh((__m512)hi, (__m512)lo));
  return _mm512_mask_blend_epi16(
      (__mmask32)0xaaaaaaaau, _mm512_srli_epi32(axi_bf16_round_hi512(lo), 16),
      axi_bf16_round_hi512(hi));
}

/* Transposes 16 x 16 dwords in place: afterwards r[j] lane i is what r[i]
 * lane j was. Two rounds of unpacks make 4 x 4 blocks, two rounds of
 * 128-bit lane shuffles move the blocks. */
TBF16_INLINE void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
#pragma GCC unroll 4
  for (int g = 0; g < 4; g++) {
    __m512i a0 = _mm512_unpacklo_epi32(r[4 * g], r[4 * g + 1]);
    __m512i a1 = _mm512_unpackhi_epi32(r[4 * g], r[4 * g + 1]);
    __m512i a2 = _mm512_unpacklo_epi32(r[4 * g + 2], r[4 * g + 3]);
    __m512i a3 = _mm512_unpackhi_epi32(r[4 * g + 2], r[4 * g + 3]);
    /* u[4g + c] lane L: column 4L + c of rows 4g .. 4g + 3 */
    u[4 * g] = _mm512_unpacklo_epi64(a0, a2);
    u[4 * g + 1] = _mm512_unpackhi_epi64(a0, a2);
    u[4 * g + 2] = _mm512_unpacklo_epi64(a1, a3);
    u[4 * g + 3] = _mm512_unpackhi_epi64(a1, a3);
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; c++) {
    t[0] = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
    t[1] = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
    t[2] = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    t[3] = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
    r[c] = _mm512_shuffle_i32x4(t[0], t[2], 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(t[0], t[2], 0xdd);
    r[8 + c] = _mm512_shuffle_i32x4(t[1], t[3], 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(t[1], t[3], 0xdd);
  }
}

/* Pairs along rows: out[q * w + r] = (x[r][2q], x[r][2q + 1]) where
 * element (r, p) is x[r * ld + p] (f32 or bf16), for r < w and
 * q < ceil(kv / 2); rows r >= rows and values p >= kv read as 0. Groups of
 * 16 rows by 16 pairs are loaded as 16 vectors and transposed. */
TBF16_INLINE void pack_rows_t(int w, int rows, int kv, const void *x, int f32,
                              long ld, uint32_t *out) {
  const int np = (kv + 1) / 2;
  for (int r0 = 0; r0 < w; r0 += 16) {
    const __mmask16 store = mask16(w - r0);
    for (int q0 = 0; q0 < np; q0 += 16) {
      const int left = kv - 2 * q0; /* values of k left in this chunk */
      __m512i v[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; i++)
        v[i] = r0 + i < rows
                   ? load32(axi_bf16_elem_at(x, f32, (r0 + i) * ld + 2 * q0),
                            f32, left)
                   : _mm512_setzero_si512();
      transpose16(v);
      const int nq = np - q0 < 16 ? np - q0 : 16;
      for (int j = 0; j < nq; j++)
        _mm512_mask_storeu_epi32(out + (q0 + j) * w + r0, store, v[j]);
    }
  }
}

/* Pairs down columns: out[q * w + r] = (x[2q][r], x[2q + 1][r]) where
 * element (p, r) is x[p * ld + r] (f32 or bf16), for r < w and
 * q < ceil(kv / 2); columns r >= cols and rows p >= kv read as 0. With
 * nsl > 1, nsl such slivers of w columns each follow one another (sliver s
 * at out + s * sstride, its columns from x + s * w, cols counted from
 * the first), packed pair by pair so that rows of x are read in order. */
TBF16_INLINE void pack_cols_t(int w, int nsl, long sstride, int cols, int kv,
                              const void *x, int f32, long ld, uint32_t *out) {
  const int np = (kv + 1) / 2;
  for (int q = 0; q < np; q++) {
    const long p0 = 2 * q * ld;
    const int two = 2 * q + 1 < kv;
    for (int s = 0; s < nsl; s++) {
      uint32_t *o = out + s * sstride + q * w;
      for (int r = 0; r < w; r += 16) {
        const int c = s * w + r;
        _mm512_mask_storeu_epi32(
            o + r, mask16(w - r),
            load_pairs16(axi_bf16_elem_at(x, f32, p0 + c),
                         two ? axi_bf16_elem_at(x, f32, p0 + ld + c) : NULL,
                         f32, mask16(cols - c)));
      }
    }
  }
}

/* pack_rows_t and pack_cols_t compiled once per operand type, so that
 * neither type's loops test it. */
TBF16 static void pack_rows(int w, int rows, int kv, const void *x, int f32,
                            long ld, uint32_t *out) {
  if (f32)
    pack_rows_t(w, rows, kv, x, 1, ld, out);
  else
    pack_rows_t(w, rows, kv, x, 0, ld, out);
}

TBF16 static void pack_cols(int w, int nsl, long sstride, int cols, int kv,
                            const void *x, int f32, long ld, uint32_t *out) {
  if (f32)
    pack_cols_t(w, nsl, sstride, cols, kv, x, 1, ld, out);
  else
    pack_cols_t(w, nsl, sstride, cols, kv, x, 0, ld, out);
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
#pragma GCC unroll 12
  for (int i = 0; i < MR; i++)
    if (i < mr) {
      _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
      _mm_prefetch((const char *)(c + i * ldc + NR - 1), _MM_HINT_T0);
    }
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
      const __mmask16 mk = mask16(left);
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
  const void *b = axi_bf16_elem_at(g->b, g->bf32, z * g->sb);
  const int j0 = s * NR, cols = g->n - j0 < NR ? g->n - j0 : NR;
  uint32_t *out = g->bpack + z * g->bsize + (size_t)s * ((g->k + 1) / 2) * NR;
  if (g->tb)
    pack_rows(NR, cols, g->k, axi_bf16_elem_at(b, g->bf32, (long)j0 * g->ldb),
              g->bf32, g->ldb, out);
  else
    pack_cols(NR, 1, 0, cols, g->k, axi_bf16_elem_at(b, g->bf32, j0), g->bf32,
              g->ldb, out);
}

/* Unit u: batch entry, rows [i0, i0 + mc), slivers [s0, s0 + scount). */
TBF16 static void run_unit(const bgemm *g, long u, uint32_t *apack) {
  const int z = (int)(u / ((long)g->nmb * g->nsb));
  const int ib = (int)(u / g->nsb % g->nmb), jb = (int)(u % g->nsb);
  const int i0 = ib * g->mc, rows = g->m - i0 < g->mc ? g->m - i0 : g->mc;
  const int s0 = jb * g->scount;
  const int s1 = s0 + g->scount < g->nsl ? s0 + g->scount : g->nsl;
  const void *a = axi_bf16_elem_at(g->a, g->af32, z * g->sa);
  const uint32_t *bp = g->bpack + (g->sb ? z * g->bsize : 0);
  const size_t bsl = (size_t)((g->k + 1) / 2) * NR; /* dwords per sliver */
  float *c = g->c + z * g->sc + (long)i0 * g->ldc;
  for (int p0 = 0; p0 < g->k; p0 += g->kc) {
    const int kc = g->k - p0 < g->kc ? g->k - p0 : g->kc, np = (kc + 1) / 2;
    if (g->ta)
      pack_cols(MR, (rows + MR - 1) / MR, (long)np * MR, rows, kc,
                axi_bf16_elem_at(a, g->af32, (long)p0 * g->lda + i0), g->af32,
                g->lda, apack);
    else
      for (int i = 0; i < rows; i += MR)
        pack_rows(MR, rows - i < MR ? rows - i : MR, kc,
                  axi_bf16_elem_at(a, g->af32, (long)(i0 + i) * g->lda + p0),
                  g->af32, g->lda, apack + (size_t)(i / MR) * np * MR);
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
                         const void *a, ax_dtype at, int lda, long sa,
                         const void *b, ax_dtype bt, int ldb, long sb,
                         float beta, float *c, int ldc, long sc, int batch) {
  bgemm g = {ta, tb, m,     n,    k, lda, ldb,          ldc,          sa,
             sb, sc, alpha, beta, a, b,   at == AX_F32, bt == AX_F32, c};
  const int threads = ax_cpu_threads();
  g.nsl = (n + NR - 1) / NR;
  g.bsize = (size_t)g.nsl * NR * ((k + 1) / 2);
  partition(&g, batch, threads);
  const int nkb = (k + KC - 1) / KC;
  g.kc = ((k + nkb - 1) / nkb + 1) & ~1;
  const int nbp = sb ? batch : 1; /* B packs */
  const size_t abytes = ((size_t)g.mc * g.kc * 2 + 63) & ~(size_t)63;
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
                         const void *a, ax_dtype at, int lda, long sa,
                         const void *b, ax_dtype bt, int ldb, long sb,
                         float beta, float *c, int ldc, long sc, int batch) {
  return ax_seterr(AX_EUNSUPPORTED, "gemm_bf16: no AVX512-BF16 kernel");
}
#endif
