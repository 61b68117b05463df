/* Fused causal attention on the CPU: the reference of the attn_causal_fwd
 * and attn_causal_bwd contracts (kernels/backend-impl.h), written after
 * FlashAttention-2 (Dao 2023) so that a GPU port follows the same steps.
 *
 * Every (sequence b, head h) is cut into blocks of BQ query rows and BK
 * keys, both aligned at position 0. Query row i sits at position
 * pos(i) = sk - sq + i and sees the keys j <= pos(i).
 *
 * Forward, one task per (b, h, query block), never more than a BQ x BK
 * tile of scores:
 *   m = -inf, l = 0, acc = 0                    (per row of the block)
 *   for each key block up to the block's last position:
 *     S = scale * Q K^T                          (tile GEMM)
 *     m' = max(m, rowmax S); c = exp(m - m')     (online softmax)
 *     P = exp(S - m') on the visible keys, 0 elsewhere
 *     l = c l + rowsum P;  acc = c acc + dropout(P) V;  m = m'
 *   o = acc / l;  lse = m + log l
 * dropout(P) keeps P_ij / (1 - p) iff ax_dropout_uniform(seed, counter of
 * (b, h, i, j)) >= p, with the contract's counter; l sums P before dropout.
 *
 * Backward, from lse (no (sq, sk) matrix either): for a pair of blocks
 *   P = exp(S - lse) (causal), dPd = dO V^T, f = the dropout factor,
 *   D_i = rowsum(dO_i * O_i), dS = scale * P * (f dPd - D)
 *   dV_j += (f P)^T dO_i,  dK_j += dS^T Q_i,  dQ_i += dS K_j.
 * When there are enough (b, h) for the threads, one task per (b, h) walks
 * the key blocks in order, each over the query blocks that see it, and
 * accumulates dQ in place. Otherwise one task per (b, h, key block) makes
 * dK and dV and one per (b, h, query block) makes dQ, walking the key
 * blocks in the same order: both ways compute every pair identically and
 * sum in the same order, so results do not depend on the thread count.
 *
 * The products run on the AVX-512 tile GEMM (cpu_gemm512.c) when the CPU
 * has it, else on plain loops; the elementwise steps are plain loops that
 * the compiler vectorises, cloned for x86-64-v4 (AVX-512) where it can.
 * This file holds the forward and the parts both directions share
 * (cpu_attn_causal-impl.h); cpu_attn_causal_bwd.c the backward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/cpu/cpu_attn_causal-impl.h"
#include "axon/kernels/error.h"

#define BQ AXI_ATTN_BQ
#define BK AXI_ATTN_BK

/* ---- shared with the backward ---- */

axi_attn_head axi_attn_head_of(const axi_attn_job *J, long bh) {
  const ax_attn_desc *d = J->d;
  int b = (int)(bh / d->heads), h = (int)(bh % d->heads);
  axi_attn_head H = {d};
  H.qo = b * d->q_sb + (long)h * d->dh;
  H.ko = b * d->k_sb + (long)h * d->dh;
  H.vo = b * d->v_sb + (long)h * d->dh;
  H.oo = b * d->o_sb + (long)h * d->dh;
  H.lo = bh * d->sq;
  H.ctr = ((uint64_t)b * d->heads_total + (uint64_t)(d->head0 + h)) *
          (uint64_t)d->sk * (uint64_t)d->sk;
  H.keep_scale = 1.0f / (1.0f - d->dropout);
  return H;
}

void axi_attn_tile_nn(int m, int n, int k, const float *a, long sam, long sak,
                      const float *b, long ldb, float beta, float *c,
                      long ldc) {
  if (axi_gemm512_available()) {
    axi_gemm512_nn(m, n, k, a, sam, sak, b, ldb, NULL, beta, c, ldc);
    return;
  }
  for (int i = 0; i < m; i++) {
    float *ci = c + i * ldc;
    if (beta == 0.0f)
      memset(ci, 0, sizeof(float) * (size_t)n);
    for (int p = 0; p < k; p++) {
      const float av = a[i * sam + p * sak], *bp = b + p * ldb;
#pragma omp simd
      for (int j = 0; j < n; j++)
        ci[j] += av * bp[j];
    }
  }
}

void axi_attn_transpose(int n, int dh, const float *x, long ss, float *xt) {
  for (int j = 0; j < n; j++)
    for (int d = 0; d < dh; d++)
      xt[(size_t)d * BK + j] = x[j * ss + d];
}

int axi_attn_run(const axi_attn_job *J, long n, size_t ws_floats,
                 axi_attn_task fn) {
  int nt = ax_cpu_threads();
  size_t wsn = (ws_floats + 15) & ~(size_t)15; /* 64-byte multiples */
  float *ws = aligned_alloc(64, sizeof(float) * wsn * (size_t)nt);
  if (!ws)
    return ax_seterr(AX_ENOMEM, "attn_causal: no scratch memory");
#pragma omp parallel num_threads(nt) if (n > 1)
  {
    int tid = 0;
#ifdef _OPENMP
    tid = omp_get_thread_num();
#endif
#pragma omp for schedule(dynamic, 1)
    for (long t = 0; t < n; t++)
      fn(J, t, ws + (size_t)tid * wsn);
  }
  free(ws);
  return AX_OK;
}

/* ---- forward ---- */

/* The online-softmax step of one tile: s (nq, nk) holds Q K^T of rows
 * [i0, i0 + nq) and keys [j0, j0 + nk). Turns s into the dropped-out
 * probabilities against the new running maxima m, updates the running
 * sums l, and writes each row's rescaling factor of acc to c. */
AXI_ATTN_CLONES static void fwd_softmax(const axi_attn_head *H, int i0, int nq,
                                        int j0, int nk, float *s, float *m,
                                        float *l, float *c) {
  const ax_attn_desc *d = H->d;
  for (int r = 0; r < nq; r++) {
    float *row = s + r * BK;
    int vis = axi_attn_visible(d, i0 + r, j0, nk);
    float mx = m[r], sum = 0.0f;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < vis; j++) {
      float x = d->scale * row[j];
      mx = x > mx ? x : mx;
    }
    /* Block 0 holds key 0, which every row sees: m is finite after it. */
    c[r] = vis > 0 ? axi_exp_nonpos(m[r] - mx) : 1.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < vis; j++) {
      float p = axi_exp_nonpos(d->scale * row[j] - mx);
      row[j] = p;
      sum += p;
    }
    for (int j = vis; j < nk; j++) /* keys after the row's position */
      row[j] = 0.0f;
    if (d->dropout > 0.0f) {
      const uint64_t seed = d->seed, c0 = axi_attn_row_ctr(H, i0 + r) + j0;
      const float p = d->dropout, ks = H->keep_scale;
#pragma omp simd
      for (int j = 0; j < nk; j++)
        row[j] *= axi_attn_keep(seed, c0 + j, p, ks);
    }
    l[r] = l[r] * c[r] + sum;
    m[r] = vis > 0 ? mx : m[r];
  }
}

/* Per-thread scratch of the forward, in floats. */
static size_t fwd_ws(int dh) {
  return BQ * BK + (size_t)dh * BK + BQ * dh + 3 * BQ;
}

static void fwd_block(const axi_attn_head *H, const float *q, const float *k,
                      const float *v, float *o, float *lse, int i0, float *ws) {
  const ax_attn_desc *d = H->d;
  int dh = d->dh, nq = axi_attn_min(BQ, d->sq - i0);
  float *s = ws, *kt = s + BQ * BK, *acc = kt + (size_t)dh * BK;
  float *m = acc + BQ * dh, *l = m + BQ, *c = l + BQ;
  const float *qb = q + H->qo + i0 * d->q_ss;
  for (int r = 0; r < nq; r++)
    m[r] = -INFINITY, l[r] = 0.0f;
  memset(acc, 0, sizeof(float) * BQ * (size_t)dh);
  int last = d->sk - d->sq + i0 + nq - 1; /* the block's last position */
  for (int j0 = 0; j0 <= last; j0 += BK) {
    int nk = axi_attn_min(BK, last + 1 - j0);
    axi_attn_transpose(nk, dh, k + H->ko + j0 * d->k_ss, d->k_ss, kt);
    axi_attn_tile_nn(nq, nk, dh, qb, d->q_ss, 1, kt, BK, 0.0f, s, BK);
    fwd_softmax(H, i0, nq, j0, nk, s, m, l, c);
    for (int r = 0; r < nq; r++)
#pragma omp simd
      for (int e = 0; e < dh; e++)
        acc[r * dh + e] *= c[r];
    axi_attn_tile_nn(nq, dh, nk, s, BK, 1, v + H->vo + j0 * d->v_ss, d->v_ss,
                     1.0f, acc, dh);
  }
  for (int r = 0; r < nq; r++) {
    float inv = 1.0f / l[r], *orow = o + H->oo + (i0 + r) * d->o_ss;
#pragma omp simd
    for (int e = 0; e < dh; e++)
      orow[e] = acc[r * dh + e] * inv;
    if (lse)
      lse[H->lo + i0 + r] = m[r] + logf(l[r]);
  }
}

/* Forward task: query block (nqb - 1 - t % nqb) of (b, h) = t / nqb, so the
 * heaviest blocks (the last ones, which see the most keys) go first. */
static void fwd_task(const axi_attn_job *J, long t, float *ws) {
  axi_attn_head H = axi_attn_head_of(J, t / J->nqb);
  int i0 = (J->nqb - 1 - (int)(t % J->nqb)) * BQ;
  fwd_block(&H, J->q, J->k, J->v, J->o_out, J->lse_out, i0, ws);
}

int axi_cpu_attn_causal_fwd(ax_backend *be, const ax_attn_desc *d,
                            const float *q, const float *k, const float *v,
                            float *o, float *lse) {
  (void)be;
  AX_TRY(ax_attn_desc_check(d, "attn_causal_fwd"));
  axi_attn_job J = {d, q, k, v, NULL, NULL, NULL, o, lse};
  J.nqb = (d->sq + BQ - 1) / BQ;
  return axi_attn_run(&J, (long)d->b * d->heads * J.nqb, fwd_ws(d->dh),
                      fwd_task);
}
