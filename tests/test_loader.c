/* The synthetic data set and ax_loader: determinism of examples and of
 * (seed, epoch) batch orders, every example once per epoch, drop_last. */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "axon/models/data/dataset.h"

static int64_t *iota(int64_t n) {
  int64_t *v = malloc(sizeof *v * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    v[i] = i;
  return v;
}

static ax_dataset *open_synth(const char *s, int split) {
  ax_config cfg;
  AX_ASSERT_OK(ax_config_parse(&cfg, s));
  ax_dataset *ds;
  AX_ASSERT_OK(ax_dataset_open("synthetic", &cfg, split, &ds));
  return ds;
}

static void test_synthetic(void **state) {
  (void)state;
  ax_dataset *ds = open_synth("shape=3/4/5,classes=7,examples=50,seed=3", 0);
  assert_int_equal(ax_dataset_size(ds), 50);
  assert_int_equal(ax_dataset_classes(ds), 7);
  int64_t *all = iota(50), two[2] = {31, 4}, dims[4] = {50, 3, 4, 5};
  ax_tlist in = {0}, lb = {0}, in2 = {0}, lb2 = {0};
  AX_ASSERT_OK(ax_dataset_batch(ds, all, 50, &in, &lb));
  AX_ASSERT_OK(ax_tensor_check(in.t[0], "x", AX_F32, 4, dims));
  AX_ASSERT_OK(ax_dataset_batch(ds, two, 2, &in2, &lb2));
  for (int b = 0; b < 2; b++) {
    assert_int_equal(ax_i32(lb2.t[0])[b], ax_i32(lb.t[0])[two[b]]);
    assert_memory_equal(ax_f32(in2.t[0]) + b * 60,
                        ax_f32(in.t[0]) + two[b] * 60, 60 * sizeof(float));
  }
  double s = 0, s2 = 0;
  for (int i = 0; i < 50 * 60; i++)
    s += ax_f32(in.t[0])[i], s2 += ax_f32(in.t[0])[i] * ax_f32(in.t[0])[i];
  assert_true(fabs(s / 3000) < 0.1 && fabs(s2 / 3000 - 1) < 0.1);
  for (int i = 0; i < 50; i++)
    assert_true(ax_i32(lb.t[0])[i] >= 0 && ax_i32(lb.t[0])[i] < 7);
  ax_tlist_clear(&in2);
  ax_tlist_clear(&lb2);
  /* The test split draws other values. */
  ax_dataset *te = open_synth("shape=3/4/5,classes=7,examples=50,seed=3", 1);
  AX_ASSERT_OK(ax_dataset_batch(te, two, 2, &in2, &lb2));
  assert_true(ax_f32(in2.t[0])[0] != ax_f32(in.t[0])[31 * 60]);
  ax_tlist_clear(&in2);
  ax_tlist_clear(&lb2);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lb);
  ax_dataset_close(te);
  ax_dataset_close(ds);
  free(all);
  ax_config cfg;
  AX_ASSERT_OK(ax_config_parse(&cfg, "shape=1/2"));
  AX_ASSERT_ERR(ax_dataset_open("synthetic", &cfg, 0, &ds), AX_EINVAL);
}

/* Runs one epoch; writes the example order into order (identified through
 * each example's unique input value) and returns the batch count. */
static int run_epoch(ax_loader *ld, int epoch, const float *ref, int n,
                     int *order, int *sizes) {
  ax_loader_start(ld, epoch);
  ax_tlist in = {0}, lb = {0};
  int nb = 0, k = 0, rc;
  while ((rc = ax_loader_next(ld, &in, &lb)) == AX_OK) {
    sizes[nb++] = (int)in.t[0]->shape[0];
    for (int64_t b = 0; b < in.t[0]->shape[0]; b++) {
      int found = -1;
      for (int i = 0; i < n; i++)
        if (ref[i] == ax_f32(in.t[0])[b])
          found = i;
      assert_true(found >= 0);
      order[k++] = found;
    }
    ax_tlist_clear(&in);
    ax_tlist_clear(&lb);
  }
  assert_int_equal(rc, AX_ECLOSED);
  return nb;
}

static void test_loader(void **state) {
  (void)state;
  enum { N = 23 };
  ax_dataset *ds = open_synth("shape=1,examples=23,seed=5", 0);
  int64_t *all = iota(N);
  ax_tlist in = {0}, lb = {0};
  AX_ASSERT_OK(ax_dataset_batch(ds, all, N, &in, &lb));
  float ref[N];
  memcpy(ref, ax_f32(in.t[0]), sizeof ref);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lb);
  free(all);
  int o1[N], o2[N], o3[N], sz[N];
  ax_loader *ld, *ld2;
  AX_ASSERT_OK(ax_loader_new(ds, 5, 1, 0, 42, &ld));
  assert_int_equal(ax_loader_batches(ld), 5);
  assert_int_equal(run_epoch(ld, 0, ref, N, o1, sz), 5);
  assert_int_equal(sz[4], 3); /* the short last batch */
  int seen[N] = {0};
  for (int i = 0; i < N; i++)
    seen[o1[i]]++;
  for (int i = 0; i < N; i++)
    assert_int_equal(seen[i], 1);
  AX_ASSERT_OK(ax_loader_new(ds, 5, 1, 0, 42, &ld2)); /* same seed, epoch */
  run_epoch(ld2, 0, ref, N, o2, sz);
  assert_memory_equal(o1, o2, sizeof o1);
  run_epoch(ld2, 1, ref, N, o3, sz); /* another epoch, another order */
  assert_memory_not_equal(o1, o3, sizeof o1);
  memset(seen, 0, sizeof seen);
  for (int i = 0; i < N; i++)
    seen[o3[i]]++;
  for (int i = 0; i < N; i++)
    assert_int_equal(seen[i], 1);
  run_epoch(ld, 0, ref, N, o2, sz); /* restarting replays epoch 0 */
  assert_memory_equal(o1, o2, sizeof o1);
  ax_loader_free(ld);
  ax_loader_free(ld2);
  /* drop_last: 4 full batches of 5, the 3 left over never appear. */
  AX_ASSERT_OK(ax_loader_new(ds, 5, 1, 1, 42, &ld));
  assert_int_equal(ax_loader_batches(ld), 4);
  assert_int_equal(run_epoch(ld, 0, ref, N, o2, sz), 4);
  assert_memory_equal(o1, o2, 20 * sizeof(int));
  for (int i = 0; i < 4; i++)
    assert_int_equal(sz[i], 5);
  ax_loader_free(ld);
  /* No shuffle: the data set order. */
  AX_ASSERT_OK(ax_loader_new(ds, 7, 0, 0, 42, &ld));
  assert_int_equal(run_epoch(ld, 3, ref, N, o2, sz), 4);
  for (int i = 0; i < N; i++)
    assert_int_equal(o2[i], i);
  ax_loader_free(ld);
  AX_ASSERT_ERR(ax_loader_new(ds, 0, 1, 0, 42, &ld), AX_EINVAL);
  ax_dataset_close(ds);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(test_synthetic),
      cmocka_unit_test(test_loader),
  };
  return AX_TEST_MAIN(t);
}
