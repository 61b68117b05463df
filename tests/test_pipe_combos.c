/* The combinations of features a training run needs, through axon-run as
 * a user runs them (--local worlds, a tiny MLP): each either runs with an
 * oracle or is refused with its reason. A run's oracle is a run of the same
 * math without the feature that must not change it (spares that are never
 * used, ZeRO, an optimizer host, checkpoints in memory, the emulation):
 * every loss equal, bit for bit. Recovery itself is tested with faults by
 * test_pipe_recover, test_pipe_fault_sweep and test_pipe_freeze_cli;
 * resuming on other layouts by test_pipe_relayout. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "tests/mp_testutil.h"

static char g_tmp[64];

#define COMMON                                                                 \
  "--dataset", "synthetic", "--data-config",                                   \
      "shape=16,classes=4,examples=512", "--model", "mlp", "--model-config",   \
      "widths=16/16/16/16/4", "--steps", "12", "--batch", "32", "--optim",     \
      "opt=sgd,lr=0.05,momentum=0.9", "--eval-limit", "64", "--quiet",         \
      "--microbatches", "4"

typedef struct row {
  const char *name, *same_as; /* same_as: the run whose losses it must equal */
  const char *opt[16];
  const char *refused; /* NULL: runs; else exit 2 with this in the message */
} row;

/* Ordered so that every reference runs before the rows that name it. */
static const row g_rows[] = {
    {"pipe", NULL, {"--local", "2", "--mode", "1f1b"}, NULL},
    {"rep", NULL, {"--local", "4", "--replicas", "2", "--mode", "1f1b"}, NULL},
    {"rep+spares",
     "rep",
     {"--local", "4", "--replicas", "2", "--mode", "1f1b", "--spares",
      "spare0"},
     NULL},
    {"rep+restarts",
     "rep",
     {"--local", "4", "--replicas", "2", "--mode", "1f1b", "--restarts", "1"},
     NULL},
    {"rep+memory",
     "rep",
     {"--local", "4", "--replicas", "2", "--mode", "1f1b", "--checkpoint-every",
      "4", "--checkpoint-in-memory"},
     NULL},
    {"rep+elastic",
     "rep",
     {"--local", "4", "--replicas", "2", "--mode", "1f1b", "--elastic"},
     NULL},
    {"zero+ckpt",
     "rep",
     {"--local", "4", "--replicas", "2", "--zero", "1", "--mode", "1f1b",
      "--checkpoint-every", "4", "--checkpoint-in-memory", "--spares",
      "spare0"},
     NULL},
    {"opthost+ckpt",
     "pipe",
     {"--local", "2", "--mode", "1f1b", "--optimizer-host", "stage1",
      "--checkpoint-every", "4", "--checkpoint-in-memory", "--restarts", "1"},
     NULL},
    {"emulate+rep",
     "rep",
     {"--stages", "2", "--emulate", "--replicas", "2", "--mode", "1f1b"},
     NULL},
    {"emulate+opthost",
     "pipe",
     {"--stages", "2", "--emulate", "--optimizer-host", "x", "--mode", "1f1b"},
     NULL},
    {"freeze",
     NULL,
     {"--local", "4", "--mode", "1f1b", "--freeze-schedule", "6:2"},
     NULL},
    {"freeze+spares",
     "freeze",
     {"--local", "4", "--mode", "1f1b", "--freeze-schedule", "6:2", "--spares",
      "spare0", "--checkpoint-every", "4", "--checkpoint-in-memory"},
     NULL},
    {"freeze+opthost",
     "freeze",
     {"--local", "4", "--mode", "1f1b", "--freeze-schedule", "6:2",
      "--optimizer-host", "stage3"},
     NULL},
    {"freeze+emulate",
     "freeze",
     {"--stages", "4", "--emulate", "--mode", "1f1b", "--freeze-schedule",
      "6:2"},
     NULL},
    {"opthost+zero",
     NULL,
     {"--local", "4", "--replicas", "2", "--zero", "1", "--optimizer-host",
      "stage1"},
     "--optimizer-host"},
    {"elastic+zero",
     NULL,
     {"--local", "4", "--replicas", "2", "--zero", "1", "--mode", "1f1b",
      "--elastic"},
     "the only copy of its shard"},
};

static int setup(void **state) {
  snprintf(g_tmp, sizeof g_tmp, "/tmp/axon_combosXXXXXX");
  return mkdtemp(g_tmp) ? 0 : -1;
}

static int teardown(void **state) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
  return system(cmd) == 0 ? 0 : -1;
}

/* Every line of b's loss log equals a's (same steps, every bit). */
static void same_losses(const char *a, const char *b) {
  char pa[128], pb[128];
  snprintf(pa, sizeof pa, "%s/%s.losses", g_tmp, a);
  snprintf(pb, sizeof pb, "%s/%s.losses", g_tmp, b);
  char *x = mt_slurp(pa), *y = mt_slurp(pb);
  assert_non_null(x);
  assert_non_null(y);
  if (strcmp(x, y))
    fail_msg("%s: its losses differ from %s's:\n%s\n----\n%s", b, a, y, x);
  assert_int_equal(strlen(x) > 0, 1);
  free(x);
  free(y);
}

static void run_row(const row *r) {
  char log[160], out[160], name[64];
  snprintf(name, sizeof name, "%s", r->name);
  for (char *c = name; *c; c++)
    *c = *c == '+' ? '_' : *c;
  snprintf(log, sizeof log, "%s/%s.losses", g_tmp, r->name);
  snprintf(out, sizeof out, "%s/%s.out", g_tmp, name);
  const char *a[48] = {"train", COMMON, "--loss-log", log};
  int n = 0;
  while (a[n])
    n++;
  for (int i = 0; r->opt[i]; i++)
    a[n++] = r->opt[i];
  a[n] = NULL;
  int st = mt_run_axon(out, NULL, 300000, a);
  char *o = mt_slurp(out);
  if (r->refused) {
    if (st != 2 || !o || !strstr(o, r->refused))
      fail_msg("%s: exit %d, expected a refusal naming '%s':\n%s", r->name, st,
               r->refused, o ? o : "");
    fprintf(stderr, "  %-16s refused: %s", r->name,
            strstr(o, "axon-run: ") ? strstr(o, "axon-run: ") : o);
  } else {
    if (st != 0)
      fail_msg("%s: exit %d:\n%s", r->name, st, o ? o : "");
    if (r->same_as)
      same_losses(r->same_as, r->name);
    fprintf(stderr, "  %-16s runs%s%s\n", r->name,
            r->same_as ? ", every loss equal to " : "",
            r->same_as ? r->same_as : "");
  }
  free(o);
}

static void test_combinations(void **state) {
  for (size_t i = 0; i < sizeof g_rows / sizeof *g_rows; i++)
    run_row(&g_rows[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_combinations),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
