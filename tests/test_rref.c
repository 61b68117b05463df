/* RRefs across three agent processes and this driver: creation, to_here,
 * stored creation errors, deadlines, calls through RRefs, fork trees
 * (user -> user -> user, user -> owner, owner -> user) in forced message
 * orders, and zero live records on every node after each test. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/value-impl.h"
#include "harness.h"
#include "tests/mp_testutil.h"

#define NAGENTS 3
static const char *g_names[NAGENTS] = {"w1", "w2", "w3"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

static void zero_all(void) {
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static ax_rref *make_tensor_on(const char *to, int64_t n, int64_t seed) {
  int64_t a[2] = {n, seed};
  ax_values *args = dt_i64s(2, a);
  ax_rref *r = NULL;
  AX_ASSERT_OK(ax_remote(g_drv, to, "axon.test.make_tensor", args, NULL, &r));
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

static void test_remote_value(void **state) {
  ax_rref *r = make_tensor_on("w1", 5, 7);
  assert_string_equal(ax_rref_owner(r), "w1");
  assert_false(ax_rref_is_owner(r));
  assert_int_equal(ax_rref_type_of(r), AX_RREF_VALUE);
  ax_values *v = NULL;
  AX_ASSERT_OK(ax_rref_to_here(g_drv, r, 10000, 0, &v));
  check_tensor(v, 5, 7);
  assert_true(ax_rref_confirmed(r));
  ax_values_free(v);
  /* No time left is an error at once; INT64_MAX is no practical limit. */
  v = NULL;
  AX_ASSERT_ERR(ax_rref_to_here(g_drv, r, -1, 0, &v), AX_ETIMEOUT);
  assert_null(v);
  AX_ASSERT_OK(ax_rref_to_here(g_drv, r, INT64_MAX, 0, &v));
  check_tensor(v, 5, 7);
  ax_values_free(v);
  AX_ASSERT_OK(dt_wait_counts(g_drv, "w1", 1, 0, 0));
  ax_rref_release(r);
  zero_all();
}

static void test_creation_error_and_deadline(void **state) {
  ax_values *a = ax_values_new();
  ax_values_add_i64(a, AX_EIO);
  ax_values_add_str(a, "boom");
  ax_rref *r = NULL;
  AX_ASSERT_OK(ax_remote(g_drv, "w2", "axon.test.fail", a, NULL, &r));
  ax_values_free(a);
  ax_values *v = NULL;
  AX_ASSERT_ERR(ax_rref_to_here(g_drv, r, 10000, 0, &v), AX_EIO);
  assert_non_null(strstr(ax_errmsg(), "boom"));
  AX_ASSERT_ERR(ax_rref_to_here(g_drv, r, 10000, 0, &v), AX_EIO);
  ax_rref_release(r);
  /* Unknown function: the creation error is AX_ENOFUNC. */
  AX_ASSERT_OK(ax_remote(g_drv, "w3", "no_such_fn", NULL, NULL, &r));
  AX_ASSERT_ERR(ax_rref_wait_created(r, 10000), AX_ENOFUNC);
  ax_rref_release(r);
  /* to_here past its deadline, then again with time enough. */
  int64_t ms = 1500;
  a = dt_i64s(1, &ms);
  AX_ASSERT_OK(ax_remote(g_drv, "w3", "axon.test.sleep_ms", a, NULL, &r));
  ax_values_free(a);
  int64_t t0 = ax_clock_ms();
  AX_ASSERT_ERR(ax_rref_to_here(g_drv, r, 200, 0, &v), AX_ETIMEOUT);
  assert_true(ax_clock_ms() - t0 < 1000);
  AX_ASSERT_OK(ax_rref_to_here(g_drv, r, 10000, 0, &v));
  int64_t got;
  AX_ASSERT_OK(ax_values_get_i64(v, 0, &got));
  assert_int_equal(got, 1500);
  ax_values_free(v);
  ax_rref_release(r);
  /* A remote object whose construction fails. */
  AX_ASSERT_OK(
      ax_remote_module(g_drv, "w1", "mlp.stage", "stage=9", AX_CPU, &r));
  AX_ASSERT_ERR(ax_rref_rpc_sync(g_drv, r, "state_save", NULL, NULL, &v),
                AX_EINVAL);
  ax_rref_release(r);
  zero_all();
}

static void set_delay(const char *node, const char *msg, int64_t ms) {
  ax_values *a = ax_values_new();
  ax_values_add_str(a, msg);
  ax_values_add_i64(a, ms);
  if (!strcmp(node, "driver"))
    AX_ASSERT_OK(ax_rref_debug_delay(g_drv, msg, ms));
  else
    AX_ASSERT_OK(ax_rpc_sync(g_drv, node, "axon.rref.debug", a, NULL, NULL));
  ax_values_free(a);
}

static ax_rref *box_on(const char *node) {
  ax_rref *b = NULL;
  AX_ASSERT_OK(ax_remote_object(g_drv, node, "rref.box", "", AX_CPU, NULL, &b));
  AX_ASSERT_OK(ax_rref_wait_created(b, 10000));
  return b;
}

static void box_call(ax_rref *b, const char *m, ax_rref *arg) {
  ax_values *a = ax_values_new();
  if (arg)
    ax_values_add_rref(a, arg);
  AX_ASSERT_OK(ax_rref_rpc_sync(g_drv, b, m, a, NULL, NULL));
  ax_values_free(a);
}

static void box_fetch_check(ax_rref *b, int64_t n, int64_t seed) {
  int64_t a[2] = {0, 10000};
  ax_values *args = dt_i64s(2, a), *v = NULL;
  AX_ASSERT_OK(ax_rref_rpc_sync(g_drv, b, "fetch", args, NULL, &v));
  check_tensor(v, n, seed);
  ax_values_free(v);
  ax_values_free(args);
}

/* A payload as the RRef codec puts it on the wire (rref/rref_codec.c). */
typedef struct wire {
  uint64_t id, fork, parent_fork;
  uint32_t type, pad;
  char owner[64], parent[64];
} wire;

/* Payloads naming a node outside the world, as owner or as parent, are
 * refused with an error naming it (they would queue protocol messages to
 * nobody and leave records behind); one naming members decodes. */
static void test_payload_naming_strangers(void **state) {
  const ax_value_ext_ops *ops = axi_value_ext_ops(AX_VALUE_EXT_RREF);
  assert_non_null(ops);
  const char *cases[3][2] = {
      {"stranger", "w1"}, {"w1", "stranger"}, {"w1", "w1"}};
  for (int i = 0; i < 3; i++) {
    wire w = {.id = ((uint64_t)7 << 48) | (900 + i),
              .fork = 77 + i,
              .type = AX_RREF_VALUE};
    snprintf(w.owner, sizeof w.owner, "%s", cases[i][0]);
    snprintf(w.parent, sizeof w.parent, "%s", cases[i][1]);
    void *obj = NULL;
    int rc = ops->decode(&w, sizeof w, "w1", &obj);
    if (i < 2) {
      assert_int_equal(rc, AX_EMALFORMED);
      assert_non_null(strstr(ax_errmsg(), "'stranger', not a member"));
      assert_null(obj);
    } else {
      AX_ASSERT_OK(rc);
      ops->release(obj); /* its fork is reported to w1, which drops it */
    }
  }
  zero_all();
}

/* driver -> w2 -> w3 (-> w1, the owner) with the value owned by w1, in the
 * message order forced by `delays` (node, message, ms). */
typedef struct delay {
  const char *node, *msg;
  int64_t ms;
} delay;

static void fork_tree(const delay *d, int nd, int back_to_owner) {
  for (int i = 0; i < nd; i++)
    set_delay(d[i].node, d[i].msg, d[i].ms);
  ax_rref *b1 = box_on("w1"), *b2 = box_on("w2"), *b3 = box_on("w3");
  ax_rref *v = make_tensor_on("w1", 4, 3);
  box_call(b2, "put", v);   /* driver -> w2 */
  ax_rref_release(v);       /* the driver's own fork goes at once */
  box_call(b2, "send", b3); /* w2 -> w3 */
  box_call(b2, "clear", NULL);
  if (back_to_owner) { /* w3 -> w1 (user -> owner), then w1 -> w2 */
    box_call(b3, "send", b1);
    box_call(b3, "clear", NULL);
    box_call(b1, "send", b2); /* owner -> user */
    box_call(b1, "clear", NULL);
  }
  ax_rref *last = back_to_owner ? b2 : b3;
  rt_sleep_ms(700); /* every delayed message is out by now */
  /* The value lives: one holder is left. */
  AX_ASSERT_OK(dt_wait_counts(g_drv, "w1", 2, -1, 0)); /* b1 + the value */
  box_fetch_check(last, 4, 3);
  box_call(last, "clear", NULL);
  AX_ASSERT_OK(dt_wait_counts(g_drv, "w1", 1, -1, 0)); /* only b1 */
  ax_rref_release(b1);
  ax_rref_release(b2);
  ax_rref_release(b3);
  for (int i = 0; i < nd; i++)
    set_delay(d[i].node, d[i].msg, 0);
  zero_all();
}

static void test_fork_trees(void **state) {
  static const delay orders[][3] = {
      {{0}},
      {{"w2", "fork", 400}},   /* w2's fork after the driver drops */
      {{"w3", "fork", 400}},   /* w3's fork after w2 clears */
      {{"w3", "accept", 400}}, /* w2 waits for the accept */
      {{"driver", "delete", 300}, {"w2", "accept", 300}},
      {{"w2", "delete", 400}, {"w3", "fork", 200}},
      {{"w1", "fork", 300}, {"w3", "accept", 300}, {"w2", "fork", 300}},
  };
  static const int counts[] = {0, 1, 1, 1, 2, 2, 3};
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
    fork_tree(orders[i], counts[i], 0);
    fork_tree(orders[i], counts[i], 1);
  }
}

static void test_calls_through_rref(void **state) {
  ax_rref *b = box_on("w2");
  ax_rref *v = make_tensor_on("w3", 3, 11);
  /* rpc_sync through the RRef; remote() of a method result. */
  box_call(b, "put", v);
  ax_rref *res = NULL;
  int64_t a[2] = {0, 10000};
  ax_values *args = dt_i64s(2, a), *out = NULL;
  AX_ASSERT_OK(ax_rref_remote(g_drv, b, "fetch", args, NULL, &res));
  assert_string_equal(ax_rref_owner(res), "w2");
  AX_ASSERT_OK(ax_rref_to_here(g_drv, res, 10000, 0, &out));
  check_tensor(out, 3, 11);
  ax_values_free(out);
  /* Unknown method: AX_ENOFUNC. */
  AX_ASSERT_ERR(ax_rref_rpc_sync(g_drv, b, "nope", NULL, NULL, &out),
                AX_ENOFUNC);
  /* to_here of an object: unsupported. */
  AX_ASSERT_ERR(ax_rref_to_here(g_drv, b, 10000, 0, &out), AX_EUNSUPPORTED);
  ax_values_free(args);
  ax_rref_release(res);
  ax_rref_release(v);
  ax_rref_release(b);
  zero_all();
}

int main(void) {
  static const char *const args[] = {"--threads", "2", "--peer-timeout-ms",
                                     "3000", NULL};
  if (mt_start("driver", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_remote_value),
      cmocka_unit_test(test_creation_error_and_deadline),
      cmocka_unit_test(test_calls_through_rref),
      cmocka_unit_test(test_fork_trees),
      cmocka_unit_test(test_payload_naming_strangers),
  };
  int failed = AX_TEST_MAIN(tests);
  for (int i = 0; i < NAGENTS; i++)
    failed += mt_stop_checked(g_names[i], g_pids[i]);
  dt_driver_end(g_drv);
  return failed;
}
