/* 10,000 concurrent async calls from 4 caller threads to one agent: every
 * future completes exactly once with the right result. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tests/mp_testutil.h"

#define CALLERS 4
#define PER_CALLER 2500
static ax_node *g_drv;
static pid_t g_pid;

static int g_done[CALLERS * PER_CALLER]; /* completions per call */
static int g_bad;

typedef struct slot {
  int idx;
  int64_t want;
} slot;

static void on_done(ax_future *f, void *user) {
  slot *s = user;
  int64_t got = -1;
  if (ax_future_err(f) != AX_OK ||
      ax_values_get_i64(ax_future_values(f), 0, &got) != AX_OK ||
      got != s->want)
    __atomic_add_fetch(&g_bad, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&g_done[s->idx], 1, __ATOMIC_RELAXED);
}

typedef struct caller {
  int id, rc;
  ax_future *f[PER_CALLER];
  slot s[PER_CALLER];
} caller;

static void *caller_main(void *arg) {
  caller *c = arg;
  for (int i = 0; i < PER_CALLER; i++) {
    int idx = c->id * PER_CALLER + i;
    ax_values *a = ax_values_new();
    ax_values_add_i64(a, idx);
    ax_values_add_i64(a, 1000000LL * c->id);
    c->s[i].idx = idx;
    c->s[i].want = idx + 1000000LL * c->id;
    ax_call_opts o = {.timeout_ms = 120000};
    int rc = ax_rpc_async(g_drv, "w1", "axon.test.add", a, &o, &c->f[i]);
    ax_values_free(a);
    if (rc == AX_OK)
      rc = ax_future_on_done(c->f[i], on_done, &c->s[i]);
    if (rc != AX_OK) {
      c->rc = rc;
      return NULL;
    }
  }
  return NULL;
}

static void test_10k_concurrent(void **state) {
  static caller cs[CALLERS];
  pthread_t th[CALLERS];
  int64_t t0 = ax_clock_ms();
  for (int i = 0; i < CALLERS; i++) {
    cs[i].id = i;
    pthread_create(&th[i], NULL, caller_main, &cs[i]);
  }
  for (int i = 0; i < CALLERS; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < CALLERS; i++)
    AX_ASSERT_OK(cs[i].rc);
  for (int i = 0; i < CALLERS; i++)
    for (int k = 0; k < PER_CALLER; k++) {
      AX_ASSERT_OK(ax_future_wait(cs[i].f[k], 120000));
      ax_future_release(cs[i].f[k]);
    }
  int64_t ms = ax_clock_ms() - t0;
  fprintf(stderr, "10000 calls in %lld ms\n", (long long)ms);
  rt_sleep_ms(50); /* callbacks finish right after the futures complete */
  assert_int_equal(g_bad, 0);
  for (int i = 0; i < CALLERS * PER_CALLER; i++)
    if (g_done[i] != 1)
      fail_msg("call %d completed %d times", i, g_done[i]);
}

static void test_zero_live(void **state) {
  AX_ASSERT_OK(rt_remote_zero(g_drv, "w1"));
  AX_ASSERT_OK(rt_local_zero());
}

int main(void) {
  int port = rt_free_port();
  g_pid = rt_spawn_agent("w1", port, "--threads", "2", NULL);
  int rc = rt_driver("driver", port, 2, &g_drv);
  if (rc != AX_OK) {
    fprintf(stderr, "driver: %s: %s\n", ax_strerror(rc), ax_errmsg());
    rt_stop_agent(g_pid, SIGKILL, 5000);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_10k_concurrent),
      cmocka_unit_test(test_zero_live),
  };
  int failed = AX_TEST_MAIN(tests);
  int st = rt_stop_agent(g_pid, SIGTERM, 15000);
  ax_node_destroy(g_drv);
  if (!(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
    fprintf(stderr, "agent: bad exit status %d\n", st);
    failed++;
  }
  return failed || ax_rpc_live_calls() || ax_future_live_count();
}
