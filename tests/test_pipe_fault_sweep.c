/* The fault sweep: axon-run trains a tiny model with two spares and a
 * checkpoint every 5 steps, while one agent (or two, one after the other)
 * dies from inside at a named point (AXON_FAULT,
 * runtime/pipeline/stage/fault-impl.h): the start of an F, B, I, W or STEP
 * of some unit, the writing of a checkpoint file, or the handoff of a
 * stage's state in a recovery. Modes: a flushed one (1f1b, and zb-h1 for
 * I and W), asynchronous ones (pipedream, 2bw) and a chunked one
 * (interleaved). Layouts: a plain pipeline of three --local agents (an
 * MLP); two replicas of it (--replicas 2: agents stage0..2 are replica
 * 0's, stage3..5 replica 1's), which recover live from the other replica
 * in a flushed mode and roll back in an asynchronous one; the same under
 * ZeRO (--zero 1), which rolls back, since the lost replica held the only
 * copy of its optimizer shard; and tensor parallelism (--tensor-parallel
 * 2, a tiny bert over gcide's text: stage0..1 are member 0's, stage2..3
 * member 1's), which rolls back, and two replicas of that, which recover
 * live. Oracle, per point: the fault fired (its
 * agent said so), the run recovered and ended with exit 0, the last loss
 * logged for every step equals the uninterrupted run's, and the final
 * checkpoint, exported (axon-run export), equals the uninterrupted run's
 * byte for byte. Every bit must match: a rollback goes to a cut the
 * uninterrupted run took too (docs/CHECKPOINTS.md), and a live recovery
 * runs the interrupted step again from the state every stage had at its
 * start (tests/test_pipe_recover.c); only the losses of steps a live
 * recovery says were applied but not reported may be missing. It prints
 * the points tried and survived, per layout.
 *
 * `test_pipe_fault_sweep` (make test) runs the points marked short; `ctest
 * -L faults` runs test_pipe_fault_sweep_full, every point (argument
 * "full"). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "axon/rpc/launch.h"
#include "harness.h"
#include "tests/mp_testutil.h"

#define STEPS 15
#define COMMON                                                                 \
  "--steps", "15", "--optim", "opt=adamw,lr=1e-3", "--eval-limit", "12",       \
      "--checkpoint-every", "5", "--spares", "spare0,spare1", "--quiet"
#define MLP                                                                    \
  "--dataset", "synthetic", "--data-config",                                   \
      "shape=16,classes=4,examples=512", "--model", "mlp", "--model-config",   \
      "widths=16/16/16/16/16/16/4", "--batch", "12", "--microbatches", "3"
#define BERT                                                                   \
  "--dataset", "gcide", "--data-config",                                       \
      "seq=16,vocab=200,examples=1024,max_bytes=1m", "--model", "bert",        \
      "--model-config",                                                        \
      "layers=2,hidden=32,heads=4,ff=64,vocab=200,seq=16,dropout=0.1",         \
      "--batch", "16", "--microbatches", "2"

/* A layout: its agents and model (NULL-ended). */
typedef struct layout {
  const char *name;
  const char *args[24];
} layout;

enum { PLAIN, REPLICAS, ZERO, TP, TP_REPLICAS, NLAYOUTS };
static const layout g_layouts[NLAYOUTS] = {
    {"plain", {"--local", "3", MLP, NULL}},
    {"replicas", {"--local", "6", "--replicas", "2", MLP, NULL}},
    {"zero", {"--local", "6", "--replicas", "2", "--zero", "1", MLP, NULL}},
    {"tp", {"--local", "4", "--tensor-parallel", "2", BERT, NULL}},
    {"tp+replicas",
     {"--local", "8", "--replicas", "2", "--tensor-parallel", "2", BERT, NULL}},
};

typedef struct point {
  int layout;
  const char *mode;
  const char *fault; /* AXON_FAULT */
  int in_short;      /* also in the short form */
  int memory;        /* --checkpoint-in-memory too */
} point;

/* Interleaved: 6 stages, stage s on agent stage(s % 3). Units 0..2. A
 * handoff needs a rollback to a checkpoint (one to the run's start loads
 * nothing): its first fault comes after step 10, when the checkpoint of
 * step 5 is complete (the one of step 10 waited for it). */
static const point g_points[] = {
    {PLAIN, "1f1b", "agent=stage1,stage=1,action=F,unit=1,step=8", 1, 0},
    {PLAIN, "1f1b", "agent=stage2,stage=2,action=B,unit=2,step=12", 0, 0},
    {PLAIN, "1f1b", "agent=stage0,stage=0,action=STEP,step=7", 0, 0},
    {PLAIN, "1f1b", "agent=stage1,action=F,unit=0,step=2", 0, 0},
    {PLAIN, "1f1b", "agent=stage1,ckpt-write,step=10", 1, 0},
    {PLAIN, "1f1b", "agent=stage2,ckpt-write,step=15", 0, 0},
    {PLAIN, "1f1b", "agent=stage1,action=B,unit=0,step=12;agent=spare0,handoff",
     1, 0},
    {PLAIN, "1f1b", "agent=stage1,action=B,unit=1,step=13;agent=stage2,handoff",
     0, 0},
    {PLAIN, "1f1b", "agent=stage1,stage=1,action=F,unit=2,step=11", 0, 1},
    {PLAIN, "1f1b", "agent=stage1,action=B,unit=0,step=11;agent=spare0,handoff",
     0, 1},
    {PLAIN, "1f1b",
     "agent=stage1,action=F,unit=0,step=12;agent=stage2,handoff,stage=1", 0, 1},
    {PLAIN, "pipedream", "agent=stage1,stage=1,action=F,unit=0,step=8", 0, 0},
    {PLAIN, "pipedream", "agent=stage2,stage=2,action=B,unit=0,step=11", 1, 0},
    {PLAIN, "pipedream", "agent=stage0,action=STEP,step=7", 0, 0},
    {PLAIN, "pipedream", "agent=stage2,ckpt-write,step=5", 0, 0},
    {PLAIN, "pipedream", "agent=stage1,action=B,step=12;agent=spare0,handoff",
     0, 0},
    {PLAIN, "2bw", "agent=stage2,stage=2,action=F,unit=2,step=8", 0, 0},
    {PLAIN, "2bw", "agent=stage0,stage=0,action=B,unit=1,step=9", 0, 0},
    {PLAIN, "2bw", "agent=stage1,action=STEP,step=12", 0, 0},
    {PLAIN, "2bw", "agent=stage0,ckpt-write,step=10", 0, 0},
    {PLAIN, "interleaved", "agent=stage1,stage=4,action=F,unit=1,step=8", 0, 0},
    {PLAIN, "interleaved", "agent=stage0,stage=3,action=B,unit=2,step=9", 0, 0},
    {PLAIN, "interleaved", "agent=stage2,stage=5,action=STEP,step=11", 0, 0},
    {PLAIN, "interleaved", "agent=stage1,stage=4,ckpt-write,step=10", 1, 0},
    {PLAIN, "interleaved",
     "agent=stage2,action=B,unit=0,step=11;agent=spare0,handoff", 0, 0},
    {PLAIN, "zb-h1", "agent=stage1,stage=1,action=I,unit=1,step=8", 0, 0},
    {PLAIN, "zb-h1", "agent=stage2,stage=2,action=W,unit=0,step=9", 0, 0},
    {PLAIN, "zb-h1", "agent=stage0,action=STEP,step=6", 0, 0},
    /* Replicas, K = 3: a flushed mode recovers live, an asynchronous one
     * rolls back. Only replica 0 writes checkpoint files (the replicas
     * hold the same state), and pipedream runs one unit per mini-batch. */
    {REPLICAS, "1f1b", "agent=stage4,stage=1,action=B,unit=1,step=8", 1, 0},
    {REPLICAS, "1f1b", "agent=stage0,stage=0,action=F,unit=0,step=6", 0, 0},
    {REPLICAS, "1f1b", "agent=stage5,action=STEP,step=7", 0, 0},
    {REPLICAS, "1f1b", "agent=stage2,ckpt-write,step=10", 0, 0},
    {REPLICAS, "1f1b", "agent=stage3,action=F,unit=2,step=12", 0, 1},
    {REPLICAS, "1f1b",
     "agent=stage4,action=B,unit=0,step=12;agent=spare0,handoff", 0, 0},
    {REPLICAS, "zb-h1", "agent=stage3,stage=0,action=W,unit=1,step=9", 0, 0},
    {REPLICAS, "zb-h1", "agent=stage1,stage=1,action=I,unit=2,step=4", 0, 0},
    {REPLICAS, "interleaved", "agent=stage4,stage=4,action=F,unit=1,step=8", 0,
     0},
    {REPLICAS, "pipedream", "agent=stage4,stage=1,action=F,unit=0,step=8", 0,
     0},
    {REPLICAS, "pipedream", "agent=stage1,action=B,unit=0,step=11", 0, 0},
    {REPLICAS, "pipedream", "agent=stage3,action=B,unit=0,step=9", 0, 1},
    {REPLICAS, "2bw", "agent=stage5,action=STEP,step=12", 0, 0},
    {REPLICAS, "2bw", "agent=stage0,ckpt-write,step=10", 0, 0},
    /* ZeRO over the replicas: every point rolls back. */
    {ZERO, "1f1b", "agent=stage4,stage=1,action=F,unit=1,step=8", 1, 0},
    {ZERO, "1f1b", "agent=stage0,action=STEP,step=12", 0, 0},
    {ZERO, "1f1b", "agent=stage5,ckpt-write,step=10", 0, 0},
    {ZERO, "1f1b", "agent=stage1,action=B,unit=0,step=11;agent=spare0,handoff",
     0, 0},
    {ZERO, "1f1b", "agent=stage2,action=F,unit=2,step=13", 0, 1},
    {ZERO, "pipedream", "agent=stage3,action=B,unit=0,step=9", 0, 0},
    /* Tensor parallelism, K = 2, T = 2: every point rolls back. */
    {TP, "1f1b", "agent=stage3,stage=1,action=B,unit=1,step=8", 1, 0},
    {TP, "1f1b", "agent=stage0,stage=0,action=F,unit=0,step=6", 0, 0},
    {TP, "1f1b", "agent=stage2,ckpt-write,step=10", 0, 0},
    {TP, "1f1b", "agent=stage1,action=STEP,step=12", 0, 0},
    {TP, "1f1b", "agent=stage3,action=F,unit=1,step=12;agent=spare0,handoff", 0,
     0},
    {TP, "1f1b", "agent=stage1,action=B,unit=0,step=9", 0, 1},
    {TP, "pipedream", "agent=stage2,action=B,unit=0,step=11", 0, 0},
    /* Two replicas of it, replica r's member t on stage(4 r + 2 t) and
     * stage(4 r + 2 t + 1): a flushed mode recovers live. */
    {TP_REPLICAS, "1f1b", "agent=stage7,stage=1,action=B,unit=1,step=8", 0, 0},
    {TP_REPLICAS, "1f1b", "agent=stage2,stage=0,action=F,unit=0,step=11", 0, 0},
};
#define NPOINTS (int)(sizeof g_points / sizeof g_points[0])

static char g_tmp[64];
static int g_full;

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

/* The last loss logged for each step ("step loss" lines), as text; the
 * number of steps seen. */
static int last_losses(const char *path, char (*v)[40]) {
  FILE *f = fopen(path, "r");
  long s;
  char val[40];
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

/* Trains mode in layout lay into dir (dir.losses, dir.out; fault:
 * AXON_FAULT or NULL), then exports its final checkpoint to dir.bin.
 * Returns NULL, or what failed. */
static const char *train(int lay, const char *mode, const char *dir,
                         const char *fault, int memory) {
  char losses[300], out[300], bin[300];
  snprintf(losses, sizeof losses, "%s.losses", dir);
  snprintf(out, sizeof out, "%s.out", dir);
  snprintf(bin, sizeof bin, "%s.bin", dir);
  const char *argv[48] = {"train", COMMON};
  int n = 0;
  while (argv[n])
    n++;
  for (const char *const *a = g_layouts[lay].args; *a; a++)
    argv[n++] = *a;
  const char *rest[] = {"--mode",
                        mode,
                        "--checkpoint-dir",
                        dir,
                        "--loss-log",
                        losses,
                        memory ? "--checkpoint-in-memory" : NULL};
  for (size_t i = 0; i < sizeof rest / sizeof rest[0] && rest[i]; i++)
    argv[n++] = rest[i];
  if (run_axon(out, argv, fault) != 0)
    return "axon-run train did not end with exit 0";
  char eout[300];
  snprintf(eout, sizeof eout, "%s.export", dir);
  const char *ex[] = {"export", "--checkpoint", dir, "--out", bin, NULL};
  return run_axon(eout, ex, NULL) == 0 ? NULL : "axon-run export failed";
}

typedef struct ref {
  int layout;
  const char *mode;
  char losses[STEPS][40];
  char *model; /* the exported final checkpoint */
  size_t model_len;
} ref;

static ref g_refs[16];
static int g_nrefs;

static char *slurp_len(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  char *b = NULL;
  long n = -1;
  if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 &&
      fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)n + 1)))
    *len = fread(b, 1, (size_t)n, f);
  if (f)
    fclose(f);
  return b;
}

/* The uninterrupted run of mode in layout lay (trained the first time it
 * is asked for). */
static const ref *ref_of(int lay, const char *mode) {
  for (int i = 0; i < g_nrefs; i++)
    if (g_refs[i].layout == lay && !strcmp(g_refs[i].mode, mode))
      return &g_refs[i];
  assert_true(g_nrefs < (int)(sizeof g_refs / sizeof g_refs[0]));
  ref *r = &g_refs[g_nrefs++];
  r->layout = lay;
  r->mode = mode;
  char dir[200], path[300];
  snprintf(dir, sizeof dir, "%s/ref-%s-%s", g_tmp, g_layouts[lay].name, mode);
  const char *why = train(lay, mode, dir, NULL, 0);
  if (why)
    fail_msg("%s, uninterrupted: %s (%s.out)", mode, why, dir);
  snprintf(path, sizeof path, "%s.losses", dir);
  assert_int_equal(last_losses(path, r->losses), STEPS);
  snprintf(path, sizeof path, "%s.bin", dir);
  r->model = slurp_len(path, &r->model_len);
  assert_non_null(r->model);
  return r;
}

static int count_of(const char *text, const char *what) {
  int n = 0;
  for (const char *at = text; (at = strstr(at, what)); at += strlen(what))
    n++;
  return n;
}

/* The step the run went on from after its last recovery ("back at step
 * N" after a rollback, "at step N, 0 steps lost" after a live recovery),
 * or -1; *live: whether that recovery was live; [*un_lo, *un_hi]: the
 * steps a live recovery said were applied but not reported (empty when
 * *un_lo > *un_hi). */
static long recovered_at(const char *out, int *live, long *un_lo, long *un_hi) {
  static const char *const said[] = {"back at step ", "replicas in "};
  const char *last = NULL;
  *live = 0;
  for (int k = 0; k < 2; k++)
    for (const char *at = out; (at = strstr(at, said[k])); at++)
      if (!last || at > last) {
        last = at;
        *live = k;
      }
  *un_lo = 0;
  *un_hi = -1;
  const char *un = strstr(out, "axon-run: steps ");
  if (un &&
      sscanf(un, "axon-run: steps %ld to %ld were applied", un_lo, un_hi) != 2)
    *un_hi = -1;
  if (!last)
    return -1;
  if (!*live)
    return atol(last + strlen(said[0]));
  const char *at = strstr(last, "; at step ");
  return at ? atol(at + strlen("; at step ")) : -1;
}

/* Point i: NULL when it survived, else why not; *back: the step of the
 * last recovery (-1: none); *live: whether it was live. */
static const char *try_point(int i, long *back, int *live) {
  const point *p = &g_points[i];
  const ref *r = ref_of(p->layout, p->mode);
  char dir[200], path[300];
  snprintf(dir, sizeof dir, "%s/p%02d-%s-%s", g_tmp, i,
           g_layouts[p->layout].name, p->mode);
  *back = -1;
  *live = 0;
  long un_lo = 0, un_hi = -1;
  const char *why = train(p->layout, p->mode, dir, p->fault, p->memory);
  snprintf(path, sizeof path, "%s.out", dir);
  char *out = mt_slurp(path);
  if (out) { /* every fault of the point fired, and the run recovered */
    *back = recovered_at(out, live, &un_lo, &un_hi);
    if (!why && count_of(out, "axon fault: ") != 1 + count_of(p->fault, ";"))
      why = "not every fault fired";
    if (!why && *back < 0)
      why = "no recovery";
  }
  if (!out || why)
    fprintf(stderr, "---- %s ----\n%s----\n", path, out ? out : "");
  free(out);
  if (why)
    return why;
  static char got[STEPS][40];
  memset(got, 0, sizeof got);
  snprintf(path, sizeof path, "%s.losses", dir);
  last_losses(path, got);
  for (int s = 0; s < STEPS; s++)
    if (s >= un_lo && s <= un_hi ? got[s][0] != 0
                                 : strcmp(got[s], r->losses[s]) != 0) {
      fprintf(stderr, "  step %d: %s uninterrupted, %s recovered\n", s,
              r->losses[s], got[s][0] ? got[s] : "(none)");
      return "a loss differs from the uninterrupted run's";
    }
  size_t len = 0;
  snprintf(path, sizeof path, "%s.bin", dir);
  char *model = slurp_len(path, &len);
  int same = model && len == r->model_len && !memcmp(model, r->model, len);
  free(model);
  return same ? NULL
              : "the final parameters differ from the uninterrupted "
                "run's";
}

static void test_sweep(void **state) {
  int tried[NLAYOUTS] = {0}, survived[NLAYOUTS] = {0}, all = 0, ok = 0;
  for (int i = 0; i < NPOINTS; i++) {
    const point *p = &g_points[i];
    if (!g_full && !p->in_short)
      continue;
    long back;
    int live;
    const char *why = try_point(i, &back, &live);
    tried[p->layout]++;
    survived[p->layout] += why == NULL;
    fprintf(stderr, "  %-8s %-11s %-11s %s%s: %s at step %ld%s%s\n",
            why ? "LOST" : "survived", g_layouts[p->layout].name, p->mode,
            p->fault, p->memory ? " (in memory)" : "", live ? "live" : "back",
            back, why ? ": " : "", why ? why : "");
  }
  for (int l = 0; l < NLAYOUTS; l++) {
    printf("fault sweep (%s), %s: %d points tried, %d survived\n",
           g_full ? "full" : "short", g_layouts[l].name, tried[l], survived[l]);
    all += tried[l];
    ok += survived[l];
  }
  printf("fault sweep (%s): %d points tried, %d survived\n",
         g_full ? "full" : "short", all, ok);
  for (int i = 0; i < g_nrefs; i++)
    free(g_refs[i].model);
  assert_int_equal(ok, all);
}

/* An agent refuses a malformed AXON_FAULT at its start (exit 1, naming
 * the variable), before it joins. */
static void test_malformed(void **state) {
  static const char *const bad[] = {
      "action=X",           "stage=1",         "action=F,handoff",
      "action=STEP,unit=0", "unit=-1",         "ckpt-write;",
      "handoff,step=3",     "agent=,action=B", "action=B,stage=1,stage=2"};
  char path[4200], out[300], var[200];
  mt_bin_path("axon-agent", path, sizeof path);
  snprintf(out, sizeof out, "%s/malformed.out", g_tmp);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(var, sizeof var, "AXON_FAULT=%s", bad[i]);
    const char *const env[] = {var, NULL};
    const char *argv[] = {path, "--name", "a", "--master", "127.0.0.1:1", NULL};
    ax_spawn_opts o = {.argv = argv, .env = env, .out = out, .pin = -1};
    pid_t pid = ax_local_spawn(&o);
    int st = 0;
    assert_true(pid > 0 && waitpid(pid, &st, 0) == pid);
    char *text = mt_slurp(out);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 1 || !text ||
        !strstr(text, "AXON_FAULT="))
      fail_msg("AXON_FAULT=%s: status %d, said: %s", bad[i], st,
               text ? text : "");
    free(text);
  }
}

int main(int argc, char **argv) {
  g_full = argc > 1 && !strcmp(argv[1], "full");
  snprintf(g_tmp, sizeof g_tmp, "/tmp/axon-faults-XXXXXX");
  if (!mkdtemp(g_tmp))
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_sweep),
  };
  int rc = AX_TEST_MAIN(tests);
  char rm[128];
  snprintf(rm, sizeof rm, "rm -rf '%s'", g_tmp);
  if (system(rm) != 0)
    fprintf(stderr, "could not remove %s\n", g_tmp);
  return rc;
}
