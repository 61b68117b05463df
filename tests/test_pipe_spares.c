/* Recovering a lost stage with --spares and --restarts (axon-run): a stage
 * agent is killed with SIGKILL between two checkpoints; the coordinator
 * replaces it with the spare (no outside action), or waits until an agent
 * started again under the same name rejoined; every stage rolls back to
 * the newest checkpoint and training goes on. Oracle: the run ends with exit
 * 0, the spare holds the lost stage, and the loss of every step (the last
 * one logged for a step that ran twice, every bit) equals the run that was
 * never interrupted, which for gpipe and 1f1b means the same parameters at
 * every step: the rolled-back run took the same cuts, and a resumed run is
 * bit-identical (docs/CHECKPOINTS.md). Breaking the rollback (restoring
 * nothing, so the spare starts from initial weights) fails it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "harness.h"
#include "tests/spares_testutil.h"

static char g_tmp[64];

#define STEPS 60
#define COMMON                                                                 \
  "--local", "3", "--dataset", "synthetic", "--data-config",                   \
      "shape=64,classes=10,examples=4096", "--model", "mlp", "--model-config", \
      "widths=64/64/64/10", "--steps", "60", "--batch", "32", "--optim",       \
      "opt=adamw,lr=1e-3", "--eval-limit", "200", "--microbatches", "4",       \
      "--checkpoint-every", "10"

/* A stage agent lost mid-run (restart: how it comes back; a spare when
 * NO_RESTART) with checkpoints on disk, or only in memory. */
static void run_case(const char *mode, int restart, int in_memory) {
  char d_ref[256], d_sp[256], l_ref[300], l_sp[300], o_ref[300], o_sp[300];
  snprintf(d_ref, sizeof d_ref, "%s/%s-ref", g_tmp, mode);
  snprintf(d_sp, sizeof d_sp, "%s/%s-%s%s", g_tmp, mode,
           restart == RESTART_SAME_ADDRESS ? "same-address"
           : restart == RESTART_HUNG       ? "hung"
           : restart                       ? "restart"
                                           : "spare",
           in_memory ? "-memory" : "");
  snprintf(l_ref, sizeof l_ref, "%s.losses", d_ref);
  snprintf(l_sp, sizeof l_sp, "%s.losses", d_sp);
  snprintf(o_ref, sizeof o_ref, "%s.out", d_ref);
  snprintf(o_sp, sizeof o_sp, "%s.out", d_sp);
  const char *ref[] = {
      "train", COMMON,       "--mode", mode, "--checkpoint-dir",
      d_ref,   "--loss-log", l_ref,    NULL};
  run_axon_ref(o_ref, l_ref, ref);
  const char *sp[] = {"train",
                      COMMON,
                      "--mode",
                      mode,
                      "--loss-log",
                      l_sp,
                      restart ? "--restarts" : "--spares",
                      restart ? "1" : "spare0",
                      in_memory ? "--checkpoint-in-memory" : "--checkpoint-dir",
                      in_memory ? NULL : d_sp,
                      NULL};
  int st = run_axon_kill(o_sp, l_sp, d_sp, 25, restart, "stage1", sp);
  char *out = mt_slurp(o_sp);
  if (st != 0 || !out || !strstr(out, "recovered in"))
    fprintf(stderr, "---- %s ----\n%s\n----\n", o_sp, out ? out : "");
  assert_int_equal(st, 0);
  assert_non_null(strstr(out, restart ? "stage1 rejoined; rebuilding"
                                      : "rebuilding the pipeline with spare "
                                        "spare0"));
  assert_non_null(strstr(out, "recovered in"));
  assert_non_null(strstr(out, restart ? "[1 stage1 " : "[1 spare0 "));
  /* Rolled back from the copies in memory, or from the files. */
  assert_non_null(strstr(out, in_memory ? "rolled back from memory"
                                        : "rolled back from /"));
  const char *rec = strstr(out, "recovered in");
  fprintf(stderr, "  %s: %.*s\n", mode, (int)strcspn(rec, "\n"), rec);
  free(out);
  static char a[STEPS][40], b[STEPS][40];
  memset(a, 0, sizeof a);
  memset(b, 0, sizeof b);
  assert_int_equal(last_losses(l_ref, a, STEPS), STEPS);
  assert_int_equal(last_losses(l_sp, b, STEPS), STEPS);
  assert_true(count_lines(l_sp) > STEPS); /* some steps ran twice */
  for (int s = 0; s < STEPS; s++)
    if (strcmp(a[s], b[s])) {
      fprintf(stderr, "  step %d: %s uninterrupted, %s recovered\n", s, a[s],
              b[s]);
      fail();
    }
}

static void run_mode(const char *mode, int restart) {
  run_case(mode, restart, 0);
}

static void test_gpipe(void **state) { run_mode("gpipe", NO_RESTART); }
static void test_1f1b(void **state) { run_mode("1f1b", NO_RESTART); }
/* --restarts: the same name comes back from a new process (new addresses:
 * the world's members take its rejoin from the master and dial those). */
static void test_restart_1f1b(void **state) {
  run_mode("1f1b", RESTART_ANYWHERE);
}
/* The same, on the dead process's own control address (an agent started
 * with a fixed --listen): only its new incarnation tells the new process
 * from the old, and the world must dial its new data address. */
static void test_restart_same_address(void **state) {
  run_mode("1f1b", RESTART_SAME_ADDRESS);
}
/* A hung stage1 restarted at once: the master holds the new process's
 * join until the old one is declared down (heartbeats), then takes it;
 * the old one, woken after the rebuild, is refused as an earlier
 * incarnation and changes nothing. */
static void test_restart_hung(void **state) { run_mode("1f1b", RESTART_HUNG); }
/* Checkpoints only in memory (no --checkpoint-dir): the lost stage's copy
 * comes from its neighbour's agent, the others' from their own. */
static void test_spare_from_memory(void **state) {
  run_case("1f1b", NO_RESTART, 1);
}
/* The same with a restart (the new process holds no copy; stage 1's comes
 * from stage 2's agent). */
static void test_restart_from_memory(void **state) {
  run_case("gpipe", RESTART_ANYWHERE, 1);
}

int main(void) {
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  snprintf(g_tmp, sizeof g_tmp, "/tmp/axon-spares-XXXXXX");
  if (!mkdtemp(g_tmp))
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpipe),
      cmocka_unit_test(test_1f1b),
      cmocka_unit_test(test_restart_1f1b),
      cmocka_unit_test(test_restart_same_address),
      cmocka_unit_test(test_restart_hung),
      cmocka_unit_test(test_spare_from_memory),
      cmocka_unit_test(test_restart_from_memory),
  };
  int rc = AX_TEST_MAIN(tests);
  char rm[128];
  snprintf(rm, sizeof rm, "rm -rf '%s'", g_tmp);
  if (system(rm) != 0)
    fprintf(stderr, "could not remove %s\n", g_tmp);
  return rc;
}
