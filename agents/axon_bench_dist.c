/* axon-bench dist: training steps through distributed autograd against the
 * same model in one process, and the cost of one RPC edge in a distributed
 * backward.
 *
 *   axon-bench dist [--steps N] [--warmup N] [--threads N]
 *                   [--agent-threads N] [--edge-iters N] [--only WHAT]
 *
 * Three local agents (axon-agent next to this binary, forked and exec'ed
 * before gRPC starts here) hold the three stages of the MLP (widths
 * 784/256/128/10, batch 64) and of ResNet20 (batch 32), built with
 * ax_remote_module. A distributed step is: a context, the forward stage to
 * stage (each stage fetches the previous stage's output RRef), the backward
 * from the loss RRef (ax_dist_backward_rrefs), ax_dist_optim_step and the
 * context release. The one-process step is ax_model_stage of all blocks,
 * ax_net_forward, ax_loss_xent, ax_net_backward and ax_optim_step. Both use
 * SGD with momentum and --threads compute threads per process (agents get
 * AXON_THREADS; default 1), agents --agent-threads handler threads
 * (default 2). Times are medians over --steps after --warmup.
 *
 * Edge overhead: an MLP with widths 4/4/4/4 (batch 1, compute negligible)
 * split over the 3 agents has 2 RPC edges in its backward (w3 -> w2 ->
 * w1); the same model as one stage on w1 has none. The median time of the
 * backward call, (3 stages - 1 stage) / 2, is the cost per edge; the
 * one-process backward of that model is printed as the local baseline.
 * --only mlp|resnet20|edge runs one part. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agents/axon_bench_local.h"
#include "axon/kernels/clock.h"
#include "axon/models/loss.h"
#include "axon/models/model.h"
#include "axon/models/optim.h"
#include "axon/rpc/launch.h"
#include "axon/runtime/autograd/stage.h"

#define NAG 3
static const char *g_names[NAG] = {"w1", "w2", "w3"};
static ax_node *g_drv;
static const char *g_optim = "opt=sgd,lr=0.01,momentum=0.9";

#define CK(x)                                                                  \
  do {                                                                         \
    int e_ = (x);                                                              \
    if (e_ != AX_OK) {                                                         \
      fprintf(stderr, "axon-bench dist: %s:%d %s: %s\n", __FILE__, __LINE__,   \
              ax_strerror(e_), ax_errmsg());                                   \
      return e_;                                                               \
    }                                                                          \
  } while (0)

/* ---- the two kinds of step ----------------------------------------------- */
static void rand_fill(ax_rng *r, ax_tensor *t) {
  for (size_t i = 0; i < ax_tensor_numel(t); i++)
    ax_f32(t)[i] = (float)ax_rng_normal(r);
}

static int make_batch(const char *model, const ax_config *cfg, int batch,
                      ax_tlist *in, ax_tlist *lab) {
  ax_rng r;
  ax_rng_seed(&r, 12345);
  int err = AX_OK, classes = 10;
  if (!strcmp(model, "resnet20")) {
    int64_t ch = ax_config_int(cfg, "in_channels", 1, &err);
    int64_t im = ax_config_int(cfg, "image", 32, &err);
    int64_t s[4] = {batch, ch, im, im};
    in->t[0] = ax_tensor_new(AX_F32, 4, s, AX_CPU);
  } else {
    int64_t w[32];
    int n = ax_config_ints(cfg, "widths", w, 32, &err);
    int64_t s[2] = {batch, w[0]};
    in->t[0] = ax_tensor_new(AX_F32, 2, s, AX_CPU);
    classes = (int)w[n - 1];
  }
  int64_t nb = batch;
  in->n = lab->n = 1;
  lab->t[0] = ax_tensor_new(AX_I32, 1, &nb, AX_CPU);
  if (!in->t[0] || !lab->t[0])
    return AX_ENOMEM;
  rand_fill(&r, in->t[0]);
  for (int i = 0; i < batch; i++)
    ax_i32(lab->t[0])[i] = (int)ax_rng_below(&r, (uint64_t)classes);
  return err;
}

static int local_step(ax_net *net, ax_optim *opt, const ax_tlist *in,
                      const ax_tlist *lab, const ax_model_info *info,
                      int do_opt, double *bwd_s) {
  ax_slot *slot = ax_slot_new();
  ax_tlist out = {0}, dout = {0}, din = {0};
  ax_loss_result r;
  int err = ax_net_zero_grad(net);
  if (!err)
    err = ax_net_forward(net, slot, 1, 7, in, &out);
  if (!err)
    err = ax_loss_xent(&out, lab, info->ignore_index, NULL, 1.0f, &r, &dout);
  double t0 = ax_clock_s();
  if (!err)
    err = ax_net_backward(net, slot, 7, 0, &dout, &din);
  if (bwd_s)
    *bwd_s = ax_clock_s() - t0;
  if (!err && do_opt) /* the whole model: its tied copies summed */
    err = ax_model_tie_grads(info, 1, (int[]){0, info->n_blocks}, &net, NULL);
  if (!err && do_opt)
    err = ax_optim_step(opt, net->params, net->grads);
  ax_tlist_clear(&out);
  ax_tlist_clear(&dout);
  ax_tlist_clear(&din);
  ax_slot_free(slot);
  return err;
}

/* Forward through nst stages under a new context, the backward (timed in
 * *bwd_s), the optimizer step when opt != NULL, the release. */
static int dist_step(ax_rref **st, int nst, ax_dist_optim *opt,
                     const ax_tlist *in, const ax_tlist *lab, double *bwd_s) {
  uint64_t ctx;
  ax_rref *y[NAG] = {0};
  CK(ax_dist_context_new(g_drv, &ctx));
  int err = AX_OK;
  for (int k = 0; k < nst && !err; k++) {
    ax_values *a = ax_values_new();
    ax_values_add_i64(a, 7);
    ax_values_add_i64(a, k == nst - 1 ? lab->n : 0);
    if (k == 0)
      ax_values_add_tensor(a, in->t[0]);
    else
      ax_values_add_rref(a, y[k - 1]);
    if (k == nst - 1)
      ax_values_add_tensor(a, lab->t[0]);
    err = ax_rmod_forward_remote(g_drv, st[k], a, &y[k]);
    ax_values_free(a);
  }
  double t0 = ax_clock_s();
  if (!err)
    err = ax_dist_backward_rrefs(g_drv, ctx, &y[nst - 1], 1, 60000);
  if (bwd_s)
    *bwd_s = ax_clock_s() - t0;
  if (!err && opt)
    err = ax_dist_optim_step(opt, ctx, 60000);
  int e2 = ax_dist_context_release(g_drv, ctx, 10000);
  for (int k = 0; k < nst; k++)
    ax_rref_release(y[k]);
  CK(err);
  return e2;
}

/* Stages [bounds] of `model` on the agents (nst of them, from w1). */
static int make_stages(const char *kind, const char *mconf, const int *bounds,
                       int nst, ax_rref **st) {
  for (int k = 0; k < nst; k++) {
    char cfg[512], splits[64];
    int o = 0;
    for (int i = 0; i <= nst; i++)
      o += snprintf(splits + o, sizeof splits - (size_t)o, "%s%d", i ? "/" : "",
                    bounds[i]);
    snprintf(cfg, sizeof cfg, "stage=%d,splits=%s,seed=3,%s", k, splits, mconf);
    CK(ax_remote_module(g_drv, g_names[k], kind, cfg, AX_CPU, &st[k]));
  }
  return AX_OK;
}

static int bench_model(const char *model, const char *mconf, int batch,
                       int steps, int warmup, double *dist_ms,
                       double *local_ms) {
  const ax_model_def *def = ax_model_find(model);
  ax_config mcfg, ocfg;
  ax_model_info info;
  ax_optim_cfg oc;
  char kind[64];
  int b[NAG + 1];
  snprintf(kind, sizeof kind, "%s.stage", model);
  CK(def ? AX_OK : AX_ENOTFOUND);
  CK(ax_model_config(def, mconf, &mcfg));
  CK(ax_model_describe(def, &mcfg, &info));
  CK(ax_split_uniform(info.n_blocks, NAG, b));
  ax_rref *st[NAG], *par[NAG];
  ax_dist_optim *dopt;
  CK(make_stages(kind, mconf, b, NAG, st));
  for (int k = 0; k < NAG; k++)
    CK(ax_rmod_parameters(g_drv, st[k], &par[k]));
  CK(ax_dist_optim_new(g_drv, par, NAG, g_optim, &dopt));
  ax_net *net;
  CK(ax_model_stage(def, &mcfg, 0, info.n_blocks, AX_CPU, 3, &net));
  CK(ax_config_parse(&ocfg, g_optim));
  CK(ax_optim_cfg_parse(&ocfg, &oc));
  ax_optim *lopt = ax_optim_new(&oc, net->n_params, AX_CPU);
  ax_tlist in = {0}, lab = {0};
  CK(make_batch(model, &mcfg, batch, &in, &lab));
  double *td = calloc((size_t)steps, sizeof *td);
  double *tl = calloc((size_t)steps, sizeof *tl);
  for (int s = -warmup; s < steps; s++) { /* alternate: same load for both */
    double t0 = ax_clock_s();
    CK(dist_step(st, NAG, dopt, &in, &lab, NULL));
    double t1 = ax_clock_s();
    CK(local_step(net, lopt, &in, &lab, &info, 1, NULL));
    double t2 = ax_clock_s();
    if (s >= 0) {
      td[s] = t1 - t0;
      tl[s] = t2 - t1;
    }
  }
  *dist_ms = 1e3 * axi_bench_median(td, steps);
  *local_ms = 1e3 * axi_bench_median(tl, steps);
  free(td);
  free(tl);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lab);
  ax_optim_free(lopt);
  ax_net_free(net);
  ax_dist_optim_free(dopt);
  for (int k = 0; k < NAG; k++) {
    ax_rref_release(par[k]);
    ax_rref_release(st[k]);
  }
  return AX_OK;
}

/* Median backward time (µs) of the tiny MLP over 3 stages and 1 stage, and
 * of the one-process backward. */
static int bench_edge(int iters, double *us3, double *us1, double *us_local) {
  const char *mconf = "widths=4/4/4/4";
  const ax_model_def *def = ax_model_find("mlp");
  ax_config mcfg;
  CK(ax_model_config(def, mconf, &mcfg));
  int b3[4] = {0, 1, 2, 3}, b1[2] = {0, 3};
  ax_model_info info;
  CK(ax_model_describe(def, &mcfg, &info));
  ax_rref *s3[NAG], *s1[1];
  CK(make_stages("mlp.stage", mconf, b3, 3, s3));
  CK(make_stages("mlp.stage", mconf, b1, 1, s1));
  ax_net *net;
  CK(ax_model_stage(def, &mcfg, 0, 3, AX_CPU, 3, &net));
  ax_tlist in = {0}, lab = {0};
  CK(make_batch("mlp", &mcfg, 1, &in, &lab));
  double *a = calloc((size_t)iters, sizeof *a),
         *c = calloc((size_t)iters, sizeof *c);
  double *l = calloc((size_t)iters, sizeof *l);
  for (int i = -iters / 10; i < iters; i++) { /* interleaved */
    double x, y, z;
    CK(dist_step(s3, 3, NULL, &in, &lab, &x));
    CK(dist_step(s1, 1, NULL, &in, &lab, &y));
    CK(local_step(net, NULL, &in, &lab, &info, 0, &z));
    if (i >= 0) {
      a[i] = x;
      c[i] = y;
      l[i] = z;
    }
  }
  *us3 = 1e6 * axi_bench_median(a, iters);
  *us1 = 1e6 * axi_bench_median(c, iters);
  *us_local = 1e6 * axi_bench_median(l, iters);
  free(a);
  free(c);
  free(l);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lab);
  ax_net_free(net);
  for (int k = 0; k < NAG; k++)
    ax_rref_release(s3[k]);
  ax_rref_release(s1[0]);
  return AX_OK;
}

int ax_bench_dist_main(int argc, char **argv) {
  int steps = 10, warmup = 2, threads = 1, athreads = 2, iters = 200;
  const char *only = NULL;
  static const struct option opts[] = {
      {"steps", 1, 0, 's'},      {"warmup", 1, 0, 'w'},
      {"threads", 1, 0, 't'},    {"agent-threads", 1, 0, 'a'},
      {"edge-iters", 1, 0, 'e'}, {"only", 1, 0, 'o'},
      {"help", 0, 0, 'h'},       {0, 0, 0, 0}};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 's':
      steps = atoi(optarg);
      break;
    case 'w':
      warmup = atoi(optarg);
      break;
    case 't':
      threads = atoi(optarg);
      break;
    case 'a':
      athreads = atoi(optarg);
      break;
    case 'e':
      iters = atoi(optarg);
      break;
    case 'o':
      only = optarg;
      break;
    case 'h':
      printf(
          "usage: axon-bench dist [--steps N] [--warmup N] [--threads N] "
          "[--agent-threads N] [--edge-iters N] [--only mlp|resnet20|edge]\n");
      return 0;
    default:
      return 2;
    }
  }
  if (steps < 1 || iters < 1)
    return 2;
  int port = ax_local_free_port();
  pid_t pids[NAG];
  char th[16], at[16];
  snprintf(th, sizeof th, "%d", threads);
  snprintf(at, sizeof at, "%d", athreads);
  const char *args[] = {"--threads", at, NULL};
  for (int i = 0; i < NAG; i++) /* before gRPC starts in this process */
    pids[i] =
        axi_bench_spawn_agent(g_names[i], port, "AXON_THREADS", th, 1, args);
  ax_cpu_set_threads(threads);
  int err = axi_bench_master("driver", port, NAG + 1, &g_drv);
  if (err)
    fprintf(stderr, "axon-bench dist: driver: %s: %s\n", ax_strerror(err),
            ax_errmsg());
  printf("# axon dist: 3 agents, %d compute thread(s) per process, %d handler "
         "threads per agent, %s; medians of %d steps\n",
         threads, athreads, g_optim, steps);
  double d, l;
  if (!err && (!only || !strcmp(only, "mlp")) &&
      !(err = bench_model("mlp", "widths=784/256/128/10", 64, steps, warmup, &d,
                          &l)))
    printf("%-28s %10.2f ms dist  %10.2f ms local  x%.2f\n",
           "mlp 784/256/128/10 b64", d, l, d / l);
  if (!err && (!only || !strcmp(only, "resnet20")) &&
      !(err = bench_model("resnet20", "in_channels=1,image=32", 32, steps,
                          warmup, &d, &l)))
    printf("%-28s %10.2f ms dist  %10.2f ms local  x%.2f\n",
           "resnet20 1x32x32 b32", d, l, d / l);
  double u3, u1, ul;
  if (!err && (!only || !strcmp(only, "edge")) &&
      !(err = bench_edge(iters, &u3, &u1, &ul)))
    printf("%-28s %10.1f us 3-stage bwd  %8.1f us 1-stage bwd  %8.1f us "
           "per edge  (local bwd %.1f us)\n",
           "edge mlp 4/4/4/4 b1", u3, u1, (u3 - u1) / 2, ul);
  fflush(stdout);
  if (g_drv) { /* the agents leave when told to; signals as the fallback */
    ax_local_end_world(g_drv, NAG, pids, 10000, NULL, "axon-bench dist");
    ax_node_shutdown(g_drv, 5000);
  }
  ax_local_stop(NAG, pids, 10000, NULL);
  if (g_drv) {
    ax_dist_fini(g_drv);
    ax_node_destroy(g_drv);
  }
  return err ? 1 : 0;
}
