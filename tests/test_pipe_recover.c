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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

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
#define COMMON                                                                 \
  "--local", "4", "--steps", "60", "--optim", "opt=adamw,lr=1e-3",             \
      "--eval-limit", "64"

typedef struct rcase {
  const char *name;      /* of the case's files */
  const char *model[16]; /* MLP or BERT, NULL-terminated */
  const char *mode;
  const char *parts[5]; /* --replicas and --tensor-parallel, NULL-ended */
  const char *ckpt[4];  /* the checkpoint options of the recovered run */
  const char *victim;
  int restart;      /* NO_RESTART: a spare */
  const char *said; /* what the recovered run must print */
  int same_files;   /* compare the final checkpoints' files */
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
  rec[nr++] = c->restart ? "--restarts" : "--spares";
  rec[nr++] = c->restart ? "1" : "spare0";
  for (int i = 0; i < 4 && c->ckpt[i]; i++)
    rec[nr++] = strcmp(c->ckpt[i], "DIR") ? c->ckpt[i] : d_rec;
  assert_int_equal(run_axon(o_ref, l_ref, 0, 0, ref), 0);
  int st = run_axon_victim(o_rec, l_rec, 25, c->restart, c->victim, rec);
  char *out = mt_slurp(o_rec);
  if (st != 0 || !out || !strstr(out, c->said))
    fprintf(stderr, "---- %s ----\n%s\n----\n", o_rec, out ? out : "");
  assert_int_equal(st, 0);
  assert_non_null(strstr(out, c->said));
  const char *r = strstr(out, "recovered");
  assert_non_null(r);
  fprintf(stderr, "  %s: %.*s\n", c->name, (int)strcspn(r, "\n"), r);
  /* Steps whose update every stage applied before the coordinator took
   * their answers: said so, and their losses are not logged. */
  long un_lo = 0, un_hi = -1;
  const char *un = strstr(out, "axon-run: steps ");
  if (un && sscanf(un, "axon-run: steps %ld to %ld were applied", &un_lo,
                   &un_hi) == 2)
    fprintf(stderr, "  steps %ld to %ld not reported\n", un_lo, un_hi);
  free(out);
  static char a[STEPS][40], b[STEPS][40];
  memset(a, 0, sizeof a);
  memset(b, 0, sizeof b);
  assert_int_equal(last_losses(l_ref, a, STEPS), STEPS);
  assert_int_equal(last_losses(l_rec, b, STEPS), STEPS);
  for (int s = 0; s < STEPS; s++)
    if (s >= un_lo && s <= un_hi)
      assert_string_equal(b[s], ""); /* never logged */
    else if (strcmp(a[s], b[s])) {
      fprintf(stderr, "  step %d: %s uninterrupted, %s recovered\n", s, a[s],
              b[s]);
      fail();
    }
  if (c->same_files)
    same_checkpoint(d_ref, d_rec);
}

/* Tensor parallelism (bert, T = 2, K = 2): member 1's last stage lost; the
 * spare joins the rebuilt front, which rolls back to the files. */
static void test_tp_spare_disk(void **state) {
  rcase c = {"tp-disk",
             {BERT, NULL},
             "1f1b",
             {"--tensor-parallel", "2"},
             {"--checkpoint-every", "10", "--checkpoint-dir", "DIR"},
             "stage3",
             NO_RESTART,
             "rolled back from /",
             0};
  run_case(&c);
}

/* The same from the copies in memory, with the agent restarted: member 1's
 * first stage's copy comes from its neighbour's agent. */
static void test_tp_restart_memory(void **state) {
  rcase c = {"tp-memory",
             {BERT, NULL},
             "gpipe",
             {"--tensor-parallel", "2"},
             {"--checkpoint-every", "10", "--checkpoint-in-memory"},
             "stage2",
             RESTART_ANYWHERE,
             "rolled back from memory",
             0};
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
             {"--checkpoint-every", "10", "--checkpoint-in-memory"},
             "stage3",
             NO_RESTART,
             "rolled back from memory",
             0};
  run_case(&c);
}

/* Live: replicas of 1f1b (R = 2, K = 2), replica 1's last stage lost, a
 * spare; no checkpoint but the final one (to compare). */
static void test_live_spare(void **state) {
  rcase c = {"live-spare",
             {MLP, NULL},
             "1f1b",
             {"--replicas", "2"},
             {"--checkpoint-dir", "DIR"},
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
             {"--checkpoint-every", "10", "--checkpoint-dir", "DIR"},
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
             {"--checkpoint-dir", "DIR"},
             "stage3",
             NO_RESTART,
             "0 steps lost",
             1};
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
  };
  int rc = AX_TEST_MAIN(tests);
  char rm[128];
  snprintf(rm, sizeof rm, "rm -rf '%s'", g_tmp);
  if (system(rm) != 0)
    fprintf(stderr, "could not remove %s\n", g_tmp);
  return rc;
}
