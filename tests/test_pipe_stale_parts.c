/* Staleness corrections (runtime/pipeline/stage/staleness.h) with the
 * optimizer state away from the stage, over 6 real agent processes on
 * loopback:
 *  - ZeRO (zero 1, two replicas): pipedream with pipemare (K = 3 and a
 *    warm-up, so stage 0's learning-rate scale changes at every update)
 *    and 2bw with predict equal the same runs without zero, bit for bit;
 *  - an optimizer host: the same corrections equal the stages' own
 *    optimizers, bit for bit;
 *  - each corrected run differs from the run without its correction (the
 *    runs compared do correct), and every replica holds the same weights;
 *  - a resume from a checkpoint equals the run that goes on, with either;
 *  - an optimizer host with zero is refused, saying where each keeps the
 *    optimizer state;
 * and every node ends with zero live RRefs, contexts, calls and futures. */
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/pipeline/state/checkpoint.h"
#include "tests/pipe_testutil.h"

#define NAGENTS 6
static const char *g_names[NAGENTS] = {"q1", "q2", "q3", "q4", "q5", "q6"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

static const char *g_model_cfg = "widths=48/40/32/24/10";
static const char *g_data_cfg = "shape=48,classes=10,examples=256,seed=7";
enum { STEPS = 8 };

typedef struct stale_run {
  int mode, K, M, staleness, warmup;
  const char *optim;
  int R, zero;      /* replicas (0: none) and ZeRO */
  const char *host; /* the optimizer host, or NULL */
} stale_run;

static int same_bits(const ax_tensor *a, const ax_tensor *b) {
  return ax_tensor_numel(a) == ax_tensor_numel(b) &&
         !memcmp(a->data, b->data, ax_tensor_nbytes(a));
}

static ax_pipe *new_pipe(const stale_run *r) {
  ax_pipe_opts o = {"mlp",    g_model_cfg, r->K,   g_names,
                    NULL,     r->mode,     r->M,   AX_RECOMPUTE_NEVER,
                    r->optim, 3,           AX_CPU, 30000};
  o.staleness = r->staleness;
  o.stale_warmup = r->warmup;
  o.replicas = r->R;
  o.zero = r->zero;
  o.optimizer_host = r->host;
  ax_pipe *p = NULL;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  return p;
}

/* Every stage's parameters (replica 0's, after checking that the others
 * hold the same) in out. */
static void stage_params(ax_pipe *p, const stale_run *r, ax_tensor **out) {
  for (int s = 0; s < r->K; s++) {
    ax_tensor *buf, *b, *bb;
    AX_ASSERT_OK(ax_pipe_stage_state(p, s, &out[s], &buf));
    ax_tensor_release(buf);
    for (int i = 1; i < r->R; i++) {
      AX_ASSERT_OK(ax_pipe_stage_state(ax_pipe_replica(p, i), s, &b, &bb));
      if (!same_bits(out[s], b))
        fail_msg("replica %d stage %d differs from replica 0", i, s);
      ax_tensor_release(b), ax_tensor_release(bb);
    }
  }
}

static void open_data(pt_data *data) {
  ax_config dcfg;
  AX_ASSERT_OK(ax_config_parse(&dcfg, g_data_cfg));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data->ds));
}

/* Trains the run for STEPS mini-batches of 16; its parameters in out. */
static void train(const stale_run *r, ax_tensor **out) {
  pt_data data = {NULL, 16};
  open_data(&data);
  ax_pipe *p = new_pipe(r);
  AX_ASSERT_OK(ax_pipe_train(p, STEPS, pt_batch, NULL, &data));
  stage_params(p, r, out);
  ax_pipe_free(p);
  ax_dataset_close(data.ds);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

/* Whether every stage of a equals b's to the bit. */
static int equal_runs(int K, ax_tensor **a, ax_tensor **b) {
  int same = 1;
  for (int s = 0; s < K; s++)
    same &= same_bits(a[s], b[s]);
  return same;
}

static void release_runs(int K, ax_tensor **a, ax_tensor **b, ax_tensor **c) {
  for (int s = 0; s < K; s++) {
    ax_tensor_release(a[s]);
    ax_tensor_release(b[s]);
    ax_tensor_release(c[s]);
  }
}

static const char *what(const stale_run *r) {
  static char s[128];
  snprintf(s, sizeof s, "%s %s K=%d M=%d (%s)", ax_pipe_mode_name(r->mode),
           ax_staleness_name(r->staleness), r->K, r->M, r->optim);
  return s;
}

static const stale_run g_cases[] = {
    {AX_MODE_PIPEDREAM, 3, 1, AX_STALE_PIPEMARE, 4,
     "opt=sgd,lr=0.05,momentum=0.9", 0, 0, NULL},
    {AX_MODE_2BW, 2, 2, AX_STALE_PREDICT, 0, "opt=adamw,lr=0.01,wd=0.01", 0, 0,
     NULL},
};
#define NCASES (sizeof g_cases / sizeof g_cases[0])

/* Case i as given (base), changed by `change` (the run under test), and
 * that run without its correction: the second must equal the first to the
 * bit and differ from the third. */
static void compare(size_t i, void (*change)(stale_run *), const char *how,
                    const char *base_how) {
  stale_run base = g_cases[i], r = g_cases[i];
  ax_tensor *want[NAGENTS], *got[NAGENTS], *none[NAGENTS];
  change(&base);
  base.zero = 0;
  base.host = NULL;
  change(&r);
  train(&base, want);
  train(&r, got);
  r.staleness = AX_STALE_NONE;
  train(&r, none);
  int same = equal_runs(r.K, want, got), off = !equal_runs(r.K, got, none);
  release_runs(r.K, want, got, none);
  if (!same)
    fail_msg("%s %s: differs from the run %s", what(&g_cases[i]), how,
             base_how);
  if (!off)
    fail_msg("%s %s: the same as without the correction", what(&g_cases[i]),
             how);
  fprintf(stderr,
          "  %s %s: equal to the run %s, bit for bit (and not to the run "
          "without the correction)\n",
          what(&g_cases[i]), how, base_how);
}

static void with_zero(stale_run *r) {
  r->R = 2;
  r->zero = 1;
}

static void with_host(stale_run *r) { r->host = g_names[r->K]; }

/* The sharded optimizer state takes the same learning-rate scale, and the
 * correction reads the update from the all-gathered weights. */
static void test_zero_equals_unsharded(void **state) {
  for (size_t i = 0; i < NCASES; i++)
    compare(i, with_zero, "with 2 replicas, zero 1", "without zero");
}

/* The optimizer host applies the learning-rate scale its step carries;
 * the stage reads the update once the weights are back. */
static void test_offload_equals_local(void **state) {
  for (size_t i = 0; i < NCASES; i++)
    compare(i, with_host, "with an optimizer host",
            "with the stages' own optimizers");
}

/* A checkpoint after 3 steps and 3 more steps; a new pipeline restored
 * from it and trained 3 steps holds the same weights, bit for bit: the
 * file has the correction's history and the optimizer's update count
 * (PipeMare's warm-up goes on from it, also on an optimizer host). */
static void resume(void (*change)(stale_run *), const char *how) {
  stale_run r = g_cases[0];
  change(&r);
  char root[] = "/tmp/axon_stale_parts_XXXXXX";
  assert_non_null(mkdtemp(root));
  pt_data data = {NULL, 16};
  open_data(&data);
  ax_ckpt_info in, got;
  memset(&in, 0, sizeof in);
  in.step = 3;
  in.seed = 3;
  snprintf(in.model, sizeof in.model, "mlp");
  snprintf(in.config, sizeof in.config, "stale");
  ax_pipe *a = new_pipe(&r);
  AX_ASSERT_OK(ax_pipe_train(a, 3, pt_batch, NULL, &data));
  AX_ASSERT_OK(ax_pipe_checkpoint(a, root, &in, 2, AX_CKPT_TO_COORDINATOR));
  AX_ASSERT_OK(ax_pipe_train(a, 3, pt_batch, NULL, &data));
  ax_pipe *b = new_pipe(&r);
  AX_ASSERT_OK(ax_pipe_restore(b, root, &got));
  assert_int_equal(got.step, 3);
  AX_ASSERT_OK(ax_pipe_train(b, 3, pt_batch, NULL, &data));
  ax_tensor *pa[NAGENTS], *pb[NAGENTS], *none[NAGENTS] = {NULL};
  stage_params(a, &r, pa);
  stage_params(b, &r, pb);
  int same = equal_runs(r.K, pa, pb);
  release_runs(r.K, pa, pb, none);
  ax_pipe_free(a);
  ax_pipe_free(b);
  ax_dataset_close(data.ds);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  assert_int_equal(system(cmd), 0);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
  if (!same)
    fail_msg("%s %s: the resumed run differs", what(&r), how);
  fprintf(stderr,
          "  %s %s: resumed from step 3, equal to the run that went "
          "on, bit for bit\n",
          what(&r), how);
}

static void test_resume(void **state) {
  resume(with_zero, "with 2 replicas, zero 1");
  resume(with_host, "with an optimizer host");
}

static void test_offload_with_zero_refused(void **state) {
  ax_pipe_opts o = {"mlp",
                    g_model_cfg,
                    2,
                    g_names,
                    NULL,
                    AX_MODE_PIPEDREAM,
                    1,
                    AX_RECOMPUTE_NEVER,
                    "opt=sgd,lr=0.05",
                    3,
                    AX_CPU,
                    30000};
  o.replicas = 2;
  o.zero = 1;
  o.optimizer_host = g_names[4];
  o.staleness = AX_STALE_PIPEMARE;
  ax_pipe *p = NULL;
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL);
  assert_null(p);
  assert_non_null(strstr(ax_errmsg(), "whole optimizer state on one agent"));
  assert_non_null(strstr(ax_errmsg(), "shards it over the replicas"));
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

int main(void) {
  static const char *const args[] = {"--threads", "2", NULL};
  if (mt_start("coordq", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_offload_with_zero_refused),
      cmocka_unit_test(test_zero_equals_unsharded),
      cmocka_unit_test(test_offload_equals_local),
      cmocka_unit_test(test_resume),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
