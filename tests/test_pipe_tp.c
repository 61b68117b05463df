/* Tensor parallelism in the pipeline (ax_pipe_opts.tensor_parallel), with
 * real agent processes: a small BERT with dropout 0.1 whose encoder layers
 * are split over T agents per stage (models/layers/parallel.h), trained
 * by 1f1b (K = 2, T = 2), zb-h1 (split backward, K = 2, T = 2) and gpipe
 * (K = 1, T = 4), and by 1f1b in bf16 (ax_pipe_opts.precision), against
 * the micro-batched single-process reference of the whole model (in the
 * same precision): every member's every stage must equal its slice of the
 * reference (ax_tp_slice_params) within relative 1e-5, and the reference
 * with other dropout masks must be off by more than 1e-3 (negative
 * control). Evaluation runs on every member; a checkpoint resumes every
 * member to the bit; models without split layers and tp keys in the model
 * configuration are refused; a killed member fails the call. Every
 * node ends with zero live RRefs, contexts, calls and futures. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PT_FLOOR_RMS
#include "axon/kernels/clock.h"
#include "axon/models/layers/parallel.h"
#include "axon/runtime/pipeline/state/checkpoint.h"
#include "axon/runtime/pipeline/state/ckpt_file-impl.h"
#include "tests/pipe_testutil.h"

#define NAGENTS 4
static const char *g_names[NAGENTS] = {"t1", "t2", "t3", "t4"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

#define BERT_CFG "layers=2,hidden=32,heads=4,ff=64,vocab=50,seq=16,dropout=0.1"
#define BERT_B 8
#define BERT_T 16
#define OPTIM "opt=sgd,lr=0.05,momentum=0.9"
#define SEED 7

static int bert_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  return ax_test_bert_batch(t, BERT_B, BERT_T, 3, in, lab);
}

/* The worst relative difference of part `part` of p (member t of T) from
 * its slices of the whole reference want[0 .. K - 1]. */
static double worst_member(ax_pipe *p, int part_index, const ax_model_def *def,
                           int K, const int *bounds, int T, int t,
                           ax_tensor **want) {
  char cfg[256];
  snprintf(cfg, sizeof cfg, "%s,tp=%d,tp_rank=%d", BERT_CFG, T, t);
  ax_config wc, pc;
  AX_ASSERT_OK(ax_model_config(def, BERT_CFG, &wc));
  AX_ASSERT_OK(ax_model_config(def, cfg, &pc));
  double worst = 0;
  for (int s = 0; s < K; s++) {
    ax_net *whole, *part;
    AX_ASSERT_OK(ax_model_stage(def, &wc, bounds[s], bounds[s + 1], AX_CPU,
                                SEED, &whole));
    AX_ASSERT_OK(ax_model_stage(def, &pc, bounds[s], bounds[s + 1], AX_CPU,
                                SEED, &part));
    int64_t n = (int64_t)part->n_params;
    ax_tensor *slice = ax_tensor_new(AX_F32, 1, &n, AX_CPU);
    AX_ASSERT_OK(ax_tp_slice_params(part->root, whole->root, ax_f32(want[s]),
                                    ax_f32(slice)));
    ax_tensor *got, *gbuf;
    AX_ASSERT_OK(
        ax_pipe_stage_state(ax_pipe_replica(p, part_index), s, &got, &gbuf));
    double w = pt_worst(got, slice);
    worst = w > worst ? w : worst;
    ax_tensor_release(got);
    ax_tensor_release(gbuf);
    ax_tensor_release(slice);
    ax_net_free(whole);
    ax_net_free(part);
  }
  return worst;
}

/* The small BERT's blocks split uniformly over K stages (bounds: K + 1). */
static void bert_split(int K, int *bounds) {
  const ax_model_def *def = ax_model_find("bert");
  ax_config mcfg;
  ax_model_info info;
  AX_ASSERT_OK(ax_model_config(def, BERT_CFG, &mcfg));
  AX_ASSERT_OK(def->describe(&mcfg, &info));
  AX_ASSERT_OK(ax_split_uniform(info.n_blocks, K, bounds));
}

static void run_case(int mode, int K, int T, int M, int steps, int prec) {
  const ax_model_def *def = ax_model_find("bert");
  ax_config mcfg;
  AX_ASSERT_OK(ax_model_config(def, BERT_CFG, &mcfg));
  int bounds[NAGENTS + 1];
  bert_split(K, bounds);
  ax_pipe_opts o = {"bert", BERT_CFG,           K,     g_names, bounds, mode,
                    M,      AX_RECOMPUTE_NEVER, OPTIM, SEED,    AX_CPU, 30000};
  o.tensor_parallel = T;
  o.precision = prec;
  ax_pipe *p;
  double t0 = ax_clock_s();
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, steps, bert_batch, NULL, NULL));
  double t1 = ax_clock_s();
  double acc = -1, loss = -1;
  AX_ASSERT_OK(ax_pipe_evaluate(p, 2, bert_batch, NULL, &acc, &loss));
  assert_true(loss > 0 && loss < 100);
  ax_tensor *want[NAGENTS], *wbuf[NAGENTS], *off[NAGENTS], *obuf[NAGENTS];
  pt_ref_opts ro = {M, 0};
  ro.precision = prec;
  pt_reference_ex(def, &mcfg, bounds, K, REF_SYNC, steps, bert_batch, NULL,
                  OPTIM, SEED, &ro, want, wbuf);
  ro.units = 1; /* other dropout masks */
  pt_reference_ex(def, &mcfg, bounds, K, REF_SYNC, steps, bert_batch, NULL,
                  OPTIM, SEED, &ro, off, obuf);
  double worst = 0, worst_off = 1e9;
  for (int t = 0; t < T; t++) {
    double w = worst_member(p, t, def, K, bounds, T, t, want);
    double wo = worst_member(p, t, def, K, bounds, T, t, off);
    worst = w > worst ? w : worst;
    worst_off = wo < worst_off ? wo : worst_off;
  }
  fprintf(stderr,
          "  bert %-6s %s K=%d T=%d M=%d: %d steps in %.2f s, worst "
          "relative difference of a member from its slice %.2g (%.2g "
          "against other masks); evaluation loss %.4f\n",
          ax_pipe_mode_name(mode), ax_precision_name(prec), K, T, M, steps,
          t1 - t0, worst, worst_off, loss);
  if (worst > 1e-5)
    fail_msg("bert %s K=%d T=%d: relative difference %.3g > 1e-5",
             ax_pipe_mode_name(mode), K, T, worst);
  assert_true(worst_off > 1e-3);
  for (int s = 0; s < K; s++) {
    ax_tensor_release(want[s]), ax_tensor_release(wbuf[s]);
    ax_tensor_release(off[s]), ax_tensor_release(obuf[s]);
  }
  ax_pipe_free(p);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_members_equal_whole_model(void **state) {
  run_case(AX_MODE_1F1B, 2, 2, 4, 3, AX_PREC_FP32);
  run_case(AX_MODE_ZBH1, 2, 2, 4, 3, AX_PREC_FP32);
  run_case(AX_MODE_GPIPE, 1, 4, 2, 3, AX_PREC_FP32);
}

/* In bf16 the members' column and row parts round their GEMMs' operands
 * as the whole layers do: only the sums' order differs, as in fp32. */
static void test_members_bf16(void **state) {
  run_case(AX_MODE_1F1B, 2, 2, 4, 3, AX_PREC_BF16);
}

/* R = 2 replicas of T = 2 members (K = 1, 4 agents) against the same
 * replicas unsplit (2 agents): each member equals its slice of the
 * unsplit replicas' stage, which their all-reduce keeps equal. */
static void test_with_replicas(void **state) {
  const ax_model_def *def = ax_model_find("bert");
  int bounds[2];
  bert_split(1, bounds);
  ax_pipe_opts o = {"bert", BERT_CFG,      1,      g_names,
                    bounds, AX_MODE_GPIPE, 2,      AX_RECOMPUTE_NEVER,
                    OPTIM,  SEED,          AX_CPU, 30000};
  o.replicas = 2;
  ax_pipe *p;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, 3, bert_batch, NULL, NULL));
  ax_tensor *want[1], *wbuf[1];
  AX_ASSERT_OK(ax_pipe_stage_state(p, 0, &want[0], &wbuf[0]));
  ax_pipe_free(p);
  o.tensor_parallel = 2;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, 3, bert_batch, NULL, NULL));
  double worst = 0;
  for (int r = 0; r < 2; r++)
    for (int t = 0; t < 2; t++) { /* part 2 r + t: member t of replica r */
      double w = worst_member(p, 2 * r + t, def, 1, bounds, 2, t, want);
      worst = w > worst ? w : worst;
    }
  fprintf(stderr,
          "  bert gpipe  K=1 R=2 T=2: worst relative difference of "
          "a member from its slice of the unsplit replicas %.2g\n",
          worst);
  if (worst > 1e-5)
    fail_msg("R=2 T=2: relative difference %.3g > 1e-5", worst);
  ax_tensor_release(want[0]);
  ax_tensor_release(wbuf[0]);
  ax_pipe_free(p);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_refusals(void **state) {
  ax_pipe_opts o = {"mlp", NULL,          2,      g_names,
                    NULL,  AX_MODE_GPIPE, 2,      AX_RECOMPUTE_NEVER,
                    OPTIM, SEED,          AX_CPU, 30000};
  o.tensor_parallel = 2;
  ax_pipe *p = NULL;
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EUNSUPPORTED);
  assert_non_null(strstr(ax_errmsg(), "tensor-parallel"));
  o.model = "bert";
  o.model_config = BERT_CFG ",tp=2";
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL);
  fprintf(stderr, "  %s\n", ax_errmsg());
  assert_non_null(strstr(ax_errmsg(), "tp and tp_rank"));
  o.model_config = "layers=2,hidden=32,heads=3,ff=64,vocab=50,seq=16";
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL); /* 3 heads */
  o.model_config = BERT_CFG;
  o.tensor_parallel = 3; /* 6 agents of 4 */
  assert_int_equal(ax_pipe_new(g_drv, &o, &p), AX_EINVAL);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

/* The whole model joined from a tensor-parallel checkpoint
 * (ax_ckpt_load_net, what axon-run eval and export use), sliced again for
 * each member, equals that member's stages just restored from it. */
static void check_joined(const char *root, ax_pipe *p) {
  ax_net *whole = NULL;
  ax_ckpt_info info;
  AX_ASSERT_OK(ax_ckpt_load_net(root, AX_CPU, &whole, &info));
  const ax_model_def *def = ax_model_find("bert");
  for (int t = 0; t < 2; t++) {
    char cfg[256];
    snprintf(cfg, sizeof cfg, "%s,tp=2,tp_rank=%d", BERT_CFG, t);
    ax_config pc;
    ax_model_info mi;
    ax_net *part = NULL;
    AX_ASSERT_OK(ax_model_config(def, cfg, &pc));
    AX_ASSERT_OK(def->describe(&pc, &mi));
    AX_ASSERT_OK(ax_model_stage(def, &pc, 0, mi.n_blocks, AX_CPU, 0, &part));
    AX_ASSERT_OK(ax_tp_slice_params(
        part->root, whole->root, ax_f32(whole->params), ax_f32(part->params)));
    size_t at = 0;
    for (int s = 0; s < 2; s++) {
      ax_tensor *got, *buf;
      AX_ASSERT_OK(ax_pipe_stage_state(ax_pipe_replica(p, t), s, &got, &buf));
      assert_true(at + ax_tensor_numel(got) <= part->n_params);
      assert_memory_equal(ax_f32(got), ax_f32(part->params) + at,
                          ax_tensor_nbytes(got));
      at += ax_tensor_numel(got);
      ax_tensor_release(got);
      ax_tensor_release(buf);
    }
    assert_int_equal(at, part->n_params);
    ax_net_free(part);
  }
  ax_net_free(whole);
}

/* Each member's stage files name it (tp.members, tp.member). */
static void check_member_records(const char *root) {
  char dir[1024], path[1200];
  AX_ASSERT_OK(ax_ckpt_find(root, dir, sizeof dir));
  for (int t = 0; t < 2; t++)
    for (int s = 0; s < 2; s++) {
      axi_ckr r;
      int64_t T = 0, m = -1;
      snprintf(path, sizeof path, "%s/stage-%02d-t%d.axck", dir, s, t);
      AX_ASSERT_OK(axi_ckr_open(&r, path, AXI_CK_STAGE, -1, NULL));
      AX_ASSERT_OK(axi_ckr_i64(&r, "tp.members", &T));
      AX_ASSERT_OK(axi_ckr_i64(&r, "tp.member", &m));
      axi_ckr_close(&r);
      assert_int_equal(T, 2);
      assert_int_equal(m, t);
    }
}

/* Checkpoint and resume: K = 2, T = 2, 3 steps, a checkpoint (every
 * member's stage files), 2 more steps; a new pipeline restored from it and
 * trained 2 steps holds every member's part to the bit (files on the
 * agents, and through the coordinator). A checkpoint of other members, or
 * of none, is refused by a restore; the parts join into the whole model
 * (check_joined). */
static void test_resume(void **state) {
  int bounds[3];
  bert_split(2, bounds);
  for (int flags = 0; flags <= AX_CKPT_TO_COORDINATOR; flags++) {
    char root[] = "/tmp/axon_tp_ckptXXXXXX";
    assert_non_null(mkdtemp(root));
    ax_pipe_opts o = {"bert", BERT_CFG,     2,      g_names,
                      bounds, AX_MODE_1F1B, 4,      AX_RECOMPUTE_NEVER,
                      OPTIM,  SEED,         AX_CPU, 30000};
    o.tensor_parallel = 2;
    ax_pipe *a = NULL, *b = NULL, *c = NULL;
    AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &a));
    AX_ASSERT_OK(ax_pipe_train(a, 3, bert_batch, NULL, NULL));
    ax_ckpt_info in;
    memset(&in, 0, sizeof in);
    in.step = 3;
    in.seed = SEED;
    snprintf(in.model, sizeof in.model, "bert");
    snprintf(in.model_config, sizeof in.model_config, "%s", BERT_CFG);
    AX_ASSERT_OK(ax_pipe_checkpoint(a, root, &in, 2, flags));
    check_member_records(root);
    AX_ASSERT_OK(ax_pipe_train(a, 2, bert_batch, NULL, NULL));
    AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &b));
    ax_ckpt_info got;
    AX_ASSERT_OK(ax_pipe_restore(b, root, &got));
    assert_int_equal(got.step, 3);
    check_joined(root, b);
    AX_ASSERT_OK(ax_pipe_train(b, 2, bert_batch, NULL, NULL));
    for (int t = 0; t < 2; t++)
      for (int s = 0; s < 2; s++) {
        ax_tensor *pa, *ba, *pb, *bb;
        AX_ASSERT_OK(ax_pipe_stage_state(ax_pipe_replica(a, t), s, &pa, &ba));
        AX_ASSERT_OK(ax_pipe_stage_state(ax_pipe_replica(b, t), s, &pb, &bb));
        assert_int_equal(ax_tensor_numel(pa), ax_tensor_numel(pb));
        if (memcmp(pa->data, pb->data, ax_tensor_nbytes(pa)))
          fail_msg("member %d stage %d: the resumed run differs (flags %d)", t,
                   s, flags);
        ax_tensor_release(pa), ax_tensor_release(ba);
        ax_tensor_release(pb), ax_tensor_release(bb);
      }
    ax_pipe_free(a);
    ax_pipe_free(b);
    /* The same split without members: the mover joins the members'
     * parts, so each stage holds exactly the whole model's slice. */
    o.tensor_parallel = 0;
    AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &c));
    AX_ASSERT_OK(ax_pipe_restore(c, root, &got));
    ax_net *whole = NULL;
    AX_ASSERT_OK(ax_ckpt_load_net(root, AX_CPU, &whole, &got));
    size_t at = 0;
    for (int s = 0; s < 2; s++) {
      ax_tensor *pc, *bc;
      AX_ASSERT_OK(ax_pipe_stage_state(c, s, &pc, &bc));
      assert_true(at + ax_tensor_numel(pc) <= whole->n_params);
      assert_memory_equal(ax_f32(pc), ax_f32(whole->params) + at,
                          ax_tensor_nbytes(pc));
      at += ax_tensor_numel(pc);
      ax_tensor_release(pc), ax_tensor_release(bc);
    }
    assert_int_equal(at, whole->n_params);
    ax_net_free(whole);
    ax_pipe_free(c);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    assert_int_equal(system(cmd), 0);
    fprintf(stderr,
            "  1f1b K=2 T=2: resumed from step 3 (%s), equal to the "
            "uninterrupted run in both members\n",
            flags ? "files through the coordinator" : "files on the agents");
  }
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

/* Member 1 of stage 1 (agent t4) killed mid-run: the train call fails
 * with AX_EPEERDOWN naming it within seconds (its partner t3 waited in the
 * layers' all-reduce and saw it go). Runs last: t4 stays dead. */
static void test_lost_member(void **state) {
  int bounds[3];
  bert_split(2, bounds);
  ax_pipe_opts o = {"bert", BERT_CFG,     2,      g_names,
                    bounds, AX_MODE_1F1B, 4,      AX_RECOMPUTE_NEVER,
                    OPTIM,  SEED,         AX_CPU, 30000};
  o.tensor_parallel = 2;
  ax_pipe *p;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  const char *want[] = {"member 1", "t4", NULL};
  pt_train_until_killed(p, &g_pids[3], bert_batch, NULL, "t4", want);
  ax_pipe_free(p);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS - 1));
}

int main(void) {
  static const char *const args[] = {"--threads", "1", NULL};
  ax_cpu_set_threads(1); /* the references: no OpenMP spinning under load */
  if (mt_start("tdrv", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_members_equal_whole_model),
      cmocka_unit_test(test_members_bf16),
      cmocka_unit_test(test_with_replicas),
      cmocka_unit_test(test_resume),
      cmocka_unit_test(test_lost_member),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
