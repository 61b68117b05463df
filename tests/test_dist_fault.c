/* A peer killed during a distributed backward: the backward fails at the
 * root with AX_EPEERDOWN within the deadline, the surviving nodes release
 * the context, and every survivor ends with zero live RRefs, contexts,
 * calls and futures. Also: a finished backward leaves gradients only in
 * the context (read with "gradients"), and releasing the context frees
 * them on every node. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "harness.h"
#include "tests/mp_testutil.h"

#define NAGENTS 3
static const char *g_names[NAGENTS] = {"w1", "w2", "w3"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;
static ax_rref *g_stage[NAGENTS];

static void make_stages(void) {
  for (int k = 0; k < NAGENTS; k++) {
    char cfg[256];
    snprintf(cfg, sizeof cfg, "stage=%d,nstages=3,seed=2,widths=32/16/16/4", k);
    AX_ASSERT_OK(ax_remote_module(g_drv, g_names[k], "mlp.stage", cfg, AX_CPU,
                                  &g_stage[k]));
  }
}

/* Forward of one batch through the 3 stages under the current context;
 * returns the loss RRef (owned by w3) and the intermediate RRefs. */
static void forward3(ax_rref **y) {
  int64_t xs[2] = {6, 32}, ls = 6;
  ax_tensor *x = ax_test_randn(1, 1.0f, 2, xs);
  ax_tensor *l = ax_test_randint(2, 0, 4, 1, &ls);
  for (int k = 0; k < NAGENTS; k++) {
    ax_values *a = ax_values_new();
    ax_values_add_i64(a, 7);
    ax_values_add_i64(a, k == 2);
    if (k == 0)
      ax_values_add_tensor(a, x);
    else
      ax_values_add_rref(a, y[k - 1]);
    if (k == 2)
      ax_values_add_tensor(a, l);
    AX_ASSERT_OK(ax_rmod_forward_remote(g_drv, g_stage[k], a, &y[k]));
    ax_values_free(a);
  }
  ax_tensor_release(x);
  ax_tensor_release(l);
}

static void test_grads_per_context(void **state) {
  uint64_t ctx;
  ax_rref *y[NAGENTS];
  AX_ASSERT_OK(ax_dist_context_new(g_drv, &ctx));
  forward3(y);
  AX_ASSERT_OK(ax_dist_backward_rrefs(g_drv, ctx, &y[2], 1, 30000));
  for (int k = 0; k < NAGENTS; k++) {
    ax_values *g = NULL;
    ax_call_opts o = {.timeout_ms = 10000, .autograd_ctx = ctx};
    AX_ASSERT_OK(
        ax_rref_rpc_sync(g_drv, g_stage[k], "gradients", NULL, &o, &g));
    ax_tensor *t;
    AX_ASSERT_OK(ax_values_get_tensor(g, 0, &t));
    double s = 0;
    for (size_t i = 0; i < ax_tensor_numel(t); i++)
      s += fabs(ax_f32(t)[i]);
    assert_true(s > 0.0); /* every stage got gradients */
    ax_values_free(g);
  }
  for (int k = 0; k < NAGENTS; k++)
    AX_ASSERT_OK(dt_wait_counts(g_drv, g_names[k], -1, -1, 1));
  AX_ASSERT_OK(ax_dist_context_release(g_drv, ctx, 10000));
  for (int k = 0; k < NAGENTS; k++) {
    ax_rref_release(y[k]);
    AX_ASSERT_OK(dt_wait_counts(g_drv, g_names[k], 1, 0, 0)); /* the stage */
  }
  /* The context is gone: using it again is a stale-handle error. */
  ax_values *g = NULL;
  ax_call_opts o = {.timeout_ms = 10000, .autograd_ctx = ctx};
  AX_ASSERT_ERR(ax_rref_rpc_sync(g_drv, g_stage[1], "gradients", NULL, &o, &g),
                AX_ESTALE);
}

/* Time of a backward through 3 tiny stages: one root call plus two
 * gradient edges, each answered after the next hop finished. */
static void test_bench_backward_edges(void **state) {
  const int iters = 40;
  double total = 0;
  for (int i = 0; i < iters; i++) {
    uint64_t ctx;
    ax_rref *y[NAGENTS];
    AX_ASSERT_OK(ax_dist_context_new(g_drv, &ctx));
    forward3(y);
    AX_ASSERT_OK(ax_rref_wait_created(y[2], 10000));
    double t0 = ax_clock_s();
    AX_ASSERT_OK(ax_dist_backward_rrefs(g_drv, ctx, &y[2], 1, 30000));
    if (i >= 5)
      total += ax_clock_s() - t0;
    AX_ASSERT_OK(ax_dist_context_release(g_drv, ctx, 10000));
    for (int k = 0; k < NAGENTS; k++)
      ax_rref_release(y[k]);
  }
  double us = 1e6 * total / (iters - 5);
  fprintf(stderr,
          "[bench] dist backward over 3 tiny stages: %.0f us "
          "(root call + 2 gradient edges: %.0f us per edge)\n",
          us, us / 3);
}

typedef struct killer {
  pid_t pid;
  int ms;
} killer;

static void *kill_later(void *arg) {
  killer *k = arg;
  rt_sleep_ms(k->ms);
  kill(k->pid, SIGKILL);
  return NULL;
}

static void test_peer_dies_during_backward(void **state) {
  uint64_t ctx;
  ax_rref *y[NAGENTS];
  AX_ASSERT_OK(ax_dist_context_new(g_drv, &ctx));
  forward3(y);
  AX_ASSERT_OK(ax_rref_wait_created(y[2], 10000));
  /* w2 holds the gradient for 1.5 s; w1 dies meanwhile. */
  int64_t ms = 1500;
  ax_values *a = dt_i64s(1, &ms);
  AX_ASSERT_OK(ax_rpc_sync(g_drv, "w2", "axon.autograd.debug", a, NULL, NULL));
  ax_values_free(a);
  killer k = {g_pids[0], 300};
  pthread_t th;
  pthread_create(&th, NULL, kill_later, &k);
  int64_t t0 = ax_clock_ms();
  AX_ASSERT_ERR(ax_dist_backward_rrefs(g_drv, ctx, &y[2], 1, 30000),
                AX_EPEERDOWN);
  assert_true(ax_clock_ms() - t0 < 15000);
  pthread_join(th, NULL);
  int st;
  waitpid(g_pids[0], &st, 0);
  g_pids[0] = -1;
  AX_ASSERT_OK(ax_dist_context_release(g_drv, ctx, 10000));
  for (int i = 0; i < NAGENTS; i++)
    ax_rref_release(y[i]);
  ax_rref_release(g_stage[0]);
  g_stage[0] = NULL;
  for (int i = 1; i < NAGENTS; i++)
    AX_ASSERT_OK(dt_wait_counts(g_drv, g_names[i], 1, 0, 0));
  a = dt_i64s(1, (int64_t[]){0});
  AX_ASSERT_OK(ax_rpc_sync(g_drv, "w2", "axon.autograd.debug", a, NULL, NULL));
  ax_values_free(a);
}

static void test_zero_at_end(void **state) {
  for (int k = 1; k < NAGENTS; k++) {
    ax_rref_release(g_stage[k]);
    g_stage[k] = NULL;
  }
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names + 1, NAGENTS - 1));
}

int main(void) {
  static const char *const args[] = {"--threads", "2", "--peer-timeout-ms",
                                     "1500", NULL};
  if (mt_start("driver", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  make_stages();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grads_per_context),
      cmocka_unit_test(test_bench_backward_edges),
      cmocka_unit_test(test_peer_dies_during_backward),
      cmocka_unit_test(test_zero_at_end),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
