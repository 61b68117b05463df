/* The data-parallel example (examples/data_parallel) run small as real
 * processes: N replicas with the bucketed ring all-reduce end with the
 * parameters of single-process training on the concatenated batch
 * (relative 1e-5); EASGD and D-PSGD reduce the loss; a replica killed
 * mid-run is reported by the survivors, which re-form the ring and finish;
 * every replica ends with zero live calls, futures, RRefs and contexts. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "axon/kernels/rng.h"
#include "axon/models/data/dataset.h"
#include "axon/models/loss.h"
#include "axon/models/model.h"
#include "axon/models/optim.h"
#include "axon/rpc/launch.h"
#include "harness.h"

#define MODEL_CFG "widths=784/48/10"
#define DATA_CFG "limit=2048"

/* Runs data_parallel with the NULL-terminated arguments, output into a
 * malloc'ed string; returns the exit status. */
static int run_dp(char **out, ...) {
  char path[4200], log[] = "/tmp/axon_dp_XXXXXX";
  const char *d = getenv("AXON_BIN_DIR");
  snprintf(path, sizeof path, "%s/data_parallel", d && *d ? d : ".");
  const char *argv[40] = {path};
  int argc = 1;
  va_list ap;
  va_start(ap, out);
  const char *a;
  while (argc < 39 && (a = va_arg(ap, const char *)))
    argv[argc++] = a;
  va_end(ap);
  argv[argc] = NULL;
  int fd = mkstemp(log);
  assert_true(fd >= 0);
  ax_spawn_opts so = {.argv = argv, .out = log, .pin = -1};
  pid_t pid = ax_local_spawn(&so);
  int st = -1;
  waitpid(pid, &st, 0);
  off_t n = lseek(fd, 0, SEEK_END);
  *out = calloc(1, n + 1);
  pread(fd, *out, n, 0);
  close(fd);
  unlink(log);
  fprintf(stderr, "%s", *out);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Value of key=... in rank `rank`'s result line. */
static double result(const char *out, int rank, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "dp: result rank=%d ", rank);
  const char *l = strstr(out, pat);
  if (!l)
    fail_msg("no result line for rank %d", rank);
  const char *e = strchr(l, '\n');
  snprintf(pat, sizeof pat, " %s=", key);
  const char *k = strstr(l, pat);
  if (!k || (e && k > e))
    fail_msg("rank %d: no %s", rank, key);
  return atof(k + strlen(pat));
}

static void assert_clean(const char *out, int rank) {
  assert_int_equal((int)result(out, rank, "live_calls"), 0);
  assert_int_equal((int)result(out, rank, "live_futures"), 0);
  assert_int_equal((int)result(out, rank, "rrefs"), 0);
  assert_int_equal((int)result(out, rank, "contexts"), 0);
}

/* Single-process SGD on the global batches the example's sharding rule
 * produces: epoch permutation from (seed, epoch), batch n * b. */
static float *reference(int n, int b, int steps, size_t *np) {
  const ax_model_def *def = ax_model_find("mlp");
  ax_config mc, dc, oc;
  ax_model_info info;
  AX_ASSERT_OK(ax_model_config(def, MODEL_CFG, &mc));
  AX_ASSERT_OK(def->describe(&mc, &info));
  AX_ASSERT_OK(ax_config_parse(&dc, DATA_CFG));
  AX_ASSERT_OK(ax_config_parse(&oc, "opt=sgd,lr=0.05"));
  ax_optim_cfg ocfg;
  AX_ASSERT_OK(ax_optim_cfg_parse(&oc, &ocfg));
  ax_dataset *ds;
  AX_ASSERT_OK(ax_dataset_open("fashion-mnist", &dc, AX_SPLIT_TRAIN, &ds));
  ax_net *net;
  AX_ASSERT_OK(ax_model_stage(def, &mc, 0, info.n_blocks, AX_CPU, 1, &net));
  ax_optim *opt = ax_optim_new(&ocfg, net->n_params, AX_CPU);
  int64_t size = ax_dataset_size(ds), B = (int64_t)n * b;
  int32_t *perm = malloc(size * sizeof *perm);
  int64_t *idx = malloc(B * sizeof *idx);
  ax_rng r;
  ax_rng_seed2(&r, 1, 0);
  for (int64_t i = 0; i < size; i++)
    perm[i] = (int32_t)i;
  ax_rng_shuffle_i32(&r, perm, size);
  assert_true((steps + 1) * B <= size); /* one epoch */
  ax_slot *slot = ax_slot_new();
  for (int t = 0; t < steps; t++) {
    for (int64_t i = 0; i < B; i++)
      idx[i] = perm[t * B + i];
    ax_tlist in = {0}, lab = {0}, out = {0}, dl = {0}, din = {0};
    ax_loss_result res;
    AX_ASSERT_OK(ax_dataset_batch(ds, idx, B, &in, &lab));
    AX_ASSERT_OK(ax_net_forward(net, slot, 1, 0, &in, &out));
    AX_ASSERT_OK(
        ax_loss_xent(&out, &lab, info.ignore_index, NULL, 1.0f, &res, &dl));
    AX_ASSERT_OK(ax_net_zero_grad(net));
    AX_ASSERT_OK(ax_net_backward(net, slot, 0, 0, &dl, &din));
    AX_ASSERT_OK(ax_optim_step(opt, net->params, net->grads));
    ax_slot_reset(slot);
    ax_tlist_clear(&in);
    ax_tlist_clear(&lab);
    ax_tlist_clear(&out);
    ax_tlist_clear(&dl);
    ax_tlist_clear(&din);
  }
  *np = net->n_params;
  float *p = malloc(*np * sizeof(float));
  memcpy(p, net->params->data, *np * sizeof(float));
  ax_slot_free(slot);
  ax_optim_free(opt);
  ax_net_free(net);
  ax_dataset_close(ds);
  free(perm);
  free(idx);
  return p;
}

static void check_equal(int n, int b, int steps, const char *bucket_kb) {
  char nn[8], bb[8], ss[8], dump[] = "/tmp/axon_dp_params_XXXXXX";
  snprintf(nn, sizeof nn, "%d", n);
  snprintf(bb, sizeof bb, "%d", b);
  snprintf(ss, sizeof ss, "%d", steps);
  close(mkstemp(dump));
  char *out;
  int rc =
      run_dp(&out, "--local", nn, "--batch", bb, "--steps", ss,
             "--model-config", MODEL_CFG, "--data-config", DATA_CFG, "--optim",
             "opt=sgd,lr=0.05", "--bucket-kb", bucket_kb, "--eval-limit", "0",
             "--dump", dump, "--quiet", "--time-limit", "120", NULL);
  assert_int_equal(rc, 0);
  for (int r = 0; r < n; r++)
    assert_clean(out, r);
  free(out);
  size_t np;
  float *want = reference(n, b, steps, &np);
  float *got = malloc(np * sizeof(float));
  FILE *f = fopen(dump, "rb");
  assert_non_null(f);
  assert_int_equal(fread(got, sizeof(float), np, f), np);
  fclose(f);
  unlink(dump);
  double num = 0, den = 0, worst = 0;
  for (size_t i = 0; i < np; i++) {
    double d = fabs((double)got[i] - want[i]);
    num += d * d;
    den += (double)want[i] * want[i];
    if (d > worst)
      worst = d;
  }
  double rel = sqrt(num / den);
  fprintf(stderr,
          "[dp] N=%d b=%d steps=%d: relative difference %.3g "
          "(max abs %.3g)\n",
          n, b, steps, rel, worst);
  assert_true(rel <= 1e-5);
  free(want);
  free(got);
}

static void test_allreduce_equals_single(void **s) {
  check_equal(2, 16, 15, "16"); /* small buckets: several per step */
  check_equal(3, 8, 10, "256");
}

static void run_algo(const char *algo) {
  char *out;
  int rc =
      run_dp(&out, "--local", "3", "--algo", algo, "--steps", "60", "--batch",
             "16", "--model-config", MODEL_CFG, "--data-config", DATA_CFG,
             "--eval-limit", "500", "--quiet", "--time-limit", "120", NULL);
  assert_int_equal(rc, 0);
  for (int r = 0; r < 3; r++) {
    assert_true(result(out, r, "loss_last") <
                result(out, r, "loss_first") - 0.3);
    assert_clean(out, r);
  }
  assert_true(result(out, 0, "acc") > 0.5);
  free(out);
}

static void test_easgd(void **s) { run_algo("easgd"); }
static void test_dpsgd(void **s) { run_algo("dpsgd"); }

/* Replica 2 of 3 exits at step 8: the others name it, continue as a ring
 * of 2 from the new rank 0's state and finish every step. */
static void test_dead_replica(void **s) {
  char *out;
  int rc = run_dp(&out, "--local", "3", "--steps", "30", "--batch", "16",
                  "--model-config", MODEL_CFG, "--data-config", DATA_CFG,
                  "--eval-limit", "500", "--die-rank", "2", "--die-step", "8",
                  "--quiet", "--time-limit", "120", NULL);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "dp: rank 0: replica dp2 is down"));
  assert_non_null(strstr(out, "dp: rank 1: replica dp2 is down"));
  for (int r = 0; r < 2; r++) {
    assert_int_equal((int)result(out, r, "world"), 2);
    assert_int_equal((int)result(out, r, "reforms"), 1);
    assert_int_equal((int)result(out, r, "steps"), 30);
    assert_clean(out, r);
  }
  assert_null(strstr(out, "dp: result rank=2"));
  free(out);
}

int main(void) {
  const struct CMUnitTest t[] = {cmocka_unit_test(test_allreduce_equals_single),
                                 cmocka_unit_test(test_easgd),
                                 cmocka_unit_test(test_dpsgd),
                                 cmocka_unit_test(test_dead_replica)};
  return AX_TEST_MAIN(t);
}
