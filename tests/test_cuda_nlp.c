/* The CUDA transformer kernels (layer norm, softmax cross-entropy, masked
 * softmax, permutation, embedding) against the CPU backend, called through
 * both vtables on the same inputs. Skipped (exit 77) without a GPU.
 *
 * Tolerances, per op (|gpu - cpu| <= atol + rtol * |cpu|):
 *  - layer norm: mean / rstd 1e-6 rel (double sums on both sides, one
 *    rounding to float), y and dx 1e-5 (the same float expressions from
 *    those statistics, no FMA contraction), dgamma / dbeta 1e-4 abs + 1e-5
 *    rel (double sums over rows in another grouping, then to float).
 *  - cross-entropy: probs 1e-6 abs + 1e-5 rel (expf of the two libraries
 *    may differ by an ulp or two; sums in double), the loss sum 1e-5 rel,
 *    the count and the correct count exactly (on integer logits, whose
 *    ties give bit-equal probabilities on both sides, too); dlogits 1e-7
 *    abs + 1e-5 rel.
 *  - masked softmax and its backward: 1e-6 abs + 1e-5 rel (as probs);
 *    padded keys exactly 0.
 *  - permutation and embedding: exactly (copies; the embedding gradient
 *    does the CPU's additions in the CPU's order, by design). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "cuda_testutil.h"
#include "harness.h"

/* ---- layer norm ---- */

static void layernorm_case(int rows, int d) {
  size_t n = (size_t)rows * d;
  float *x = ct_randn(1, n, 2.0f), *g = ct_randn(2, d, 1.0f),
        *b = ct_randn(3, d, 1.0f);
  float *dy = ct_randn(4, n, 1.0f), *y = malloc(n * 4), *dx = malloc(n * 4);
  float *mean = malloc(rows * 4 + 4), *rstd = malloc(rows * 4 + 4);
  float *dg = malloc(d * 4), *db = malloc(d * 4);
  const float eps = 1e-5f;
  for (int j = 0; j < d; j++)
    dg[j] = db[j] = 1.0f; /* parameter gradients accumulate */
  float *gx = ct_up(x, n * 4), *gg = ct_up(g, d * 4), *gb = ct_up(b, d * 4),
        *gdy = ct_up(dy, n * 4), *gy = ct_up(NULL, n * 4),
        *gdx = ct_up(NULL, n * 4), *gm = ct_up(NULL, rows * 4),
        *gr = ct_up(NULL, rows * 4), *gdg = ct_up(dg, d * 4),
        *gdb = ct_up(db, d * 4), *gdg2 = ct_up(dg, d * 4),
        *gdb2 = ct_up(db, d * 4);
  AX_ASSERT_OK(
      AX_K(ct_cpu(), layernorm_fwd, rows, d, x, g, b, eps, y, mean, rstd));
  AX_ASSERT_OK(
      AX_K(ct_cpu(), layernorm_bwd, rows, d, x, dy, g, mean, rstd, dx, dg, db));
  AX_ASSERT_OK(
      AX_K(ct_gpu(), layernorm_fwd, rows, d, gx, gg, gb, eps, gy, gm, gr));
  AX_ASSERT_OK(AX_K(ct_gpu(), layernorm_bwd, rows, d, gx, gdy, gg, gm, gr, gdx,
                    gdg, gdb));
  ct_check("layernorm mean", gm, mean, rows, 1e-6, 1e-6);
  ct_check("layernorm rstd", gr, rstd, rows, 0, 1e-6);
  ct_check("layernorm y", gy, y, n, 1e-5, 1e-5);
  ct_check("layernorm dx", gdx, dx, n, 1e-5, 1e-5);
  ct_check("layernorm dgamma", gdg, dg, d, 1e-4, 1e-5);
  ct_check("layernorm dbeta", gdb, db, d, 1e-4, 1e-5);
  /* Deterministic: the same call again gives the same bits; dx NULL and
   * statistics NULL are allowed. */
  AX_ASSERT_OK(AX_K(ct_gpu(), layernorm_bwd, rows, d, gx, gdy, gg, gm, gr, NULL,
                    gdg2, gdb2));
  float *h1 = malloc(d * 4), *h2 = malloc(d * 4);
  ct_down(h1, gdg, d * 4);
  ct_check_exact("layernorm dgamma (repeat)", gdg2, h1, d * 4);
  ct_down(h2, gdb, d * 4);
  ct_check_exact("layernorm dbeta (repeat)", gdb2, h2, d * 4);
  AX_ASSERT_OK(
      AX_K(ct_gpu(), layernorm_fwd, rows, d, gx, gg, gb, eps, gdx, NULL, NULL));
  ct_check("layernorm y (no statistics)", gdx, y, n, 1e-5, 1e-5);
  ct_free(gx), ct_free(gg), ct_free(gb), ct_free(gdy), ct_free(gy);
  ct_free(gdx);
  ct_free(gm), ct_free(gr), ct_free(gdg), ct_free(gdb), ct_free(gdg2);
  ct_free(gdb2);
  free(x), free(g), free(b), free(dy), free(y), free(dx), free(mean);
  free(rstd), free(dg), free(db), free(h1), free(h2);
}

static void layernorm_matches_cpu(void **state) {
  layernorm_case(7, 33);
  layernorm_case(256, 768); /* BERT-base width, several row chunks */
  layernorm_case(3, 1000);
  layernorm_case(1000, 20); /* many chunks, narrow rows */
  layernorm_case(1, 1);
}

/* ---- cross-entropy ---- */

/* ties != 0 rounds the logits to integers in [-3, 3] (rows with equal
 * maxima). Every third kept row is labelled with the first maximum of its
 * logits (a hit), the others at random. */
static void xent_case(int rows, int classes, int ignore_index, int ties) {
  size_t n = (size_t)rows * classes;
  float *z = ct_randn(5, n, 3.0f), *p = malloc(n * 4 + 4), *dz = malloc(n * 4);
  int32_t *lab = malloc(rows * 4 + 4);
  ax_rng r;
  ax_rng_seed(&r, 6);
  for (size_t i = 0; ties && i < n; i++)
    z[i] = fminf(3.0f, fmaxf(-3.0f, roundf(z[i])));
  for (int i = 0; i < rows; i++) {
    const float *zi = z + (size_t)i * classes;
    int first = 0;
    for (int j = 1; j < classes; j++)
      first = zi[j] > zi[first] ? j : first;
    lab[i] = i % 5 == 3   ? ignore_index
             : i % 3 == 0 ? first
                          : (int32_t)ax_rng_below(&r, (uint64_t)classes);
  }
  double loss, gloss;
  int64_t cnt, gcnt, ok, gok;
  float *gz = ct_up(z, n * 4), *gp = ct_up(NULL, n * 4),
        *gdz = ct_up(NULL, n * 4);
  int32_t *glab = ct_up(lab, rows * 4);
  AX_ASSERT_OK(AX_K(ct_cpu(), xent_fwd, rows, classes, z, lab, ignore_index, p,
                    &loss, &cnt, &ok));
  AX_ASSERT_OK(AX_K(ct_gpu(), xent_fwd, rows, classes, gz, glab, ignore_index,
                    gp, &gloss, &gcnt, &gok));
  assert_int_equal(gcnt, cnt);
  assert_int_equal(gok, ok);
  assert_true(ok > 0 || rows < 3);
  AX_ASSERT_CLOSE(gloss, loss, 1e-9, 1e-5);
  ct_check("xent probs", gp, p, n, 1e-6, 1e-5);
  const float scale = cnt ? 1.0f / (float)cnt : 1.0f;
  AX_ASSERT_OK(
      AX_K(ct_cpu(), xent_bwd, rows, classes, p, lab, ignore_index, scale, dz));
  /* The CPU's probabilities on both sides, to compare the backward alone. */
  float *gp2 = ct_up(p, n * 4);
  AX_ASSERT_OK(AX_K(ct_gpu(), xent_bwd, rows, classes, gp2, glab, ignore_index,
                    scale, gdz));
  ct_check("xent dlogits", gdz, dz, n, 1e-7, 1e-5);
  ct_free(gz), ct_free(gp), ct_free(gdz), ct_free(glab), ct_free(gp2);
  free(z), free(p), free(dz), free(lab);
}

static void xent_matches_cpu(void **state) {
  xent_case(64, 10, -100, 0);    /* CIFAR-10 head */
  xent_case(37, 30522, -100, 0); /* a BERT vocabulary */
  xent_case(300, 7, 2, 0);       /* ignore_index inside the class range */
  xent_case(5, 1, -100, 0);
  xent_case(200, 9, -100, 1);    /* ties: the lowest index wins */
  xent_case(33, 30522, -100, 1); /* ties spread over a block's threads */
}

static void xent_rejects_bad_labels(void **state) {
  float z[6] = {0, 1, 2, 3, 4, 5};
  float *gz = ct_up(z, 24), *gp = ct_up(NULL, 24);
  double loss = -1;
  int64_t cnt = -1;
  int32_t bad_hi[2] = {1, 3}, bad_lo[2] = {-1, 0}, ign[2] = {-1, 2};
  int32_t *g1 = ct_up(bad_hi, 8), *g2 = ct_up(bad_lo, 8), *g3 = ct_up(ign, 8);
  AX_ASSERT_ERR(
      AX_K(ct_gpu(), xent_fwd, 2, 3, gz, g1, -100, gp, &loss, &cnt, NULL),
      AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "label 3 of row 1"));
  AX_ASSERT_ERR(
      AX_K(ct_gpu(), xent_fwd, 2, 3, gz, g2, -100, gp, &loss, &cnt, NULL),
      AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "label -1 of row 0"));
  /* -1 is fine when it is the ignore_index */
  AX_ASSERT_OK(
      AX_K(ct_gpu(), xent_fwd, 2, 3, gz, g3, -1, gp, &loss, &cnt, NULL));
  assert_int_equal(cnt, 1);
  AX_ASSERT_OK(
      AX_K(ct_gpu(), xent_fwd, 0, 3, gz, g3, -1, gp, &loss, &cnt, NULL));
  assert_int_equal(cnt, 0);
  assert_true(loss == 0.0);
  ct_free(gz), ct_free(gp), ct_free(g1), ct_free(g2), ct_free(g3);
}

/* ---- masked softmax ---- */

static void softmax_case(int b, int h, int sq, int sk, int with_mask) {
  size_t n = (size_t)b * h * sq * sk;
  float *s = ct_randn(7, n, 3.0f), *dp = ct_randn(8, n, 1.0f);
  float *p = malloc(n * 4), *ds = malloc(n * 4), *gp_h = malloc(n * 4);
  float *mask = malloc(sizeof(float) * (size_t)b * sk);
  /* Element 0 attends everywhere, the others have padded tails of
   * different lengths, the last one (b >= 3) is entirely padding. */
  for (int i = 0; i < b; i++)
    for (int j = 0; j < sk; j++)
      mask[i * sk + j] = i == 0                   ? 1.0f
                         : (i == b - 1 && b >= 3) ? 0.0f
                         : j < sk - 1 - i         ? 1.0f
                                                  : 0.0f;
  const float scale = 0.125f;
  const float *mk = with_mask ? mask : NULL;
  float *gs = ct_up(s, n * 4), *gdp = ct_up(dp, n * 4),
        *gm = ct_up(mask, b * sk * 4), *gp = ct_up(NULL, n * 4),
        *gds = ct_up(NULL, n * 4);
  AX_ASSERT_OK(AX_K(ct_cpu(), softmax_mask_fwd, b, h, sq, sk, s, mk, scale, p));
  AX_ASSERT_OK(AX_K(ct_gpu(), softmax_mask_fwd, b, h, sq, sk, gs,
                    with_mask ? gm : NULL, scale, gp));
  ct_check("softmax probs", gp, p, n, 1e-6, 1e-5);
  ct_down(gp_h, gp, n * 4);
  for (size_t r = 0; with_mask && r < n / sk; r++)
    for (int j = 0; j < sk; j++)
      if (mask[(r / ((size_t)h * sq)) * sk + j] == 0.0f &&
          gp_h[r * sk + j] != 0.0f)
        fail_msg("softmax: padded key %d of row %zu has probability %g", j, r,
                 (double)gp_h[r * sk + j]);
  /* The backward on the CPU's probabilities, then in place on the GPU. */
  float *gp2 = ct_up(p, n * 4);
  AX_ASSERT_OK(AX_K(ct_cpu(), softmax_bwd, b * h * sq, sk, p, dp, scale, ds));
  AX_ASSERT_OK(
      AX_K(ct_gpu(), softmax_bwd, b * h * sq, sk, gp2, gdp, scale, gds));
  ct_check("softmax dscores", gds, ds, n, 1e-6, 1e-5);
  ct_down(gp_h, gds, n * 4);
  AX_ASSERT_OK(
      AX_K(ct_gpu(), softmax_bwd, b * h * sq, sk, gp2, gdp, scale, gdp));
  ct_check_exact("softmax_bwd in place", gdp, gp_h, n * 4);
  ct_free(gs), ct_free(gdp), ct_free(gm), ct_free(gp), ct_free(gds);
  ct_free(gp2);
  free(s), free(dp), free(p), free(ds), free(gp_h), free(mask);
}

static void softmax_matches_cpu(void **state) {
  softmax_case(3, 2, 3, 5, 1);    /* a fully padded batch element */
  softmax_case(2, 3, 4, 6, 0);    /* no mask */
  softmax_case(4, 4, 32, 128, 1); /* BERT-like sequence length */
  softmax_case(3, 2, 5, 700, 1);  /* rows wider than a block */
}

/* ---- permutation ---- */

static void permute_case(int d0, int d1, int d2, int d3) {
  size_t n = (size_t)d0 * d1 * d2 * d3;
  float *x = ct_randn(9, n, 1.0f), *y = malloc(n * 4 + 4);
  float *gx = ct_up(x, n * 4), *gy = ct_up(NULL, n * 4);
  AX_ASSERT_OK(AX_K(ct_cpu(), permute0213, d0, d1, d2, d3, x, y));
  AX_ASSERT_OK(AX_K(ct_gpu(), permute0213, d0, d1, d2, d3, gx, gy));
  ct_check_exact("permute0213", gy, y, n * 4);
  ct_free(gx), ct_free(gy);
  free(x), free(y);
}

static void permute_matches_cpu(void **state) {
  permute_case(2, 3, 4, 5);
  permute_case(1, 7, 3, 1);
  permute_case(8, 12, 128, 64); /* (batch, seq, heads, head_dim) */
  float *p = ct_up(NULL, 64);
  AX_ASSERT_ERR(AX_K(ct_gpu(), permute0213, 1, 2, 2, 4, p, p), AX_EINVAL);
  ct_free(p);
}

/* ---- embedding ---- */

static void embedding_case(int n_idx, int dim, int rows, int distinct,
                           int negatives) {
  size_t nt = (size_t)rows * dim, ny = (size_t)n_idx * dim;
  float *table = ct_randn(10, nt, 1.0f), *dy = ct_randn(11, ny, 1.0f);
  float *y = malloc(ny * 4 + 4), *dt = ct_randn(12, nt, 1.0f);
  int32_t *idx = malloc(sizeof(int32_t) * (size_t)n_idx + 4);
  ax_rng r;
  ax_rng_seed(&r, 13);
  for (int i = 0; i < n_idx; i++) /* few distinct ids: many repeats */
    idx[i] = (int32_t)ax_rng_below(&r, (uint64_t)distinct);
  float *gt = ct_up(table, nt * 4), *gdy = ct_up(dy, ny * 4),
        *gy = ct_up(NULL, ny * 4), *gdt = ct_up(dt, nt * 4),
        *gdt2 = ct_up(dt, nt * 4);
  int32_t *gi = ct_up(idx, n_idx * 4);
  AX_ASSERT_OK(AX_K(ct_cpu(), embedding_fwd, n_idx, dim, rows, idx, table, y));
  AX_ASSERT_OK(AX_K(ct_gpu(), embedding_fwd, n_idx, dim, rows, gi, gt, gy));
  ct_check_exact("embedding_fwd", gy, y, ny * 4);
  if (negatives) { /* skipped by the backward */
    for (int i = 0; i < n_idx; i += 7)
      idx[i] = -1;
    AX_ASSERT_OK(AX_K(ct_gpu(), copy_from_host, gi, idx, n_idx * 4));
  }
  AX_ASSERT_OK(AX_K(ct_cpu(), embedding_bwd, n_idx, dim, idx, dy, dt));
  AX_ASSERT_OK(AX_K(ct_gpu(), embedding_bwd, n_idx, dim, gi, gdy, gdt));
  AX_ASSERT_OK(AX_K(ct_gpu(), embedding_bwd, n_idx, dim, gi, gdy, gdt2));
  ct_check_exact("embedding_bwd", gdt, dt, nt * 4);
  ct_check_exact("embedding_bwd (repeat)", gdt2, dt, nt * 4);
  ct_free(gt), ct_free(gdy), ct_free(gy), ct_free(gdt), ct_free(gdt2);
  ct_free(gi);
  free(table), free(dy), free(y), free(dt), free(idx);
}

static void embedding_matches_cpu(void **state) {
  embedding_case(9, 5, 7, 5, 0);
  embedding_case(600, 200, 11, 5, 1);
  embedding_case(4096, 256, 1000, 50, 0); /* a batch of tokens */
  embedding_case(3000, 64, 30522, 30522, 1);
}

static void embedding_rejects_bad_ids(void **state) {
  float table[12] = {0};
  int32_t hi[3] = {1, 2, 4}, lo[2] = {0, -1};
  float *gt = ct_up(table, 48), *gy = ct_up(NULL, 36);
  int32_t *ghi = ct_up(hi, 12), *glo = ct_up(lo, 8);
  AX_ASSERT_ERR(AX_K(ct_gpu(), embedding_fwd, 3, 3, 4, ghi, gt, gy), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "id 4 at position 2 outside [0, 4)"));
  AX_ASSERT_ERR(AX_K(ct_gpu(), embedding_fwd, 2, 3, 4, glo, gt, gy), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "id -1 at position 1"));
  AX_ASSERT_OK(AX_K(ct_gpu(), embedding_fwd, 2, 3, 4, ghi, gt, gy));
  ct_free(gt), ct_free(gy), ct_free(ghi), ct_free(glo);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(layernorm_matches_cpu),
      cmocka_unit_test(xent_matches_cpu),
      cmocka_unit_test(xent_rejects_bad_labels),
      cmocka_unit_test(softmax_matches_cpu),
      cmocka_unit_test(permute_matches_cpu),
      cmocka_unit_test(embedding_matches_cpu),
      cmocka_unit_test(embedding_rejects_bad_ids),
  };
  return AX_CUDA_TEST_MAIN(tests);
}
