/* Stage-driven execution, the agent's side
 * (runtime/pipeline/stage/stage_line-impl.h): a rank's actions run in their
 * sequence order whatever order they arrive in; bad sequences (repeated, far
 * ahead, negative, of an older train call) are refused; a newer train call
 * cancels what an older one left; a failed action cancels the rest of its call;
 * a host torn down cancels its queued actions; and a real agent's
 * axon.pipe.stage refuses hostile sequence metadata and keeps serving. Zero
 * live calls on every node after each. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/pipeline/stage/stage_line-impl.h"
#include "harness.h"
#include "tests/mp_testutil.h"

#define NAGENTS 1
static const char *g_names[NAGENTS] = {"la1"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

/* ---- a local object whose one method runs in its line ------------------ */
typedef struct recorder {
  pthread_mutex_t mu;
  int64_t order[64];
  int n;
  axi_pipe_line *line;
} recorder;

static int rec_create(ax_node *n, const char *config, ax_device dev,
                      void **obj) {
  recorder *r = calloc(1, sizeof *r);
  if (!r)
    return AX_ENOMEM;
  pthread_mutex_init(&r->mu, NULL);
  *obj = r;
  return AX_OK;
}

static void rec_destroy(void *obj) {
  recorder *r = obj;
  axi_pipe_line_detach(&r->line, r);
  pthread_mutex_destroy(&r->mu);
  free(r);
}

/* [value, fail, sleep_ms]: records value; fail = 1 fails instead. */
static int rec_run(ax_call_ctx *cc, void *obj, const ax_values *args,
                   ax_values *out) {
  recorder *r = obj;
  int64_t v, fail, ms;
  AX_TRY(ax_values_get_i64(args, 0, &v));
  AX_TRY(ax_values_get_i64(args, 1, &fail));
  AX_TRY(ax_values_get_i64(args, 2, &ms));
  rt_sleep_ms((int)ms);
  pthread_mutex_lock(&r->mu);
  if (r->n < 64)
    r->order[r->n++] = v;
  pthread_mutex_unlock(&r->mu);
  if (fail)
    return ax_seterr(AX_EINVAL, "recorder: told to fail at %lld", (long long)v);
  return ax_values_add_i64(out, v);
}

static int m_run(ax_call_ctx *cc, void *obj, const ax_values *args,
                 ax_values *out) {
  return axi_pipe_line_call(cc, &((recorder *)obj)->line, obj, rec_run, args,
                            out);
}

static int m_detach(ax_call_ctx *cc, void *obj, const ax_values *args,
                    ax_values *out) {
  axi_pipe_line_detach(&((recorder *)obj)->line, obj);
  return AX_OK;
}

static const ax_robj_method_def g_rec_methods[] = {
    {"run", m_run}, {"detach", m_detach}, {NULL, NULL}};
static const ax_robj_kind g_rec = {"test.line", rec_create, rec_destroy,
                                   g_rec_methods};

static ax_rref *new_recorder(recorder **obj) {
  ax_rref *h = NULL;
  AX_ASSERT_OK(ax_remote_object(g_drv, ax_node_name(g_drv), "test.line", "",
                                AX_CPU, NULL, &h));
  void *o = NULL;
  AX_ASSERT_OK(ax_rref_local_object(h, &o));
  *obj = o;
  return h;
}

/* Issues "run" [value, fail, ms] on line `line` as action seq of call gen. */
static ax_future *run_on(ax_rref *h, int64_t line, int64_t gen, int64_t seq,
                         int64_t value, int fail, int ms, int64_t tmo) {
  int64_t a[3] = {value, fail, ms};
  ax_values *args = dt_i64s(3, a);
  const char *keys[3] = {AXP_META_LINE, AXP_META_GEN, AXP_META_SEQ};
  int64_t vals[3] = {line, gen, seq};
  ax_call_opts co = {
      .timeout_ms = tmo, .nmeta = 3, .meta_key = keys, .meta_val = vals};
  ax_future *f = NULL;
  AX_ASSERT_OK(ax_rref_rpc_async(g_drv, h, "run", args, &co, &f));
  ax_values_free(args);
  return f;
}

/* Waits until k calls wait in r's line: an asynchronous call and the next
 * one run on different workers, so the order the test means must be seen
 * first (seen in CI: a detach that overtook the call it was to cancel). */
static void wait_queued(recorder *r, int k) {
  int64_t t0 = ax_clock_ms();
  while (axi_pipe_line_queued(&r->line) < k && ax_clock_ms() - t0 < 10000)
    rt_sleep_ms(2);
  assert_true(axi_pipe_line_queued(&r->line) >= k);
}

static int outcome(ax_future *f) {
  int err = ax_future_wait(f, 20000);
  ax_future_release(f);
  return err;
}

static void finish(ax_rref *h) {
  ax_rref_release(h);
  AX_ASSERT_OK(rt_local_zero());
}

/* ---- the cases ------------------------------------------------------- */
static void test_runs_in_sequence_order(void **state) {
  recorder *r;
  ax_rref *h = new_recorder(&r);
  ax_future *f[4];
  for (int i = 3; i >= 0; i--) /* arrive last first */
    f[i] = run_on(h, 7, 1, i, 10 + i, 0, 20, 10000);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(ax_future_wait(f[i], 10000), AX_OK);
    int64_t v = -1;
    AX_ASSERT_OK(ax_values_get_i64(ax_future_values(f[i]), 0, &v));
    assert_int_equal(v, 10 + i);
    ax_future_release(f[i]);
  }
  assert_int_equal(r->n, 4);
  for (int i = 0; i < 4; i++)
    assert_int_equal(r->order[i], 10 + i);
  finish(h);
}

static void test_refuses_bad_sequences(void **state) {
  recorder *r;
  ax_rref *h = new_recorder(&r);
  assert_int_equal(outcome(run_on(h, 8, 1, 0, 1, 0, 0, 10000)), AX_OK);
  /* Already run, far ahead, negative. */
  assert_int_equal(outcome(run_on(h, 8, 1, 0, 2, 0, 0, 10000)), AX_EBADARG);
  assert_int_equal(
      outcome(run_on(h, 8, 1, 1 + AXP_LINE_AHEAD_MAX + 1, 3, 0, 0, 10000)),
      AX_EBADARG);
  assert_int_equal(outcome(run_on(h, 8, 1, -1, 4, 0, 0, 10000)), AX_EBADARG);
  assert_int_equal(outcome(run_on(h, 8, -2, 0, 4, 0, 0, 10000)), AX_EBADARG);
  /* Queued twice; then a newer call cancels it; the older call is over. */
  ax_future *waiting = run_on(h, 8, 1, 5, 5, 0, 0, 10000);
  wait_queued(r, 1);
  assert_int_equal(outcome(run_on(h, 8, 1, 5, 6, 0, 0, 10000)), AX_EBADARG);
  assert_int_equal(outcome(run_on(h, 8, 2, 0, 7, 0, 0, 10000)), AX_OK);
  assert_int_equal(outcome(waiting), AX_ECANCELLED);
  assert_int_equal(outcome(run_on(h, 8, 1, 1, 8, 0, 0, 10000)), AX_ESTALE);
  /* Only what ran was recorded: 1 and 7. */
  assert_int_equal(r->n, 2);
  assert_int_equal(r->order[0], 1);
  assert_int_equal(r->order[1], 7);
  finish(h);
}

static void test_failure_cancels_the_rest(void **state) {
  recorder *r;
  ax_rref *h = new_recorder(&r);
  ax_future *later = run_on(h, 9, 1, 1, 2, 0, 0, 10000);
  assert_int_equal(outcome(run_on(h, 9, 1, 0, 1, 1, 0, 10000)), AX_EINVAL);
  assert_int_equal(outcome(later), AX_ECANCELLED);
  assert_int_equal(outcome(run_on(h, 9, 1, 2, 3, 0, 0, 10000)), AX_ECANCELLED);
  /* The next train call runs again. */
  assert_int_equal(outcome(run_on(h, 9, 2, 0, 4, 0, 0, 10000)), AX_OK);
  assert_int_equal(r->n, 2);
  assert_int_equal(r->order[1], 4);
  finish(h);
}

static void test_teardown_cancels_queued(void **state) {
  recorder *r;
  ax_rref *h = new_recorder(&r);
  ax_future *q = run_on(h, 10, 1, 1, 1, 0, 0, 10000); /* 0 never comes */
  wait_queued(r, 1);
  ax_values *out = NULL;
  AX_ASSERT_OK(ax_rref_rpc_sync(g_drv, h, "detach", NULL, NULL, &out));
  ax_values_free(out);
  assert_int_equal(outcome(q), AX_ECANCELLED);
  assert_int_equal(r->n, 0);
  finish(h);
}

/* An action whose turn never comes is answered at its deadline, and the
 * agent's side frees it (no call left in flight). */
static void test_deadline_frees_waiting(void **state) {
  recorder *r;
  ax_rref *h = new_recorder(&r);
  ax_future *q = run_on(h, 11, 1, 3, 1, 0, 0, 300);
  assert_int_equal(outcome(q), AX_ETIMEOUT);
  int64_t t0 = ax_clock_ms();
  while (rt_local_zero() != AX_OK && ax_clock_ms() - t0 < 5000)
    rt_sleep_ms(50);
  assert_int_equal(r->n, 0);
  finish(h);
}

/* A real agent's stage host: hostile sequence metadata is refused with an
 * error, and the host still answers. */
static void test_agent_refuses_hostile_sequence(void **state) {
  ax_call_opts co = {.timeout_ms = 10000};
  ax_rref *h = NULL;
  AX_ASSERT_OK(ax_remote_object(g_drv, g_names[0], "axon.pipe.stage",
                                "model=mlp,stage=0,splits=0/3,seed=3,"
                                "widths=8/8/8/4",
                                AX_CPU, &co, &h));
  const char *keys[3] = {AXP_META_LINE, AXP_META_GEN, AXP_META_SEQ};
  int64_t bad[][3] = {{1, 1, (int64_t)1 << 40}, {1, -5, 0}, {1, 1, -1}};
  int64_t a[5] = {0, 0, 0, 1, 0};
  for (int i = 0; i < 3; i++) {
    ax_values *args = dt_i64s(5, a), *out = NULL;
    ax_call_opts c = {
        .timeout_ms = 10000, .nmeta = 3, .meta_key = keys, .meta_val = bad[i]};
    int e = ax_rref_rpc_sync(g_drv, h, "fwd", args, &c, &out);
    if (e != AX_EBADARG)
      fprintf(stderr, "  case %d: %s: %s\n", i, ax_strerror(e), ax_errmsg());
    assert_int_equal(e, AX_EBADARG);
    ax_values_free(args);
  }
  /* In order, the action runs (and fails: the host was never set up). */
  int64_t ok[3] = {1, 1, 0};
  ax_values *args = dt_i64s(5, a), *out = NULL;
  ax_call_opts c = {
      .timeout_ms = 10000, .nmeta = 3, .meta_key = keys, .meta_val = ok};
  int err = ax_rref_rpc_sync(g_drv, h, "fwd", args, &c, &out);
  assert_true(err != AX_OK && err != AX_ETIMEOUT && err != AX_EBADARG);
  ax_values_free(args);
  AX_ASSERT_OK(ax_rref_rpc_sync(g_drv, h, "teardown", NULL, &co, &out));
  ax_values_free(out);
  ax_rref_release(h);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
  AX_ASSERT_OK(rt_remote_zero(g_drv, g_names[0]));
}

int main(void) {
  static const char *const args[] = {"--threads", "2", NULL};
  if (mt_start("lined", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  if (ax_robj_register(g_drv, &g_rec) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_runs_in_sequence_order),
      cmocka_unit_test(test_refuses_bad_sequences),
      cmocka_unit_test(test_failure_cancels_the_rest),
      cmocka_unit_test(test_teardown_cancels_queued),
      cmocka_unit_test(test_deadline_frees_waiting),
      cmocka_unit_test(test_agent_refuses_hostile_sequence),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
