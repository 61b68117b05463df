/* Pushes and takes under a distributed autograd context (ax_dist_push,
 * ax_dist_take in runtime/autograd/autograd.h), with agents as producers
 * (their built-in "axon.test.push") and this process as the consumer: a take
 * before and after the push, the deadline, two keys and two contexts that never
 * mix, a push to this node itself whose gradient comes back along the
 * recorded edges, a released context (a waiting take ends, pushed memory
 * is freed, a late push is dropped), a closed key, and a producer killed
 * while a take waits for it (AX_EPEERDOWN long before the deadline). Every
 * node ends with zero live contexts, RRefs, calls and futures. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tests/mp_testutil.h"

#define NAGENTS 2
static const char *g_names[NAGENTS] = {"p1", "p2"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

/* An f32 tensor (n,) with values v, v + 1, ... */
static ax_tensor *vec(int n, float v) {
  int64_t shape = n;
  ax_tensor *t = ax_tensor_new(AX_F32, 1, &shape, AX_CPU);
  assert_non_null(t);
  for (int i = 0; i < n; i++)
    ax_f32(t)[i] = v + (float)i;
  return t;
}

static void expect_vec(const ax_tensor *t, int n, float v) {
  assert_non_null(t);
  assert_int_equal(ax_tensor_numel(t), n);
  for (int i = 0; i < n; i++)
    assert_true(ax_f32(t)[i] == v + (float)i);
}

/* Asks agent `who` to push [vec(n, v), no tensor] to this node under ctx
 * for key after delay_ms; the future of that call. */
static ax_future *push_from(const char *who, uint64_t ctx, uint64_t key,
                            int64_t delay_ms, int n, float v) {
  ax_values *a = ax_values_new();
  ax_tensor *t = vec(n, v);
  ax_values_add_str(a, "driver");
  ax_values_add_i64(a, (int64_t)key);
  ax_values_add_i64(a, delay_ms);
  ax_values_add_tensor(a, t);
  ax_values_add_i64(a, 0);
  ax_tensor_release(t);
  ax_call_opts o = {.timeout_ms = 30000, .autograd_ctx = ctx};
  ax_future *f = NULL;
  AX_ASSERT_OK(ax_rpc_async(g_drv, who, "axon.test.push", a, &o, &f));
  ax_values_free(a);
  return f;
}

/* The outcome of f (released). */
static int outcome(ax_future *f) {
  int err = ax_future_wait(f, 40000);
  if (err != AX_OK && ax_future_is_done(f))
    fprintf(stderr, "  push: %s\n", ax_future_errmsg(f));
  ax_future_release(f);
  return err;
}

/* Waits (up to 5 s) until this process holds `want` tensor handles. */
static void wait_tensors(long want) {
  int64_t t0 = ax_clock_ms();
  while (ax_tensor_live_count() != want && ax_clock_ms() - t0 < 5000)
    rt_sleep_ms(10);
  assert_int_equal(ax_tensor_live_count(), want);
}

static void test_take_after_push(void **state) {
  uint64_t ctx;
  AX_ASSERT_OK(ax_dist_context_new(g_drv, &ctx));
  AX_ASSERT_OK(outcome(push_from("p1", ctx, 7, 0, 4, 1.0f)));
  ax_tlist in = {0};
  int64_t t0 = ax_clock_ms();
  AX_ASSERT_OK(ax_dist_take(g_drv, ctx, 7, "p1", AX_CPU, 5000, &in));
  assert_true(ax_clock_ms() - t0 < 1000); /* it was there */
  assert_int_equal(in.n, 2);
  expect_vec(in.t[0], 4, 1.0f);
  assert_null(in.t[1]); /* "no tensor" travels as such */
  ax_tlist_clear(&in);
  AX_ASSERT_OK(ax_dist_context_release(g_drv, ctx, 10000));
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_take_before_push(void **state) {
  uint64_t ctx;
  AX_ASSERT_OK(ax_dist_context_new(g_drv, &ctx));
  ax_future *f = push_from("p1", ctx, 3, 400, 5, 2.0f);
  ax_tlist in = {0};
  int64_t t0 = ax_clock_ms();
  AX_ASSERT_OK(ax_dist_take(g_drv, ctx, 3, "p1", AX_CPU, 20000, &in));
  assert_true(ax_clock_ms() - t0 >= 300); /* it waited for the push */
  expect_vec(in.t[0], 5, 2.0f);
  ax_tlist_clear(&in);
  AX_ASSERT_OK(outcome(f));
  AX_ASSERT_OK(ax_dist_context_release(g_drv, ctx, 10000));
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_timeout(void **state) {
  uint64_t ctx;
  AX_ASSERT_OK(ax_dist_context_new(g_drv, &ctx));
  ax_tlist in = {0};
  int64_t t0 = ax_clock_ms();
  AX_ASSERT_ERR(ax_dist_take(g_drv, ctx, 99, "p1", AX_CPU, 300, &in),
                AX_ETIMEOUT);
  int64_t took = ax_clock_ms() - t0;
  assert_true(took >= 290 && took < 3000);
  assert_int_equal(in.n, 0);
  AX_ASSERT_OK(ax_dist_context_release(g_drv, ctx, 10000));
}

/* Two keys of one context, the same key in two contexts and a push from
 * this node to itself: each take gets its own list, once. */
static void test_keys_never_mix(void **state) {
  uint64_t c1, c2;
  AX_ASSERT_OK(ax_dist_context_new(g_drv, &c1));
  AX_ASSERT_OK(ax_dist_context_new(g_drv, &c2));
  AX_ASSERT_OK(outcome(push_from("p1", c1, 1, 0, 3, 10.0f)));
  AX_ASSERT_OK(outcome(push_from("p1", c1, 2, 0, 3, 20.0f)));
  AX_ASSERT_OK(outcome(push_from("p2", c2, 1, 0, 3, 30.0f)));
  ax_tensor *own = vec(3, 40.0f);
  ax_tlist t = ax_tlist1(own);
  ax_future *f = NULL;
  AX_ASSERT_OK(ax_dist_push(g_drv, c1, "driver", 4, &t, &f));
  AX_ASSERT_OK(outcome(f));
  ax_tensor_release(own);
  struct {
    uint64_t ctx, key;
    const char *from;
    float v;
  } want[4] = {{c1, 2, "p1", 20.0f},
               {c2, 1, "p2", 30.0f},
               {c1, 4, "driver", 40.0f},
               {c1, 1, "p1", 10.0f}};
  for (int i = 0; i < 4; i++) {
    ax_tlist in = {0};
    AX_ASSERT_OK(ax_dist_take(g_drv, want[i].ctx, want[i].key, want[i].from,
                              AX_CPU, 5000, &in));
    expect_vec(in.t[0], 3, want[i].v);
    ax_tlist_clear(&in);
  }
  ax_tlist in = {0};
  AX_ASSERT_ERR(ax_dist_take(g_drv, c1, 1, "p1", AX_CPU, 200, &in),
                AX_ETIMEOUT);
  AX_ASSERT_OK(ax_dist_context_release(g_drv, c1, 10000));
  AX_ASSERT_OK(ax_dist_context_release(g_drv, c2, 10000));
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

/* A pushed recorded output: its send edge travels with it and the taker
 * records the receive edge, so a backward from what was taken reaches the
 * producer's held function. */
static void test_edges(void **state) {
  uint64_t ctx, fn;
  AX_ASSERT_OK(ax_dist_context_new(g_drv, &ctx));
  ax_tensor *y = vec(4, 2.0f);
  ax_tlist none = {0}, out = ax_tlist1(y), in = {0}, dy = {0};
  AX_ASSERT_OK(ax_dist_record_held(g_drv, ctx, &none, &out, &fn));
  AX_ASSERT_OK(ax_dist_push(g_drv, ctx, "driver", 9, &out, NULL));
  AX_ASSERT_OK(ax_dist_take(g_drv, ctx, 9, "driver", AX_CPU, 5000, &in));
  AX_ASSERT_OK(ax_dist_backward(g_drv, ctx, &in, 10000));
  AX_ASSERT_OK(ax_dist_take_grads(g_drv, ctx, fn, 5000, &dy));
  assert_int_equal(dy.n, 1);
  for (int i = 0; i < 4; i++)
    assert_true(ax_f32(dy.t[0])[i] == 1.0f);
  ax_tlist_clear(&dy);
  ax_tlist_clear(&in);
  ax_tensor_release(y);
  AX_ASSERT_OK(ax_dist_context_release(g_drv, ctx, 10000));
}

typedef struct taker {
  uint64_t ctx, key;
  const char *from;
  int err;
  int64_t took;
} taker;

static void *take_main(void *arg) {
  taker *k = arg;
  ax_tlist in = {0};
  int64_t t0 = ax_clock_ms();
  k->err = ax_dist_take(g_drv, k->ctx, k->key, k->from, AX_CPU, 20000, &in);
  k->took = ax_clock_ms() - t0;
  ax_tlist_clear(&in);
  return NULL;
}

/* Releasing a context ends the takes waiting under it and frees what was
 * pushed there; a push that arrives after the release is dropped. */
static void test_released_context(void **state) {
  long base = ax_tensor_live_count();
  uint64_t ctx;
  AX_ASSERT_OK(ax_dist_context_new(g_drv, &ctx));
  AX_ASSERT_OK(outcome(push_from("p1", ctx, 5, 0, 1000, 0.0f)));
  assert_true(ax_tensor_live_count() > base); /* kept; nobody takes it */
  taker k = {ctx, 6, "p1", AX_OK, 0};
  pthread_t th;
  pthread_create(&th, NULL, take_main, &k);
  rt_sleep_ms(200);
  AX_ASSERT_OK(ax_dist_context_release(g_drv, ctx, 10000));
  pthread_join(th, NULL);
  assert_int_equal(k.err, AX_ESTALE);
  assert_true(k.took < 5000);
  wait_tensors(base); /* the pushed list is freed */
  ax_tlist in = {0};
  AX_ASSERT_ERR(ax_dist_take(g_drv, ctx, 5, "p1", AX_CPU, 1000, &in),
                AX_ESTALE);
  assert_int_equal(ax_dist_live_contexts(g_drv), 0);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));

  /* Released here before p1 pushes: dropped, and no error for p1. */
  AX_ASSERT_OK(ax_dist_context_new(g_drv, &ctx));
  ax_future *f = push_from("p1", ctx, 7, 500, 1000, 0.0f);
  AX_ASSERT_OK(ax_dist_context_release(g_drv, ctx, 10000));
  AX_ASSERT_OK(outcome(f));
  wait_tensors(base);
  assert_int_equal(ax_dist_live_contexts(g_drv), 0);
  /* p1 saw the context only as it pushed; this node forgot it already,
   * so the release goes to p1 directly. */
  ax_values *none = ax_values_new();
  ax_call_opts o = {.timeout_ms = 10000, .autograd_ctx = ctx};
  AX_ASSERT_OK(
      ax_rpc_sync(g_drv, "p1", "axon.autograd.release", none, &o, NULL));
  ax_values_free(none);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

/* A closed key (a consumer torn down) fails its waiting take and every
 * later one, even with a list there, until it is opened again. */
static void test_closed_key(void **state) {
  uint64_t ctx;
  AX_ASSERT_OK(ax_dist_context_new(g_drv, &ctx));
  taker k = {ctx, 8, NULL, AX_OK, 0};
  pthread_t th;
  pthread_create(&th, NULL, take_main, &k);
  rt_sleep_ms(200);
  AX_ASSERT_OK(ax_dist_take_close(g_drv, 8, 1));
  pthread_join(th, NULL);
  assert_int_equal(k.err, AX_ECLOSED);
  assert_true(k.took < 5000);
  AX_ASSERT_OK(outcome(push_from("p1", ctx, 8, 0, 2, 5.0f)));
  ax_tlist in = {0};
  AX_ASSERT_ERR(ax_dist_take(g_drv, ctx, 8, "p1", AX_CPU, 5000, &in),
                AX_ECLOSED);
  AX_ASSERT_OK(ax_dist_take_close(g_drv, 8, 0));
  AX_ASSERT_OK(ax_dist_take(g_drv, ctx, 8, "p1", AX_CPU, 5000, &in));
  expect_vec(in.t[0], 2, 5.0f);
  ax_tlist_clear(&in);
  AX_ASSERT_OK(ax_dist_context_release(g_drv, ctx, 10000));
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void *kill_later(void *arg) {
  rt_sleep_ms(300);
  kill(*(pid_t *)arg, SIGKILL);
  return NULL;
}

/* The producer dies while a take waits for it: AX_EPEERDOWN as soon as
 * its node is known to be down, not at the deadline; a push to it fails
 * at its producer. */
static void test_producer_killed(void **state) {
  uint64_t ctx;
  AX_ASSERT_OK(ax_dist_context_new(g_drv, &ctx));
  pthread_t th;
  pthread_create(&th, NULL, kill_later, &g_pids[1]);
  ax_tlist in = {0};
  int64_t t0 = ax_clock_ms();
  AX_ASSERT_ERR(ax_dist_take(g_drv, ctx, 10, "p2", AX_CPU, 60000, &in),
                AX_EPEERDOWN);
  fprintf(stderr, "  take ended %lld ms after it started\n",
          (long long)(ax_clock_ms() - t0));
  assert_true(ax_clock_ms() - t0 < 15000);
  pthread_join(th, NULL);
  waitpid(g_pids[1], NULL, 0);
  g_pids[1] = -1;
  ax_tensor *x = vec(2, 0.0f);
  ax_tlist t = ax_tlist1(x);
  ax_future *f = NULL;
  int err = ax_dist_push(g_drv, ctx, "p2", 11, &t, &f);
  if (err == AX_OK)
    err = outcome(f);
  assert_int_not_equal(err, AX_OK);
  ax_tensor_release(x);
  AX_ASSERT_OK(ax_dist_context_release(g_drv, ctx, 10000));
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, 1));
}

int main(void) {
  static const char *const args[] = {"--threads", "2", "--peer-timeout-ms",
                                     "1500", NULL};
  if (mt_start("driver", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_take_after_push),
      cmocka_unit_test(test_take_before_push),
      cmocka_unit_test(test_timeout),
      cmocka_unit_test(test_keys_never_mix),
      cmocka_unit_test(test_edges),
      cmocka_unit_test(test_released_context),
      cmocka_unit_test(test_closed_key),
      cmocka_unit_test(test_producer_killed),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
