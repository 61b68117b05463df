/* Losing an agent of a replicated or tensor-parallel run (axon-run train
 * --replicas R / --tensor-parallel T with --spares or --restarts): one
 * agent of one replica or member is killed with SIGKILL mid-run.
 *
 * Rollback (tensor parallelism; replicas of an asynchronous mode): the
 * whole front is rebuilt with the spare or the restarted agent and rolls
 * back to the newest checkpoint (on disk, or the stages' copies in memory).
 * Oracle: exit 0, and the loss of every step (the last one logged for a
 * step that ran twice, every bit) equals the uninterrupted run's, which
 * took the same cuts.
 *
 * Elastic (--elastic, no spare): the lost agent's replica is dropped and
 * the others go on with the whole batch from the interrupted step's
 * boundary; with --restarts it comes back once the agent rejoined. The
 * update rule is the same (the mean over the batch), the sums run in
 * another order: the losses and the final parameters agree to ELASTIC_TOL
 * (measured: 2e-7 of the largest parameter), not to the bit.
 *
 * Live (replicas of a flushed mode): the front is rebuilt and the lost
 * stage takes its state from a live replica of the same stage; no step is
 * lost, the interrupted mini-batch runs again. Oracle: "0 steps lost", the
 * losses as above, and the final checkpoint's files (every stage's
 * parameters, buffers, optimizer state and step count) byte for byte the
 * uninterrupted run's (steps whose update every stage applied before the
 * coordinator took their answers are said so, and only their losses may
 * be missing). The kill lands at a random point of a step; in most gpipe
 * runs one stage has already applied the interrupted step's update, and
 * without its rewind (broken on purpose) that update is applied twice and
 * the replayed step's loss differs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "axon/runtime/pipeline/state/checkpoint.h"
#include "harness.h"
#include "tests/spares_testutil.h"

static char g_tmp[64];

#define STEPS 60
#define MLP                                                                    \
  "--dataset", "synthetic", "--data-config",                                   \
      "shape=64,classes=10,examples=4096", "--model", "mlp", "--model-config", \
      "widths=64/64/64/10", "--batch", "32", "--microbatches", "4"
#define BERT                                                                   \
  "--dataset", "gcide", "--data-config",                                       \
      "seq=16,vocab=200,examples=1024,max_bytes=1m", "--model", "bert",        \
      "--model-config",                                                        \
      "layers=2,hidden=32,heads=4,ff=64,vocab=200,seq=16,dropout=0.1",         \
      "--batch", "16", "--microbatches", "2"
/* A larger MLP, slow enough that a restarted agent rejoins mid-run. */
#define MLP_SLOW                                                               \
  "--dataset", "synthetic", "--data-config",                                   \
      "shape=256,classes=10,examples=4096", "--model", "mlp",                  \
      "--model-config", "widths=256/512/512/10", "--batch", "64",              \
      "--microbatches", "4"
/* Losses and parameters of a run that shrank (and grew) against the
 * uninterrupted one: the same rule summed in another order. */
#define ELASTIC_TOL 1e-6
#define COMMON                                                                 \
  "--local", "4", "--steps", "60", "--optim", "opt=adamw,lr=1e-3",             \
      "--eval-limit", "64"

typedef struct rcase {
  const char *name;      /* of the case's files */
  const char *model[16]; /* MLP or BERT, NULL-terminated */
  const char *mode;
  const char *parts[6]; /* both runs' --replicas, --tensor-parallel, ...,
                           NULL-ended */
  const char *how[8];   /* the recovered run's own options ("DIR": its
                           checkpoint directory), NULL-ended */
  const char *victim;
  int restart;      /* how the victim comes back (spares_testutil.h) */
  const char *said; /* what the recovered run must print */
  int same_files;   /* compare the final checkpoints' files */
  double tol;       /* > 0: the losses and the final parameters within
                       this relative difference, not equal */
} rcase;

/* The files of dir's newest checkpoint (stage files and the coordinator's;
 * not the manifest, whose lines carry no state of their own), compared
 * byte for byte with ref's. */
static void same_checkpoint(const char *ref, const char *dir) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "cd '%s' && d=$(ls -d ckpt-* | tail -1) && cd '%s' && "
           "e=$(ls -d ckpt-* | tail -1) && [ \"$d\" = \"$e\" ] && "
           "for f in '%s'/$d/stage-*.axck; do cmp \"$f\" \"$e/${f##*/}\" || "
           "exit 1; done",
           ref, dir, ref);
  if (system(cmd) != 0)
    fail_msg("the final checkpoint of %s differs from %s's", dir, ref);
}

/* The whole model's parameters of dir's final checkpoint within tol of
 * ref's: max |a - b| <= tol max |a|. */
static void near_checkpoint(const char *ref, const char *dir, double tol) {
  ax_net *na = NULL, *nb = NULL;
  ax_ckpt_info ia, ib;
  AX_ASSERT_OK(ax_ckpt_load_net(ref, AX_CPU, &na, &ia));
  AX_ASSERT_OK(ax_ckpt_load_net(dir, AX_CPU, &nb, &ib));
  assert_int_equal(ia.step, ib.step);
  assert_int_equal(na->n_params, nb->n_params);
  const float *a = ax_f32(na->params), *b = ax_f32(nb->params);
  double dmax = 0, amax = 0;
  for (size_t i = 0; i < na->n_params; i++) {
    dmax = fmax(dmax, fabs((double)a[i] - b[i]));
    amax = fmax(amax, fabs((double)a[i]));
  }
  fprintf(stderr, "  final parameters: max difference %.3g of max %.3g\n", dmax,
          amax);
  ax_net_free(na);
  ax_net_free(nb);
  assert_true(dmax <= tol * amax);
}

static void run_case(const rcase *c) {
  char d_ref[256], d_rec[256], l_ref[300], l_rec[300], o_ref[300], o_rec[300];
  snprintf(d_ref, sizeof d_ref, "%s/%s-ref", g_tmp, c->name);
  snprintf(d_rec, sizeof d_rec, "%s/%s-rec", g_tmp, c->name);
  snprintf(l_ref, sizeof l_ref, "%s.losses", d_ref);
  snprintf(l_rec, sizeof l_rec, "%s.losses", d_rec);
  snprintf(o_ref, sizeof o_ref, "%s.out", d_ref);
  snprintf(o_rec, sizeof o_rec, "%s.out", d_rec);
  const char *ref[48] = {"train", COMMON}, *rec[48] = {"train", COMMON};
  int nf = 0, nr = 0;
  while (ref[nf])
    nf++;
  nr = nf;
  for (int i = 0; c->model[i]; i++)
    ref[nf++] = rec[nr++] = c->model[i];
  ref[nf++] = rec[nr++] = "--mode";
  ref[nf++] = rec[nr++] = c->mode;
  for (int i = 0; c->parts[i]; i++)
    ref[nf++] = rec[nr++] = c->parts[i];
  ref[nf++] = rec[nr++] = "--loss-log";
  ref[nf++] = l_ref;
  rec[nr++] = l_rec;
  /* The reference takes the same cuts, and a final checkpoint. */
  const char *cuts[] = {"--checkpoint-every", "10", "--checkpoint-dir", d_ref};
  for (int i = 0; i < 4; i++)
    ref[nf++] = cuts[i];
  for (int i = 0; c->how[i]; i++)
    rec[nr++] = strcmp(c->how[i], "DIR") ? c->how[i] : d_rec;
  run_axon_ref(o_ref, l_ref, ref);
  int st = run_axon_kill(o_rec, l_rec, d_rec, 25, c->restart, c->victim, rec);
  char *out = mt_slurp(o_rec);
  if (st != 0 || !out || !strstr(out, c->said))
    fprintf(stderr, "---- %s ----\n%s\n----\n", o_rec, out ? out : "");
  assert_int_equal(st, 0);
  assert_non_null(strstr(out, c->said));
  const char *r = strstr(out, "recovered");
  assert_non_null(r);
  fprintf(stderr, "  %s: %.*s\n", c->name, (int)strcspn(r, "\n"), r);
  if ((r = strstr(out, "axon-run: grew back")))
    fprintf(stderr, "  %s: %.*s\n", c->name, (int)strcspn(r, "\n"), r);
  same_losses(l_ref, l_rec, STEPS, out, c->tol);
  free(out);
  if (c->same_files)
    same_checkpoint(d_ref, d_rec);
  if (c->tol > 0)
    near_checkpoint(d_ref, d_rec, c->tol);
}

/* Tensor parallelism (bert, T = 2, K = 2): member 1's last stage lost; the
 * spare joins the rebuilt front, which rolls back to the files. */
static void test_tp_spare_disk(void **state) {
  rcase c = {"tp-disk",
             {BERT, NULL},
             "1f1b",
             {"--tensor-parallel", "2"},
             {"--spares", "spare0", "--checkpoint-every", "10",
              "--checkpoint-dir", "DIR"},
             "stage3",
             NO_RESTART,
             "rolled back from /"};
  run_case(&c);
}

/* The same from the copies in memory, with the agent restarted: member 1's
 * first stage's copy comes from its neighbour's agent. */
static void test_tp_restart_memory(void **state) {
  rcase c = {
      "tp-memory",
      {BERT, NULL},
      "gpipe",
      {"--tensor-parallel", "2"},
      {"--restarts", "1", "--checkpoint-every", "10", "--checkpoint-in-memory"},
      "stage2",
      RESTART_ANYWHERE,
      "rolled back from memory"};
  run_case(&c);
}

/* Replicas of an asynchronous mode (pipedream, R = 2, K = 2): no drained
 * step boundary in flight, so the front rolls back to the copies in
 * memory. */
static void test_replicas_async_memory(void **state) {
  rcase c = {"replicas-async",
             {MLP, NULL},
             "pipedream",
             {"--replicas", "2"},
             {"--spares", "spare0", "--checkpoint-every", "10",
              "--checkpoint-in-memory"},
             "stage3",
             NO_RESTART,
             "rolled back from memory"};
  run_case(&c);
}

/* Live: replicas of 1f1b (R = 2, K = 2), replica 1's last stage lost, a
 * spare; no checkpoint but the final one (to compare). */
static void test_live_spare(void **state) {
  rcase c = {"live-spare",
             {MLP, NULL},
             "1f1b",
             {"--replicas", "2"},
             {"--spares", "spare0", "--checkpoint-dir", "DIR"},
             "stage3",
             NO_RESTART,
             "0 steps lost",
             1};
  run_case(&c);
}

/* Live with the agent restarted: replica 0's first stage (gpipe), with
 * checkpoints every 10 steps that the recovery does not need. */
static void test_live_restart(void **state) {
  rcase c = {"live-restart",
             {MLP, NULL},
             "gpipe",
             {"--replicas", "2"},
             {"--restarts", "1", "--checkpoint-every", "10", "--checkpoint-dir",
              "DIR"},
             "stage0",
             RESTART_ANYWHERE,
             "0 steps lost",
             1};
  run_case(&c);
}

/* Live with tensor parallelism: R = 2 replicas of T = 2 members of one
 * stage (bert); replica 1's member 1 lost, whose slice comes from replica
 * 0's member 1. */
static void test_live_tp(void **state) {
  rcase c = {"live-tp",
             {BERT, NULL},
             "1f1b",
             {"--replicas", "2", "--tensor-parallel", "2"},
             {"--spares", "spare0", "--checkpoint-dir", "DIR"},
             "stage3",
             NO_RESTART,
             "0 steps lost",
             1};
  run_case(&c);
}

/* --elastic without a spare: replica 1 is dropped and replica 0 goes on
 * with the whole batch: the same update rule (the mean over the batch),
 * summed in another order, so equal to rounding only. */
static void test_elastic_shrink(void **state) {
  rcase c = {"elastic",
             {MLP, NULL},
             "gpipe",
             {"--replicas", "2", "--elastic"},
             {"--checkpoint-dir", "DIR"},
             "stage3",
             NO_RESTART,
             "going on with 1 replica(s)",
             0,
             ELASTIC_TOL};
  run_case(&c);
}

/* --elastic with unequal shares: R = 3 replicas of one stage take 10, 11
 * and 11 of the 32 rows, weighed by their shares; replica 1 lost, the two
 * left take 16 each. Averaging the replicas' means instead (DDP's rule)
 * would change the update at the shrink, beyond ELASTIC_TOL. */
static void test_elastic_unequal(void **state) {
  rcase c = {"elastic-unequal",
             {MLP, NULL},
             "gpipe",
             {"--replicas", "3", "--local", "3", "--elastic"},
             {"--checkpoint-dir", "DIR"},
             "stage1",
             NO_RESTART,
             "going on with 2 replica(s)",
             0,
             ELASTIC_TOL};
  run_case(&c);
}

/* --elastic with --restarts: the replica comes back once its agent
 * rejoined, from the replica that went on. */
static void test_elastic_grow(void **state) {
  rcase c = {"elastic-grow",
             {MLP_SLOW, NULL},
             "gpipe",
             {"--replicas", "2", "--elastic"},
             {"--restarts", "1", "--checkpoint-dir", "DIR"},
             "stage2",
             RESTART_ANYWHERE,
             "grew back",
             0,
             ELASTIC_TOL};
  run_case(&c);
}

int main(void) {
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  snprintf(g_tmp, sizeof g_tmp, "/tmp/axon-recover-XXXXXX");
  if (!mkdtemp(g_tmp))
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tp_spare_disk),
      cmocka_unit_test(test_tp_restart_memory),
      cmocka_unit_test(test_replicas_async_memory),
      cmocka_unit_test(test_live_spare),
      cmocka_unit_test(test_live_restart),
      cmocka_unit_test(test_live_tp),
      cmocka_unit_test(test_elastic_shrink),
      cmocka_unit_test(test_elastic_unequal),
      cmocka_unit_test(test_elastic_grow),
  };
  int rc = AX_TEST_MAIN(tests);
  char rm[128];
  snprintf(rm, sizeof rm, "rm -rf '%s'", g_tmp);
  if (system(rm) != 0)
    fprintf(stderr, "could not remove %s\n", g_tmp);
  return rc;
}
