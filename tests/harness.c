#include "harness.h"

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "axon/kernels/backend-impl.h"
#include "axon/kernels/rng.h"

int ax_test_run(const char *name, const struct CMUnitTest *tests, size_t n) {
  long t0 = ax_tensor_live_count(), s0 = ax_storage_live_count();
  int failed = _cmocka_run_group_tests(name, tests, n, NULL, NULL);
  long t1 = ax_tensor_live_count(), s1 = ax_storage_live_count();
  if (t1 != t0 || s1 != s0) {
    fprintf(stderr,
            "[  LEAK    ] %s: %ld tensor handles and %ld storages "
            "still alive\n",
            name, t1 - t0, s1 - s0);
    failed++;
  }
  return failed;
}

int ax_test_run_cuda(const char *name, const struct CMUnitTest *tests,
                     size_t n) {
  if (ax_cuda_device_count() == 0) {
    printf("SKIP: %s: no CUDA device present (the CUDA code is compiled; "
           "these tests run on a GPU host)\n",
           name);
    return 77;
  }
  return ax_test_run(name, tests, n);
}

ax_tensor *ax_test_randn(uint64_t seed, float scale, int ndim,
                         const int64_t *shape) {
  ax_tensor *t = ax_tensor_new(AX_F32, ndim, shape, AX_CPU);
  assert_non_null(t);
  ax_rng r;
  ax_rng_seed(&r, seed);
  float *p = ax_f32(t);
  for (size_t i = 0; i < ax_tensor_numel(t); i++)
    p[i] = scale * (float)ax_rng_normal(&r);
  return t;
}

ax_tensor *ax_test_randint(uint64_t seed, int32_t lo, int32_t hi, int ndim,
                           const int64_t *shape) {
  ax_tensor *t = ax_tensor_new(AX_I32, ndim, shape, AX_CPU);
  assert_non_null(t);
  ax_rng r;
  ax_rng_seed(&r, seed);
  int32_t *p = ax_i32(t);
  for (size_t i = 0; i < ax_tensor_numel(t); i++)
    p[i] = lo + (int32_t)ax_rng_below(&r, (uint64_t)(hi - lo));
  return t;
}

double ax_test_close_ratio(const float *a, const float *b, size_t n,
                           double atol, double rtol) {
  double worst = 0.0;
  for (size_t i = 0; i < n; i++) {
    double r = fabs((double)a[i] - b[i]) / (atol + rtol * fabs((double)b[i]));
    if (r > worst || isnan(r))
      worst = isnan(r) ? INFINITY : r;
  }
  return worst;
}

/* loss = sum_i <out_i, R_i>, with R_i drawn from a fixed seed (outputs
 * read on the host, wherever the net runs). */
static double probe_loss(ax_net *net, const ax_tlist *in, int update_stats) {
  ax_slot *slot = ax_slot_new();
  ax_exec ex = ax_net_exec(net, 1);
  ex.seed = 99;
  ex.update_stats = update_stats;
  ax_tlist out = {0};
  AX_ASSERT_OK(ax_forward(net->root, &ex, slot, in, &out));
  double loss = 0.0;
  for (int i = 0; i < out.n; i++) {
    if (!out.t[i] || out.t[i]->dtype != AX_F32)
      continue;
    ax_tensor *h = ax_tensor_to(out.t[i], AX_CPU);
    assert_non_null(h);
    ax_rng r;
    ax_rng_seed(&r, 1000 + (uint64_t)i);
    const float *o = ax_f32(h);
    for (size_t j = 0; j < ax_tensor_numel(h); j++)
      loss += (double)o[j] * ax_rng_normal(&r);
    ax_tensor_release(h);
  }
  ax_tlist_clear(&out);
  ax_slot_free(slot);
  return loss;
}

/* Element i of f32 tensor x, on any device. */
static float elem_get(const ax_tensor *x, size_t i) {
  float v;
  ax_backend *be = ax_backend_of(x->device);
  AX_ASSERT_OK(AX_K(be, copy_to_host, &v, ax_f32(x) + i, sizeof v));
  return v;
}

static void elem_set(ax_tensor *x, size_t i, float v) {
  ax_backend *be = ax_backend_of(x->device);
  AX_ASSERT_OK(AX_K(be, copy_from_host, ax_f32(x) + i, &v, sizeof v));
}

static void check_coord(ax_tensor *x, size_t i, float analytic, ax_net *net,
                        const ax_tlist *in, double eps, double atol,
                        double rtol, const char *what, double *worst,
                        char *report, size_t report_len) {
  float saved = elem_get(x, i);
  elem_set(x, i, saved + (float)eps);
  double lp = probe_loss(net, in, 0);
  elem_set(x, i, saved - (float)eps);
  double lm = probe_loss(net, in, 0);
  elem_set(x, i, saved);
  double numeric = (lp - lm) / (2.0 * eps);
  double ratio = fabs(analytic - numeric) / (atol + rtol * fabs(numeric));
  if (ratio > *worst) {
    *worst = ratio;
    snprintf(report, report_len, "%s[%zu]: analytic %.6g numeric %.6g", what, i,
             (double)analytic, numeric);
  }
}

/* 1 when every element of the f32 tensor x (any device) is zero. */
static int all_zero(const ax_tensor *x) {
  ax_tensor *h = ax_tensor_to(x, AX_CPU);
  assert_non_null(h);
  int zero = 1;
  for (size_t i = 0; i < ax_tensor_numel(h) && zero; i++)
    zero = ax_f32(h)[i] == 0.0f;
  ax_tensor_release(h);
  return zero;
}

/* The analytic gradients: ax_backward, or (split) the input half then the
 * weight half, with the split's own contract checked in between. */
static void analytic_backward(ax_net *net, const ax_exec *ex, ax_slot *slot,
                              const ax_tlist *dout, ax_tlist *din, int split) {
  if (!split) {
    AX_ASSERT_OK(ax_backward(net->root, ex, slot, dout, din));
    return;
  }
  AX_ASSERT_OK(ax_backward_input(net->root, ex, slot, dout, din));
  if (!all_zero(net->grads))
    fail_msg("the input half of %s wrote parameter gradients",
             net->root->ops->kind);
  AX_ASSERT_OK(ax_backward_weight(net->root, ex, slot));
  if (ax_slot_bytes(slot) != 0)
    fail_msg("%s still holds %zu bytes after its weight half",
             net->root->ops->kind, ax_slot_bytes(slot));
}

static void gradcheck(ax_device dev, ax_module *m, const ax_tlist *host_in,
                      unsigned input_mask, int samples, double eps, double atol,
                      double rtol, int split);

void ax_test_gradcheck(ax_module *m, const ax_tlist *inputs,
                       unsigned input_mask, int samples, double eps,
                       double atol, double rtol) {
  gradcheck(AX_CPU, m, inputs, input_mask, samples, eps, atol, rtol, 0);
}

void ax_test_gradcheck_on(ax_device dev, ax_module *m, const ax_tlist *inputs,
                          unsigned input_mask, int samples, double eps,
                          double atol, double rtol) {
  gradcheck(dev, m, inputs, input_mask, samples, eps, atol, rtol, 0);
}

void ax_test_gradcheck_split(ax_module *m, const ax_tlist *inputs,
                             unsigned input_mask, int samples, double eps,
                             double atol, double rtol) {
  gradcheck(AX_CPU, m, inputs, input_mask, samples, eps, atol, rtol, 1);
}

static void gradcheck(ax_device dev, ax_module *m, const ax_tlist *host_in,
                      unsigned input_mask, int samples, double eps, double atol,
                      double rtol, int split) {
  ax_net *net = ax_net_new(m, dev, 7);
  assert_non_null(net);
  ax_tlist in = {0}; /* the inputs on dev (references when already there) */
  in.n = host_in->n;
  for (int k = 0; k < host_in->n; k++)
    if (host_in->t[k])
      assert_non_null(in.t[k] = ax_tensor_to(host_in->t[k], dev));
  /* Analytic gradients of loss = sum <out, R>. */
  ax_slot *slot = ax_slot_new();
  ax_exec ex = ax_net_exec(net, 1);
  ex.seed = 99;
  ex.update_stats = 0;
  ax_tlist out = {0}, dout = {0}, din = {0};
  AX_ASSERT_OK(ax_forward(net->root, &ex, slot, &in, &out));
  dout.n = out.n;
  for (int i = 0; i < out.n; i++) {
    if (!out.t[i] || out.t[i]->dtype != AX_F32)
      continue;
    ax_tensor *h =
        ax_tensor_new(AX_F32, out.t[i]->ndim, out.t[i]->shape, AX_CPU);
    assert_non_null(h);
    ax_rng r;
    ax_rng_seed(&r, 1000 + (uint64_t)i);
    float *d = ax_f32(h);
    for (size_t j = 0; j < ax_tensor_numel(h); j++)
      d[j] = (float)ax_rng_normal(&r);
    assert_non_null(dout.t[i] = ax_tensor_to(h, dev));
    ax_tensor_release(h);
  }
  AX_ASSERT_OK(ax_net_zero_grad(net));
  ex.need_dx = input_mask != 0;
  analytic_backward(net, &ex, slot, &dout, &din, split);
  ax_tlist_clear(&out);
  ax_tlist_clear(&dout);
  ax_slot_free(slot);

  double worst = 0.0;
  char report[256] = "";
  ax_rng pick;
  ax_rng_seed(&pick, 4242);
  ax_tensor *g = ax_tensor_to(net->grads, AX_CPU);
  assert_non_null(g);
  size_t np = net->n_params;
  for (int s = 0; s < samples && np; s++) {
    size_t i = (size_t)ax_rng_below(&pick, np);
    check_coord(net->params, i, ax_f32(g)[i], net, &in, eps, atol, rtol,
                "param", &worst, report, sizeof report);
  }
  ax_tensor_release(g);
  for (int k = 0; k < in.n; k++) {
    ax_tensor *x = in.t[k];
    if (!(input_mask & (1u << k)) || !x || x->dtype != AX_F32)
      continue;
    assert_true(k < din.n && din.t[k] != NULL);
    assert_true(ax_tensor_same_shape(din.t[k], x));
    size_t nx = ax_tensor_numel(x);
    ax_tensor *dx = ax_tensor_to(din.t[k], AX_CPU);
    assert_non_null(dx);
    char what[32];
    snprintf(what, sizeof what, "input%d", k);
    for (int s = 0; s < samples && nx; s++) {
      size_t i = (size_t)ax_rng_below(&pick, nx);
      check_coord(x, i, ax_f32(dx)[i], net, &in, eps, atol, rtol, what, &worst,
                  report, sizeof report);
    }
    ax_tensor_release(dx);
  }
  ax_tlist_clear(&din);
  ax_tlist_clear(&in);
  ax_net_free(net);
  if (worst > 1.0)
    fail_msg("gradcheck%s on %s: worst ratio %.3g at %s",
             split ? " (split backward)" : "",
             dev.type == AX_DEV_CPU ? "cpu" : "cuda", worst, report);
}

int ax_test_bert_batch(long t, int B, int T, int pad, ax_tlist *in,
                       ax_tlist *lab) {
  int64_t shape[2] = {B, T}, rows = (int64_t)B * T, b1 = B;
  in->n = 3;
  in->t[0] = ax_test_randint(100 + (uint64_t)t, 0, 50, 2, shape);
  in->t[1] = ax_test_randint(200 + (uint64_t)t, 0, 2, 2, shape);
  in->t[2] = ax_tensor_new(AX_F32, 2, shape, AX_CPU);
  if (!in->t[0] || !in->t[1] || !in->t[2])
    return AX_ENOMEM;
  for (int b = 0; b < B; b++)
    for (int s = 0; s < T; s++)
      ax_f32(in->t[2])[b * T + s] = (b % 2 && s >= T - pad) ? 0.f : 1.f;
  lab->n = 2;
  lab->t[0] = ax_test_randint(300 + (uint64_t)t, 0, 50, 1, &rows);
  lab->t[1] = ax_test_randint(400 + (uint64_t)t, 0, 2, 1, &b1);
  if (!lab->t[0] || !lab->t[1])
    return AX_ENOMEM;
  int32_t *l = (int32_t *)lab->t[0]->data;
  for (int64_t i = 0; i < rows; i++)
    if ((i * 7 + t) % 4 != 0)
      l[i] = -100;
  return AX_OK;
}

int ax_test_lm_batch(long t, int B, int T, int vocab, ax_tlist *in,
                     ax_tlist *lab) {
  ax_tensor *x = ax_tensor_new_v(AX_I32, AX_CPU, 2, B, T),
            *y = ax_tensor_new_v(AX_I32, AX_CPU, 1, B * T);
  if (!x || !y) {
    ax_tensor_release(x);
    ax_tensor_release(y);
    return AX_ENOMEM;
  }
  ax_rng r;
  ax_rng_seed2(&r, 99, (uint64_t)t);
  for (int b = 0; b < B; b++) {
    int prev = (int)ax_rng_below(&r, (uint64_t)vocab);
    for (int i = 0; i < T; i++) {
      int next = (int)ax_rng_below(&r, (uint64_t)vocab);
      ax_i32(x)[b * T + i] = prev;
      ax_i32(y)[b * T + i] = next;
      prev = next;
    }
  }
  *in = ax_tlist1(x);
  *lab = ax_tlist1(y);
  return AX_OK;
}

void ax_test_mkdtemp(char *dir, const char *tag) {
  snprintf(dir, 64, "/tmp/axon-%.20s-XXXXXX", tag);
  assert_non_null(mkdtemp(dir));
}

static int rm_entry(const char *p, const struct stat *st, int flag,
                    struct FTW *f) {
  (void)st, (void)flag, (void)f;
  return remove(p);
}

void ax_test_rmtree(const char *dir) {
  nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

const char *ax_test_write_file(const char *dir, const char *name, const void *p,
                               size_t n, int gz) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (gz) {
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, p, (unsigned)n), (int)n);
    assert_int_equal(gzclose(f), Z_OK);
  } else {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
  }
  return path;
}
