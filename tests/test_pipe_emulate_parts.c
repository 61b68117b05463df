/* The single-process emulation (runtime/pipeline/schedule/emulate.h) of
 * replicated and tensor-parallel pipelines equals the agents' run bit for
 * bit on the CPU.
 *
 * Phase 1, four real agents on loopback: an MLP of 2 stages x 2 replicas
 * by 1f1b, the same with ZeRO (the optimizer state sharded), a BERT with
 * dropout of 1 stage x 2 replicas x 2 tensor-parallel members by gpipe,
 * and an MLP of 1 stage x 3 replicas by pipedream (three ranks: the ring's
 * order shows in the sums' bits); each run's per-step losses and every part's
 * final parameters and buffers are kept. Phase 2, a world of one
 * (ax_pipe_emulator_new, what `axon-run train --emulate` uses) hosting every
 * part: the same runs must equal them to the bit (the replicas' all-reduce and
 * the members' sums run on the one node, the same ring in the same order), and
 * the modelled time of the measured costs is positive. The CLI: `--emulate
 * --replicas 2` writes the loss log of `--local 4 --replicas 2`, every bit, and
 * reports its modelled time. Zero live RRefs, contexts and calls after
 * every run, on every node. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/pipeline/schedule/emulate.h"
#include "tests/pipe_testutil.h"

#define NAGENTS 4
#define STEPS 4
#define NCASES 4
static const char *g_names[NAGENTS] = {"p1", "p2", "p3", "p4"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv; /* phase 1: the agents' master; phase 2: emulator */

#define MLP_CFG "widths=48/44/40/36/32/10"
#define MLP_DATA "shape=48,classes=10,examples=256,seed=7"
#define BERT_CFG "layers=2,hidden=32,heads=4,ff=64,vocab=50,seq=16,dropout=0.1"
#define OPTIM "opt=sgd,lr=0.05,momentum=0.9"

typedef struct kase { /* a run: model, mode, K, M, R, T, zero */
  const char *model, *cfg;
  int mode, K, M, R, T, zero;
} kase;
static const kase g_cases[NCASES] = {
    {"mlp", MLP_CFG, AX_MODE_1F1B, 2, 2, 2, 1, 0},
    {"mlp", MLP_CFG, AX_MODE_1F1B, 2, 2, 2, 1, 1},
    {"bert", BERT_CFG, AX_MODE_GPIPE, 1, 2, 2, 2, 0},
    {"mlp", MLP_CFG, AX_MODE_PIPEDREAM, 1, 1, 3, 1, 0},
};

#define PARTS 4         /* at least R T of every case */
typedef struct result { /* what a run leaves: plain copies */
  long nloss;
  double loss[STEPS];
  float *param[PARTS][2], *buf[PARTS][2];
  size_t np[PARTS][2], nb[PARTS][2];
} result;
static result g_dist[NCASES];

static void result_clear(result *r) {
  for (int i = 0; i < PARTS; i++)
    for (int s = 0; s < 2; s++) {
      free(r->param[i][s]);
      free(r->buf[i][s]);
    }
  memset(r, 0, sizeof *r);
}

typedef struct feed {
  pt_data data; /* the MLP's */
  int bert;
  result *r;
} feed;

static int feed_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  feed *f = user;
  return f->bert ? ax_test_bert_batch(t, 8, 16, 3, in, lab)
                 : pt_batch(&f->data, t, in, lab);
}

static void feed_step(void *user, const ax_pipe_step_info *si) {
  result *r = ((feed *)user)->r;
  if (r->nloss < STEPS)
    r->loss[r->nloss] = si->loss;
  r->nloss++;
}

static float *copy_floats(const ax_tensor *t, size_t *n) {
  *n = t ? ax_tensor_numel(t) : 0;
  if (!t)
    return NULL;
  float *c = malloc(*n * sizeof *c + 1);
  assert_non_null(c);
  memcpy(c, t->data, *n * sizeof *c);
  return c;
}

/* Trains case c with the R T K stage owners `agents` on node n; fills *r.
 * costs (may be NULL) receives the run's measured costs. */
static void run_case(ax_node *n, const char *const *agents, int c, result *r,
                     ax_pipe_costs *costs) {
  const kase *k = &g_cases[c];
  feed f = {{NULL, 16}, !strcmp(k->model, "bert"), r};
  memset(r, 0, sizeof *r);
  if (!f.bert) {
    ax_config dcfg;
    AX_ASSERT_OK(ax_config_parse(&dcfg, MLP_DATA));
    AX_ASSERT_OK(
        ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &f.data.ds));
  }
  ax_pipe_opts o = {k->model, k->cfg, k->K,  agents, NULL,   k->mode,
                    k->M,     0,      OPTIM, 7,      AX_CPU, 30000};
  o.replicas = k->R;
  o.tensor_parallel = k->T;
  o.zero = k->zero;
  ax_pipe *p = NULL;
  AX_ASSERT_OK(ax_pipe_new(n, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, STEPS, feed_batch, feed_step, &f));
  assert_int_equal(r->nloss, STEPS);
  if (costs) {
    ax_pipe_costs_init(costs, &o);
    ax_pipe_costs_add(costs, p);
  }
  for (int i = 0; i < k->R * k->T; i++)
    for (int s = 0; s < k->K; s++) {
      ax_tensor *pa = NULL, *bu = NULL;
      AX_ASSERT_OK(ax_pipe_stage_state(ax_pipe_replica(p, i), s, &pa, &bu));
      r->param[i][s] = copy_floats(pa, &r->np[i][s]);
      r->buf[i][s] = copy_floats(bu, &r->nb[i][s]);
      ax_tensor_release(pa);
      ax_tensor_release(bu);
    }
  ax_pipe_free(p);
  ax_dataset_close(f.data.ds);
}

/* Fails unless got equals want to the bit: every loss, and every part's
 * parameters and buffers. */
static void assert_same_bits(int c, const result *got, const result *want) {
  const kase *k = &g_cases[c];
  assert_int_equal(got->nloss, want->nloss);
  for (long t = 0; t < STEPS; t++)
    if (memcmp(&got->loss[t], &want->loss[t], sizeof(double)))
      fail_msg("case %d: loss of step %ld %.17g != distributed %.17g", c, t,
               got->loss[t], want->loss[t]);
  for (int i = 0; i < k->R * k->T; i++)
    for (int s = 0; s < k->K; s++) {
      assert_int_equal(got->np[i][s], want->np[i][s]);
      assert_int_equal(got->nb[i][s], want->nb[i][s]);
      if (memcmp(got->param[i][s], want->param[i][s],
                 got->np[i][s] * sizeof(float)))
        fail_msg("case %d: part %d stage %d parameters differ", c, i, s);
      if (got->nb[i][s] && memcmp(got->buf[i][s], want->buf[i][s],
                                  got->nb[i][s] * sizeof(float)))
        fail_msg("case %d: part %d stage %d buffers differ", c, i, s);
    }
  fprintf(stderr,
          "  %s %s K=%d R=%d T=%d zero=%d: %d steps equal to the bit "
          "(last loss %.6f)\n",
          k->model, ax_pipe_mode_name(k->mode), k->K, k->R, k->T, k->zero,
          STEPS, got->loss[STEPS - 1]);
}

static void test_distributed(void **state) {
  for (int c = 0; c < NCASES; c++) {
    run_case(g_drv, g_names, c, &g_dist[c], NULL);
    AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
  }
}

static void test_emulated(void **state) {
  const char *self[NAGENTS];
  for (int i = 0; i < NAGENTS; i++)
    self[i] = ax_node_name(g_drv);
  assert_int_equal(ax_node_world_size(g_drv), 1);
  for (int c = 0; c < NCASES; c++) {
    assert_int_equal(g_dist[c].nloss, STEPS); /* phase 1 ran */
    result r;
    ax_pipe_costs costs;
    run_case(g_drv, self, c, &r, &costs);
    assert_same_bits(c, &r, &g_dist[c]);
    result_clear(&r);
    double spb = 0;
    AX_ASSERT_OK(ax_pipe_costs_model(&costs, &spb));
    assert_true(spb > 0);
    AX_ASSERT_OK(dt_wait_counts(g_drv, NULL, 0, 0, 0));
    AX_ASSERT_OK(rt_local_zero());
  }
}

/* The CLI's loss log (every bit of every step's loss) of args. */
static int run_cli(const char *args, const char *log, char *out, size_t len) {
  char bin[4096], cmd[8192];
  mt_bin_path("axon-run", bin, sizeof bin);
  snprintf(cmd, sizeof cmd,
           "%s train --model mlp --model-config " MLP_CFG
           " --dataset synthetic --data-config " MLP_DATA " --optim " OPTIM
           " --steps 6 --batch 16 --eval-limit 64 --quiet "
           "--mode 1f1b --microbatches 2 --loss-log %s %s 2>&1",
           bin, log, args);
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  size_t n = fread(out, 1, len - 1, f);
  out[n] = 0;
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  static char buf[2][4096];
  static int which;
  char *b = buf[which++ % 2];
  size_t n = fread(b, 1, sizeof buf[0] - 1, f);
  b[n] = 0;
  fclose(f);
  return b;
}

static void test_cli(void **state) {
  static char out[1 << 16];
  char emu[64], loc[64];
  snprintf(emu, sizeof emu, "/tmp/axon_emuparts_%d_e.log", (int)getpid());
  snprintf(loc, sizeof loc, "/tmp/axon_emuparts_%d_l.log", (int)getpid());
  unlink(emu);
  unlink(loc);
  assert_int_equal(
      run_cli("--emulate --stages 2 --replicas 2", emu, out, sizeof out), 0);
  assert_non_null(strstr(out, "replicas=2 emulated=1"));
  assert_non_null(strstr(out, "modelled_seconds="));
  assert_int_equal(run_cli("--local 4 --replicas 2", loc, out, sizeof out), 0);
  char *a = slurp(emu), *b = slurp(loc);
  assert_true(strlen(a) > 0 && strchr(a, '\n'));
  if (strcmp(a, b))
    fail_msg("emulated loss log\n%s!= the agents'\n%s", a, b);
  fprintf(stderr, "  the CLI's loss logs are equal:\n%s", a);
  unlink(emu);
  unlink(loc);
  /* More parts than this process hosts: refused, with the bound. */
  assert_int_equal(
      run_cli("--emulate --stages 9 --replicas 2", emu, out, sizeof out), 2);
  assert_non_null(strstr(out, "at most 16"));
}

static int world_start(void **state) {
  static const char *const args[] = {"--threads", "4", NULL};
  return mt_start("coordp", g_names, NAGENTS, args, g_pids, &g_drv);
}
static int world_end(void **state) {
  mt_end(g_drv, g_pids, NAGENTS);
  g_drv = NULL;
  return 0;
}
static int emulator_start(void **state) {
  int err = ax_pipe_emulator_new("emup", 0, &g_drv);
  if (err != AX_OK)
    fprintf(stderr, "emulator: %s\n", ax_errmsg());
  return err;
}
static int emulator_end(void **state) {
  ax_pipe_emulator_free(g_drv);
  g_drv = NULL;
  for (int c = 0; c < NCASES; c++)
    result_clear(&g_dist[c]);
  return 0;
}

int main(void) {
  /* The CLI first, before this process starts gRPC; then the agents'
   * world (phase 1), then the world of one (phase 2). */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cli),
      cmocka_unit_test_setup_teardown(test_distributed, world_start, world_end),
      cmocka_unit_test_setup_teardown(test_emulated, emulator_start,
                                      emulator_end),
  };
  return AX_TEST_MAIN(tests);
}
