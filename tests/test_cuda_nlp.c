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
 *    the count exactly; dlogits 1e-7 abs + 1e-5 rel.
 *  - masked softmax and its backward: 1e-6 abs + 1e-5 rel (as probs);
 *    padded keys exactly 0.
 *  - permutation and embedding: exactly (copies; the embedding gradient
 *    does the CPU's additions in the CPU's order, by design). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kernels/backend-impl.h"

static ax_backend *cpu(void) { return ax_backend_of(AX_CPU); }

static ax_backend *gpu(void) {
  ax_backend *be = NULL;
  AX_ASSERT_OK(ax_backend_get((ax_device){AX_DEV_CUDA, 0}, &be));
  return be;
}

/* n bytes of device memory, a copy of host unless host is NULL. */
static void *up(const void *host, size_t n) {
  void *d = gpu()->iface.alloc(gpu(), n ? n : 4);
  assert_non_null(d);
  if (host && n)
    AX_ASSERT_OK(AX_K(gpu(), copy_from_host, d, host, n));
  return d;
}

static void down(void *host, const void *dev, size_t n) {
  AX_ASSERT_OK(AX_K(gpu(), synchronize));
  AX_ASSERT_OK(AX_K(gpu(), copy_to_host, host, dev, n));
}

static void dfree(void *d) { gpu()->iface.free(gpu(), d); }

static float *randn(uint64_t seed, size_t n, float scale) {
  ax_rng r;
  ax_rng_seed(&r, seed);
  float *p = malloc(sizeof(float) * (n + 1));
  assert_non_null(p);
  for (size_t i = 0; i < n; i++)
    p[i] = scale * (float)ax_rng_normal(&r);
  return p;
}

static void check(const void *dev, const float *ref, size_t n, double atol,
                  double rtol, const char *what) {
  float *got = malloc(n * sizeof(float) + 4);
  down(got, dev, n * sizeof(float));
  double r = ax_test_close_ratio(got, ref, n, atol, rtol);
  free(got);
  if (!(r <= 1.0))
    fail_msg("%s: GPU differs from the CPU (worst ratio %g)", what, r);
}

static void check_exact(const void *dev, const void *ref, size_t bytes,
                        const char *what) {
  char *got = malloc(bytes + 4);
  down(got, dev, bytes);
  int same = memcmp(got, ref, bytes) == 0;
  free(got);
  if (!same)
    fail_msg("%s: GPU differs from the CPU", what);
}

/* ---- layer norm ---- */

static void layernorm_case(int rows, int d) {
  size_t n = (size_t)rows * d;
  float *x = randn(1, n, 2.0f), *g = randn(2, d, 1.0f), *b = randn(3, d, 1.0f);
  float *dy = randn(4, n, 1.0f), *y = malloc(n * 4), *dx = malloc(n * 4);
  float *mean = malloc(rows * 4 + 4), *rstd = malloc(rows * 4 + 4);
  float *dg = malloc(d * 4), *db = malloc(d * 4);
  const float eps = 1e-5f;
  for (int j = 0; j < d; j++)
    dg[j] = db[j] = 1.0f; /* parameter gradients accumulate */
  float *gx = up(x, n * 4), *gg = up(g, d * 4), *gb = up(b, d * 4),
        *gdy = up(dy, n * 4), *gy = up(NULL, n * 4), *gdx = up(NULL, n * 4),
        *gm = up(NULL, rows * 4), *gr = up(NULL, rows * 4),
        *gdg = up(dg, d * 4), *gdb = up(db, d * 4), *gdg2 = up(dg, d * 4),
        *gdb2 = up(db, d * 4);
  AX_ASSERT_OK(
      AX_K(cpu(), layernorm_fwd, rows, d, x, g, b, eps, y, mean, rstd));
  AX_ASSERT_OK(
      AX_K(cpu(), layernorm_bwd, rows, d, x, dy, g, mean, rstd, dx, dg, db));
  AX_ASSERT_OK(
      AX_K(gpu(), layernorm_fwd, rows, d, gx, gg, gb, eps, gy, gm, gr));
  AX_ASSERT_OK(
      AX_K(gpu(), layernorm_bwd, rows, d, gx, gdy, gg, gm, gr, gdx, gdg, gdb));
  check(gm, mean, rows, 1e-6, 1e-6, "layernorm mean");
  check(gr, rstd, rows, 0, 1e-6, "layernorm rstd");
  check(gy, y, n, 1e-5, 1e-5, "layernorm y");
  check(gdx, dx, n, 1e-5, 1e-5, "layernorm dx");
  check(gdg, dg, d, 1e-4, 1e-5, "layernorm dgamma");
  check(gdb, db, d, 1e-4, 1e-5, "layernorm dbeta");
  /* Deterministic: the same call again gives the same bits; dx NULL and
   * statistics NULL are allowed. */
  AX_ASSERT_OK(AX_K(gpu(), layernorm_bwd, rows, d, gx, gdy, gg, gm, gr, NULL,
                    gdg2, gdb2));
  float *h1 = malloc(d * 4), *h2 = malloc(d * 4);
  down(h1, gdg, d * 4);
  check_exact(gdg2, h1, d * 4, "layernorm dgamma (repeat)");
  down(h2, gdb, d * 4);
  check_exact(gdb2, h2, d * 4, "layernorm dbeta (repeat)");
  AX_ASSERT_OK(
      AX_K(gpu(), layernorm_fwd, rows, d, gx, gg, gb, eps, gdx, NULL, NULL));
  check(gdx, y, n, 1e-5, 1e-5, "layernorm y (no statistics)");
  dfree(gx), dfree(gg), dfree(gb), dfree(gdy), dfree(gy), dfree(gdx);
  dfree(gm), dfree(gr), dfree(gdg), dfree(gdb), dfree(gdg2), dfree(gdb2);
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

static void xent_case(int rows, int classes, int ignore_index) {
  size_t n = (size_t)rows * classes;
  float *z = randn(5, n, 3.0f), *p = malloc(n * 4 + 4), *dz = malloc(n * 4);
  int32_t *lab = malloc(rows * 4 + 4);
  ax_rng r;
  ax_rng_seed(&r, 6);
  for (int i = 0; i < rows; i++)
    lab[i] = i % 5 == 3 ? ignore_index
                        : (int32_t)ax_rng_below(&r, (uint64_t)classes);
  double loss, gloss;
  int64_t cnt, gcnt;
  float *gz = up(z, n * 4), *gp = up(NULL, n * 4), *gdz = up(NULL, n * 4);
  int32_t *glab = up(lab, rows * 4);
  AX_ASSERT_OK(AX_K(cpu(), xent_fwd, rows, classes, z, lab, ignore_index, p,
                    &loss, &cnt));
  AX_ASSERT_OK(AX_K(gpu(), xent_fwd, rows, classes, gz, glab, ignore_index, gp,
                    &gloss, &gcnt));
  assert_int_equal(gcnt, cnt);
  AX_ASSERT_CLOSE(gloss, loss, 1e-9, 1e-5);
  check(gp, p, n, 1e-6, 1e-5, "xent probs");
  const float scale = cnt ? 1.0f / (float)cnt : 1.0f;
  AX_ASSERT_OK(
      AX_K(cpu(), xent_bwd, rows, classes, p, lab, ignore_index, scale, dz));
  /* The CPU's probabilities on both sides, to compare the backward alone. */
  float *gp2 = up(p, n * 4);
  AX_ASSERT_OK(AX_K(gpu(), xent_bwd, rows, classes, gp2, glab, ignore_index,
                    scale, gdz));
  check(gdz, dz, n, 1e-7, 1e-5, "xent dlogits");
  dfree(gz), dfree(gp), dfree(gdz), dfree(glab), dfree(gp2);
  free(z), free(p), free(dz), free(lab);
}

static void xent_matches_cpu(void **state) {
  xent_case(64, 10, -100);    /* CIFAR-10 head */
  xent_case(37, 30522, -100); /* a BERT vocabulary */
  xent_case(300, 7, 2);       /* ignore_index inside the class range */
  xent_case(5, 1, -100);
}

static void xent_rejects_bad_labels(void **state) {
  float z[6] = {0, 1, 2, 3, 4, 5};
  float *gz = up(z, 24), *gp = up(NULL, 24);
  double loss = -1;
  int64_t cnt = -1;
  int32_t bad_hi[2] = {1, 3}, bad_lo[2] = {-1, 0}, ign[2] = {-1, 2};
  int32_t *g1 = up(bad_hi, 8), *g2 = up(bad_lo, 8), *g3 = up(ign, 8);
  AX_ASSERT_ERR(AX_K(gpu(), xent_fwd, 2, 3, gz, g1, -100, gp, &loss, &cnt),
                AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "label 3 of row 1"));
  AX_ASSERT_ERR(AX_K(gpu(), xent_fwd, 2, 3, gz, g2, -100, gp, &loss, &cnt),
                AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "label -1 of row 0"));
  /* -1 is fine when it is the ignore_index */
  AX_ASSERT_OK(AX_K(gpu(), xent_fwd, 2, 3, gz, g3, -1, gp, &loss, &cnt));
  assert_int_equal(cnt, 1);
  AX_ASSERT_OK(AX_K(gpu(), xent_fwd, 0, 3, gz, g3, -1, gp, &loss, &cnt));
  assert_int_equal(cnt, 0);
  assert_true(loss == 0.0);
  dfree(gz), dfree(gp), dfree(g1), dfree(g2), dfree(g3);
}

/* ---- masked softmax ---- */

static void softmax_case(int b, int h, int sq, int sk, int with_mask) {
  size_t n = (size_t)b * h * sq * sk;
  float *s = randn(7, n, 3.0f), *dp = randn(8, n, 1.0f);
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
  float *gs = up(s, n * 4), *gdp = up(dp, n * 4), *gm = up(mask, b * sk * 4),
        *gp = up(NULL, n * 4), *gds = up(NULL, n * 4);
  AX_ASSERT_OK(AX_K(cpu(), softmax_mask_fwd, b, h, sq, sk, s, mk, scale, p));
  AX_ASSERT_OK(AX_K(gpu(), softmax_mask_fwd, b, h, sq, sk, gs,
                    with_mask ? gm : NULL, scale, gp));
  check(gp, p, n, 1e-6, 1e-5, "softmax probs");
  down(gp_h, gp, n * 4);
  for (size_t r = 0; with_mask && r < n / sk; r++)
    for (int j = 0; j < sk; j++)
      if (mask[(r / ((size_t)h * sq)) * sk + j] == 0.0f &&
          gp_h[r * sk + j] != 0.0f)
        fail_msg("softmax: padded key %d of row %zu has probability %g", j, r,
                 (double)gp_h[r * sk + j]);
  /* The backward on the CPU's probabilities, then in place on the GPU. */
  float *gp2 = up(p, n * 4);
  AX_ASSERT_OK(AX_K(cpu(), softmax_bwd, b * h * sq, sk, p, dp, scale, ds));
  AX_ASSERT_OK(AX_K(gpu(), softmax_bwd, b * h * sq, sk, gp2, gdp, scale, gds));
  check(gds, ds, n, 1e-6, 1e-5, "softmax dscores");
  down(gp_h, gds, n * 4);
  AX_ASSERT_OK(AX_K(gpu(), softmax_bwd, b * h * sq, sk, gp2, gdp, scale, gdp));
  check_exact(gdp, gp_h, n * 4, "softmax_bwd in place");
  dfree(gs), dfree(gdp), dfree(gm), dfree(gp), dfree(gds), dfree(gp2);
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
  float *x = randn(9, n, 1.0f), *y = malloc(n * 4 + 4);
  float *gx = up(x, n * 4), *gy = up(NULL, n * 4);
  AX_ASSERT_OK(AX_K(cpu(), permute0213, d0, d1, d2, d3, x, y));
  AX_ASSERT_OK(AX_K(gpu(), permute0213, d0, d1, d2, d3, gx, gy));
  check_exact(gy, y, n * 4, "permute0213");
  dfree(gx), dfree(gy);
  free(x), free(y);
}

static void permute_matches_cpu(void **state) {
  permute_case(2, 3, 4, 5);
  permute_case(1, 7, 3, 1);
  permute_case(8, 12, 128, 64); /* (batch, seq, heads, head_dim) */
  float *p = up(NULL, 64);
  AX_ASSERT_ERR(AX_K(gpu(), permute0213, 1, 2, 2, 4, p, p), AX_EINVAL);
  dfree(p);
}

/* ---- embedding ---- */

static void embedding_case(int n_idx, int dim, int rows, int distinct,
                           int negatives) {
  size_t nt = (size_t)rows * dim, ny = (size_t)n_idx * dim;
  float *table = randn(10, nt, 1.0f), *dy = randn(11, ny, 1.0f);
  float *y = malloc(ny * 4 + 4), *dt = randn(12, nt, 1.0f);
  int32_t *idx = malloc(sizeof(int32_t) * (size_t)n_idx + 4);
  ax_rng r;
  ax_rng_seed(&r, 13);
  for (int i = 0; i < n_idx; i++) /* few distinct ids: many repeats */
    idx[i] = (int32_t)ax_rng_below(&r, (uint64_t)distinct);
  float *gt = up(table, nt * 4), *gdy = up(dy, ny * 4), *gy = up(NULL, ny * 4),
        *gdt = up(dt, nt * 4), *gdt2 = up(dt, nt * 4);
  int32_t *gi = up(idx, n_idx * 4);
  AX_ASSERT_OK(AX_K(cpu(), embedding_fwd, n_idx, dim, rows, idx, table, y));
  AX_ASSERT_OK(AX_K(gpu(), embedding_fwd, n_idx, dim, rows, gi, gt, gy));
  check_exact(gy, y, ny * 4, "embedding_fwd");
  if (negatives) { /* skipped by the backward */
    for (int i = 0; i < n_idx; i += 7)
      idx[i] = -1;
    AX_ASSERT_OK(AX_K(gpu(), copy_from_host, gi, idx, n_idx * 4));
  }
  AX_ASSERT_OK(AX_K(cpu(), embedding_bwd, n_idx, dim, idx, dy, dt));
  AX_ASSERT_OK(AX_K(gpu(), embedding_bwd, n_idx, dim, gi, gdy, gdt));
  AX_ASSERT_OK(AX_K(gpu(), embedding_bwd, n_idx, dim, gi, gdy, gdt2));
  check_exact(gdt, dt, nt * 4, "embedding_bwd");
  check_exact(gdt2, dt, nt * 4, "embedding_bwd (repeat)");
  dfree(gt), dfree(gdy), dfree(gy), dfree(gdt), dfree(gdt2), dfree(gi);
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
  float *gt = up(table, 48), *gy = up(NULL, 36);
  int32_t *ghi = up(hi, 12), *glo = up(lo, 8);
  AX_ASSERT_ERR(AX_K(gpu(), embedding_fwd, 3, 3, 4, ghi, gt, gy), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "id 4 at position 2 outside [0, 4)"));
  AX_ASSERT_ERR(AX_K(gpu(), embedding_fwd, 2, 3, 4, glo, gt, gy), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "id -1 at position 1"));
  AX_ASSERT_OK(AX_K(gpu(), embedding_fwd, 2, 3, 4, ghi, gt, gy));
  dfree(gt), dfree(gy), dfree(ghi), dfree(glo);
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
