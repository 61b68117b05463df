/* axon-run train --freeze-schedule with the rest of a run: a tiny MLP of 6
 * blocks by 1f1b over four --local agents, its first 3 blocks frozen at
 * step 4 (re-packed from K = 4 onto K = 2 x 2 replicas), a checkpoint every
 * 5 of 15 steps. The reference is that run uninterrupted; each other run
 * must log the same last loss for every step, bit for bit, and end with
 * the same final checkpoint (axon-run export, byte for byte):
 *  - a lost agent (AXON_FAULT, runtime/pipeline/stage/fault-impl.h) with
 *    --spares (checkpoints written through the coordinator, so each is
 *    complete before training goes on): after the freeze (the rollback restores
 * the checkpoint of step 5, which holds the frozen prefix, onto the pipeline
 * frozen again as at step 5), during the freeze's move of the state (rolled
 * back to the run's start, the freeze made again), and a spare lost in turn
 *    while the rollback freezes again;
 *  - --resume of the step-10 checkpoint on another layout (two agents, so
 *    the freeze re-packs onto K = 1 x 2);
 *  - --emulate (every stage and replica in axon-run's own process).
 * Each fault must have fired and the run recovered ("back at step"). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "tests/mp_testutil.h"

#define STEPS 15
#define COMMON                                                                 \
  "--dataset", "synthetic", "--data-config",                                   \
      "shape=16,classes=4,examples=512", "--model", "mlp", "--model-config",   \
      "widths=16/16/16/16/16/16/4", "--steps", "15", "--batch", "12",          \
      "--optim", "opt=adamw,lr=1e-3", "--eval-limit", "12", "--microbatches",  \
      "3", "--mode", "1f1b", "--freeze-schedule", "4:3", "--checkpoint-every", \
      "5", "--quiet"

static char g_tmp[64];

/* Runs axon-run with argv (and AXON_FAULT=fault unless NULL), its output
 * into out; up to 120 s. The exit status, or -1. */
static int run_axon(const char *out, const char *const *argv,
                    const char *fault) {
  char var[1200];
  snprintf(var, sizeof var, "AXON_FAULT=%s", fault ? fault : "");
  const char *const env[] = {var, NULL};
  pid_t pid = mt_spawn_axon_run_env(out, argv, fault ? env : NULL, 1);
  if (pid < 0)
    return -1;
  int64_t end = ax_clock_ms() + 120000;
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (ax_clock_ms() > end) { /* axon-run and its agents */
      kill(-pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    rt_sleep_ms(10);
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Trains g_tmp/NAME with the extra options `more` (NULL-terminated) and
 * AXON_FAULT=fault (NULL: none), then exports its final checkpoint; its
 * output in g_tmp/NAME.out (printed on failure). */
static void train(const char *name, const char *const *more,
                  const char *fault) {
  char dir[128], log[128], out[128], bin[128];
  snprintf(dir, sizeof dir, "%s/%s", g_tmp, name);
  snprintf(log, sizeof log, "%s/%s.losses", g_tmp, name);
  snprintf(out, sizeof out, "%s/%s.out", g_tmp, name);
  snprintf(bin, sizeof bin, "%s/%s.bin", g_tmp, name);
  const char *a[48] = {"train", COMMON,       "--checkpoint-dir",
                       dir,     "--loss-log", log};
  int n = 0;
  while (a[n])
    n++;
  for (int i = 0; more[i] && n < 46; i++)
    a[n++] = more[i];
  int st = run_axon(out, a, fault);
  const char *ex[] = {"export", "--checkpoint", dir, "--out", bin, NULL};
  if (st == 0)
    st = run_axon(bin, ex, NULL) == 0 ? 0 : -2;
  if (st != 0) {
    char *o = mt_slurp(out);
    fprintf(stderr, "---- %s ----\n%s----\n", name, o ? o : "");
    free(o);
    fail_msg("%s: axon-run %s failed (%d)", name, st == -2 ? "export" : "train",
             st);
  }
}

/* The last loss logged for each step of NAME, as text; the steps seen. */
static int last_losses(const char *name, char (*v)[40]) {
  char path[128], val[40];
  snprintf(path, sizeof path, "%s/%s.losses", g_tmp, name);
  FILE *f = fopen(path, "r");
  long s;
  int n = 0;
  while (f && fscanf(f, "%ld %39s", &s, val) == 2)
    if (s >= 0 && s < STEPS) {
      snprintf(v[s], 40, "%s", val);
      n = s + 1 > n ? (int)s + 1 : n;
    }
  if (f)
    fclose(f);
  return n;
}

/* NAME's losses from step `from` on and its final checkpoint equal the
 * reference's. */
static void same_as_ref(const char *name, int from) {
  static char want[STEPS][40], got[STEPS][40];
  memset(got, 0, sizeof got);
  assert_int_equal(last_losses("ref", want), STEPS);
  assert_int_equal(last_losses(name, got), STEPS);
  for (int s = from; s < STEPS; s++)
    if (strcmp(got[s], want[s]))
      fail_msg("%s: step %d: loss %s, the uninterrupted run's %s", name, s,
               got[s], want[s]);
  char a[128], b[128];
  snprintf(a, sizeof a, "%s/ref.bin", g_tmp);
  snprintf(b, sizeof b, "%s/%s.bin", g_tmp, name);
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  assert_non_null(fa);
  assert_non_null(fb);
  int ca, cb;
  do
    ca = getc(fa), cb = getc(fb);
  while (ca == cb && ca != EOF);
  fclose(fa), fclose(fb);
  if (ca != cb)
    fail_msg("%s: its final checkpoint differs from the uninterrupted run's",
             name);
}

static int count_of(const char *text, const char *what) {
  int n = 0;
  for (const char *at = text; (at = strstr(at, what)); at += strlen(what))
    n++;
  return n;
}

static int setup(void **state) {
  snprintf(g_tmp, sizeof g_tmp, "/tmp/axon_freeze_cliXXXXXX");
  assert_non_null(mkdtemp(g_tmp));
  const char *more[] = {"--local", "4", NULL};
  train("ref", more, NULL);
  return 0;
}

static int teardown(void **state) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
  return system(cmd) == 0 ? 0 : -1;
}

static void test_lost_agent(void **state) {
  static const struct {
    const char *fault;
    long back; /* the step the last rollback must reach */
  } c[] = {
      {"agent=stage1,action=B,unit=1,step=8", 5},
      {"agent=stage2,handoff", 0},
      {"agent=stage1,action=F,unit=0,step=7;agent=spare0,handoff", 5},
  };
  /* Checkpoints written before training goes on (through the coordinator),
   * so the one of step 5 is complete when the faults come. */
  const char *more[] = {
      "--local",         "4",           "--spares", "spare0,spare1",
      "--checkpoint-to", "coordinator", NULL};
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    char name[32], path[128];
    snprintf(name, sizeof name, "lost%zu", i);
    train(name, more, c[i].fault);
    snprintf(path, sizeof path, "%s/%s.out", g_tmp, name);
    char *out = mt_slurp(path);
    assert_non_null(out);
    const char *rec = NULL;
    for (const char *at = out; (at = strstr(at, "back at step ")); at++)
      rec = at;
    if (count_of(out, "axon fault: ") != 1 + count_of(c[i].fault, ";") ||
        !rec || atol(rec + strlen("back at step ")) != c[i].back)
      fail_msg("%s: the faults did not all fire, or it did not roll back "
               "to step %ld:\n%s",
               c[i].fault, c[i].back, out);
    free(out);
    same_as_ref(name, 0);
    fprintf(stderr,
            "  %s: recovered at step %ld, every loss and the final "
            "checkpoint equal to the uninterrupted run's\n",
            c[i].fault, c[i].back);
  }
}

/* The rollback from an in-memory checkpoint taken after the freeze: the
 * stages' copies on the agents, the frozen prefix's on the coordinator. */
static void test_lost_agent_memory(void **state) {
  const char *more[] = {"--local",
                        "4",
                        "--spares",
                        "spare0",
                        "--checkpoint-in-memory",
                        "--checkpoint-to",
                        "coordinator",
                        NULL};
  train("lostmem", more, "agent=stage1,action=B,unit=1,step=8");
  char path[128];
  snprintf(path, sizeof path, "%s/lostmem.out", g_tmp);
  char *out = mt_slurp(path);
  assert_non_null(out);
  if (!strstr(out, "rolled back from memory at step 5"))
    fail_msg("no rollback from memory to step 5:\n%s", out);
  free(out);
  same_as_ref("lostmem", 0);
  fprintf(stderr, "  a lost agent after the freeze, rolled back from memory "
                  "(the prefix from the coordinator's copy): every loss and "
                  "the final checkpoint equal to the uninterrupted run's\n");
}

static void test_resume_other_layout(void **state) {
  char from[128];
  snprintf(from, sizeof from, "%s/ref/ckpt-00000010", g_tmp);
  const char *more[] = {"--local", "2", "--resume", from, NULL};
  train("resumed", more, NULL);
  same_as_ref("resumed", 10);
  fprintf(stderr, "  resumed at step 10 on two agents (K = 1 x 2 after the "
                  "freeze): equal to the uninterrupted run\n");
}

static void test_emulate(void **state) {
  const char *more[] = {"--stages", "4", "--emulate", NULL};
  train("emulated", more, NULL);
  same_as_ref("emulated", 0);
  fprintf(stderr, "  --emulate: equal to the run over agents\n");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lost_agent),
      cmocka_unit_test(test_lost_agent_memory),
      cmocka_unit_test(test_resume_other_layout),
      cmocka_unit_test(test_emulate),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
