/* Value lists, the frame codec (round trip, truncation, garbage), futures,
 * and an in-process pair of nodes (small and bulk calls, local calls). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/codec-impl.h"
#include "axon/rpc/rpc.h"
#include "harness.h"
#include "tests/mp_testutil.h"

static ax_values *sample(void) {
  ax_values *v = ax_values_new();
  assert_non_null(v);
  AX_ASSERT_OK(ax_values_add_i64(v, -1234567890123LL));
  AX_ASSERT_OK(ax_values_add_f64(v, 3.25));
  AX_ASSERT_OK(ax_values_add_str(v, "héllo"));
  AX_ASSERT_OK(ax_values_add_bytes(v, "\0\1\2", 3));
  int64_t shape[2] = {3, 5};
  ax_tensor *t = ax_test_randn(1, 1.0f, 2, shape);
  AX_ASSERT_OK(ax_values_add_tensor(v, t));
  ax_tensor_release(t);
  ax_tensor *e = ax_tensor_new(AX_I64, 1, (int64_t[]){0}, AX_CPU);
  AX_ASSERT_OK(ax_values_add_tensor(v, e)); /* empty tensor */
  ax_tensor_release(e);
  return v;
}

static void check_sample(const ax_values *a, const ax_values *b) {
  assert_int_equal(ax_values_count(a), ax_values_count(b));
  int64_t i;
  double d;
  const char *s;
  const void *p;
  size_t n;
  ax_tensor *t, *u;
  AX_ASSERT_OK(ax_values_get_i64(b, 0, &i));
  assert_true(i == -1234567890123LL);
  AX_ASSERT_OK(ax_values_get_f64(b, 1, &d));
  assert_true(d == 3.25);
  AX_ASSERT_OK(ax_values_get_str(b, 2, &s));
  assert_string_equal(s, "héllo");
  AX_ASSERT_OK(ax_values_get_bytes(b, 3, &p, &n));
  assert_int_equal(n, 3);
  assert_memory_equal(p, "\0\1\2", 3);
  AX_ASSERT_OK(ax_values_get_tensor(a, 4, &t));
  AX_ASSERT_OK(ax_values_get_tensor(b, 4, &u));
  assert_true(ax_tensor_same_shape(t, u));
  assert_memory_equal(t->data, u->data, ax_tensor_nbytes(t));
  AX_ASSERT_OK(ax_values_get_tensor(b, 5, &u));
  assert_int_equal(u->dtype, AX_I64);
  assert_int_equal(ax_tensor_numel(u), 0);
}

static void test_values_types(void **state) {
  ax_values *v = sample();
  int64_t i;
  const char *s;
  AX_ASSERT_ERR(ax_values_get_i64(v, 2, &i), AX_EBADARG);
  AX_ASSERT_ERR(ax_values_get_str(v, 0, &s), AX_EBADARG);
  AX_ASSERT_ERR(ax_values_get_i64(v, 99, &i), AX_EBADARG);
  assert_int_equal(ax_values_type(v, 4), AX_VAL_TENSOR);
  ax_values *c = ax_values_clone(v);
  check_sample(v, c);
  ax_values_free(c);
  ax_values_free(v);
}

static void encode(const ax_values *v, uint8_t **buf, size_t *len) {
  axi_msg m = {.kind = AXI_REQUEST,
               .call_id = 77,
               .fn = "f",
               .values = (ax_values *)v,
               .timeout_ms = 1000,
               .autograd_ctx = 9};
  size_t blob;
  AX_ASSERT_OK(axi_frame_encode(&m, 0, 1, buf, len, &blob));
}

/* A view of a part of a list reads like a list of its own, copies nothing,
 * never grows and is never freed; append copies it; truncate drops. */
static void test_values_view(void **state) {
  ax_values *v = sample();
  ax_values_view view;
  const ax_values *w = ax_values_view_range(v, 2, 5, &view);
  assert_non_null(w);
  assert_int_equal(ax_values_count(w), 3);
  const char *s, *s0;
  ax_tensor *t, *t0;
  AX_ASSERT_OK(ax_values_get_str(w, 0, &s));
  AX_ASSERT_OK(ax_values_get_str(v, 2, &s0));
  assert_ptr_equal(s, s0); /* the list's own string */
  AX_ASSERT_OK(ax_values_get_tensor(w, 2, &t));
  AX_ASSERT_OK(ax_values_get_tensor(v, 4, &t0));
  assert_ptr_equal(t, t0);
  AX_ASSERT_ERR(ax_values_get_i64(w, 3, &(int64_t){0}), AX_EBADARG);
  AX_ASSERT_ERR(ax_values_add_i64((ax_values *)w, 1), AX_EINVAL);
  ax_values_free((ax_values *)w); /* ignored */
  ax_values_truncate((ax_values *)w, 0);
  assert_int_equal(ax_values_count(w), 3);
  assert_null(ax_values_view_range(v, 4, 3, &view));
  assert_null(ax_values_view_range(v, 0, 7, &view));
  assert_int_equal(ax_values_count(ax_values_view_range(v, 6, 6, &view)), 0);
  /* append: a copy of the view; the original and the copy stay apart */
  ax_values *c = ax_values_new();
  AX_ASSERT_OK(ax_values_append(c, ax_values_view_range(v, 2, 5, &view)));
  AX_ASSERT_OK(ax_values_append(c, c)); /* itself: doubled */
  assert_int_equal(ax_values_count(c), 6);
  AX_ASSERT_OK(ax_values_get_str(c, 3, &s));
  assert_string_equal(s, "héllo");
  assert_ptr_not_equal(s, s0);
  AX_ASSERT_OK(ax_values_get_tensor(c, 5, &t));
  assert_ptr_equal(t, t0); /* tensors shared */
  ax_values_truncate(c, 1);
  assert_int_equal(ax_values_count(c), 1);
  ax_values_truncate(c, 5);
  assert_int_equal(ax_values_count(c), 1);
  ax_values_free(c);
  ax_values_free(v);
}

static void test_codec_roundtrip(void **state) {
  ax_values *v = sample();
  uint8_t *buf;
  size_t len;
  encode(v, &buf, &len);
  axi_msg m;
  AX_ASSERT_OK(axi_frame_decode(buf, len, AX_CPU, NULL, 1u << 30, &m));
  assert_int_equal(m.kind, AXI_REQUEST);
  assert_true(m.call_id == 77 && m.autograd_ctx == 9);
  assert_string_equal(m.fn, "f");
  check_sample(v, m.values);
  axi_msg_clear(&m);
  free(buf);
  ax_values_free(v);
}

/* Every truncation and a few thousand random corruptions decode to an
 * error or to a valid message, never to a crash (ASan checks the reads). */
static void test_codec_malformed(void **state) {
  ax_values *v = sample();
  uint8_t *buf;
  size_t len;
  encode(v, &buf, &len);
  axi_msg m;
  for (size_t cut = 0; cut < len; cut++) {
    int rc = axi_frame_decode(buf, cut, AX_CPU, NULL, 1u << 30, &m);
    assert_int_equal(rc, AX_EMALFORMED);
    axi_msg_clear(&m);
  }
  uint8_t *bad = malloc(len);
  srand(5);
  int errors = 0;
  for (int k = 0; k < 3000; k++) {
    memcpy(bad, buf, len);
    int flips = 1 + rand() % 4;
    for (int f = 0; f < flips; f++)
      bad[rand() % len] = (uint8_t)rand();
    int rc = axi_frame_decode(bad, len, AX_CPU, NULL, 1u << 30, &m);
    errors += rc != AX_OK;
    assert_true(rc == AX_OK || rc == AX_EMALFORMED || rc == AX_ETOOBIG ||
                rc == AX_ENOMEM);
    axi_msg_clear(&m);
  }
  assert_true(errors > 0);
  /* Pure garbage, and a body that claims a huge tensor. */
  for (int k = 0; k < 1000; k++) {
    size_t n = (size_t)(rand() % 200);
    for (size_t i = 0; i < n; i++)
      bad[i % len] = (uint8_t)rand();
    int rc =
        axi_frame_decode(bad, n < len ? n : len, AX_CPU, NULL, 1u << 30, &m);
    assert_true(rc != AX_OK || m.kind != 0);
    axi_msg_clear(&m);
  }
  /* A limit smaller than the tensor bytes gives AX_ETOOBIG. */
  assert_int_equal(axi_frame_decode(buf, len, AX_CPU, NULL, 16, &m),
                   AX_ETOOBIG);
  axi_msg_clear(&m);
  free(bad);
  free(buf);
  ax_values_free(v);
}

static int g_cb_count;
static void count_cb(ax_future *f, void *user) {
  __atomic_add_fetch(&g_cb_count, 1, __ATOMIC_RELAXED);
}

static void test_future(void **state) {
  ax_future *f = ax_future_new();
  g_cb_count = 0;
  AX_ASSERT_OK(ax_future_on_done(f, count_cb, NULL));
  AX_ASSERT_ERR(ax_future_wait(f, 10), AX_ETIMEOUT);
  assert_int_equal(ax_future_err(f), AX_ESTATE);
  ax_values *v = ax_values_new();
  ax_values_add_i64(v, 5);
  ax_future *g = ax_future_follow(f);
  AX_ASSERT_OK(ax_future_complete(f, AX_OK, v, NULL));
  AX_ASSERT_ERR(ax_future_complete(f, AX_EIO, NULL, "x"), AX_ESTATE);
  AX_ASSERT_OK(ax_future_wait(f, 0));
  AX_ASSERT_OK(ax_future_on_done(f, count_cb, NULL)); /* runs at once */
  assert_int_equal(g_cb_count, 2);
  int64_t x;
  AX_ASSERT_OK(ax_values_get_i64(ax_future_values(g), 0, &x));
  assert_int_equal(x, 5);
  ax_future_release(g);
  ax_future_release(f);
  ax_future *e = ax_future_new();
  ax_future_complete(e, AX_EREMOTE, NULL, "n: f: boom");
  AX_ASSERT_ERR(ax_future_wait(e, 0), AX_EREMOTE);
  assert_string_equal(ax_future_errmsg(e), "n: f: boom");
  ax_future_release(e);
  assert_int_equal(ax_future_live_count(), 0);
}

static int h_echo(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                  void *user) {
  ax_values *c = ax_values_clone(args);
  for (size_t i = 0; c && i < ax_values_count(c); i++) {
    ax_tensor *t;
    if (ax_values_get_tensor(c, i, &t) == AX_OK)
      ax_values_add_tensor(out, t);
    else if (ax_values_type(c, i) == AX_VAL_I64) {
      int64_t x;
      ax_values_get_i64(c, i, &x);
      ax_values_add_i64(out, x);
    }
  }
  ax_values_free(c);
  int64_t ag = (int64_t)ax_call_autograd_ctx(ctx), mv = 0;
  ax_call_meta(ctx, "k", &mv);
  ax_values_add_i64(out, ag);
  ax_values_add_i64(out, mv);
  return ax_values_add_str(out, ax_call_caller(ctx));
}

struct jargs {
  ax_node *n;
  int rc;
};
static void *join_main(void *p) {
  struct jargs *j = p;
  j->rc = ax_node_join(j->n, 30000);
  return NULL;
}

/* Two nodes in one process: small and bulk-sized tensors both ways, call
 * metadata, local calls, and unknown functions. */
static void test_inprocess_pair(void **state) {
  int port = rt_free_port();
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  ax_node_opts o;
  ax_node_opts_init(&o);
  o.name = "a";
  o.listen = listen;
  o.world_size = 2;
  ax_node *a, *b;
  AX_ASSERT_OK(ax_node_create(&o, &a));
  o.name = "b";
  o.listen = "127.0.0.1:0";
  o.master = listen;
  o.world_size = 0;
  AX_ASSERT_OK(ax_node_create(&o, &b));
  AX_ASSERT_OK(ax_rpc_register(a, "echo", h_echo, NULL));
  AX_ASSERT_OK(ax_rpc_register(b, "echo", h_echo, NULL));
  AX_ASSERT_ERR(ax_rpc_register(b, "echo", h_echo, NULL), AX_ESTATE);
  AX_ASSERT_ERR(ax_rpc_register(b, "axon.x", h_echo, NULL), AX_EINVAL);
  /* b joins on a thread while the master a joins here. */
  pthread_t th;
  struct jargs ja = {b, -1};
  pthread_create(&th, NULL, join_main, &ja);
  AX_ASSERT_OK(ax_node_join(a, 30000));
  pthread_join(th, NULL);
  AX_ASSERT_OK(ja.rc);
  assert_int_equal(ax_node_world_size(b), 2);
  const char *nm;
  AX_ASSERT_OK(ax_node_member(b, 0, &nm));
  assert_string_equal(nm, "a");
  for (int round = 0; round < 2; round++) {
    ax_node *from = round ? b : a;
    const char *to = round ? "a" : "b";
    for (int big = 0; big < 2; big++) {
      int64_t n = big ? (int64_t)(3 << 20) : 1000; /* 12 MiB / 4 KB */
      ax_tensor *t = ax_tensor_new(AX_F32, 1, &n, AX_CPU);
      for (int64_t i = 0; i < n; i++)
        ax_f32(t)[i] = (float)(i % 977);
      ax_values *args = ax_values_new();
      ax_values_add_tensor(args, t);
      ax_values_add_i64(args, 42);
      const char *mk[1] = {"k"};
      int64_t mvv[1] = {17};
      ax_call_opts co = {.timeout_ms = 30000,
                         .autograd_ctx = 123,
                         .nmeta = 1,
                         .meta_key = mk,
                         .meta_val = mvv};
      ax_values *r = NULL;
      AX_ASSERT_OK(ax_rpc_sync(from, to, "echo", args, &co, &r));
      ax_tensor *u;
      int64_t x;
      const char *caller;
      AX_ASSERT_OK(ax_values_get_tensor(r, 0, &u));
      assert_int_equal(ax_tensor_nbytes(u), ax_tensor_nbytes(t));
      assert_memory_equal(u->data, t->data, ax_tensor_nbytes(t));
      AX_ASSERT_OK(ax_values_get_i64(r, 1, &x));
      assert_int_equal(x, 42);
      AX_ASSERT_OK(ax_values_get_i64(r, 2, &x));
      assert_int_equal(x, 123);
      AX_ASSERT_OK(ax_values_get_i64(r, 3, &x));
      assert_int_equal(x, 17);
      AX_ASSERT_OK(ax_values_get_str(r, 4, &caller));
      assert_string_equal(caller, ax_node_name(from));
      ax_values_free(r);
      /* The same through a local call. */
      AX_ASSERT_OK(
          ax_rpc_sync(from, ax_node_name(from), "echo", args, &co, &r));
      AX_ASSERT_OK(ax_values_get_i64(r, 3, &x));
      assert_int_equal(x, 17);
      ax_values_free(r);
      ax_values_free(args);
      ax_tensor_release(t);
    }
    AX_ASSERT_ERR(ax_rpc_sync(from, to, "nope", NULL, NULL, NULL), AX_ENOFUNC);
    assert_non_null(strstr(ax_errmsg(), "nope"));
    AX_ASSERT_ERR(
        ax_rpc_sync(from, ax_node_name(from), "nope", NULL, NULL, NULL),
        AX_ENOFUNC);
    AX_ASSERT_ERR(ax_rpc_sync(from, "nobody", "echo", NULL, NULL, NULL),
                  AX_ENOTFOUND);
  }
  /* Both nodes share this process's counters: check them once both are
   * gone (rt_remote_zero would count the stats call itself). */
  ax_node_destroy(b);
  ax_node_destroy(a);
  AX_ASSERT_OK(rt_local_zero());
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_values_types),
      cmocka_unit_test(test_values_view),
      cmocka_unit_test(test_codec_roundtrip),
      cmocka_unit_test(test_codec_malformed),
      cmocka_unit_test(test_future),
      cmocka_unit_test(test_inprocess_pair),
  };
  return AX_TEST_MAIN(tests);
}
