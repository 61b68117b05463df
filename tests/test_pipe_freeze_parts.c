/* Freezing (runtime/pipeline/state/freeze.h) with the other ways a pipeline
 * holds its state, through the mover, with real agents:
 *  - tensor parallelism: a small BERT (dropout 0.1) by 1f1b over K = 2
 *    stages of T = 2 members, its embedding frozen at step 3 and the rest
 *    re-packed onto K = 1 x 2 replicas of 2 members, to step 6, equals the
 *    same run without tensor parallelism (K = 2, then K = 1 x 2 replicas)
 *    within relative 1e-5 in the whole model's parameters and in the
 *    evaluation loss through the prefix (negative control: the run without
 *    the freeze is off by more than 1e-3);
 *  - ZeRO (gpipe, K = 2 x 2 replicas, re-packed onto K = 1 x 4 sharding over
 *    the four) and an optimizer host (1f1b, K = 2 re-packed onto K = 1 x 2,
 *    every optimizer on a fifth agent) equal the same runs without, bit for
 *    bit: the whole model's parameters and optimizer state;
 *  - a staleness correction (pipedream with pipemare and with predict, 2bw
 *    with predict; K = 4 re-packed onto K = 2 x 2): its history (the
 *    average update, 2bw's prediction for the next batch) moves with the
 *    rest of the state;
 *  - a checkpoint of a frozen pipeline (gpipe K = 4 re-packed onto K = 2 x
 *    2, 2 steps after the freeze) resumed on another layout (K = 2
 *    re-packed onto K = 1 x 2) goes on to the same bits.
 * The whole model's state is read back as a checkpoint of the pipeline
 * (ax_state_read); every freeze must leave it as it was (every block's
 * parameters and buffers, the trained blocks' optimizer state and update
 * counts), bit for bit. Zero live RRefs, contexts and calls on every
 * node. */
#include <stdlib.h>
#include <string.h>

#define PT_FLOOR_RMS
#include "axon/runtime/pipeline/state/checkpoint.h"
#include "axon/runtime/pipeline/state/freeze.h"
#include "axon/runtime/pipeline/state/state.h"
#include "tests/pipe_testutil.h"

#define NAGENTS 5
static const char *g_names[NAGENTS] = {"f1", "f2", "f3", "f4", "f5"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

#define BERT_CFG "layers=2,hidden=32,heads=4,ff=64,vocab=50,seq=16,dropout=0.1"
#define MLP_CFG "widths=24/32/28/20/16/10"
#define DATA_CFG "shape=24,classes=10,examples=64,seed=3"
#define OPTIM "opt=sgd,lr=0.05,momentum=0.9"
#define SEED 7

static int bert_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  return ax_test_bert_batch(t, 8, 16, 3, in, lab);
}

/* The whole model's state of p, read back from a checkpoint of it. */
static void state_of(ax_pipe *p, ax_train_state *st) {
  char root[] = "/tmp/axon_freeze_partsXXXXXX", cmd[128];
  assert_non_null(mkdtemp(root));
  ax_ckpt_info in;
  memset(&in, 0, sizeof in);
  in.step = 1;
  AX_ASSERT_OK(ax_pipe_checkpoint(p, root, &in, 2, 0));
  AX_ASSERT_OK(ax_state_read(root, st, NULL));
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  assert_int_equal(system(cmd), 0);
}

/* n floats as a tensor, for pt_worst. */
static ax_tensor *as_tensor(const float *v, size_t n) {
  int64_t len = (int64_t)n;
  ax_tensor *t = ax_tensor_new(AX_F32, 1, &len, AX_CPU);
  memcpy(ax_f32(t), v, n * sizeof(float));
  return t;
}

static double worst_params(const ax_train_state *a, const ax_train_state *b) {
  assert_int_equal(a->n_params, b->n_params);
  ax_tensor *x = as_tensor(a->params, a->n_params);
  ax_tensor *y = as_tensor(b->params, b->n_params);
  double w = pt_worst(x, y);
  ax_tensor_release(x);
  ax_tensor_release(y);
  return w;
}

/* The same bits in the parameters, buffers and optimizer state. */
static int same_state(const ax_train_state *a, const ax_train_state *b) {
  size_t np = a->n_params * sizeof(float), nb = a->n_buffers * sizeof(float);
  return a->n_params == b->n_params && a->n_buffers == b->n_buffers &&
         !memcmp(a->params, b->params, np) &&
         !memcmp(a->buffers, b->buffers, nb) && !a->m == !b->m &&
         (!a->m || !memcmp(a->m, b->m, np)) && !a->v == !b->v &&
         (!a->v || !memcmp(a->v, b->v, np)) &&
         !memcmp(a->optim_steps, b->optim_steps,
                 (size_t)a->n_blocks * sizeof(long));
}

/* n floats from `at` of a and b: both absent, or the same bits. */
static int same_part(const float *a, const float *b, size_t at, size_t n) {
  return !a == !b && (!a || !memcmp(a + at, b + at, n * sizeof(float)));
}

/* The state right after a freeze (b) is the state right before it (a):
 * every block's parameters and buffers, and from block f on (the frozen
 * prefix keeps none) the optimizer state, update counts and the staleness
 * correction's history. */
static int same_moved(const ax_train_state *a, const ax_train_state *b, int f) {
  size_t at = a->param_at[f], n = a->n_params - at;
  int same = a->n_params == b->n_params && a->n_buffers == b->n_buffers &&
             same_part(a->params, b->params, 0, a->n_params) &&
             same_part(a->buffers, b->buffers, 0, a->n_buffers) &&
             same_part(a->m, b->m, at, n) && same_part(a->v, b->v, at, n) &&
             same_part(a->delta, b->delta, at, n) &&
             same_part(a->pred, b->pred, at, n) && a->pred_for == b->pred_for;
  for (int i = f; same && i < a->n_blocks; i++)
    same = a->optim_steps[i] == b->optim_steps[i] &&
           a->last_step[i] == b->last_step[i];
  return same;
}

typedef struct run {
  const char *model, *model_cfg;
  int mode, K, M, T, R, zero;
  const char *optim_host;
  int staleness;
  const char *const *agents; /* NULL: g_names */
} run;

static ax_pipe *new_pipe(const run *r) {
  ax_pipe_opts o = {
      r->model, r->model_cfg, r->K,   r->agents ? r->agents : g_names,
      NULL,     r->mode,      r->M,   AX_RECOMPUTE_NEVER,
      OPTIM,    SEED,         AX_CPU, 30000};
  o.tensor_parallel = r->T;
  o.replicas = r->R;
  o.zero = r->zero;
  o.optimizer_host = r->optim_host;
  o.staleness = r->staleness;
  ax_pipe *p = NULL;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  return p;
}

/* Trains r `before` steps, freezes `blocks` onto K agents per replica (a
 * negative count: no freeze), trains `after` steps; the whole state into
 * *st, the evaluation loss into *loss. The freeze must move the state
 * exactly (same_moved). */
static void train_frozen(const run *r, ax_pipe_batch_fn batch, void *data,
                         long before, int blocks, int K, long after,
                         ax_train_state *st, double *loss) {
  ax_pipe *p = new_pipe(r);
  AX_ASSERT_OK(ax_pipe_train(p, before, batch, NULL, data));
  ax_freeze_opts fo = {blocks, K, 0};
  if (blocks > 0) {
    ax_train_state s0, s1;
    state_of(p, &s0);
    AX_ASSERT_OK(ax_pipe_freeze(&p, &fo));
    state_of(p, &s1);
    if (!same_moved(&s0, &s1, blocks))
      fail_msg("the freeze of %d blocks did not move the state exactly",
               blocks);
    ax_state_free(&s0), ax_state_free(&s1);
  }
  AX_ASSERT_OK(ax_pipe_train(p, after, batch, NULL, data));
  double acc;
  if (loss)
    AX_ASSERT_OK(ax_pipe_evaluate(p, 2, batch, data, &acc, loss));
  state_of(p, st);
  ax_pipe_free(p);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_tensor_parallel(void **state) {
  run tp = {"bert", BERT_CFG, AX_MODE_1F1B, 2, 2, 2}, plain = tp;
  plain.T = 1;
  ax_train_state a, b, c;
  double la, lb, lc;
  train_frozen(&tp, bert_batch, NULL, 3, 1, 1, 3, &a, &la);
  train_frozen(&plain, bert_batch, NULL, 3, 1, 1, 3, &b, &lb);
  train_frozen(&plain, bert_batch, NULL, 3, -1, 0, 3, &c, &lc);
  double w = worst_params(&a, &b), off = worst_params(&c, &b);
  double dl = fabs(la - lb) / fabs(lb);
  fprintf(stderr,
          "  bert 1f1b K=2 T=2 -> embedding frozen, K=1 x 2 replicas of 2 "
          "members: worst relative difference from the run without tensor "
          "parallelism %.2g (without the freeze %.2g), evaluation loss "
          "%.2g\n",
          w, off, dl);
  if (w > 1e-5 || dl > 1e-5)
    fail_msg("tensor-parallel freeze: relative differences %.3g / %.3g > "
             "1e-5",
             w, dl);
  assert_true(off > 1e-3);
  ax_state_free(&a), ax_state_free(&b), ax_state_free(&c);
}

static void open_data(pt_data *d) {
  ax_config dcfg;
  AX_ASSERT_OK(ax_config_parse(&dcfg, DATA_CFG));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &d->ds));
}

static void test_zero_and_optimizer_host(void **state) {
  static const run c[] = {
      {"mlp", MLP_CFG, AX_MODE_GPIPE, 2, 2, 1, 2, 1, NULL},
      {"mlp", MLP_CFG, AX_MODE_1F1B, 2, 2, 1, 1, 0, "f5"},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    pt_data d = {NULL, 16};
    open_data(&d);
    run plain = c[i];
    plain.zero = 0;
    plain.optim_host = NULL;
    ax_train_state a, b;
    train_frozen(&c[i], pt_batch, &d, 3, 2, 1, 3, &a, NULL);
    train_frozen(&plain, pt_batch, &d, 3, 2, 1, 3, &b, NULL);
    if (!same_state(&a, &b))
      fail_msg("%s: the frozen run differs from the one without",
               c[i].zero ? "zero" : "optimizer host");
    fprintf(stderr,
            "  mlp %s K=2 x %d %s -> 2 blocks frozen, K=1 x %d: equal to "
            "the run without, bit for bit\n",
            ax_pipe_mode_name(c[i].mode), c[i].R > 1 ? c[i].R : 1,
            c[i].zero ? "zero 1" : "optimizer on f5", c[i].zero ? 4 : 2);
    ax_state_free(&a), ax_state_free(&b);
    ax_dataset_close(d.ds);
  }
}

/* Trains a pipeline of r 3 steps, freezes it (fo), trains `between`
 * steps, checkpoints it, trains `after` steps; then a new pipeline of rb
 * frozen by fo_b restores the checkpoint and trains `after` steps too: the
 * same bits. */
static void freeze_resume(const run *r, const ax_freeze_opts *fo, const run *rb,
                          const ax_freeze_opts *fo_b, long between, long after,
                          const char *what) {
  pt_data d = {NULL, 16};
  open_data(&d);
  char root[] = "/tmp/axon_freeze_resumeXXXXXX", cmd[128];
  assert_non_null(mkdtemp(root));
  ax_pipe *a = new_pipe(r), *b = new_pipe(rb);
  AX_ASSERT_OK(ax_pipe_train(a, 3, pt_batch, NULL, &d));
  AX_ASSERT_OK(ax_pipe_freeze(&a, fo));
  AX_ASSERT_OK(ax_pipe_train(a, between, pt_batch, NULL, &d));
  ax_ckpt_info in, got;
  memset(&in, 0, sizeof in);
  in.step = 3 + between;
  AX_ASSERT_OK(ax_pipe_checkpoint(a, root, &in, 2, 0));
  AX_ASSERT_OK(ax_pipe_train(a, after, pt_batch, NULL, &d));
  AX_ASSERT_OK(ax_pipe_freeze(&b, fo_b));
  AX_ASSERT_OK(ax_pipe_restore(b, root, &got));
  assert_int_equal(got.step, 3 + between);
  AX_ASSERT_OK(ax_pipe_train(b, after, pt_batch, NULL, &d));
  ax_train_state sa, sb;
  state_of(a, &sa);
  state_of(b, &sb);
  double acc, la, lb;
  AX_ASSERT_OK(ax_pipe_evaluate(a, 2, pt_batch, &d, &acc, &la));
  AX_ASSERT_OK(ax_pipe_evaluate(b, 2, pt_batch, &d, &acc, &lb));
  if (!same_state(&sa, &sb) || la != lb)
    fail_msg("%s: the resumed frozen run differs", what);
  fprintf(stderr, "  %s: resumed, equal to the uninterrupted run\n", what);
  ax_state_free(&sa), ax_state_free(&sb);
  ax_pipe_free(a);
  ax_pipe_free(b);
  ax_dataset_close(d.ds);
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  assert_int_equal(system(cmd), 0);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_staleness(void **state) {
  static const struct {
    int mode, kind;
  } c[] = {{AX_MODE_PIPEDREAM, AX_STALE_PIPEMARE},
           {AX_MODE_PIPEDREAM, AX_STALE_PREDICT},
           {AX_MODE_2BW, AX_STALE_PREDICT}};
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    pt_data d = {NULL, 16};
    open_data(&d);
    run r = {"mlp", MLP_CFG, c[i].mode, 4, 4, 1, 1, 0, NULL};
    r.staleness = c[i].kind;
    ax_train_state st;
    train_frozen(&r, pt_batch, &d, 3, 2, 2, 3, &st, NULL);
    assert_non_null(st.delta); /* a history to move */
    assert_true(c[i].mode != AX_MODE_2BW || st.pred);
    fprintf(stderr,
            "  mlp %s --staleness %s K=4 -> 2 blocks frozen, K=2 x 2: "
            "the correction's history moved too\n",
            ax_pipe_mode_name(c[i].mode), ax_staleness_name(c[i].kind));
    ax_state_free(&st);
    ax_dataset_close(d.ds);
  }
}

static void test_resume_other_layout(void **state) {
  run a = {"mlp", MLP_CFG, AX_MODE_GPIPE, 4, 2, 1, 1, 0, NULL}, b = a;
  b.K = 2;
  ax_freeze_opts fa = {2, 2, 0}, fb = {2, 1, 0};
  freeze_resume(&a, &fa, &b, &fb, 2, 2,
                "gpipe K=4 -> 2 blocks frozen, K=2 x 2, resumed on K=2 -> "
                "K=1 x 2");
}

int main(void) {
  static const char *const args[] = {"--threads", "1", NULL};
  ax_cpu_set_threads(1);
  if (mt_start("fdrv", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tensor_parallel),
      cmocka_unit_test(test_zero_and_optimizer_host),
      cmocka_unit_test(test_staleness),
      cmocka_unit_test(test_resume_other_layout),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
