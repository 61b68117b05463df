/* Tensors (views, reshapes, reference counts, copies, errors), devices and
 * configurations. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/models/config.h"
#include "harness.h"

static void views_share_storage(void **state) {
  ax_tensor *t =
      ax_tensor_new_v(AX_F32, AX_CPU, 3, (int64_t)4, (int64_t)2, (int64_t)3);
  assert_non_null(t);
  for (int i = 0; i < 24; i++)
    ax_f32(t)[i] = (float)i;
  ax_tensor *v = ax_tensor_slice0(t, 1, 2);
  assert_non_null(v);
  assert_int_equal(v->shape[0], 2);
  assert_int_equal(ax_tensor_numel(v), 12);
  assert_ptr_equal(v->storage, t->storage);
  assert_true(ax_f32(v)[0] == 6.0f);
  ax_f32(v)[0] = -1.0f; /* writes through to the base */
  assert_true(ax_f32(t)[6] == -1.0f);
  /* The view keeps the storage alive after the base is released. */
  long storages = ax_storage_live_count();
  ax_tensor_release(t);
  assert_int_equal(ax_storage_live_count(), storages);
  assert_true(ax_f32(v)[11] == 17.0f);
  int64_t flat[1] = {12};
  ax_tensor *r = ax_tensor_reshape(v, 1, flat);
  assert_non_null(r);
  assert_true(ax_f32(r)[11] == 17.0f);
  ax_tensor_release(v);
  ax_tensor_release(r);
  assert_int_equal(ax_storage_live_count(), storages - 1);
}

static void count_release(void *ctx, void *data) {
  int *n = ctx;
  (*n)++;
  free(data);
}

/* A tensor over caller memory calls its release function once, when the
 * last view goes, and counts as a live tensor and storage until then. */
static void from_blob_releases_once(void **state) {
  long tensors = ax_tensor_live_count(), storages = ax_storage_live_count();
  int released = 0;
  float *mem = malloc(6 * sizeof *mem);
  int64_t shape[2] = {2, 3};
  ax_tensor *t = ax_tensor_from_blob(AX_F32, 2, shape, AX_CPU, mem,
                                     count_release, &released);
  assert_non_null(t);
  assert_ptr_equal(t->data, mem);
  assert_int_equal(ax_storage_live_count(), storages + 1);
  ax_tensor *v = ax_tensor_slice0(t, 1, 1);
  ax_tensor_release(t);
  assert_int_equal(released, 0); /* the view still holds the storage */
  ax_tensor_release(v);
  assert_int_equal(released, 1);
  assert_int_equal(ax_tensor_live_count(), tensors);
  assert_int_equal(ax_storage_live_count(), storages);
  /* Without a release function the memory is only borrowed. */
  float local[6];
  t = ax_tensor_from_blob(AX_F32, 2, shape, AX_CPU, local, NULL, NULL);
  assert_non_null(t);
  ax_tensor_release(t);
  /* On failure nothing is released and nothing stays live. */
  int64_t bad[1] = {-1};
  assert_null(ax_tensor_from_blob(AX_F32, 1, bad, AX_CPU, local, count_release,
                                  &released));
  assert_int_equal(released, 1);
  assert_int_equal(ax_storage_live_count(), storages);
}

static void bad_shapes_are_errors(void **state) {
  ax_tensor *t = ax_tensor_new_v(AX_I64, AX_CPU, 2, (int64_t)3, (int64_t)2);
  assert_null(ax_tensor_slice0(t, 2, 2));
  int64_t bad[1] = {7};
  assert_null(ax_tensor_reshape(t, 1, bad));
  int64_t neg[2] = {2, -1};
  assert_null(ax_tensor_new(AX_F32, 2, neg, AX_CPU));
  assert_null(ax_tensor_new(AX_F32, AX_MAX_DIMS + 1, neg, AX_CPU));
  ax_tensor *f = ax_tensor_new_v(AX_F32, AX_CPU, 1, (int64_t)6);
  AX_ASSERT_ERR(ax_tensor_copy(f, t), AX_ESHAPE); /* dtype differs */
  AX_ASSERT_ERR(ax_tensor_fill(t, 1.0f), AX_EDTYPE);
  int64_t dims[2] = {3, 3};
  AX_ASSERT_ERR(ax_tensor_check(t, "labels", AX_I64, 2, dims), AX_ESHAPE);
  assert_non_null(strstr(ax_errmsg(), "labels"));
  AX_ASSERT_ERR(ax_tensor_check(t, "labels", AX_I32, 2, NULL), AX_EDTYPE);
  ax_tensor_release(t);
  ax_tensor_release(f);
}

static void copies_and_conversions(void **state) {
  ax_tensor *a = ax_tensor_new_v(AX_I64, AX_CPU, 1, (int64_t)3);
  int64_t v[3] = {5, -2, 1 << 20};
  AX_ASSERT_OK(ax_tensor_write(a, v, sizeof v));
  ax_tensor *b = ax_tensor_to_i32(a);
  assert_int_equal(b->dtype, AX_I32);
  assert_int_equal(ax_i32(b)[1], -2);
  assert_int_equal(ax_i32(b)[2], 1 << 20);
  ax_tensor *c = ax_tensor_like(a);
  AX_ASSERT_OK(ax_tensor_copy(c, a));
  int64_t back[3];
  AX_ASSERT_OK(ax_tensor_read(c, back, sizeof back));
  assert_memory_equal(back, v, sizeof v);
  AX_ASSERT_ERR(ax_tensor_read(c, back, 8), AX_ESHAPE);
  ax_tensor *z = ax_tensor_zeros(AX_F32, 2, (int64_t[]){2, 2}, AX_CPU);
  for (int i = 0; i < 4; i++)
    assert_true(ax_f32(z)[i] == 0.0f);
  ax_tensor *same = ax_tensor_to(z, AX_CPU);
  assert_ptr_equal(same, z);
  ax_tensor_release(same);
  ax_tensor_release(a);
  ax_tensor_release(b);
  ax_tensor_release(c);
  ax_tensor_release(z);
}

static void devices(void **state) {
  ax_device d;
  char buf[16];
  AX_ASSERT_OK(ax_device_parse("cpu", &d));
  assert_int_equal(d.type, AX_DEV_CPU);
  AX_ASSERT_OK(ax_device_parse("cuda:3", &d));
  assert_int_equal(d.index, 3);
  assert_string_equal(ax_device_str(d, buf, sizeof buf), "cuda:3");
  AX_ASSERT_ERR(ax_device_parse("tpu", &d), AX_EINVAL);
  AX_ASSERT_ERR(ax_device_parse("cuda:x", &d), AX_EINVAL);
  if (ax_cuda_device_count() == 0) {
    /* No GPU here: creating a CUDA tensor is a clear error, not a crash. */
    ax_device g = {AX_DEV_CUDA, 0};
    assert_null(ax_tensor_new_v(AX_F32, g, 1, (int64_t)4));
    assert_true(strstr(ax_errmsg(), "cuda:0") != NULL);
  }
}

static void configs(void **state) {
  ax_config c;
  AX_ASSERT_OK(ax_config_parse(&c, "widths=784/256/10,lr=0.5,name=x"));
  int err = AX_OK;
  int64_t w[4];
  assert_int_equal(ax_config_ints(&c, "widths", w, 4, &err), 3);
  assert_int_equal(w[1], 256);
  AX_ASSERT_CLOSE(ax_config_float(&c, "lr", 0, &err), 0.5, 0, 0);
  assert_int_equal(ax_config_int(&c, "missing", 42, &err), 42);
  AX_ASSERT_OK(err);
  ax_config_int(&c, "name", 0, &err);
  AX_ASSERT_ERR(err, AX_EINVAL);
  AX_ASSERT_ERR(ax_config_parse(&c, "novalue"), AX_EINVAL);
  ax_config a, b;
  AX_ASSERT_OK(ax_config_parse(&a, "x=1,y=2"));
  AX_ASSERT_OK(ax_config_parse(&b, "y=3"));
  AX_ASSERT_OK(ax_config_merge(&a, &b));
  char buf[64];
  assert_string_equal(ax_config_format(&a, buf, sizeof buf), "x=1,y=3");
}

static void error_strings(void **state) {
  assert_string_equal(ax_strerror(AX_OK), "success");
  assert_string_equal(ax_errname(AX_ESHAPE), "AX_ESHAPE");
  assert_string_equal(ax_strerror(AX_ETIMEOUT), "deadline exceeded");
  assert_string_equal(ax_strerror(-12345), "unknown error");
  assert_int_equal(ax_seterr(AX_EIO, "file %s", "x"), AX_EIO);
  assert_string_equal(ax_errmsg(), "file x");
  /* A message over 511 bytes keeps its start and its end (the cause of a
   * nested remote error), and may quote the message it replaces. */
  char nested[1200];
  size_t k = 0;
  for (int i = 0; i < 50; i++)
    k += (size_t)snprintf(nested + k, sizeof nested - k,
                          "w2: axon.test.chain: ");
  snprintf(nested + k, sizeof nested - k, "call depth 33");
  ax_seterr(AX_EINVAL, "%s", nested);
  const char *m = ax_errmsg();
  assert_int_equal(strlen(m), 511);
  assert_memory_equal(m, "w2: axon.test.chain: w2:", 24);
  assert_non_null(strstr(m, " ... "));
  assert_string_equal(m + 511 - 24, "est.chain: call depth 33");
  ax_seterr(AX_EINVAL, "outer: %s", ax_errmsg());
  assert_memory_equal(ax_errmsg(), "outer: w2: axon.test.chain", 26);
  assert_non_null(strstr(ax_errmsg(), "call depth 33"));
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(views_share_storage),
      cmocka_unit_test(from_blob_releases_once),
      cmocka_unit_test(bad_shapes_are_errors),
      cmocka_unit_test(copies_and_conversions),
      cmocka_unit_test(devices),
      cmocka_unit_test(configs),
      cmocka_unit_test(error_strings),
  };
  return AX_TEST_MAIN(t);
}
