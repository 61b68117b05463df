/* RRef edge cases: stale ids answered at once with AX_ESTALE (freed ids,
 * ids the owner minted, acknowledged references) while calls that overtake
 * a creation still wait for it; a delete that reaches the owner before the
 * create; a fork that reaches the owner before the create; a user killed
 * while holding an owner-made fork; and a child fork whose receiver dies
 * before accepting it (swept after the fork timeout). Every test ends with
 * zero live records on the surviving nodes. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tests/mp_testutil.h"

#define NAGENTS 4
static const char *g_names[NAGENTS] = {"w1", "w2", "v1", "v2"};
static const char *g_live[2] = {"w1", "w2"}; /* v1, v2 are killed */
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

static void zero_live(void) { AX_ASSERT_OK(dt_all_zero(g_drv, g_live, 2)); }

static ax_rref *make_tensor_on(const char *to, int64_t n, int64_t seed,
                               const ax_call_opts *o) {
  int64_t a[2] = {n, seed};
  ax_values *args = dt_i64s(2, a);
  ax_rref *r = NULL;
  AX_ASSERT_OK(ax_remote(g_drv, to, "axon.test.make_tensor", args, o, &r));
  ax_values_free(args);
  return r;
}

static void check_tensor(const ax_values *v, int64_t n, int64_t seed) {
  ax_tensor *t;
  AX_ASSERT_OK(ax_values_get_tensor(v, 0, &t));
  assert_int_equal(ax_tensor_numel(t), n);
  for (int64_t i = 0; i < n; i++)
    assert_true(ax_f32(t)[i] == (float)(seed + i));
}

static void set_debug(const char *node, const char *kind, int64_t ms) {
  if (!strcmp(node, "driver")) {
    AX_ASSERT_OK(ax_rref_debug_delay(g_drv, kind, ms));
    return;
  }
  ax_values *a = ax_values_new();
  ax_values_add_str(a, kind);
  ax_values_add_i64(a, ms);
  AX_ASSERT_OK(ax_rpc_sync(g_drv, node, "axon.rref.debug", a, NULL, NULL));
  ax_values_free(a);
}

/* A raw "axon.rref.fetch" of id on w1; conf: claim an acknowledged ref. */
static int raw_fetch_async(uint64_t id, int conf, int64_t timeout_ms,
                           ax_future **f) {
  int64_t v = (int64_t)id;
  ax_values *a = dt_i64s(1, &v);
  const char *keys[1] = {"rr.conf"};
  int64_t vals[1] = {1};
  ax_call_opts o = {.timeout_ms = timeout_ms,
                    .nmeta = conf ? 1 : 0,
                    .meta_key = keys,
                    .meta_val = vals};
  int err = ax_rpc_async(g_drv, "w1", "axon.rref.fetch", a, &o, f);
  ax_values_free(a);
  return err;
}

static int raw_fetch(uint64_t id, int conf, int64_t *ms) {
  ax_future *f;
  int64_t t0 = ax_clock_ms();
  AX_ASSERT_OK(raw_fetch_async(id, conf, 8000, &f));
  int err = ax_future_wait(f, 10000);
  *ms = ax_clock_ms() - t0;
  ax_future_release(f);
  return err;
}

static void test_stale_ids(void **state) {
  int64_t ms;
  /* A freed value: AX_ESTALE at once. */
  ax_rref *r = make_tensor_on("w1", 3, 1, NULL);
  uint64_t id = ax_rref_id(r);
  AX_ASSERT_OK(ax_rref_wait_created(r, 10000));
  ax_rref_release(r);
  AX_ASSERT_OK(dt_wait_counts(g_drv, "w1", 0, -1, -1));
  AX_ASSERT_ERR(raw_fetch(id, 0, &ms), AX_ESTALE);
  assert_true(ms < 1000);
  /* An id the owner itself would have minted: never created. */
  int w1;
  AX_ASSERT_OK(ax_node_rank_of(g_drv, "w1", &w1));
  uint64_t own = ((uint64_t)(w1 + 1) << 48) | 999999u;
  AX_ASSERT_ERR(raw_fetch(own, 0, &ms), AX_ESTALE);
  assert_true(ms < 1000);
  /* A call through an acknowledged reference to an absent id. */
  AX_ASSERT_ERR(raw_fetch(id + 1000000, 1, &ms), AX_ESTALE);
  assert_true(ms < 1000);
  /* A call naming a stale id: AX_ESTALE too. */
  ax_values *a = ax_values_new();
  ax_values_add_i64(a, (int64_t)id);
  ax_values_add_str(a, "put");
  ax_values_add_bytes(a, NULL, 0);
  ax_call_opts co = {.timeout_ms = 8000};
  int64_t t0 = ax_clock_ms();
  AX_ASSERT_ERR(ax_rpc_sync(g_drv, "w1", "axon.rref.call", a, &co, NULL),
                AX_ESTALE);
  assert_true(ax_clock_ms() - t0 < 1000);
  ax_values_free(a);
  /* A fetch that overtakes its creation waits for it: learn the driver's
   * next id from a local creation, then fetch that id before creating it. */
  ax_rref *loc = NULL;
  AX_ASSERT_OK(
      ax_remote_object(g_drv, "driver", "rref.box", "", AX_CPU, NULL, &loc));
  uint64_t next = ax_rref_id(loc) + 1;
  ax_future *f;
  AX_ASSERT_OK(raw_fetch_async(next, 0, 8000, &f));
  rt_sleep_ms(300);
  assert_false(ax_future_is_done(f));
  r = make_tensor_on("w1", 4, 5, NULL);
  assert_true(ax_rref_id(r) == next);
  AX_ASSERT_OK(ax_future_wait(f, 10000));
  check_tensor(ax_future_values(f), 4, 5);
  ax_future_release(f);
  /* An id below what w1 has seen created by the driver (the driver's local
   * box, never a value of w1): AX_ESTALE after the short reorder grace. */
  AX_ASSERT_ERR(raw_fetch(ax_rref_id(loc), 0, &ms), AX_ESTALE);
  assert_true(ms >= 500 && ms < 5000);
  ax_rref_release(r);
  ax_rref_release(loc);
  zero_live();
}

/* The creator's create times out, it drops the RRef, and its delete reaches
 * the owner before the create does: the owner tombstones the fork and frees
 * the value as soon as it is created. */
static void test_delete_before_create(void **state) {
  set_debug("w1", "create", 900);
  ax_call_opts o = {.timeout_ms = 200};
  ax_rref *r = make_tensor_on("w1", 2, 2, &o);
  AX_ASSERT_ERR(ax_rref_wait_created(r, 5000), AX_ETIMEOUT);
  assert_true(ax_rref_confirmed(r));
  ax_values *v = NULL;
  AX_ASSERT_ERR(ax_rref_to_here(g_drv, r, 5000, 0, &v), AX_ETIMEOUT);
  ax_rref_release(r); /* the delete leaves now, the create sleeps */
  rt_sleep_ms(1200);
  set_debug("w1", "create", 0);
  zero_live();
}

/* A user forks the RRef to w2 before the owner got the create: w2's fork
 * and fetch wait for the creation instead of failing as stale. */
static void test_fork_before_create(void **state) {
  set_debug("w1", "create", 600);
  ax_rref *b = NULL;
  AX_ASSERT_OK(ax_remote_object(g_drv, "w2", "rref.box", "", AX_CPU, NULL, &b));
  AX_ASSERT_OK(ax_rref_wait_created(b, 10000));
  ax_rref *r = make_tensor_on("w1", 3, 9, NULL);
  ax_values *a = ax_values_new(), *v = NULL;
  ax_values_add_rref(a, r);
  AX_ASSERT_OK(ax_rref_rpc_sync(g_drv, b, "put", a, NULL, NULL));
  ax_values_free(a);
  ax_rref_release(r); /* the driver's fork goes once confirmed */
  int64_t i2[2] = {0, 10000};
  a = dt_i64s(2, i2);
  AX_ASSERT_OK(ax_rref_rpc_sync(g_drv, b, "fetch", a, NULL, &v));
  check_tensor(v, 3, 9);
  ax_values_free(v);
  ax_values_free(a);
  set_debug("w1", "create", 0);
  AX_ASSERT_OK(ax_rref_rpc_sync(g_drv, b, "clear", NULL, NULL, NULL));
  ax_rref_release(b);
  zero_live();
}

/* w1 (the owner) forks its value to v1, which is then killed: w1 learned
 * the holder from v1's accept and frees the value once v1 is down. */
static void test_killed_holder_of_owner_fork(void **state) {
  ax_rref *b1 = NULL, *bv = NULL;
  AX_ASSERT_OK(
      ax_remote_object(g_drv, "w1", "rref.box", "", AX_CPU, NULL, &b1));
  AX_ASSERT_OK(
      ax_remote_object(g_drv, "v1", "rref.box", "", AX_CPU, NULL, &bv));
  ax_rref *r = make_tensor_on("w1", 2, 4, NULL);
  ax_values *a = ax_values_new();
  ax_values_add_rref(a, r);
  AX_ASSERT_OK(ax_rref_rpc_sync(g_drv, b1, "put", a, NULL, NULL));
  ax_values_free(a);
  ax_rref_release(r);
  a = ax_values_new();
  ax_values_add_rref(a, bv);
  AX_ASSERT_OK(
      ax_rref_rpc_sync(g_drv, b1, "send", a, NULL, NULL)); /* owner -> v1 */
  ax_values_free(a);
  AX_ASSERT_OK(ax_rref_rpc_sync(g_drv, b1, "clear", NULL, NULL, NULL));
  rt_sleep_ms(300); /* v1's accept (naming it the holder) reaches w1 */
  AX_ASSERT_OK(dt_wait_counts(g_drv, "w1", 2, -1, -1)); /* b1 + the value */
  int64_t t0 = ax_clock_ms();
  kill(g_pids[2], SIGKILL);
  waitpid(g_pids[2], NULL, 0);
  g_pids[2] = 0;
  AX_ASSERT_OK(dt_wait_counts(g_drv, "w1", 1, -1, -1)); /* only b1 */
  fprintf(stderr, "[rref] owner freed the killed holder's value in %lld ms\n",
          (long long)(ax_clock_ms() - t0));
  ax_rref_release(bv);
  ax_rref_release(b1);
  zero_live();
}

/* The driver forks a user RRef to v2, which never sends its fork (delayed)
 * and is killed: the driver's unaccepted child is swept after the fork
 * timeout, so the driver's delete goes out and w1 frees the value. */
static void test_child_never_accepted(void **state) {
  set_debug("driver", "fork_timeout", 1500);
  set_debug("v2", "fork", 600000);
  ax_rref *bv = NULL;
  AX_ASSERT_OK(
      ax_remote_object(g_drv, "v2", "rref.box", "", AX_CPU, NULL, &bv));
  ax_rref *r = make_tensor_on("w1", 2, 6, NULL);
  AX_ASSERT_OK(ax_rref_wait_created(r, 10000));
  ax_values *a = ax_values_new();
  ax_values_add_rref(a, r);
  AX_ASSERT_OK(ax_rref_rpc_sync(g_drv, bv, "put", a, NULL, NULL));
  ax_values_free(a);
  ax_rref_release(r); /* dropped, but a child is pending */
  kill(g_pids[3], SIGKILL);
  waitpid(g_pids[3], NULL, 0);
  g_pids[3] = 0;
  int64_t t0 = ax_clock_ms();
  AX_ASSERT_OK(dt_wait_counts(g_drv, "w1", 0, -1, -1));
  fprintf(stderr, "[rref] unaccepted child swept, value freed in %lld ms\n",
          (long long)(ax_clock_ms() - t0));
  ax_rref_release(bv);
  set_debug("driver", "fork_timeout", 0);
  zero_live();
}

int main(void) {
  static const char *const args[] = {"--threads", "2", "--peer-timeout-ms",
                                     "2000", NULL};
  if (mt_start("driver", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stale_ids),
      cmocka_unit_test(test_delete_before_create),
      cmocka_unit_test(test_fork_before_create),
      cmocka_unit_test(test_killed_holder_of_owner_fork),
      cmocka_unit_test(test_child_never_accepted),
  };
  int failed = AX_TEST_MAIN(tests);
  for (int i = 0; i < NAGENTS; i++)
    if (g_pids[i] > 0 && i < 2)
      failed += mt_stop_checked(g_names[i], g_pids[i]);
    else if (g_pids[i] > 0)
      rt_stop_agent(g_pids[i], SIGKILL, 5000);
  dt_driver_end(g_drv);
  return failed;
}
