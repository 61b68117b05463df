/* Agents on a GPU host (skipped, exit 77, without a CUDA device):
 *
 *   g0  --device cuda:0 --device-map cpu=cpu              (stage 0, GPU)
 *   c1  --device cuda:0 --device-map cuda:0=cpu,cpu=cpu   (stage 1, CPU)
 *
 * Both defaults are the GPU: what g0 gets from CPUs (inputs, stage 1's
 * gradients) stays on the CPU by its map and stage 0 must move it, what it
 * gets from GPUs lands on its GPU; everything c1 receives lands on the CPU
 * only because of its map. The driver (this process, on the CPU) checks:
 *  1. where tensors land: CPU and GPU senders, default and mapped
 *     receivers, bytes intact both ways (device_of, checksum, echo);
 *  2. an RRef whose value lives on g0's GPU: to_here gives the CPU copy;
 *  3. distributed autograd: the 2-stage MLP with stage 0 on cuda:0 and
 *     stage 1 on the CPU (activations fetched GPU -> CPU as RRefs, gradients
 *     sent CPU -> GPU) against single-process CPU training;
 *  4. the pipeline: the same split trained by the coordinator (gpipe, 1f1b,
 *     pipedream) against the all-CPU run of the same pipeline;
 * and every node ends with zero live RRefs, contexts, calls and futures.
 *
 * Tolerance: GPU kernels sum in another order than the CPU's (GEMM
 * splits, parallel reductions), about 1e-6 relative per float32 operation;
 * after a few SGD steps with momentum that stays near 1e-5..1e-4. RTOL =
 * 1e-3 relative (to |want| + 1e-2 rms, PT_FLOOR_RMS) leaves a margin yet
 * catches any lost gradient or misplaced copy, which are O(1). It assumes
 * float32 GEMMs: TF32 tensor cores (about 1e-3 per product) would not pass. */
#define PT_FLOOR_RMS
#include "agents/axon_agent.h"
#include "tests/dist_testutil.h"
#include "tests/pipe_testutil.h"

#define GPU "cuda:0"
#define RTOL 1e-3
#define NAGENTS 2
static const char *g_names[NAGENTS] = {"g0", "c1"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;
static ax_device g_gpu;

static int world_up(void **state) {
  static const char *const gpu_args[] = {
      "--threads", "4", "--device", GPU, "--device-map", "cpu=cpu", NULL};
  static const char *const cpu_args[] = {
      "--threads",          "4", "--device", GPU, "--device-map",
      "cuda:0=cpu,cpu=cpu", NULL};
  const char *const *each[NAGENTS] = {gpu_args, cpu_args};
  if (ax_device_parse(GPU, &g_gpu) != AX_OK)
    return -1;
  int rc = mt_start_each("driver", g_names, NAGENTS, each, g_pids, &g_drv);
  return rc == AX_OK ? 0 : -1;
}

static int world_down(void **state) {
  if (g_drv)
    mt_end(g_drv, g_pids, NAGENTS);
  g_drv = NULL;
  return 0;
}

/* Calls fn on agent `to` with the tensors t[0..k). */
static ax_values *call(const char *to, const char *fn, ax_tensor *const *t,
                       int k) {
  assert_non_null(g_drv);
  ax_values *a = ax_values_new(), *r = NULL;
  for (int i = 0; i < k; i++)
    AX_ASSERT_OK(ax_values_add_tensor(a, t[i]));
  ax_call_opts o = {.timeout_ms = 30000};
  AX_ASSERT_OK(ax_rpc_sync(g_drv, to, fn, a, &o, &r));
  ax_values_free(a);
  return r;
}

static void expect_landing(const char *to, ax_tensor *t, const char *want) {
  ax_values *r = call(to, "axon.test.device_of", &t, 1);
  const char *got;
  AX_ASSERT_OK(ax_values_get_str(r, 0, &got));
  if (strcmp(got, want))
    fail_msg("a tensor sent from %s landed on %s of %s, expected %s",
             t->device.type == AX_DEV_CPU ? "cpu" : GPU, got, to, want);
  ax_values_free(r);
}

/* The value of the i-th tensor of r, on the CPU, equals want's. */
static void expect_same(const ax_values *r, size_t i, const ax_tensor *want) {
  ax_tensor *u;
  AX_ASSERT_OK(ax_values_get_tensor(r, i, &u));
  assert_int_equal(u->device.type, AX_DEV_CPU); /* the driver's device */
  assert_int_equal(u->dtype, want->dtype);
  assert_true(ax_tensor_same_shape(u, want));
  assert_memory_equal(u->data, want->data, ax_tensor_nbytes(want));
}

static void test_landing_devices(void **state) {
  int64_t big[2] = {256, 1100}, small[1] = {7};
  ax_tensor *h[3] = {ax_test_randn(5, 1.0f, 2, big),
                     ax_test_randn(6, 1.0f, 1, small),
                     ax_test_randint(7, 0, 10, 1, small)}; /* labels (i32) */
  ax_tensor *g[3];
  for (int i = 0; i < 3; i++)
    assert_non_null(g[i] = ax_tensor_to(h[i], g_gpu));
  for (int i = 0; i < 3; i++) {
    expect_landing("g0", h[i], "cpu"); /* CPU sender: g0's map */
    expect_landing("c1", h[i], "cpu"); /* CPU sender: c1's map */
    expect_landing("g0", g[i], GPU);   /* GPU sender: g0's default */
    expect_landing("c1", g[i], "cpu"); /* GPU sender: c1's map */
  }
  /* The bytes: g0 checksums what landed on its GPU; echo sends it back. */
  ax_values *r = call("g0", "axon.test.checksum", &g[0], 1);
  int64_t sum;
  AX_ASSERT_OK(ax_values_get_i64(r, 0, &sum));
  assert_true((uint64_t)sum ==
              ax_agent_checksum(h[0]->data, ax_tensor_nbytes(h[0])));
  ax_values_free(r);
  const char *to[2] = {"g0", "c1"};
  for (int a = 0; a < 2; a++) {
    r = call(to[a], "axon.test.echo", g, 3);
    for (int i = 0; i < 3; i++)
      expect_same(r, (size_t)i, h[i]);
    ax_values_free(r);
  }
  for (int i = 0; i < 3; i++) {
    ax_tensor_release(h[i]);
    ax_tensor_release(g[i]);
  }
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_rref_to_here(void **state) {
  assert_non_null(g_drv);
  int64_t shape[2] = {300, 1000};
  ax_tensor *h = ax_test_randn(9, 1.0f, 2, shape);
  ax_tensor *g = ax_tensor_to(h, g_gpu);
  assert_non_null(g);
  ax_values *a = ax_values_new();
  AX_ASSERT_OK(ax_values_add_tensor(a, g));
  ax_rref *val, *where;
  AX_ASSERT_OK(ax_remote(g_drv, "g0", "axon.test.echo", a, NULL, &val));
  AX_ASSERT_OK(ax_remote(g_drv, "g0", "axon.test.device_of", a, NULL, &where));
  ax_values_free(a);
  ax_values *v = NULL;
  const char *dev;
  AX_ASSERT_OK(ax_rref_to_here(g_drv, where, 30000, 0, &v));
  AX_ASSERT_OK(ax_values_get_str(v, 0, &dev));
  assert_string_equal(dev, GPU); /* the owner holds the value on its GPU */
  ax_values_free(v);
  AX_ASSERT_OK(ax_rref_to_here(g_drv, val, 30000, 0, &v));
  expect_same(v, 0, h);
  ax_values_free(v);
  ax_rref_release(where);
  ax_rref_release(val);
  ax_tensor_release(h);
  ax_tensor_release(g);
  AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
}

static void test_dist_autograd(void **state) {
  assert_non_null(g_drv);
  ax_device devs[NAGENTS] = {g_gpu, AX_CPU};
  dt_oracle_cfg c = {"mlp",
                     "mlp.stage",
                     "widths=784/64/32/10",
                     "shape=1/28/28,classes=10,examples=640,seed=9",
                     "opt=sgd,lr=0.05,momentum=0.9",
                     10,
                     32,
                     RTOL};
  dt_run_oracle(g_drv, g_names, NAGENTS, devs, &c);
}

/* Trains `steps` mini-batches of the 2-stage MLP with stages on devs
 * (NULL: all on the CPU); returns the pipeline (for its stage states). */
static ax_pipe *train_pipe(const ax_device *devs, int mode, int M, int steps) {
  static const char *mcfg = "widths=48/40/32/24/10";
  static const char *optim = "opt=sgd,lr=0.05,momentum=0.9";
  ax_config dcfg;
  pt_data data = {NULL, 16};
  AX_ASSERT_OK(ax_config_parse(&dcfg, "shape=48,classes=10,examples=256,"
                                      "seed=7"));
  AX_ASSERT_OK(ax_dataset_open("synthetic", &dcfg, AX_SPLIT_TRAIN, &data.ds));
  ax_pipe_opts o = {
      "mlp", mcfg, NAGENTS, g_names, NULL, mode, M, AX_RECOMPUTE_NEVER,
      optim, 3,    AX_CPU,  60000,   devs};
  ax_pipe *p;
  AX_ASSERT_OK(ax_pipe_new(g_drv, &o, &p));
  AX_ASSERT_OK(ax_pipe_train(p, steps, pt_batch, NULL, &data));
  pt_check_events(p, mode, NAGENTS, M, AX_RECOMPUTE_NEVER, steps);
  ax_dataset_close(data.ds);
  return p;
}

static void test_pipeline_cuda0_cpu(void **state) {
  assert_non_null(g_drv);
  static const int modes[][2] = {
      {AX_MODE_GPIPE, 4}, {AX_MODE_1F1B, 2}, {AX_MODE_PIPEDREAM, 1}};
  ax_device devs[NAGENTS] = {g_gpu, AX_CPU};
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
    int mode = modes[i][0], M = modes[i][1], steps = 6;
    ax_pipe *cpu = train_pipe(NULL, mode, M, steps);
    ax_tensor *want[NAGENTS], *wbuf[NAGENTS];
    for (int k = 0; k < NAGENTS; k++)
      AX_ASSERT_OK(ax_pipe_stage_state(cpu, k, &want[k], &wbuf[k]));
    ax_pipe_free(cpu);
    ax_pipe *mixed = train_pipe(devs, mode, M, steps);
    double worst = pt_worst_stages(mixed, NAGENTS, want, wbuf);
    fprintf(stderr,
            "  %-10s stage 0 on %s, stage 1 on cpu: worst relative "
            "difference to the all-CPU run %.2g\n",
            ax_pipe_mode_name(mode), GPU, worst);
    ax_pipe_free(mixed);
    AX_ASSERT_OK(dt_all_zero(g_drv, g_names, NAGENTS));
    if (worst > RTOL)
      fail_msg("%s: relative difference %.3g > %.3g", ax_pipe_mode_name(mode),
               worst, RTOL);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_landing_devices, world_up),
      cmocka_unit_test(test_rref_to_here),
      cmocka_unit_test(test_dist_autograd),
      cmocka_unit_test_teardown(test_pipeline_cuda0_cpu, world_down),
  };
  return AX_CUDA_TEST_MAIN(tests);
}
