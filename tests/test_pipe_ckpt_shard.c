/* Stage checkpoint files of a sharded optimizer (ZeRO, --zero) and of an
 * optimizer on another agent (--optimizer-host), through the stage hosts'
 * own "ckpt_save" and "ckpt_load" (docs/CHECKPOINTS.md, records of a stage
 * file), on four real agents:
 *  - zero: each replica's file holds its shard of the optimizer state
 *    (optim.off, optim.len) and the whole parameters; after two more
 *    steps, loading it gives the same file again, bit for bit. A file
 *    of the shard only (optim_only, holds_params 0) loads that shard and
 *    leaves the parameters; a file of another replica's shard is refused
 *    naming the ranges, and changes nothing;
 *  - optimizer host: a stage's file is the same, byte for byte, as the
 *    same stage's with its own optimizer (SGD with momentum: m only;
 *    AdamW: m and v); loading the local stage's file into the offloaded
 *    one and training on gives the local run's weights to the bit;
 *  - zero live RRefs, contexts and calls on every node after each test. */
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/pipeline/coord/coordinator-impl.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"
#include "axon/runtime/pipeline/state/ckpt_file-impl.h"
#include "tests/pipe_testutil.h"

#define NAGENTS 4
static const char *g_names[NAGENTS] = {"z1", "z2", "z3", "z4"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

static const char *g_model_cfg = "widths=48/40/32/24/10";
static const char *g_data_cfg = "shape=48,classes=10,examples=256,seed=7";

/* A stage file in memory. */
typedef struct sfile {
  uint8_t *buf;
  size_t len;
  char sha[AXP_SHA_HEX + 1];
} sfile;

/* Stage host h's file (the optimizer state only with optim_only). */
static sfile save(ax_rref *h, int optim_only) {
  axi_pipe_ckpt_save_msg m = {"mem", "s.axck", 1, 1, 1, 0, 1, optim_only};
  ax_values *a = ax_values_new(), *r = NULL;
  AX_ASSERT_OK(axi_pipe_ckpt_save_encode(&m, a));
  ax_call_opts co = {.timeout_ms = 30000};
  AX_ASSERT_OK(ax_rref_rpc_sync(g_drv, h, "ckpt_save", a, &co, &r));
  axi_pipe_file_msg f;
  AX_ASSERT_OK(axi_pipe_file_decode(r, &f));
  assert_true(f.has_file);
  sfile s = {NULL, (size_t)f.size, ""};
  snprintf(s.sha, sizeof s.sha, "%s", f.sha);
  AX_ASSERT_OK(axi_ck_unpack(f.file, s.len, &s.buf));
  ax_values_free(a);
  ax_values_free(r);
  return s;
}

/* Loads f into stage host h: its outcome. */
static int load(ax_rref *h, const sfile *f) {
  ax_tensor *t = axi_ck_pack(f->buf, f->len);
  assert_non_null(t);
  axi_pipe_ckpt_load_msg m = {"mem/s.axck", (int64_t)f->len, f->sha, 1, t};
  ax_values *a = ax_values_new(), *r = NULL;
  AX_ASSERT_OK(axi_pipe_ckpt_load_encode(&m, a));
  ax_call_opts co = {.timeout_ms = 30000};
  int err = ax_rref_rpc_sync(g_drv, h, "ckpt_load", a, &co, &r);
  ax_values_free(a);
  ax_values_free(r);
  ax_tensor_release(t);
  return err;
}

static int same_file(const sfile *a, const sfile *b) {
  return a->len == b->len && !memcmp(a->buf, b->buf, a->len);
}

/* A reader over a copy of f. */
static void open_file(const sfile *f, axi_ckr *r) {
  uint8_t *copy = malloc(f->len);
  assert_non_null(copy);
  memcpy(copy, f->buf, f->len);
  AX_ASSERT_OK(axi_ckr_mem(r, "test", copy, f->len, AXI_CK_STAGE, -1, NULL));
}

static int64_t rec_i64(const sfile *f, const char *name) {
  axi_ckr r;
  int64_t v;
  open_file(f, &r);
  AX_ASSERT_OK(axi_ckr_i64(&r, name, &v));
  axi_ckr_close(&r);
  return v;
}

static size_t rec_n(const sfile *f, const char *name) {
  axi_ckr r;
  const uint8_t *d;
  size_t n;
  open_file(f, &r);
  AX_ASSERT_OK(axi_ckr_f32(&r, name, &d, &n));
  axi_ckr_close(&r);
  return n;
}

/* Whether record `name` (f32) is the same in a and b. */
static int same_rec(const sfile *a, const sfile *b, const char *name) {
  axi_ckr ra, rb;
  const uint8_t *da, *db;
  size_t na, nb;
  open_file(a, &ra);
  open_file(b, &rb);
  AX_ASSERT_OK(axi_ckr_f32(&ra, name, &da, &na));
  AX_ASSERT_OK(axi_ckr_f32(&rb, name, &db, &nb));
  int same = na == nb && !memcmp(da, db, na * sizeof(float));
  axi_ckr_close(&ra);
  axi_ckr_close(&rb);
  return same;
}

static ax_pipe *new_pipe(int K, int R, int zero, const char *optim,
                         const char *opt_host) {
  ax_pipe_opts o = {
      "mlp", g_model_cfg,        K,     g_names, NULL,   AX_MODE_1F1B,
      2,     AX_RECOMPUTE_NEVER, optim, 3,       AX_CPU, 30000};
  o.replicas = R;
  o.zero = zero;
  o.optimizer_host = opt_host;
  ax_pipe *p = NULL;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  return p;
}

static void train(ax_pipe *p, pt_data *d, long steps) {
  AX_ASSERT_OK(ax_pipe_train(p, steps, pt_batch, NULL, d));
}

static void open_data(pt_data *d) {
  ax_config c;
  d->batch = 16;
  AX_ASSERT_OK(ax_config_parse(&c, g_data_cfg));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &c, AX_SPLIT_TRAIN, &d->ds));
}

#define K 2
#define R 2

static void test_zero_files(void **state) {
  pt_data d;
  open_data(&d);
  ax_pipe *p = new_pipe(K, R, 1, "opt=adamw,lr=0.01,wd=0.01", NULL);
  ax_rref *h[R][K];
  for (int r = 0; r < R; r++)
    for (int s = 0; s < K; s++)
      h[r][s] = ax_pipe_replica(p, r)->host[s];
  train(p, &d, 3);
  sfile f[R][K], g[R][K];
  for (int s = 0; s < K; s++) {
    int64_t off[R], len[R];
    for (int r = 0; r < R; r++) {
      f[r][s] = save(h[r][s], 0);
      g[r][s] = save(h[r][s], 1);
      const sfile *a = &f[r][s], *b = &g[r][s];
      off[r] = rec_i64(a, "optim.off");
      len[r] = rec_i64(a, "optim.len");
      assert_true(len[r] > 0 && (size_t)len[r] < rec_n(a, "params"));
      assert_int_equal(rec_n(a, "optim.m"), len[r]);
      assert_int_equal(rec_n(a, "optim.v"), len[r]);
      assert_int_equal(rec_i64(a, "holds_params"), 1);
      assert_int_equal(rec_i64(a, "tp.members"), 1);
      assert_int_equal(rec_i64(a, "tp.member"), 0);
      /* The shard-only file: the same shard, no parameters. */
      assert_int_equal(rec_i64(b, "holds_params"), 0);
      assert_int_equal(rec_n(b, "params") + rec_n(b, "buffers"), 0);
      assert_int_equal(rec_i64(b, "optim.off"), off[r]);
      assert_int_equal(rec_i64(b, "optim.len"), len[r]);
      assert_true(same_rec(a, b, "optim.m") && same_rec(a, b, "optim.v"));
      assert_int_equal(rec_i64(b, "optim.steps"), rec_i64(a, "optim.steps"));
    }
    /* The two shards cover the parameters. */
    int lo = off[0] < off[1] ? 0 : 1;
    assert_int_equal(off[lo], 0);
    assert_int_equal(off[1 - lo], len[lo]);
    assert_int_equal(len[0] + len[1], rec_n(&f[0][s], "params"));
  }
  /* Two more steps, then each replica's file back: the same file. */
  train(p, &d, 2);
  for (int r = 0; r < R; r++)
    for (int s = 0; s < K; s++) {
      sfile later = save(h[r][s], 0);
      assert_false(same_file(&later, &f[r][s]));
      free(later.buf);
      AX_ASSERT_OK(load(h[r][s], &f[r][s]));
      sfile again = save(h[r][s], 0);
      assert_true(same_file(&again, &f[r][s]));
      free(again.buf);
    }
  /* Two more steps; the shard-only file loads the shard only. */
  train(p, &d, 2);
  for (int r = 0; r < R; r++)
    for (int s = 0; s < K; s++) {
      sfile before = save(h[r][s], 0);
      AX_ASSERT_OK(load(h[r][s], &g[r][s]));
      sfile after = save(h[r][s], 0);
      assert_true(same_rec(&after, &before, "params"));
      assert_true(same_rec(&after, &before, "buffers"));
      assert_int_equal(rec_i64(&after, "last_step"),
                       rec_i64(&before, "last_step"));
      assert_true(same_rec(&after, &f[r][s], "optim.m"));
      assert_true(same_rec(&after, &f[r][s], "optim.v"));
      assert_int_equal(rec_i64(&after, "optim.steps"),
                       rec_i64(&f[r][s], "optim.steps"));
      /* Another replica's shard, whole or alone: refused, nothing
       * changed. */
      for (int i = 0; i < 2; i++) {
        const sfile *other = i ? &g[1 - r][s] : &f[1 - r][s];
        assert_int_equal(load(h[r][s], other), AX_EINVAL);
        assert_non_null(strstr(ax_errmsg(), "optim.off"));
        assert_non_null(strstr(ax_errmsg(), "not this stage's"));
        sfile still = save(h[r][s], 0);
        assert_true(same_file(&still, &after));
        free(still.buf);
      }
      free(before.buf);
      free(after.buf);
    }
  fprintf(stderr,
          "  1f1b K=%d R=%d zero 1 (adamw): shard files and shard-only "
          "files round-trip; another replica's shard refused\n",
          K, R);
  for (int r = 0; r < R; r++)
    for (int s = 0; s < K; s++)
      free(f[r][s].buf), free(g[r][s].buf);
  ax_pipe_free(p);
  ax_dataset_close(d.ds);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

/* One run of K stages (optimizer on opt_host, or local): 3 steps, the
 * stages' files (into f when `mine`, else compared with f), 2 steps,
 * every stage loads f (the same file again), 2 steps; its weights into
 * w. */
static void offload_run(const char *optim, const char *opt_host, sfile *f,
                        int mine, ax_tensor **w) {
  pt_data d;
  open_data(&d);
  ax_pipe *p = new_pipe(K, 1, 0, optim, opt_host);
  train(p, &d, 3);
  for (int s = 0; s < K; s++) {
    sfile here = save(p->host[s], 0);
    if (mine) {
      f[s] = here;
      continue;
    }
    if (!same_file(&here, &f[s]))
      fail_msg("stage %d: the file with its optimizer on %s differs from "
               "the local optimizer's",
               s, opt_host);
    free(here.buf);
  }
  train(p, &d, 2);
  for (int s = 0; s < K; s++) {
    AX_ASSERT_OK(load(p->host[s], &f[s]));
    sfile again = save(p->host[s], 0);
    assert_true(same_file(&again, &f[s]));
    free(again.buf);
  }
  train(p, &d, 2);
  for (int s = 0; s < K; s++) {
    ax_tensor *b;
    AX_ASSERT_OK(ax_pipe_stage_state(p, s, &w[s], &b));
    ax_tensor_release(b);
  }
  ax_pipe_free(p);
  ax_dataset_close(d.ds);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_optimizer_host_files(void **state) {
  const char *optims[] = {"opt=sgd,lr=0.05,momentum=0.9",
                          "opt=adamw,lr=0.01,wd=0.01"};
  for (int i = 0; i < 2; i++) {
    sfile f[K];
    ax_tensor *local[K], *away[K];
    offload_run(optims[i], NULL, f, 1, local);
    offload_run(optims[i], "z3", f, 0, away);
    for (int s = 0; s < K; s++) {
      assert_int_equal(ax_tensor_numel(local[s]), ax_tensor_numel(away[s]));
      if (memcmp(local[s]->data, away[s]->data, ax_tensor_nbytes(local[s])))
        fail_msg("%s stage %d: trained on from the local file with the "
                 "optimizer on z3, the weights differ",
                 optims[i], s);
      ax_tensor_release(local[s]);
      ax_tensor_release(away[s]);
      free(f[s].buf);
    }
    fprintf(stderr,
            "  1f1b K=%d, optimizer on z3 (%s): its files equal the local "
            "optimizer's; loaded and trained on, the same weights\n",
            K, optims[i]);
  }
}

int main(void) {
  static const char *const args[] = {"--threads", "2", NULL};
  if (mt_start("zcoord", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_zero_files),
      cmocka_unit_test(test_optimizer_host_files),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
