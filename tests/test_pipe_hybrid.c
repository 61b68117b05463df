/* Pipeline x data parallel (ax_pipe_opts.replicas) with 4 real agent
 * processes on loopback: R replicas of a K-stage pipeline, each on its
 * shard of every mini-batch, their stages averaging gradients at each
 * STEP, equal one single-process run on the whole mini-batch (the
 * reference of pipe_testutil.h with the mode's own rule: plain SGD for the
 * synchronous modes, stashed versions for pipedream); every replica holds
 * bit-identical weights; the step callback sees each mini-batch once;
 * bad replica options are refused; nothing is left live afterwards. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/pipeline/state/checkpoint.h"
#include "tests/pipe_testutil.h"

#define NAGENTS 4
static const char *g_names[NAGENTS] = {"h1", "h2", "h3", "h4"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

static const char *g_model_cfg = "widths=48/40/32/24/10";
static const char *g_data_cfg = "shape=48,classes=10,examples=256,seed=7";
static const char *g_optim = "opt=sgd,lr=0.05,momentum=0.9";

typedef struct steps_seen {
  long n, last;
  int in_order;
} steps_seen;

static void on_step(void *user, const ax_pipe_step_info *si) {
  steps_seen *s = user;
  s->in_order &= si->batch == s->last + 1 && si->count == 16 && si->loss > 0;
  s->last = si->batch;
  s->n++;
}

typedef struct feed {
  pt_data data;
  steps_seen seen;
} feed;
static int feed_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  return pt_batch(&((feed *)user)->data, t, in, lab);
}
static void feed_step(void *user, const ax_pipe_step_info *si) {
  on_step(&((feed *)user)->seen, si);
}

static int same_bits(const ax_tensor *a, const ax_tensor *b) {
  return ax_tensor_numel(a) == ax_tensor_numel(b) &&
         !memcmp(a->data, b->data, ax_tensor_nbytes(a));
}

/* R replicas of a K-agent pipeline in `mode` (chunks for interleaved) for
 * `steps` mini-batches of 16 against the reference on the whole batch. */
static void run_case(int mode, int K, int R, int M, int steps) {
  const ax_model_def *def = ax_model_find("mlp");
  ax_config mcfg, dcfg;
  ax_model_info info;
  AX_ASSERT_OK(ax_model_config(def, g_model_cfg, &mcfg));
  AX_ASSERT_OK(def->describe(&mcfg, &info));
  int S = K * ax_pipe_chunks(mode, 2), bounds[AX_PIPE_MAX_STAGES + 1];
  AX_ASSERT_OK(ax_split_uniform(info.n_blocks, S, bounds));
  feed f = {{NULL, 16}, {0, -1, 1}};
  AX_ASSERT_OK(ax_config_parse(&dcfg, g_data_cfg));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &f.data.ds));
  ax_pipe_opts o = {"mlp", g_model_cfg,        K,       g_names, bounds, mode,
                    M,     AX_RECOMPUTE_NEVER, g_optim, 3,       AX_CPU, 30000};
  o.chunks = 2;
  o.replicas = R;
  ax_pipe *p = NULL;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  assert_int_equal(ax_pipe_stages(p), S);
  AX_ASSERT_OK(ax_pipe_train(p, steps, feed_batch, feed_step, &f));
  assert_int_equal(f.seen.n, steps);
  assert_true(f.seen.in_order);
  ax_tensor *want[AX_PIPE_MAX_STAGES], *wbuf[AX_PIPE_MAX_STAGES];
  f.data.batch = 16;
  pt_reference(def, &mcfg, bounds, S, ref_kind(mode), steps, pt_batch, &f.data,
               g_optim, 3, want, wbuf);
  double worst = pt_worst_stages(p, S, want, wbuf); /* releases want */
  if (ref_kind(mode) != REF_SYNC) { /* negative control: plain SGD */
    ax_tensor *sync[AX_PIPE_MAX_STAGES], *sbuf[AX_PIPE_MAX_STAGES];
    pt_reference(def, &mcfg, bounds, S, REF_SYNC, steps, pt_batch, &f.data,
                 g_optim, 3, sync, sbuf);
    double off = pt_worst_stages(p, S, sync, sbuf);
    fprintf(stderr, "    (against plain SGD instead: %.2g)\n", off);
    assert_true(off > 1e-3);
  }
  for (int r = 1; r < R; r++)
    for (int s = 0; s < S; s++) {
      ax_tensor *a, *ab, *b, *bb;
      AX_ASSERT_OK(ax_pipe_stage_state(p, s, &a, &ab));
      AX_ASSERT_OK(ax_pipe_stage_state(ax_pipe_replica(p, r), s, &b, &bb));
      if (!same_bits(a, b))
        fail_msg("%s: replica %d's stage %d differs from replica 0's",
                 ax_pipe_mode_name(mode), r, s);
      ax_tensor_release(a), ax_tensor_release(ab);
      ax_tensor_release(b), ax_tensor_release(bb);
    }
  fprintf(stderr,
          "  %-11s K=%d R=%d M=%d: %d steps, worst relative "
          "difference from the whole batch %.2g\n",
          ax_pipe_mode_name(mode), K, R, M, steps, worst);
  if (worst > 1e-5)
    fail_msg("%s K=%d R=%d: relative difference %.3g", ax_pipe_mode_name(mode),
             K, R, worst);
  ax_pipe_free(p);
  ax_dataset_close(f.data.ds);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_sync_modes_equal_whole_batch(void **state) {
  run_case(AX_MODE_GPIPE, 2, 2, 2, 3);
  run_case(AX_MODE_1F1B, 2, 2, 4, 3);
  run_case(AX_MODE_SEQUENTIAL, 2, 2, 1, 3);
  run_case(AX_MODE_ZBH1, 2, 2, 2, 3);
  run_case(AX_MODE_INTERLEAVED, 2, 2, 2, 3);
  run_case(AX_MODE_GPIPE, 1, 4, 2, 3); /* data parallel alone */
}

static void test_async_mode_equals_its_rule(void **state) {
  /* Rounding differences (a mean of two shard means against one whole
   * mean) compound through the stale weights: 7e-7 after 3 steps, 4e-6
   * after 5, 3.5e-5 after 8. A wrong rule is off by more than 1e-3. */
  run_case(AX_MODE_PIPEDREAM, 2, 2, 1, 5);
}

/* Trains R replicas of K agents in `mode` with `zero` and returns every
 * stage's parameters (replica 0's, after checking the others hold the
 * same). */
static int train_params(int mode, int K, int R, int M, int steps, int zero,
                        const char *optim, const char *opt_host,
                        ax_tensor **out) {
  ax_config dcfg;
  pt_data data = {NULL, 16};
  AX_ASSERT_OK(ax_config_parse(&dcfg, g_data_cfg));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
  ax_pipe_opts o = {"mlp", g_model_cfg,        K,     g_names, NULL,   mode,
                    M,     AX_RECOMPUTE_NEVER, optim, 3,       AX_CPU, 30000};
  o.replicas = R;
  o.zero = zero;
  o.optimizer_host = opt_host;
  ax_pipe *p = NULL;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, steps, pt_batch, NULL, &data));
  int S = ax_pipe_stages(p);
  for (int s = 0; s < S; s++) {
    ax_tensor *buf, *b, *bb;
    AX_ASSERT_OK(ax_pipe_stage_state(p, s, &out[s], &buf));
    ax_tensor_release(buf);
    for (int r = 1; r < R; r++) {
      AX_ASSERT_OK(ax_pipe_stage_state(ax_pipe_replica(p, r), s, &b, &bb));
      assert_true(same_bits(out[s], b));
      ax_tensor_release(b), ax_tensor_release(bb);
    }
  }
  ax_pipe_free(p);
  ax_dataset_close(data.ds);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
  return S;
}

/* Sharded optimizer state (ZeRO 1 and 2) gives the unsharded replicas'
 * weights to the bit, with SGD momentum and with AdamW. */
static void test_zero_equals_unsharded(void **state) {
  static const struct {
    int mode, K, R, M, zero;
    const char *optim;
  } c[] = {
      {AX_MODE_1F1B, 2, 2, 2, 1, "opt=sgd,lr=0.05,momentum=0.9"},
      {AX_MODE_GPIPE, 1, 4, 2, 2, "opt=adamw,lr=0.01,wd=0.01"},
      {AX_MODE_PIPEDREAM, 2, 2, 1, 1, "opt=sgd,lr=0.05,momentum=0.9"},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    ax_tensor *plain[AX_PIPE_MAX_STAGES], *sharded[AX_PIPE_MAX_STAGES];
    int S = train_params(c[i].mode, c[i].K, c[i].R, c[i].M, 4, 0, c[i].optim,
                         NULL, plain);
    train_params(c[i].mode, c[i].K, c[i].R, c[i].M, 4, c[i].zero, c[i].optim,
                 NULL, sharded);
    for (int s = 0; s < S; s++) {
      if (!same_bits(plain[s], sharded[s]))
        fail_msg("%s K=%d R=%d zero %d: stage %d differs from the unsharded "
                 "run",
                 ax_pipe_mode_name(c[i].mode), c[i].K, c[i].R, c[i].zero, s);
      ax_tensor_release(plain[s]);
      ax_tensor_release(sharded[s]);
    }
    fprintf(stderr,
            "  %-10s K=%d R=%d zero %d (%s): equal to the unsharded "
            "run, bit for bit\n",
            ax_pipe_mode_name(c[i].mode), c[i].K, c[i].R, c[i].zero,
            c[i].optim);
  }
}

/* Every stage's optimizer on another agent (ZeRO-Offload adapted): the
 * same weights, to the bit, as the stages' own optimizers; alone and with
 * replicas; refused with zero. */
static void test_offload_equals_local(void **state) {
  static const struct {
    int mode, K, R, M;
    const char *host, *optim;
  } c[] = {
      {AX_MODE_1F1B, 2, 1, 2, "h3", "opt=sgd,lr=0.05,momentum=0.9"},
      {AX_MODE_PIPEDREAM, 2, 1, 1, "h4", "opt=adamw,lr=0.01,wd=0.01"},
      {AX_MODE_GPIPE, 1, 2, 2, "h3", "opt=sgd,lr=0.05,momentum=0.9"},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    ax_tensor *local[AX_PIPE_MAX_STAGES], *away[AX_PIPE_MAX_STAGES];
    int S = train_params(c[i].mode, c[i].K, c[i].R, c[i].M, 4, 0, c[i].optim,
                         NULL, local);
    train_params(c[i].mode, c[i].K, c[i].R, c[i].M, 4, 0, c[i].optim, c[i].host,
                 away);
    for (int s = 0; s < S; s++) {
      if (!same_bits(local[s], away[s]))
        fail_msg("%s K=%d R=%d: stage %d with its optimizer on %s differs",
                 ax_pipe_mode_name(c[i].mode), c[i].K, c[i].R, s, c[i].host);
      ax_tensor_release(local[s]);
      ax_tensor_release(away[s]);
    }
    fprintf(stderr,
            "  %-10s K=%d R=%d, optimizer on %s (%s): equal to the "
            "local update, bit for bit\n",
            ax_pipe_mode_name(c[i].mode), c[i].K, c[i].R, c[i].host,
            c[i].optim);
  }
  const char *two[2] = {"h1", "h2"};
  ax_pipe_opts o = {
      "mlp", g_model_cfg,        1,       two, NULL,   AX_MODE_GPIPE,
      2,     AX_RECOMPUTE_NEVER, g_optim, 3,   AX_CPU, 30000};
  o.replicas = 2;
  o.zero = 1;
  o.optimizer_host = "h3";
  ax_pipe *p = NULL;
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

/* Replicas checkpoint and resume: 3 steps, a checkpoint, 2 more steps;
 * a new pipeline restored from the checkpoint and trained 2 steps holds
 * the same weights to the bit in every replica (stage files on this
 * host's disk, and through the coordinator), without and with zero (each
 * replica's optimizer shard in its own file). */
static void test_replicas_resume(void **state) {
  for (int run = 0; run < 4; run++) {
    int flags = run & 1 ? AX_CKPT_TO_COORDINATOR : 0, zero = run >> 1;
    char root[] = "/tmp/axon_hybrid_ckXXXXXX";
    assert_non_null(mkdtemp(root));
    ax_config dcfg;
    pt_data data = {NULL, 16};
    AX_ASSERT_OK(ax_config_parse(&dcfg, g_data_cfg));
    AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
    ax_pipe_opts o = {
        "mlp", g_model_cfg,        2,       g_names, NULL,   AX_MODE_1F1B,
        2,     AX_RECOMPUTE_NEVER, g_optim, 3,       AX_CPU, 30000};
    o.replicas = 2;
    o.zero = zero;
    ax_pipe *a = NULL, *b = NULL;
    AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &a));
    AX_ASSERT_OK(ax_pipe_train(a, 3, pt_batch, NULL, &data));
    ax_ckpt_info in;
    memset(&in, 0, sizeof in);
    in.step = 3;
    in.seed = 3;
    snprintf(in.model, sizeof in.model, "mlp");
    snprintf(in.config, sizeof in.config, "hybrid");
    AX_ASSERT_OK(ax_pipe_checkpoint(a, root, &in, 2, flags));
    AX_ASSERT_OK(ax_pipe_train(a, 2, pt_batch, NULL, &data));
    AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &b));
    ax_ckpt_info got;
    AX_ASSERT_OK(ax_pipe_restore(b, root, &got));
    assert_int_equal(got.step, 3);
    AX_ASSERT_OK(ax_pipe_train(b, 2, pt_batch, NULL, &data));
    for (int r = 0; r < 2; r++)
      for (int s = 0; s < 2; s++) {
        ax_tensor *pa, *ba, *pb, *bb;
        AX_ASSERT_OK(ax_pipe_stage_state(ax_pipe_replica(a, r), s, &pa, &ba));
        AX_ASSERT_OK(ax_pipe_stage_state(ax_pipe_replica(b, r), s, &pb, &bb));
        if (!same_bits(pa, pb))
          fail_msg("replica %d stage %d: the resumed run differs (flags %d)", r,
                   s, flags);
        ax_tensor_release(pa), ax_tensor_release(ba);
        ax_tensor_release(pb), ax_tensor_release(bb);
      }
    ax_pipe_free(a);
    ax_pipe_free(b);
    ax_dataset_close(data.ds);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    assert_int_equal(system(cmd), 0);
    fprintf(stderr,
            "  1f1b K=2 R=2 zero %d: resumed from step 3 (%s), equal to the "
            "uninterrupted run in both replicas\n",
            zero,
            flags ? "files through the coordinator" : "files on the agents");
  }
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

/* A stage agent of replica 1 killed mid-run: the train call fails with
 * AX_EPEERDOWN naming replica 1 and the dead agent within seconds. The
 * surviving replica's call ends as soon as replica 1's fails (its stages
 * may still wait in their all-reduce on the agents, which the pipeline's
 * timeout bounds). Runs last: h4 stays dead. */
static void test_lost_replica_agent(void **state) {
  ax_config dcfg;
  pt_data data = {NULL, 16};
  AX_ASSERT_OK(ax_config_parse(&dcfg, g_data_cfg));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
  ax_pipe_opts o = {
      "mlp", g_model_cfg,        2,       g_names, NULL,   AX_MODE_1F1B,
      2,     AX_RECOMPUTE_NEVER, g_optim, 3,       AX_CPU, 30000};
  o.replicas = 2;
  ax_pipe *p = NULL;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  const char *want[] = {"replica 1", "h4", NULL};
  pt_train_until_killed(p, &g_pids[3], pt_batch, &data, "h4", want);
  ax_pipe_free(p);
  ax_dataset_close(data.ds);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS - 1));
}

static void test_bad_replica_options(void **state) {
  const char *twice[4] = {"h1", "h2", "h1", "h4"};
  ax_pipe_opts o = {
      "mlp", g_model_cfg,        2,       twice, NULL,   AX_MODE_GPIPE,
      2,     AX_RECOMPUTE_NEVER, g_optim, 3,     AX_CPU, 30000};
  o.replicas = 2;
  ax_pipe *p = NULL;
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "distinct"));
  o.agents = g_names;
  o.replicas = AX_PIPE_MAX_REPLICAS + 1;
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL);
  assert_null(p);
  o.replicas = 1; /* zero shards over replicas */
  o.zero = 1;
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL);
  o.replicas = 2;
  o.zero = 3;
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL);
  o.zero = 0;
  o.replicas = 2;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  assert_null(ax_pipe_replica(p, 2));
  ax_pipe_free(p);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

int main(void) {
  static const char *const args[] = {"--threads", "4", NULL};
  if (mt_start("hcoord", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_replica_options),
      cmocka_unit_test(test_sync_modes_equal_whole_batch),
      cmocka_unit_test(test_async_mode_equals_its_rule),
      cmocka_unit_test(test_zero_equals_unsharded),
      cmocka_unit_test(test_offload_equals_local),
      cmocka_unit_test(test_replicas_resume),
      cmocka_unit_test(test_lost_replica_agent), /* last: kills h4 */
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
