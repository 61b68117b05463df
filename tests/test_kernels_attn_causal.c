/* The CPU fused causal attention (attn_causal_fwd / attn_causal_bwd,
 * kernels/backend-impl.h) against an unfused double-precision reference
 * written here: the (sq, sk) score matrix, the causal mask, softmax,
 * dropout by the contract's counter, P V, and the textbook backward
 * (softmax gradient P (dP - rowsum(P dP))). Shapes cover sq < sk, lengths
 * that are not multiples of the kernel's 64-row blocks, head sizes that are
 * not multiples of 16, several sequences and heads, packed Q, K, V rows and
 * padded row strides, dropout 0 and 0.1. Also: finite differences of a
 * scalar loss through the kernel; results equal bit for bit on 1 and 4
 * threads (the backward then takes its two task layouts); a member holding
 * heads [2, 4) of 4 equal to those heads of the whole run; bad geometries
 * refused. Tolerance: 1e-5 relative to each tensor's largest value. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "harness.h"

static ax_backend *cpu(void) {
  ax_backend *be = NULL;
  AX_ASSERT_OK(ax_backend_get(AX_CPU, &be));
  return be;
}

/* One problem: the descriptor, inputs, the kernel's outputs and
 * gradients in the descriptor's layouts, and dense (b, h, s, e) copies of
 * the reference's. */
typedef struct prob {
  ax_attn_desc d;
  float *in, *grad, *out, *dout, *lse; /* whole buffers */
  size_t n_in, n_out;
  float *q, *k, *v, *o, *dq, *dk, *dv, *do_;
} prob;

static float *randn(uint64_t seed, size_t n) {
  ax_rng r;
  ax_rng_seed(&r, seed);
  float *p = malloc(sizeof(float) * (n + 1));
  assert_non_null(p);
  for (size_t i = 0; i < n; i++)
    p[i] = (float)ax_rng_normal(&r);
  return p;
}

/* packed: one (B, S, 3, heads, dh) buffer for Q, K, V (sq == sk) and one
 * for their gradients; else Q (B, sq) rows padded by 5 and K, V in one
 * (B, sk, 2, heads, dh) buffer; O and dO rows padded by 2. */
static prob make(int b, int heads, int sq, int sk, int dh, float p,
                 int packed) {
  prob P = {{b, heads, sq, sk, dh}};
  ax_attn_desc *d = &P.d;
  long w = (long)heads * dh;
  size_t nq = packed ? 0 : (size_t)b * sq * (w + 5);
  size_t nkv = (size_t)b * sk * (packed ? 3 : 2) * w;
  P.n_in = nq + nkv;
  P.in = randn(11, P.n_in);
  P.grad = malloc(sizeof(float) * P.n_in);
  float *kv = P.in + nq, *dkv = P.grad + nq;
  d->k_ss = d->v_ss = (packed ? 3 : 2) * w;
  d->k_sb = d->v_sb = sk * d->k_ss;
  d->q_ss = packed ? 3 * w : w + 5;
  d->q_sb = sq * d->q_ss;
  P.q = packed ? kv : P.in, P.dq = packed ? dkv : P.grad;
  P.k = kv + (packed ? w : 0), P.dk = dkv + (packed ? w : 0);
  P.v = P.k + w, P.dv = P.dk + w;
  d->o_ss = w + (packed ? 0 : 2);
  d->o_sb = sq * d->o_ss;
  P.n_out = (size_t)b * sq * d->o_ss;
  P.out = malloc(sizeof(float) * P.n_out);
  P.dout = randn(12, P.n_out);
  P.lse = malloc(sizeof(float) * ((size_t)b * heads * sq + 1));
  P.o = P.out, P.do_ = P.dout;
  d->scale = 1.0f / sqrtf((float)dh);
  d->dropout = p;
  d->seed = 0x5eedull;
  d->heads_total = heads;
  return P;
}

static void drop(prob *P) {
  free(P->in);
  free(P->grad);
  free(P->out);
  free(P->dout);
  free(P->lse);
}

static void run(ax_backend *be, prob *P) {
  AX_ASSERT_OK(
      AX_K(be, attn_causal_fwd, &P->d, P->q, P->k, P->v, P->o, P->lse));
  AX_ASSERT_OK(AX_K(be, attn_causal_bwd, &P->d, P->q, P->k, P->v, P->o, P->do_,
                    P->lse, P->dq, P->dk, P->dv));
}

/* Element e of head h of row s of sequence b of x (x_sb, x_ss). */
#define AT(x, sb, ss, b, s, h, e) (x)[(b) * (sb) + (s) * (ss) + (h)*dh + (e)]

/* The dense reference (b, h, s, e) layouts, doubles. */
typedef struct ref {
  double *o, *lse, *dq, *dk, *dv;
} ref;

/* The unfused forward and backward of one (b, h) into R. */
static void ref_head(const prob *P, int b, int h, ref *R) {
  const ax_attn_desc *d = &P->d;
  int sq = d->sq, sk = d->sk, dh = d->dh;
  size_t bh = (size_t)b * d->heads + h;
  double *s = calloc((size_t)sq * sk, 8), *pd = calloc((size_t)sq * sk, 8);
  double *f = calloc((size_t)sq * sk, 8), *dp = calloc((size_t)sq * sk, 8);
  for (int i = 0; i < sq; i++) {
    int pos = sk - sq + i;
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j <= pos; j++) {
      double dot = 0;
      for (int e = 0; e < dh; e++)
        dot += (double)AT(P->q, d->q_sb, d->q_ss, b, i, h, e) *
               AT(P->k, d->k_sb, d->k_ss, b, j, h, e);
      s[i * sk + j] = d->scale * dot;
      mx = fmax(mx, s[i * sk + j]);
    }
    for (int j = 0; j <= pos; j++)
      sum += exp(s[i * sk + j] - mx);
    R->lse[bh * sq + i] = mx + log(sum);
    uint64_t row = ((uint64_t)(b * d->heads_total + d->head0 + h) * sk + pos) *
                   (uint64_t)sk;
    for (int j = 0; j <= pos; j++) {
      s[i * sk + j] = exp(s[i * sk + j] - mx) / sum; /* now P */
      f[i * sk + j] = ax_dropout_uniform(d->seed, row + j) >= d->dropout
                          ? 1.0 / (1.0 - d->dropout)
                          : 0.0;
      pd[i * sk + j] = s[i * sk + j] * f[i * sk + j];
    }
  }
  for (int i = 0; i < sq; i++)
    for (int e = 0; e < dh; e++) {
      double acc = 0;
      for (int j = 0; j < sk; j++)
        acc += pd[i * sk + j] * AT(P->v, d->v_sb, d->v_ss, b, j, h, e);
      R->o[(bh * sq + i) * dh + e] = acc;
    }
  /* dP = f (dO V^T); dS = scale P (dP - rowsum(P dP)). */
  for (int i = 0; i < sq; i++) {
    double dot = 0;
    for (int j = 0; j < sk; j++) {
      double g = 0;
      for (int e = 0; e < dh; e++)
        g += (double)AT(P->do_, d->o_sb, d->o_ss, b, i, h, e) *
             AT(P->v, d->v_sb, d->v_ss, b, j, h, e);
      dp[i * sk + j] = f[i * sk + j] * g;
      dot += s[i * sk + j] * dp[i * sk + j];
    }
    for (int j = 0; j < sk; j++)
      dp[i * sk + j] = d->scale * s[i * sk + j] * (dp[i * sk + j] - dot);
  }
  for (int e = 0; e < dh; e++) {
    for (int i = 0; i < sq; i++) {
      double g = 0;
      for (int j = 0; j < sk; j++)
        g += dp[i * sk + j] * AT(P->k, d->k_sb, d->k_ss, b, j, h, e);
      R->dq[(bh * sq + i) * dh + e] = g;
    }
    for (int j = 0; j < sk; j++) {
      double gk = 0, gv = 0;
      for (int i = 0; i < sq; i++) {
        gk += dp[i * sk + j] * AT(P->q, d->q_sb, d->q_ss, b, i, h, e);
        gv += pd[i * sk + j] * AT(P->do_, d->o_sb, d->o_ss, b, i, h, e);
      }
      R->dk[(bh * sk + j) * dh + e] = gk;
      R->dv[(bh * sk + j) * dh + e] = gv;
    }
  }
  free(s), free(pd), free(f), free(dp);
}

/* got (read through sb, ss) against the dense reference, 1e-5 relative to
 * the reference's largest magnitude, or to 1e-2 when that is smaller: a
 * gradient that is 0 (one key: dS = P (dP - D) with P = 1 and dP = D) is
 * a difference of O(1) terms, exact only up to their rounding. */
static void expect_near(const char *what, const prob *P, const float *got,
                        long sb, long ss, int rows, const double *want) {
  const ax_attn_desc *d = &P->d;
  int dh = d->dh;
  size_t n = (size_t)d->b * d->heads * rows * dh;
  double mx = 1e-2;
  for (size_t i = 0; i < n; i++)
    mx = fmax(mx, fabs(want[i]));
  for (int b = 0; b < d->b; b++)
    for (int h = 0; h < d->heads; h++)
      for (int s = 0; s < rows; s++)
        for (int e = 0; e < dh; e++) {
          double w = want[(((size_t)b * d->heads + h) * rows + s) * dh + e];
          float g = AT(got, sb, ss, b, s, h, e);
          if (!(fabs(g - w) <= 1e-5 * mx + 1e-5 * fabs(w)))
            fail_msg("%s[b %d, h %d, row %d, %d] = %.9g, reference %.9g "
                     "(sq %d, sk %d, dh %d, p %g)",
                     what, b, h, s, e, (double)g, w, d->sq, d->sk, dh,
                     (double)d->dropout);
        }
}

static void check_case(int b, int heads, int sq, int sk, int dh, float p,
                       int packed) {
  prob P = make(b, heads, sq, sk, dh, p, packed);
  const ax_attn_desc *d = &P.d;
  /* Sentinels in the padding of O's rows, which the kernel must keep. */
  for (size_t i = 0; i < P.n_out; i++)
    P.out[i] = 7.0f;
  run(cpu(), &P);
  size_t nbh = (size_t)b * heads;
  ref R = {calloc(nbh * sq * dh, 8), calloc(nbh * sq, 8),
           calloc(nbh * sq * dh, 8), calloc(nbh * sk * dh, 8),
           calloc(nbh * sk * dh, 8)};
  for (int bb = 0; bb < b; bb++)
    for (int h = 0; h < heads; h++)
      ref_head(&P, bb, h, &R);
  expect_near("o", &P, P.o, d->o_sb, d->o_ss, sq, R.o);
  for (size_t i = 0; i < nbh * sq; i++)
    AX_ASSERT_CLOSE(P.lse[i], R.lse[i], 1e-5, 1e-5);
  for (size_t r = 0; r < (size_t)b * sq; r++)
    for (long e = (long)heads * dh; e < d->o_ss; e++)
      assert_true(P.out[r * d->o_ss + e] == 7.0f);
  expect_near("dq", &P, P.dq, d->q_sb, d->q_ss, sq, R.dq);
  expect_near("dk", &P, P.dk, d->k_sb, d->k_ss, sk, R.dk);
  expect_near("dv", &P, P.dv, d->v_sb, d->v_ss, sk, R.dv);
  free(R.o), free(R.lse), free(R.dq), free(R.dk), free(R.dv);
  drop(&P);
}

static void against_reference(void **state) {
  for (int drop_on = 0; drop_on < 2; drop_on++) {
    float p = drop_on ? 0.1f : 0.0f;
    check_case(2, 3, 77, 77, 24, p, 1);   /* S, dh off the block sizes */
    check_case(2, 2, 128, 128, 64, p, 1); /* two whole blocks */
    check_case(1, 2, 50, 130, 64, p, 0);  /* sq < sk, padded rows */
    check_case(2, 1, 70, 200, 20, p, 0);  /* queries across a block edge */
    check_case(1, 2, 1, 70, 16, p, 0);    /* one query (decoding) */
    check_case(1, 1, 1, 1, 5, p, 1);      /* a single position */
  }
}

/* loss = sum(o * R) through the kernel; the kernel's dq, dk, dv (with
 * do_ = R) against central differences on a few coordinates. */
static double loss_of(prob *P) {
  AX_ASSERT_OK(
      AX_K(cpu(), attn_causal_fwd, &P->d, P->q, P->k, P->v, P->o, NULL));
  double l = 0;
  for (size_t i = 0; i < P->n_out; i++)
    l += (double)P->o[i] * P->dout[i];
  return l;
}

static void finite_differences(void **state) {
  for (int drop_on = 0; drop_on < 2; drop_on++) {
    prob P = make(2, 2, 20, 20, 8, drop_on ? 0.1f : 0.0f, 1);
    run(cpu(), &P);
    float *grads = malloc(sizeof(float) * P.n_in);
    memcpy(grads, P.grad, sizeof(float) * P.n_in);
    ax_rng r;
    ax_rng_seed(&r, 5);
    const float eps = 1e-2f;
    /* Coordinates of the packed buffer: q, k and v alike. */
    for (int t = 0; t < 36; t++) {
      size_t i = (size_t)(ax_rng_uniform(&r) * (double)P.n_in);
      float keep = P.in[i];
      P.in[i] = keep + eps;
      double lp = loss_of(&P);
      P.in[i] = keep - eps;
      double lm = loss_of(&P);
      P.in[i] = keep;
      AX_ASSERT_CLOSE(grads[i], (lp - lm) / (2 * eps), 2e-3, 1e-2);
    }
    free(grads);
    drop(&P);
  }
}

/* The same bits on 1 thread (the backward's per-head tasks) and on 4
 * (3 heads: its per-block tasks). */
static void thread_count_independent(void **state) {
  int before = ax_cpu_threads();
  prob A = make(1, 3, 150, 150, 32, 0.1f, 1),
       B = make(1, 3, 150, 150, 32, 0.1f, 1);
  ax_cpu_set_threads(1);
  run(cpu(), &A);
  ax_cpu_set_threads(4);
  run(cpu(), &B);
  ax_cpu_set_threads(before);
  assert_memory_equal(A.out, B.out, sizeof(float) * A.n_out);
  assert_memory_equal(A.lse, B.lse, sizeof(float) * 3 * 150);
  assert_memory_equal(A.grad, B.grad, sizeof(float) * A.n_in);
  drop(&A);
  drop(&B);
}

/* A tensor-parallel member with heads [2, 4) of 4 (head0 = 2,
 * heads_total = 4), reading the whole run's Q, K, V at its heads and
 * writing its own O, gives the whole run's values of those heads, dropout
 * on. */
static void member_heads(void **state) {
  prob W = make(2, 4, 90, 90, 16, 0.1f, 1);
  run(cpu(), &W);
  int dh = 16;
  ax_attn_desc m = W.d;
  m.heads = 2, m.head0 = 2, m.heads_total = 4;
  m.o_ss = 2 * dh, m.o_sb = 90 * m.o_ss;
  size_t no = (size_t)2 * 90 * 2 * dh;
  float *o = malloc(no * 4), *dout = malloc(no * 4), *lse = malloc(360 * 4);
  float *grad = calloc(W.n_in, 4);
  for (int b = 0; b < 2; b++)
    for (int s = 0; s < 90; s++)
      for (int e = 0; e < 2 * dh; e++)
        dout[(b * 90 + s) * 2 * dh + e] =
            W.dout[b * W.d.o_sb + s * W.d.o_ss + 2 * dh + e];
  const float *q = W.q + 2 * dh, *k = W.k + 2 * dh, *v = W.v + 2 * dh;
  long gofs = W.dq - W.grad + 2 * dh;
  AX_ASSERT_OK(AX_K(cpu(), attn_causal_fwd, &m, q, k, v, o, lse));
  AX_ASSERT_OK(AX_K(cpu(), attn_causal_bwd, &m, q, k, v, o, dout, lse,
                    grad + gofs, grad + gofs + 4 * dh, grad + gofs + 8 * dh));
  for (int b = 0; b < 2; b++)
    for (int s = 0; s < 90; s++) {
      assert_memory_equal(o + (b * 90 + s) * 2 * dh,
                          W.o + b * W.d.o_sb + s * W.d.o_ss + 2 * dh,
                          2 * dh * 4);
      for (int x = 0; x < 3; x++) { /* dq, dk, dv of heads 2 and 3 */
        size_t at = (size_t)gofs + b * W.d.q_sb + s * W.d.q_ss + x * 4 * dh;
        assert_memory_equal(grad + at, W.grad + at, 2 * dh * 4);
      }
      for (int h = 0; h < 2; h++)
        assert_true(lse[(b * 2 + h) * 90 + s] ==
                    W.lse[(b * 4 + 2 + h) * 90 + s]);
    }
  free(o), free(dout), free(lse), free(grad);
  drop(&W);
}

static void bad_geometry(void **state) {
  prob P = make(1, 1, 4, 4, 8, 0.0f, 1);
  ax_backend *be = cpu();
  ax_attn_desc d = P.d;
  d.sq = 5; /* more queries than keys */
  AX_ASSERT_ERR(AX_K(be, attn_causal_fwd, &d, P.q, P.k, P.v, P.o, P.lse),
                AX_EINVAL);
  d = P.d;
  d.dropout = 1.0f;
  AX_ASSERT_ERR(AX_K(be, attn_causal_fwd, &d, P.q, P.k, P.v, P.o, P.lse),
                AX_EINVAL);
  d = P.d;
  d.head0 = 1; /* heads [1, 2) of a layer of 1 */
  AX_ASSERT_ERR(AX_K(be, attn_causal_bwd, &d, P.q, P.k, P.v, P.o, P.do_, P.lse,
                     P.dq, P.dk, P.dv),
                AX_EINVAL);
  drop(&P);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(against_reference),
      cmocka_unit_test(finite_differences),
      cmocka_unit_test(thread_count_independent),
      cmocka_unit_test(member_heads),
      cmocka_unit_test(bad_geometry),
  };
  return AX_TEST_MAIN(t);
}
