/* The CUDA fused causal attention (attn_causal_fwd / attn_causal_bwd,
 * kernels/cuda/cuda_attn.cu) against the CPU kernel on the same inputs.
 * Shapes: sq < sk (queries at the last positions), odd lengths off the
 * 64-row blocks, head sizes 32, 64, 128 and ones the kernels pad (48, 80),
 * packed Q, K, V rows (one buffer, the gradients in one buffer too) and
 * padded strides, dropout 0, 0.1 and 0.3, a tensor-parallel member's heads
 * (head0 > 0), sq == 0. The backward of both backends runs on the CPU's o
 * and lse, so it is compared alone. Gradient buffers start filled with a
 * sentinel and are compared whole: padding and other columns untouched,
 * a packed buffer entirely written. Repeated GPU calls give the same bits
 * (no atomics). Skipped (exit 77) without a GPU.
 *
 * Tolerances (|gpu - cpu| <= atol + rtol * |cpu|): fp32 on both sides with
 * different summation orders and exponentials (CUDA's expf, the CPU's
 * polynomial, each within 2 ulp): o 1e-5 + 1e-4 rel, lse 1e-5 + 1e-5 rel
 * (a log of a sum near sk, plus the maximum); dq, dk, dv sum up to sk
 * (or sq) such terms each: 5e-5 + 5e-4 rel. Dropout masks are identical by
 * contract; a differing mask changes values by O(1) and fails. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "cuda_testutil.h"
#include "harness.h"

#define SENTINEL 7.25f

typedef struct attn_case {
  int b, heads, sq, sk, dh, packed;
  float p;
  int head0, heads_total; /* 0, 0: the whole layer */
} attn_case;

/* Layouts: packed, one (b, sk, 3, heads, dh) buffer for Q, K, V (sq ==
 * sk); else Q rows padded by 3 floats, K padded by 1 and V unpadded in
 * their own buffers. O rows are padded by 2. Offsets of q, k, v in `in`. */
typedef struct layout {
  ax_attn_desc d;
  size_t n_in, n_o, n_lse, qo, ko, vo;
} layout;

static layout make_layout(attn_case c) {
  layout L;
  memset(&L, 0, sizeof L);
  ax_attn_desc *d = &L.d;
  long w = (long)c.heads * c.dh;
  d->b = c.b, d->heads = c.heads, d->sq = c.sq, d->sk = c.sk, d->dh = c.dh;
  d->scale = 1.0f / sqrtf((float)c.dh);
  d->dropout = c.p;
  d->seed = 0x5eed1234ull;
  d->head0 = c.head0;
  d->heads_total = c.heads_total ? c.heads_total : c.heads;
  if (c.packed) {
    d->q_ss = d->k_ss = d->v_ss = 3 * w;
    d->q_sb = d->k_sb = d->v_sb = (long)c.sk * 3 * w;
    L.qo = 0, L.ko = (size_t)w, L.vo = 2 * (size_t)w;
    L.n_in = (size_t)c.b * d->q_sb;
  } else {
    d->q_ss = w + 3, d->q_sb = (long)c.sq * d->q_ss;
    d->k_ss = w + 1, d->k_sb = (long)c.sk * d->k_ss;
    d->v_ss = w, d->v_sb = (long)c.sk * w;
    L.qo = 0, L.ko = (size_t)c.b * d->q_sb;
    L.vo = L.ko + (size_t)c.b * d->k_sb;
    L.n_in = L.vo + (size_t)c.b * d->v_sb;
  }
  d->o_ss = w + 2, d->o_sb = (long)c.sq * d->o_ss;
  L.n_o = (size_t)c.b * d->o_sb;
  L.n_lse = (size_t)c.b * c.heads * c.sq;
  return L;
}

static float *filled(size_t n, float v) {
  float *x = malloc(sizeof(float) * (n + 1));
  assert_non_null(x);
  for (size_t i = 0; i < n; i++)
    x[i] = v;
  return x;
}

static void attn_case_run(attn_case c) {
  layout L = make_layout(c);
  const ax_attn_desc *d = &L.d;
  char what[160], w_o[180], w_lse[180], w_grad[180];
  snprintf(what, sizeof what,
           "attn b %d heads %d (from %d of %d) sq %d sk %d dh %d packed %d "
           "p %g",
           c.b, c.heads, d->head0, d->heads_total, c.sq, c.sk, c.dh, c.packed,
           (double)c.p);
  snprintf(w_o, sizeof w_o, "%s: o", what);
  snprintf(w_lse, sizeof w_lse, "%s: lse", what);
  snprintf(w_grad, sizeof w_grad, "%s: dq, dk, dv", what);
  float *in = ct_randn(31, L.n_in, 1.0f), *dout = ct_randn(32, L.n_o, 1.0f);
  float *o = filled(L.n_o, SENTINEL), *lse = filled(L.n_lse, SENTINEL);
  float *grad = filled(L.n_in, SENTINEL);
  float *gin = ct_up(in, L.n_in * 4), *gdout = ct_up(dout, L.n_o * 4);
  float *go = ct_up(o, L.n_o * 4), *glse = ct_up(lse, L.n_lse * 4);
  float *ggrad = ct_up(grad, L.n_in * 4), *ggrad2 = ct_up(grad, L.n_in * 4);

  /* forward */
  AX_ASSERT_OK(AX_K(ct_cpu(), attn_causal_fwd, d, in + L.qo, in + L.ko,
                    in + L.vo, o, lse));
  AX_ASSERT_OK(AX_K(ct_gpu(), attn_causal_fwd, d, gin + L.qo, gin + L.ko,
                    gin + L.vo, go, glse));
  ct_check(w_o, go, o, L.n_o, 1e-5, 1e-4);
  ct_check(w_lse, glse, lse, L.n_lse, 1e-5, 1e-5);
  float *h1 = malloc(L.n_o * 4 + 4), *h2 = malloc(L.n_in * 4 + 4);
  ct_down(h1, go, L.n_o * 4);
  AX_ASSERT_OK(AX_K(ct_gpu(), attn_causal_fwd, d, gin + L.qo, gin + L.ko,
                    gin + L.vo, go, NULL)); /* lse NULL: inference */
  ct_check_exact("attn o (repeat, no lse)", go, h1, L.n_o * 4);

  /* backward on the CPU's o and lse */
  float *co = ct_up(o, L.n_o * 4), *clse = ct_up(lse, L.n_lse * 4);
  AX_ASSERT_OK(AX_K(ct_cpu(), attn_causal_bwd, d, in + L.qo, in + L.ko,
                    in + L.vo, o, dout, lse, grad + L.qo, grad + L.ko,
                    grad + L.vo));
  AX_ASSERT_OK(AX_K(ct_gpu(), attn_causal_bwd, d, gin + L.qo, gin + L.ko,
                    gin + L.vo, co, gdout, clse, ggrad + L.qo, ggrad + L.ko,
                    ggrad + L.vo));
  ct_check(w_grad, ggrad, grad, L.n_in, 5e-5, 5e-4);
  ct_down(h2, ggrad, L.n_in * 4);
  if (c.packed)
    for (size_t i = 0; i < L.n_in; i++)
      if (h2[i] == SENTINEL)
        fail_msg("%s: packed gradient element %zu not written", what, i);
  AX_ASSERT_OK(AX_K(ct_gpu(), attn_causal_bwd, d, gin + L.qo, gin + L.ko,
                    gin + L.vo, co, gdout, clse, ggrad2 + L.qo, ggrad2 + L.ko,
                    ggrad2 + L.vo));
  ct_check_exact("attn gradients (repeat)", ggrad2, h2, L.n_in * 4);

  ct_free(gin), ct_free(gdout), ct_free(go), ct_free(glse), ct_free(ggrad);
  ct_free(ggrad2), ct_free(co), ct_free(clse);
  free(in), free(dout), free(o), free(lse), free(grad), free(h1), free(h2);
}

static void attn_matches_cpu(void **state) {
  const attn_case cases[] = {
      {2, 3, 70, 70, 64, 1, 0.0f},       /* packed, two query blocks */
      {1, 2, 33, 130, 32, 0, 0.1f},      /* sq < sk, dropout */
      {2, 1, 129, 129, 32, 1, 0.2f},     /* odd length, packed, dropout */
      {1, 2, 5, 200, 64, 0, 0.0f},       /* a few queries over a long cache */
      {1, 1, 65, 65, 48, 0, 0.1f},       /* dh padded to 64 */
      {1, 1, 150, 200, 128, 0, 0.1f},    /* dh 128: 32-row tiles */
      {1, 2, 37, 37, 80, 1, 0.0f},       /* dh padded to 128 */
      {2, 2, 64, 96, 64, 0, 0.3f, 2, 5}, /* heads [2, 4) of 5 */
      {4, 12, 256, 256, 64, 1, 0.1f},    /* a BERT-base-sized layer */
      {1, 1, 1, 1, 32, 0, 0.0f},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    attn_case_run(cases[i]);
}

/* No queries: nothing to write forward; dK and dV are zeros. */
static void attn_empty_queries(void **state) {
  attn_case c = {1, 2, 0, 20, 32, 0, 0.0f};
  layout L = make_layout(c);
  float *in = ct_randn(41, L.n_in, 1.0f), *grad = filled(L.n_in, SENTINEL);
  float *gin = ct_up(in, L.n_in * 4), *ggrad = ct_up(grad, L.n_in * 4);
  float *g1 = ct_up(NULL, 4);
  AX_ASSERT_OK(AX_K(ct_gpu(), attn_causal_fwd, &L.d, gin + L.qo, gin + L.ko,
                    gin + L.vo, g1, g1));
  AX_ASSERT_OK(AX_K(ct_cpu(), attn_causal_bwd, &L.d, in + L.qo, in + L.ko,
                    in + L.vo, in, in, in, grad + L.qo, grad + L.ko,
                    grad + L.vo));
  AX_ASSERT_OK(AX_K(ct_gpu(), attn_causal_bwd, &L.d, gin + L.qo, gin + L.ko,
                    gin + L.vo, g1, g1, g1, ggrad + L.qo, ggrad + L.ko,
                    ggrad + L.vo));
  ct_check_exact("attn gradients, sq 0", ggrad, grad, L.n_in * 4);
  ct_free(gin), ct_free(ggrad), ct_free(g1);
  free(in), free(grad);
}

/* Bad geometries are AX_EINVAL (the CPU's check), dh above 256
 * AX_EUNSUPPORTED. */
static void attn_refuses(void **state) {
  attn_case c = {1, 1, 8, 8, 32, 0, 0.0f};
  layout L = make_layout(c);
  float *g = ct_up(NULL, 64);
  L.d.sq = 9; /* sq > sk */
  AX_ASSERT_ERR(AX_K(ct_gpu(), attn_causal_fwd, &L.d, g, g, g, g, g),
                AX_EINVAL);
  L.d.sq = 8, L.d.dropout = 1.0f;
  AX_ASSERT_ERR(
      AX_K(ct_gpu(), attn_causal_bwd, &L.d, g, g, g, g, g, g, g, g, g),
      AX_EINVAL);
  L.d.dropout = 0.0f, L.d.dh = 300;
  AX_ASSERT_ERR(AX_K(ct_gpu(), attn_causal_fwd, &L.d, g, g, g, g, g),
                AX_EUNSUPPORTED);
  assert_non_null(strstr(ax_errmsg(), "dh <= 256"));
  ct_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(attn_matches_cpu),
      cmocka_unit_test(attn_empty_queries),
      cmocka_unit_test(attn_refuses),
  };
  return AX_CUDA_TEST_MAIN(tests);
}
