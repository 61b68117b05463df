/* Checkpoints through the library (runtime/pipeline/state/checkpoint.h), on
 * three real agents:
 *  - exact resume: a run checkpoints every N steps, trains on past its
 *    last checkpoint, and its coordinator goes away (ax_pipe_free: the
 *    stage hosts are destroyed); a new pipeline on the same agents restores
 *    the newest checkpoint and trains to the end. Its per-step losses and
 *    final parameters equal, bit for bit, an uninterrupted run's: one
 *    ax_pipe_train call for gpipe and 1f1b, a run that took the same cuts
 *    (drained every N steps) for pipedream and 2bw (whose shadow weights
 *    are saved). AdamW with a cosine schedule, so the moments and the
 *    schedule's position matter;
 *  - damage: a checkpoint truncated or with one byte changed, at several
 *    offsets of the manifest, the coordinator's file and a stage's file,
 *    is refused with AX_EFORMAT naming that file; after each refusal the
 *    previous checkpoint still restores and trains exactly;
 *  - the same with the stages' files streamed to the coordinator
 *    (AX_CKPT_TO_COORDINATOR) and back on restore;
 *  - zero live RRefs, contexts and calls on every node after each test. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "axon/runtime/pipeline/state/checkpoint.h"
#include "tests/pipe_testutil.h"

#define K 3
#define T 12 /* steps of a run */
#define N 4  /* checkpoint interval */
static const char *g_names[K] = {"c1", "c2", "c3"};
static pid_t g_pids[K];
static ax_node *g_drv;
static char g_root[64];
static int g_flags;
/* Asynchronous checkpoints (ax_pipe_checkpoint) whose manifest was there at
 * once. */
static int g_async_early;

typedef struct run {
  pt_data d;
  double loss[T];
} run;

static void on_step(void *user, const ax_pipe_step_info *s) {
  run *r = user;
  if (s->batch >= 0 && s->batch < T)
    r->loss[s->batch] = s->loss;
}

static ax_pipe *new_pipe(int mode) {
  ax_pipe_opts o = {"mlp",
                    "widths=64/48/32/10",
                    K,
                    g_names,
                    NULL,
                    mode,
                    4,
                    0,
                    "opt=adamw,lr=3e-3,sched=cosine,total=12",
                    7,
                    AX_CPU,
                    60000};
  ax_pipe *p = NULL;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  return p;
}

static void open_data(run *r) {
  ax_config c;
  memset(r, 0, sizeof *r);
  r->d.batch = 32;
  AX_ASSERT_OK(ax_config_parse(&c, "shape=64,classes=10,examples=512"));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &c, AX_SPLIT_TRAIN, &r->d.ds));
}

/* Trains steps [from, to) of a run that checkpoints every N steps (cut:
 * one ax_pipe_train call per interval; ckpt: save at each multiple). */
static void train(ax_pipe *p, run *r, long from, long to, int cut, int ckpt) {
  while (from < to) {
    long n = cut ? ((from / N + 1) * N < to ? (from / N + 1) * N : to) - from
                 : to - from;
    AX_ASSERT_OK(ax_pipe_train(p, n, pt_batch, on_step, r));
    from += n;
    if (ckpt && from % N == 0) {
      ax_ckpt_info in;
      memset(&in, 0, sizeof in);
      in.step = from;
      in.seed = 7;
      snprintf(in.model, sizeof in.model, "mlp");
      snprintf(in.config, sizeof in.config, "test");
      ax_node_stats s0, s1;
      ax_node_stats_get(g_drv, &s0);
      AX_ASSERT_OK(ax_pipe_checkpoint(p, g_root, &in, 2, g_flags));
      ax_node_stats_get(g_drv, &s1);
      if (g_flags & AX_CKPT_ASYNC) { /* training goes on while the files
                                       are written; no manifest before */
        char man[256];
        snprintf(man, sizeof man, "%s/ckpt-%08ld/MANIFEST", g_root, from);
        struct stat sb;
        g_async_early += stat(man, &sb) == 0;
        continue; /* the next checkpoint, or ax_pipe_free, waits for it */
      }
      /* The stages' files came through the coordinator, or did not. */
      uint64_t files = 0;
      for (int s = 0; s < K; s++) {
        char path[256];
        struct stat sb;
        snprintf(path, sizeof path, "%s/ckpt-%08ld/stage-%02d.axck", g_root,
                 from, s);
        assert_int_equal(stat(path, &sb), 0);
        files += (uint64_t)sb.st_size;
      }
      if (g_flags & AX_CKPT_TO_COORDINATOR)
        assert_true(s1.bytes_in - s0.bytes_in >= files);
      else
        assert_true(s1.bytes_in - s0.bytes_in < files / 2);
    }
  }
}

/* Every stage's parameters of p into out (K tensors, new references). */
static void params_of(ax_pipe *p, ax_tensor **out) {
  for (int s = 0; s < K; s++) {
    ax_tensor *b = NULL;
    AX_ASSERT_OK(ax_pipe_stage_state(p, s, &out[s], &b));
    ax_tensor_release(b);
  }
}

static void assert_same_params(ax_tensor **a, ax_tensor **b) {
  for (int s = 0; s < K; s++) {
    assert_int_equal(ax_tensor_numel(a[s]), ax_tensor_numel(b[s]));
    assert_memory_equal(a[s]->data, b[s]->data, ax_tensor_nbytes(a[s]));
  }
}

static void rm_root(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_root);
  assert_int_equal(system(cmd), 0);
}

/* The reference: T steps without interruption (cut for async modes). */
static void reference(int mode, run *ref, ax_tensor **par) {
  open_data(ref);
  ax_pipe *p = new_pipe(mode);
  train(p, ref, 0, T, !ax_pipe_flushes(mode), 0);
  params_of(p, par);
  ax_pipe_free(p);
}

/* Resumes from `dir` on a fresh pipeline and trains to T. */
static void resume(int mode, const char *dir, run *r, ax_tensor **par) {
  ax_pipe *p = new_pipe(mode);
  ax_ckpt_info info;
  AX_ASSERT_OK(ax_pipe_restore(p, dir, &info));
  train(p, r, info.step, T, 1, 0);
  params_of(p, par);
  ax_pipe_free(p);
}

static void run_resume(int mode) {
  rm_root();
  run ref, a, b;
  ax_tensor *pref[K], *pres[K];
  reference(mode, &ref, pref);
  /* Checkpoints at N and 2N, two steps past the last, then the coordinator
   * is gone. */
  open_data(&a);
  ax_pipe *p = new_pipe(mode);
  train(p, &a, 0, 2 * N + 2, 1, 1);
  ax_pipe_free(p);
  char dir[1024];
  AX_ASSERT_OK(ax_ckpt_find(g_root, dir, sizeof dir));
  assert_non_null(strstr(dir, "ckpt-00000008"));
  open_data(&b);
  resume(mode, g_root, &b, pres);
  for (long t = 0; t < 2 * N; t++)
    assert_true(a.loss[t] == ref.loss[t]);
  for (long t = 2 * N; t < T; t++) {
    if (b.loss[t] != ref.loss[t])
      fprintf(stderr, "  step %ld: %.17g resumed, %.17g reference\n", t,
              b.loss[t], ref.loss[t]);
    assert_true(b.loss[t] == ref.loss[t]);
  }
  assert_same_params(pref, pres);
  fprintf(stderr,
          "  %s: resumed at step %d, losses and parameters equal "
          "(last loss %.9g)\n",
          ax_pipe_mode_name(mode), 2 * N, b.loss[T - 1]);
  for (int s = 0; s < K; s++) {
    ax_tensor_release(pref[s]);
    ax_tensor_release(pres[s]);
  }
  ax_dataset_close(ref.d.ds);
  ax_dataset_close(a.d.ds);
  ax_dataset_close(b.d.ds);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, K));
}

static void test_resume_gpipe(void **state) { run_resume(AX_MODE_GPIPE); }
static void test_resume_1f1b(void **state) { run_resume(AX_MODE_1F1B); }
static void test_resume_pipedream(void **state) {
  run_resume(AX_MODE_PIPEDREAM);
}
static void test_resume_2bw(void **state) { run_resume(AX_MODE_2BW); }
/* The stages' files written in the background (AX_CKPT_ASYNC): the
 * manifest comes only after them, and the resume is the same. */
static void test_resume_async(void **state) {
  g_flags = AX_CKPT_ASYNC;
  g_async_early = 0;
  run_resume(AX_MODE_1F1B);
  run_resume(AX_MODE_PIPEDREAM);
  fprintf(stderr,
          "  asynchronous: the manifest was there at return %d "
          "time(s) of 4 (the writes may finish first)\n",
          g_async_early);
  /* Synchronous saving has it there every time: the flag must have been
   * honoured at least once (each early one needs the finisher's round
   * trips to the stages done before the test's next instruction). */
  assert_true(g_async_early < 4);
  g_flags = 0;
}
/* The stages' files streamed to the coordinator's directory and back. */
static void test_resume_to_coordinator(void **state) {
  g_flags = AX_CKPT_TO_COORDINATOR;
  run_resume(AX_MODE_1F1B);
  g_flags = 0;
}

static long file_size(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fclose(f);
  return n;
}

static void read_all(const char *path, unsigned char *buf, long n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
}

static void write_all(const char *path, const unsigned char *buf, long n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
}

/* Restoring dir on a fresh gpipe pipeline must fail naming `file`. */
static void expect_refused(const char *dir, const char *file, const char *how) {
  ax_pipe *p = new_pipe(AX_MODE_GPIPE);
  ax_ckpt_info info;
  int rc = ax_pipe_restore(p, dir, &info);
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", ax_errmsg());
  ax_pipe_free(p);
  if (rc == AX_OK || !strstr(msg, file))
    fprintf(stderr, "  %s %s: %s: %s\n", file, how, ax_strerror(rc), msg);
  assert_int_equal(rc, AX_EFORMAT);
  assert_non_null(strstr(msg, file));
}

static void run_damaged(void) {
  rm_root();
  run ref, a, b;
  ax_tensor *pref[K], *pres[K];
  reference(AX_MODE_GPIPE, &ref, pref);
  open_data(&a);
  ax_pipe *p = new_pipe(AX_MODE_GPIPE);
  train(p, &a, 0, 2 * N, 1, 1);
  ax_pipe_free(p);
  char dir[1024], prev[1024];
  AX_ASSERT_OK(ax_ckpt_find(g_root, dir, sizeof dir));
  ax_ckpt_previous(dir, prev, sizeof prev);
  assert_non_null(strstr(prev, "ckpt-00000004"));
  const char *files[] = {"MANIFEST", "coordinator.axck", "stage-01.axck"};
  int refused = 0;
  for (int f = 0; f < 3; f++) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, files[f]);
    long n = file_size(path);
    unsigned char *orig = malloc((size_t)n);
    read_all(path, orig, n);
    long offs[] = {0, 9, n / 3, n / 2, n - 40, n - 1};
    for (int i = 0; i < 6; i++) {
      long at = offs[i] < 0 ? 0 : offs[i] >= n ? n - 1 : offs[i];
      unsigned char *bad = malloc((size_t)n);
      memcpy(bad, orig, (size_t)n);
      bad[at] ^= 0x5a; /* one byte changed */
      write_all(path, bad, n);
      char how[64];
      snprintf(how, sizeof how, "byte %ld changed", at);
      expect_refused(dir, files[f], how);
      write_all(path, orig, at); /* truncated at that byte */
      snprintf(how, sizeof how, "truncated to %ld bytes", at);
      expect_refused(dir, files[f], how);
      refused += 2;
      free(bad);
    }
    write_all(path, orig, n);
    free(orig);
  }
  fprintf(stderr, "  %d damaged checkpoints refused, each naming its file\n",
          refused);
  /* The previous checkpoint stays usable, and exact. */
  open_data(&b);
  resume(AX_MODE_GPIPE, prev, &b, pres);
  for (long t = N; t < T; t++)
    assert_true(b.loss[t] == ref.loss[t]);
  assert_same_params(pref, pres);
  for (int s = 0; s < K; s++) {
    ax_tensor_release(pref[s]);
    ax_tensor_release(pres[s]);
  }
  ax_dataset_close(ref.d.ds);
  ax_dataset_close(a.d.ds);
  ax_dataset_close(b.d.ds);
  rm_root();
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, K));
}

static void test_damaged(void **state) { run_damaged(); }
static void test_damaged_to_coordinator(void **state) {
  g_flags = AX_CKPT_TO_COORDINATOR;
  run_damaged();
  g_flags = 0;
}

int main(void) {
  snprintf(g_root, sizeof g_root, "/tmp/axon-ckpt-test-%d", (int)getpid());
  static const char *const args[] = {"--threads", "4", NULL};
  if (mt_start("coord", g_names, K, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resume_gpipe),
      cmocka_unit_test(test_resume_1f1b),
      cmocka_unit_test(test_resume_pipedream),
      cmocka_unit_test(test_resume_2bw),
      cmocka_unit_test(test_resume_async),
      cmocka_unit_test(test_damaged),
      cmocka_unit_test(test_resume_to_coordinator),
      cmocka_unit_test(test_damaged_to_coordinator),
  };
  int failed = AX_TEST_MAIN(tests);
  rm_root();
  mt_end(g_drv, g_pids, K);
  return failed;
}
