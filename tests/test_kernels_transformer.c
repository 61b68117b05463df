/* The CPU transformer kernels (layer norm, masked softmax, permutation,
 * embedding) against naive double-precision references, and the
 * cross-entropy's count of correct rows against the serial argmax scan of
 * its probabilities, called through the backend vtable. Each check runs a
 * small shape (serial path) and a large one (OpenMP path). */
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

static float *randn(uint64_t seed, size_t n, float scale) {
  ax_rng r;
  ax_rng_seed(&r, seed);
  float *p = malloc(sizeof(float) * (n + 1));
  assert_non_null(p);
  for (size_t i = 0; i < n; i++)
    p[i] = scale * (float)ax_rng_normal(&r);
  return p;
}

static void assert_near(const float *a, const double *ref, size_t n, double tol,
                        const char *what) {
  for (size_t i = 0; i < n; i++)
    if (!(fabs(a[i] - ref[i]) <= tol * (1.0 + fabs(ref[i]))))
      fail_msg("%s[%zu] = %.9g, reference %.9g", what, i, (double)a[i], ref[i]);
}

/* ---- layer norm ---- */

static void layernorm_case(int rows, int d) {
  ax_backend *be = cpu();
  size_t n = (size_t)rows * d;
  float *x = randn(1, n, 2.0f), *g = randn(2, d, 1.0f), *b = randn(3, d, 1.0f);
  float *dy = randn(4, n, 1.0f), *y = malloc(n * 4), *dx = malloc(n * 4);
  float *mean = malloc(rows * 4 + 4), *rstd = malloc(rows * 4 + 4);
  float *dg = malloc(d * 4), *db = malloc(d * 4);
  double *ry = calloc(n, 8), *rdx = calloc(n, 8), *rdg = calloc(d, 8),
         *rdb = calloc(d, 8);
  const float eps = 1e-5f;
  for (int j = 0; j < d; j++)
    dg[j] = db[j] = 1.0f; /* parameter gradients accumulate */
  AX_ASSERT_OK(AX_K(be, layernorm_fwd, rows, d, x, g, b, eps, y, mean, rstd));
  AX_ASSERT_OK(
      AX_K(be, layernorm_bwd, rows, d, x, dy, g, mean, rstd, dx, dg, db));
  double *xh = malloc(sizeof(double) * d);
  for (int r = 0; r < rows; r++) {
    const float *xr = x + (size_t)r * d, *gr = dy + (size_t)r * d;
    double mu = 0, var = 0;
    for (int j = 0; j < d; j++)
      mu += xr[j];
    mu /= d;
    for (int j = 0; j < d; j++)
      var += (xr[j] - mu) * (xr[j] - mu);
    double rs = 1.0 / sqrt(var / d + eps);
    AX_ASSERT_CLOSE(mean[r], mu, 1e-5, 1e-5);
    AX_ASSERT_CLOSE(rstd[r], rs, 1e-5, 1e-4);
    for (int j = 0; j < d; j++) {
      xh[j] = (xr[j] - mu) * rs;
      ry[(size_t)r * d + j] = xh[j] * g[j] + b[j];
      rdg[j] += gr[j] * xh[j];
      rdb[j] += gr[j];
    }
    /* dx_i = sum_j dy_j gamma_j rstd (delta_ij - 1/d - xh_i xh_j / d) */
    for (int i = 0; i < d; i++) {
      double s = 0;
      for (int j = 0; j < d; j++)
        s += gr[j] * g[j] * rs * ((i == j) - 1.0 / d - xh[i] * xh[j] / d);
      rdx[(size_t)r * d + i] = s;
    }
  }
  for (int j = 0; j < d; j++) {
    rdg[j] += 1.0;
    rdb[j] += 1.0;
  }
  assert_near(y, ry, n, 1e-5, "layernorm y");
  assert_near(dx, rdx, n, 1e-4, "layernorm dx");
  assert_near(dg, rdg, d, 1e-4, "layernorm dgamma");
  assert_near(db, rdb, d, 1e-4, "layernorm dbeta");
  free(xh);
  free(x), free(g), free(b), free(dy), free(y), free(dx), free(mean);
  free(rstd), free(dg), free(db), free(ry), free(rdx), free(rdg), free(rdb);
}

static void layernorm_matches_reference(void **state) {
  layernorm_case(5, 7);
  layernorm_case(300, 96);
}

/* ---- masked softmax ---- */

static void softmax_case(int b, int h, int sq, int sk, int with_mask) {
  ax_backend *be = cpu();
  size_t n = (size_t)b * h * sq * sk;
  float *s = randn(5, n, 3.0f), *dp = randn(6, n, 1.0f);
  float *p = malloc(n * 4), *ds = malloc(n * 4);
  float *mask = malloc(sizeof(float) * (size_t)b * sk);
  double *rp = calloc(n, 8), *rds = calloc(n, 8);
  /* Batch element 0 attends everywhere; the others have padded tails and
   * the last one, when there are 3 or more, is entirely padding. */
  for (int i = 0; i < b; i++)
    for (int j = 0; j < sk; j++)
      mask[i * sk + j] = i == 0                   ? 1.0f
                         : (i == b - 1 && b >= 3) ? 0.0f
                         : j < sk - 2             ? 1.0f
                                                  : 0.0f;
  const float scale = 0.37f;
  const float *mk = with_mask ? mask : NULL;
  AX_ASSERT_OK(AX_K(be, softmax_mask_fwd, b, h, sq, sk, s, mk, scale, p));
  AX_ASSERT_OK(AX_K(be, softmax_bwd, b * h * sq, sk, p, dp, scale, ds));
  for (size_t r = 0; r < n / sk; r++) {
    const float *mr = mk ? mk + (r / ((size_t)h * sq)) * sk : NULL;
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < sk; j++)
      if (!mr || mr[j] != 0)
        mx = fmax(mx, scale * s[r * sk + j]);
    for (int j = 0; j < sk; j++)
      if ((!mr || mr[j] != 0) && mx > -INFINITY)
        sum += exp(scale * s[r * sk + j] - mx);
    for (int j = 0; j < sk; j++)
      rp[r * sk + j] = ((!mr || mr[j] != 0) && sum > 0)
                           ? exp(scale * s[r * sk + j] - mx) / sum
                           : 0.0;
    /* The full Jacobian of softmax(scale * s). */
    for (int i = 0; i < sk; i++) {
      double acc = 0;
      for (int j = 0; j < sk; j++)
        acc += dp[r * sk + j] * rp[r * sk + j] * ((i == j) - rp[r * sk + i]);
      rds[r * sk + i] = scale * acc;
    }
  }
  assert_near(p, rp, n, 1e-6, "softmax probs");
  assert_near(ds, rds, n, 1e-5, "softmax dscores");
  /* Padded keys have exactly zero probability and zero gradient. */
  for (size_t r = 0; with_mask && r < n / sk; r++)
    for (int j = 0; j < sk; j++)
      if (mask[(r / ((size_t)h * sq)) * sk + j] == 0.0f) {
        assert_true(p[r * sk + j] == 0.0f);
        assert_true(ds[r * sk + j] == 0.0f);
      }
  free(s), free(dp), free(p), free(ds), free(mask), free(rp), free(rds);
}

static void softmax_matches_reference(void **state) {
  softmax_case(3, 2, 3, 5, 1);   /* includes a fully padded mask row */
  softmax_case(2, 3, 4, 6, 0);   /* no mask */
  softmax_case(2, 4, 32, 40, 1); /* OpenMP path */
}

static void softmax_bwd_in_place(void **state) {
  ax_backend *be = cpu();
  float *s = randn(7, 24, 1.0f), *dp = randn(8, 24, 1.0f), p[24], ds[24];
  AX_ASSERT_OK(AX_K(be, softmax_mask_fwd, 1, 1, 4, 6, s, NULL, 1.0f, p));
  AX_ASSERT_OK(AX_K(be, softmax_bwd, 4, 6, p, dp, 0.5f, ds));
  AX_ASSERT_OK(AX_K(be, softmax_bwd, 4, 6, p, dp, 0.5f, dp));
  for (int i = 0; i < 24; i++)
    AX_ASSERT_CLOSE(dp[i], ds[i], 0, 0);
  free(s), free(dp);
}

/* ---- permutation ---- */

static void permute_case(int d0, int d1, int d2, int d3) {
  ax_backend *be = cpu();
  size_t n = (size_t)d0 * d1 * d2 * d3;
  float *x = randn(9, n, 1.0f), *y = malloc(n * 4 + 4);
  AX_ASSERT_OK(AX_K(be, permute0213, d0, d1, d2, d3, x, y));
  for (int a = 0; a < d0; a++)
    for (int b = 0; b < d1; b++)
      for (int c = 0; c < d2; c++)
        for (int d = 0; d < d3; d++) {
          float want = x[(((size_t)a * d1 + b) * d2 + c) * d3 + d];
          float got = y[(((size_t)a * d2 + c) * d1 + b) * d3 + d];
          if (got != want)
            fail_msg("permute0213 (%d,%d,%d,%d) at [%d][%d][%d][%d]", d0, d1,
                     d2, d3, a, b, c, d);
        }
  free(x), free(y);
}

static void permute_matches_reference(void **state) {
  permute_case(2, 3, 4, 5);
  permute_case(1, 7, 3, 1);
  permute_case(4, 64, 6, 32); /* OpenMP path */
}

/* ---- embedding ---- */

static void embedding_case(int n_idx, int dim, int rows) {
  ax_backend *be = cpu();
  float *table = randn(10, (size_t)rows * dim, 1.0f);
  float *dy = randn(11, (size_t)n_idx * dim, 1.0f);
  float *y = malloc(sizeof(float) * (size_t)n_idx * dim);
  float *dt = malloc(sizeof(float) * (size_t)rows * dim);
  double *rdt = malloc(sizeof(double) * (size_t)rows * dim);
  int32_t *idx = malloc(sizeof(int32_t) * (size_t)n_idx);
  ax_rng r;
  ax_rng_seed(&r, 12);
  for (int i = 0; i < n_idx; i++) /* few distinct ids: many repeats */
    idx[i] = (int32_t)ax_rng_below(&r, (uint64_t)(rows < 5 ? rows : 5));
  for (size_t i = 0; i < (size_t)rows * dim; i++) {
    dt[i] = 0.5f;
    rdt[i] = 0.5;
  }
  AX_ASSERT_OK(AX_K(be, embedding_fwd, n_idx, dim, rows, idx, table, y));
  AX_ASSERT_OK(AX_K(be, embedding_bwd, n_idx, dim, idx, dy, dt));
  for (int i = 0; i < n_idx; i++)
    for (int j = 0; j < dim; j++) {
      assert_true(y[(size_t)i * dim + j] == table[(size_t)idx[i] * dim + j]);
      rdt[(size_t)idx[i] * dim + j] += dy[(size_t)i * dim + j];
    }
  assert_near(dt, rdt, (size_t)rows * dim, 1e-5, "embedding dtable");
  free(table), free(dy), free(y), free(dt), free(rdt), free(idx);
}

static void embedding_matches_reference(void **state) {
  embedding_case(9, 5, 7);
  embedding_case(600, 200, 11); /* OpenMP path */
}

static void embedding_rejects_bad_ids(void **state) {
  ax_backend *be = cpu();
  float table[12] = {0}, y[6] = {0};
  int32_t hi[2] = {1, 4}, lo[2] = {-1, 0};
  AX_ASSERT_ERR(AX_K(be, embedding_fwd, 2, 3, 4, hi, table, y), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "outside [0, 4)"));
  AX_ASSERT_ERR(AX_K(be, embedding_fwd, 2, 3, 4, lo, table, y), AX_EINVAL);
}

/* ---- cross-entropy: correct rows ---- */

/* The first index of row z's largest value (the serial scan of the
 * contract), found on the logits (integers, so equal logits give equal
 * probabilities) or the probabilities. */
static int first_max(const float *z, int classes) {
  int best = 0;
  for (int j = 1; j < classes; j++)
    if (z[j] > z[best])
      best = j;
  return best;
}

/* Integer logits in [-2, 2] (many ties), every fourth row ignored; the
 * other labels are the first maximum (a hit), the last maximum (a hit only
 * without a tie) or random. Rows 1 and 2 hold a NaN at index 0 and in the
 * middle. The count must equal the serial scan over the written probs. */
static void xent_correct_case(int rows, int classes, int ignore_index) {
  ax_backend *be = cpu();
  size_t n = (size_t)rows * classes;
  float *z = randn(21, n, 1.2f), *p = malloc(n * 4 + 4);
  int32_t *lab = malloc(sizeof(int32_t) * (size_t)rows);
  ax_rng r;
  ax_rng_seed(&r, 22);
  for (size_t i = 0; i < n; i++)
    z[i] = fminf(2.0f, fmaxf(-2.0f, roundf(z[i])));
  if (rows > 2 && classes > 2) {
    z[1 * (size_t)classes] = NAN;
    z[2 * (size_t)classes + classes / 2] = NAN;
  }
  int64_t ties = 0;
  for (int i = 0; i < rows; i++) {
    const float *zi = z + (size_t)i * classes;
    int first = first_max(zi, classes), last = first;
    for (int j = first + 1; j < classes; j++)
      if (zi[j] == zi[first])
        last = j;
    ties += last != first;
    int kind = (int)ax_rng_below(&r, 3);
    lab[i] = i % 4 == 3  ? ignore_index
             : kind == 0 ? first
             : kind == 1 ? last
                         : (int32_t)ax_rng_below(&r, (uint64_t)classes);
  }
  assert_true(ties > 0 || classes == 1);
  double loss;
  int64_t count, correct = -1, count2;
  AX_ASSERT_OK(AX_K(be, xent_fwd, rows, classes, z, lab, ignore_index, p, &loss,
                    &count, &correct));
  int64_t want = 0, kept = 0;
  for (int i = 0; i < rows; i++)
    if (lab[i] != ignore_index) {
      kept++;
      want += first_max(p + (size_t)i * classes, classes) == lab[i];
    }
  assert_int_equal(count, kept);
  assert_int_equal(correct, want);
  assert_true(want > 0);
  /* correct_host may be NULL. */
  AX_ASSERT_OK(AX_K(be, xent_fwd, rows, classes, z, lab, ignore_index, p, &loss,
                    &count2, NULL));
  assert_int_equal(count2, kept);
  free(z), free(p), free(lab);
}

static void xent_correct_matches_scan(void **state) {
  xent_correct_case(40, 5, -100);
  xent_correct_case(3, 1, -100);
  xent_correct_case(2000, 40, 3);  /* OpenMP path, ignore_index a class */
  xent_correct_case(64, 3000, -1); /* wide rows */
}

/* The softmax cross-entropy against a double-precision reference from the
 * same float differences z - max (probs within 5e-7 relative, the loss
 * within 1e-6), written over the logits
 * (probs = logits) to the same bits as into another buffer, and its
 * gradient in place likewise. Rows of 67 classes (vector lanes and a
 * remainder) hold -inf logits, which get a probability of at most 1e-37,
 * and row 3 a NaN of negative sign (the one x86 makes from 0 * inf), which
 * makes that row's probabilities and the loss NaN. */
static void xent_in_place_matches_reference(void **state) {
  (void)state;
  ax_backend *be = cpu();
  enum { R = 9, C = 67 };
  float *z = randn(31, R * C, 3.0f), zin[R * C], p[R * C], d1[R * C];
  int32_t lab[R];
  for (int i = 0; i < R; i++) {
    lab[i] = i == 5 ? -100 : (i * 7) % C;
    z[i * C + (i * 11 + 3) % C] = -INFINITY;
  }
  double loss, loss2, want = 0.0;
  int64_t count, count2;
  AX_ASSERT_OK(AX_K(be, xent_fwd, R, C, z, lab, -100, p, &loss, &count, NULL));
  for (int i = 0; i < R; i++) {
    double mx = -INFINITY, s = 0.0;
    for (int j = 0; j < C; j++)
      mx = fmax(mx, z[i * C + j]);
    for (int j = 0; j < C; j++)
      s += exp((double)(z[i * C + j] - (float)mx));
    for (int j = 0; j < C; j++) {
      double ref = exp((double)(z[i * C + j] - (float)mx)) / s;
      assert_true(fabs(p[i * C + j] - ref) <= 5e-7 * ref + 1e-37);
    }
    if (lab[i] != -100)
      want += log(s) + mx - z[i * C + lab[i]];
  }
  assert_int_equal(count, R - 1);
  assert_true(fabs(loss - want) <= 1e-6 * fabs(want));
  memcpy(zin, z, sizeof zin);
  AX_ASSERT_OK(
      AX_K(be, xent_fwd, R, C, zin, lab, -100, zin, &loss2, &count2, NULL));
  assert_memory_equal(zin, p, sizeof p);
  assert_true(loss2 == loss && count2 == count);
  AX_ASSERT_OK(AX_K(be, xent_bwd, R, C, p, lab, -100, 0.5f, d1));
  AX_ASSERT_OK(AX_K(be, xent_bwd, R, C, zin, lab, -100, 0.5f, zin));
  assert_memory_equal(zin, d1, sizeof d1);
  uint32_t neg_nan = 0xffc00000u;
  memcpy(&z[3 * C + 20], &neg_nan, sizeof neg_nan);
  AX_ASSERT_OK(AX_K(be, xent_fwd, R, C, z, lab, -100, p, &loss, &count, NULL));
  assert_true(isnan(loss));
  for (int j = 0; j < C; j++)
    assert_true(isnan(p[3 * C + j]));
  assert_false(isnan(p[2 * C]) || isnan(p[4 * C]));
  free(z);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(layernorm_matches_reference),
      cmocka_unit_test(softmax_matches_reference),
      cmocka_unit_test(softmax_bwd_in_place),
      cmocka_unit_test(permute_matches_reference),
      cmocka_unit_test(embedding_matches_reference),
      cmocka_unit_test(embedding_rejects_bad_ids),
      cmocka_unit_test(xent_correct_matches_scan),
      cmocka_unit_test(xent_in_place_matches_reference),
  };
  return AX_TEST_MAIN(t);
}
