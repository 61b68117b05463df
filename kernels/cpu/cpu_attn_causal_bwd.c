/* The backward of the CPU fused causal attention (the algorithm:
 * cpu_attn_causal.c): FlashAttention-2's, recomputing each tile's
 * probabilities from lse, with the forward's dropout mask. */
#include <string.h>

#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/cpu/cpu_attn_causal-impl.h"
#include "axon/kernels/error.h"

#define BQ AXI_ATTN_BQ
#define BK AXI_ATTN_BK

/* Per-thread scratch of the backward: the tiles P, dS and f P (BQ, BK),
 * K^T and V^T of the key block (dh, BK), its dK and dV (BK, dh), D (BQ). */
typedef struct bwd_ws {
  float *p, *ds, *fp, *kt, *vt, *dk, *dv, *dd;
} bwd_ws;

static size_t bwd_ws_floats(int dh) {
  return 3 * BQ * BK + 4 * (size_t)dh * BK + BQ;
}

static bwd_ws bwd_ws_at(float *ws, int dh) {
  bwd_ws w = {ws};
  w.ds = w.p + BQ * BK;
  w.fp = w.ds + BQ * BK;
  w.kt = w.fp + BQ * BK;
  w.vt = w.kt + (size_t)dh * BK;
  w.dk = w.vt + (size_t)dh * BK;
  w.dv = w.dk + (size_t)dh * BK;
  w.dd = w.dv + (size_t)dh * BK;
  return w;
}

/* The elementwise part of a pair: on entry p holds Q K^T and ds holds
 * dO V^T of rows [i0, i0 + nq) and keys [j0, j0 + nk); on exit p holds P,
 * fp the dropped-out f P (when dropout is on) and ds the score gradient
 * scale * P * (f dPd - D). lse and dd are the rows' log-sum-exp and D. */
AXI_ATTN_CLONES static void bwd_scores(const axi_attn_head *H, int i0, int nq,
                                       int j0, int nk, const float *lse,
                                       const float *dd, float *p, float *ds,
                                       float *fp) {
  const ax_attn_desc *d = H->d;
  const float sc = d->scale;
  for (int r = 0; r < nq; r++) {
    float *pr = p + r * BK, *dr = ds + r * BK, *fr = fp + r * BK;
    const float L = lse[r], D = dd[r];
    int vis = axi_attn_visible(d, i0 + r, j0, nk);
#pragma omp simd
    for (int j = 0; j < vis; j++)
      pr[j] = axi_exp_nonpos(sc * pr[j] - L);
    for (int j = vis; j < nk; j++) /* keys after the row's position */
      pr[j] = 0.0f;
    if (d->dropout > 0.0f) {
      const uint64_t seed = d->seed, c0 = axi_attn_row_ctr(H, i0 + r) + j0;
      const float p = d->dropout, ks = H->keep_scale;
#pragma omp simd
      for (int j = 0; j < nk; j++) {
        float f = axi_attn_keep(seed, c0 + j, p, ks);
        dr[j] = sc * pr[j] * (f * dr[j] - D);
        fr[j] = f * pr[j];
      }
    } else {
#pragma omp simd
      for (int j = 0; j < nk; j++)
        dr[j] = sc * pr[j] * (dr[j] - D);
    }
  }
}

/* Whether query block i0 has a row that sees key block j0. */
static int pair_live(const ax_attn_desc *d, int i0, int j0) {
  int nq = axi_attn_min(BQ, d->sq - i0);
  return j0 <= d->sk - d->sq + i0 + nq - 1;
}

/* Loads key block j0 (nk keys) of a head: its K^T and V^T. */
static void load_keys(const axi_attn_job *J, const axi_attn_head *H, int j0,
                      int nk, const bwd_ws *w) {
  const ax_attn_desc *d = J->d;
  axi_attn_transpose(nk, d->dh, J->k + H->ko + j0 * d->k_ss, d->k_ss, w->kt);
  axi_attn_transpose(nk, d->dh, J->v + H->vo + j0 * d->v_ss, d->v_ss, w->vt);
}

/* One pair (query block i0, key block j0 of width nk, loaded in w): adds
 * its share to the key block's dK and dV in w when kv, and to the query
 * block's rows of dq when dq. */
static void bwd_pair(const axi_attn_job *J, const axi_attn_head *H, int i0,
                     int j0, int nk, const bwd_ws *w, int kv, int dq) {
  const ax_attn_desc *d = J->d;
  int dh = d->dh, nq = axi_attn_min(BQ, d->sq - i0);
  const float *qb = J->q + H->qo + i0 * d->q_ss;
  const float *ob = J->o + H->oo + i0 * d->o_ss;
  const float *gb = J->do_ + H->oo + i0 * d->o_ss;
  for (int r = 0; r < nq; r++) { /* D_i = rowsum(dO_i * O_i) */
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int e = 0; e < dh; e++)
      s += gb[r * d->o_ss + e] * ob[r * d->o_ss + e];
    w->dd[r] = s;
  }
  axi_attn_tile_nn(nq, nk, dh, qb, d->q_ss, 1, w->kt, BK, 0.0f, w->p, BK);
  axi_attn_tile_nn(nq, nk, dh, gb, d->o_ss, 1, w->vt, BK, 0.0f, w->ds, BK);
  bwd_scores(H, i0, nq, j0, nk, J->lse + H->lo + i0, w->dd, w->p, w->ds, w->fp);
  if (kv) { /* dV += (f P)^T dO, dK += dS^T Q */
    const float *fp = d->dropout > 0.0f ? w->fp : w->p;
    axi_attn_tile_nn(nk, dh, nq, fp, 1, BK, gb, d->o_ss, 1.0f, w->dv, dh);
    axi_attn_tile_nn(nk, dh, nq, w->ds, 1, BK, qb, d->q_ss, 1.0f, w->dk, dh);
  }
  if (dq) /* dQ += dS K */
    axi_attn_tile_nn(nq, dh, nk, w->ds, BK, 1, J->k + H->ko + j0 * d->k_ss,
                     d->k_ss, 1.0f, J->dq + H->qo + i0 * d->q_ss, d->q_ss);
}

/* Zeroes n rows of dh floats at stride ss. */
static void zero_rows(float *x, int n, int dh, long ss) {
  for (int r = 0; r < n; r++)
    memset(x + r * ss, 0, sizeof(float) * (size_t)dh);
}

/* Stores the key block's dK and dV from w into dk and dv. */
static void store_keys(const axi_attn_job *J, const axi_attn_head *H, int j0,
                       int nk, const bwd_ws *w) {
  const ax_attn_desc *d = J->d;
  size_t row = sizeof(float) * (size_t)d->dh;
  for (int r = 0; r < nk; r++) {
    memcpy(J->dk + H->ko + (j0 + r) * d->k_ss, w->dk + r * d->dh, row);
    memcpy(J->dv + H->vo + (j0 + r) * d->v_ss, w->dv + r * d->dh, row);
  }
}

/* dK and dV of key block j0 of a head (and its share of dQ when dq). */
static void bwd_key_block(const axi_attn_job *J, const axi_attn_head *H, int j0,
                          const bwd_ws *w, int dq) {
  const ax_attn_desc *d = J->d;
  int nk = axi_attn_min(BK, d->sk - j0);
  load_keys(J, H, j0, nk, w);
  memset(w->dk, 0, sizeof(float) * (size_t)d->dh * BK);
  memset(w->dv, 0, sizeof(float) * (size_t)d->dh * BK);
  for (int i0 = 0; i0 < d->sq; i0 += BQ)
    if (pair_live(d, i0, j0))
      bwd_pair(J, H, i0, j0, nk, w, 1, dq);
  store_keys(J, H, j0, nk, w);
}

/* Backward task of a whole head t: every key block in order, dQ summed in
 * place. */
static void bwd_head_task(const axi_attn_job *J, long t, float *ws) {
  const ax_attn_desc *d = J->d;
  axi_attn_head H = axi_attn_head_of(J, t);
  bwd_ws w = bwd_ws_at(ws, d->dh);
  zero_rows(J->dq + H.qo, d->sq, d->dh, d->q_ss);
  for (int j0 = 0; j0 < d->sk; j0 += BK)
    bwd_key_block(J, &H, j0, &w, 1);
}

/* Backward task t of the blocked walk: t < b heads nkb is key block
 * (t % nkb) of head t / nkb (dK, dV); the rest are query blocks (dQ),
 * walking the key blocks in the order bwd_head_task does. */
static void bwd_block_task(const axi_attn_job *J, long t, float *ws) {
  const ax_attn_desc *d = J->d;
  bwd_ws w = bwd_ws_at(ws, d->dh);
  long nkt = (long)d->b * d->heads * J->nkb;
  if (t < nkt) {
    axi_attn_head H = axi_attn_head_of(J, t / J->nkb);
    bwd_key_block(J, &H, (int)(t % J->nkb) * BK, &w, 0);
    return;
  }
  t -= nkt;
  axi_attn_head H = axi_attn_head_of(J, t / J->nqb);
  int i0 = (int)(t % J->nqb) * BQ;
  zero_rows(J->dq + H.qo + i0 * d->q_ss, axi_attn_min(BQ, d->sq - i0), d->dh,
            d->q_ss);
  for (int j0 = 0; j0 < d->sk && pair_live(d, i0, j0); j0 += BK) {
    int nk = axi_attn_min(BK, d->sk - j0);
    load_keys(J, &H, j0, nk, &w);
    bwd_pair(J, &H, i0, j0, nk, &w, 0, 1);
  }
}

int axi_cpu_attn_causal_bwd(ax_backend *be, const ax_attn_desc *d,
                            const float *q, const float *k, const float *v,
                            const float *o, const float *do_, const float *lse,
                            float *dq, float *dk, float *dv) {
  (void)be;
  AX_TRY(ax_attn_desc_check(d, "attn_causal_bwd"));
  axi_attn_job J = {d, q, k, v, o, lse, do_, NULL, NULL, dq, dk, dv};
  J.nqb = (d->sq + BQ - 1) / BQ;
  J.nkb = (d->sk + BK - 1) / BK;
  long heads = (long)d->b * d->heads;
  if (heads >= 2L * ax_cpu_threads())
    return axi_attn_run(&J, heads, bwd_ws_floats(d->dh), bwd_head_task);
  return axi_attn_run(&J, heads * (J.nkb + J.nqb), bwd_ws_floats(d->dh),
                      bwd_block_task);
}
