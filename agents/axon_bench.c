/* axon-bench: measurements that are not tests.
 *
 *   axon-bench train --model resnet20|bert|mlp [--batch N] [--steps N]
 *                    [--warmup N] [--threads N] [--device DEV]
 *                    [--model-config K=V,..] [--seq N]
 *   axon-bench rpc ...   (see axon-bench rpc --help)
 *   axon-bench dist ...  (see axon-bench dist --help)
 *   axon-bench pipe ...  (see axon-bench pipe --help)
 *   axon-bench gemm ...  (see axon-bench gemm --help)
 *   axon-bench split ... (see axon-bench split --help)
 *   axon-bench join ...  (see axon-bench join --help)
 *
 * `train` times full training steps (forward, loss, backward, SGD update)
 * on synthetic inputs of the model's shape and prints samples/s (and
 * tokens/s for BERT). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "axon/models/loss.h"
#include "axon/models/model.h"
#include "axon/models/optim.h"

/* Provided by agents/axon_bench_rpc.c when the RPC layer is built. */
__attribute__((weak)) int ax_bench_rpc_main(int argc, char **argv);
/* Provided by agents/axon_bench_dist.c (distributed autograd steps). */
__attribute__((weak)) int ax_bench_dist_main(int argc, char **argv);
/* Provided by agents/axon_bench_pipe.c (pipeline modes on synthetic stages). */
__attribute__((weak)) int ax_bench_pipe_main(int argc, char **argv);
/* Provided by agents/axon_bench_gemm.c (backend gemm against raw cuBLAS). */
__attribute__((weak)) int ax_bench_gemm_main(int argc, char **argv);
/* Provided by agents/axon_bench_split.c (split against fused backward). */
__attribute__((weak)) int ax_bench_split_main(int argc, char **argv);
/* Provided by agents/axon_bench_join.c (many idle agents on one host). */
__attribute__((weak)) int ax_bench_join_main(int argc, char **argv);

static ax_tensor *rand_f32(ax_rng *r, int ndim, const int64_t *shape) {
  ax_tensor *t = ax_tensor_new(AX_F32, ndim, shape, AX_CPU);
  for (size_t i = 0; t && i < ax_tensor_numel(t); i++)
    ax_f32(t)[i] = (float)ax_rng_normal(r);
  return t;
}

static ax_tensor *rand_i32(ax_rng *r, int ndim, const int64_t *shape, int lo,
                           int hi) {
  ax_tensor *t = ax_tensor_new(AX_I32, ndim, shape, AX_CPU);
  for (size_t i = 0; t && i < ax_tensor_numel(t); i++)
    ax_i32(t)[i] = lo + (int)ax_rng_below(r, (uint64_t)(hi - lo));
  return t;
}

/* Synthetic inputs and labels shaped for the model. */
static int make_batch(const char *model, const ax_config *cfg, int batch,
                      ax_tlist *in, ax_tlist *lab) {
  ax_rng r;
  ax_rng_seed(&r, 12345);
  int err = AX_OK;
  if (strcmp(model, "bert") == 0) {
    int seq = (int)ax_config_int(cfg, "seq", 128, &err);
    int vocab = (int)ax_config_int(cfg, "vocab", 8192, &err);
    int64_t bs[2] = {batch, seq}, flat = (int64_t)batch * seq, nb = batch;
    in->n = 3;
    in->t[0] = rand_i32(&r, 2, bs, 5, vocab);
    in->t[1] = rand_i32(&r, 2, bs, 0, 2);
    in->t[2] = ax_tensor_new(AX_F32, 2, bs, AX_CPU);
    ax_tensor_fill(in->t[2], 1.0f);
    lab->n = 2;
    lab->t[0] = rand_i32(&r, 1, &flat, 0, vocab);
    for (int64_t i = 0; i < flat; i++) /* 15% of positions are predicted */
      if (ax_rng_uniform(&r) >= 0.15)
        ax_i32(lab->t[0])[i] = -100;
    lab->t[1] = rand_i32(&r, 1, &nb, 0, 2);
  } else if (strcmp(model, "resnet20") == 0) {
    int ch = (int)ax_config_int(cfg, "in_channels", 1, &err);
    int64_t s[4] = {batch, ch, 32, 32}, nb = batch;
    in->n = 1;
    in->t[0] = rand_f32(&r, 4, s);
    lab->n = 1;
    lab->t[0] =
        rand_i32(&r, 1, &nb, 0, (int)ax_config_int(cfg, "classes", 10, &err));
  } else {
    int64_t w[32];
    int n = ax_config_ints(cfg, "widths", w, 32, &err);
    if (n < 2)
      return ax_seterr(AX_EINVAL, "bench: mlp needs widths");
    int64_t s[2] = {batch, w[0]}, nb = batch;
    in->n = 1;
    in->t[0] = rand_f32(&r, 2, s);
    lab->n = 1;
    lab->t[0] = rand_i32(&r, 1, &nb, 0, (int)w[n - 1]);
  }
  return err;
}

/* Runs warmup + steps training steps of net on the batch (in, lab) on
 * dev; *dt gets the seconds of the last `steps`. */
static int time_steps(ax_net *net, ax_optim *opt, ax_tlist *in,
                      const ax_tlist *lab, const ax_model_info *info,
                      ax_device dev, int warmup, int steps, double *dt) {
  ax_slot *slot = ax_slot_new();
  ax_tlist din = {0};
  double t0 = 0.0;
  int rc = AX_OK;
  for (int s = 0; rc == AX_OK && s < warmup + steps; s++) {
    if (s == warmup)
      t0 = ax_clock_s();
    ax_tlist out = {0}, dout = {0};
    ax_loss_result res;
    rc = ax_net_zero_grad(net);
    if (rc == AX_OK)
      rc = ax_net_forward(net, slot, 1, (uint64_t)s, in, &out);
    if (rc == AX_OK)
      rc = ax_loss_xent(&out, lab, info->ignore_index, NULL, 1.0f, &res, &dout);
    if (rc == AX_OK)
      rc = ax_net_backward(net, slot, (uint64_t)s, 0, &dout, &din);
    if (rc == AX_OK)
      rc = ax_model_tie_grads(info, 1, (int[]){0, info->n_blocks}, &net, NULL);
    if (rc == AX_OK)
      rc = ax_optim_step(opt, net->params, net->grads);
    if (rc == AX_OK)
      rc = ax_device_synchronize(dev);
    ax_tlist_clear(&out);
    ax_tlist_clear(&dout);
    ax_tlist_clear(&din);
    ax_slot_reset(slot);
  }
  *dt = ax_clock_s() - t0;
  ax_slot_free(slot);
  return rc;
}

/* The options of `train`. */
typedef struct train_args {
  const char *model, *mconf;
  int batch, steps, warmup, threads, seq;
  ax_device dev;
} train_args;

/* Parses train's options into t: -1, or the exit status. */
static int parse_train(int argc, char **argv, train_args *t) {
  *t = (train_args){"resnet20", NULL, 0, 10, 2, 0, 0, AX_CPU};
  static const struct option opts[] = {
      {"model", 1, 0, 'm'},  {"model-config", 1, 0, 'M'},
      {"batch", 1, 0, 'b'},  {"steps", 1, 0, 's'},
      {"warmup", 1, 0, 'w'}, {"threads", 1, 0, 't'},
      {"device", 1, 0, 'v'}, {"seq", 1, 0, 'q'},
      {"help", 0, 0, 'h'},   {0, 0, 0, 0}};
  int c;
  optind = 2;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'm':
      t->model = optarg;
      break;
    case 'M':
      t->mconf = optarg;
      break;
    case 'b':
      t->batch = atoi(optarg);
      break;
    case 's':
      t->steps = atoi(optarg);
      break;
    case 'w':
      t->warmup = atoi(optarg);
      break;
    case 't':
      t->threads = atoi(optarg);
      break;
    case 'q':
      t->seq = atoi(optarg);
      break;
    case 'v':
      if (ax_device_parse(optarg, &t->dev) != AX_OK) {
        fprintf(stderr, "axon-bench: %s\n", ax_errmsg());
        return 2;
      }
      break;
    case 'h':
      printf("usage: axon-bench train --model resnet20|bert|mlp [--batch N] "
             "[--steps N] [--warmup N] [--threads N] [--device DEV] "
             "[--seq N] [--model-config K=V,..]\n");
      return 0;
    default:
      return 2;
    }
  }
  return -1;
}

static int bench_train(int argc, char **argv) {
  train_args t;
  int rc = parse_train(argc, argv, &t);
  if (rc >= 0)
    return rc;
  const char *model = t.model, *mconf = t.mconf;
  int batch = t.batch, steps = t.steps, warmup = t.warmup, seq = t.seq;
  ax_device dev = t.dev;
  ax_cpu_set_threads(t.threads);
  const ax_model_def *def = ax_model_find(model);
  ax_config cfg;
  char over[256] = "";
  if (def && strcmp(model, "bert") == 0 && seq > 0)
    snprintf(over, sizeof over, "seq=%d%s%s", seq, mconf ? "," : "",
             mconf ? mconf : "");
  else if (mconf)
    snprintf(over, sizeof over, "%s", mconf);
  if (!def || ax_model_config(def, over, &cfg) != AX_OK) {
    fprintf(stderr, "axon-bench: %s\n", ax_errmsg());
    return 2;
  }
  if (batch <= 0)
    batch = strcmp(model, "bert") == 0 ? 8 : 128;
  ax_model_info info;
  ax_net *net = NULL;
  ax_tlist in = {0}, lab = {0};
  rc = ax_model_describe(def, &cfg, &info);
  if (rc == AX_OK)
    rc = ax_model_stage(def, &cfg, 0, info.n_blocks, dev, 1, &net);
  if (rc == AX_OK)
    rc = make_batch(model, &cfg, batch, &in, &lab);
  for (int i = 0; rc == AX_OK && i < in.n; i++) {
    ax_tensor *d = ax_tensor_to(in.t[i], dev);
    ax_tensor_release(in.t[i]);
    in.t[i] = d;
  }
  ax_optim_cfg ocfg = ax_optim_defaults(AX_OPT_SGD);
  ocfg.lr = 1e-4f;
  ocfg.momentum = 0.9f;
  ax_optim *opt = net ? ax_optim_new(&ocfg, net->n_params, dev) : NULL;
  double dt = 0;
  if (rc == AX_OK)
    rc = time_steps(net, opt, &in, &lab, &info, dev, warmup, steps, &dt);
  if (rc == AX_OK) {
    double sps = (double)steps * batch / dt;
    char dname[16];
    printf("bench train: model=%s batch=%d threads=%d device=%s params=%zu "
           "step_ms=%.2f samples_per_s=%.2f",
           model, batch, ax_cpu_threads(),
           ax_device_str(dev, dname, sizeof dname), net->n_params,
           1000.0 * dt / steps, sps);
    if (strcmp(model, "bert") == 0)
      printf(" tokens_per_s=%.1f",
             sps * (double)ax_config_int(&cfg, "seq", 128, NULL));
    printf("\n");
  } else {
    fprintf(stderr, "axon-bench: %s: %s\n", ax_strerror(rc), ax_errmsg());
  }
  ax_optim_free(opt);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lab);
  ax_net_free(net);
  return rc == AX_OK ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "train") == 0)
    return bench_train(argc, argv);
  if (argc >= 2 && strcmp(argv[1], "rpc") == 0) {
    if (!ax_bench_rpc_main) {
      fprintf(stderr, "axon-bench: built without the RPC benchmark\n");
      return 2;
    }
    return ax_bench_rpc_main(argc - 1, argv + 1);
  }
  if (argc >= 2 && strcmp(argv[1], "dist") == 0) {
    if (!ax_bench_dist_main) {
      fprintf(stderr, "axon-bench: built without the dist benchmark\n");
      return 2;
    }
    return ax_bench_dist_main(argc - 1, argv + 1);
  }
  if (argc >= 2 && strcmp(argv[1], "pipe") == 0) {
    if (!ax_bench_pipe_main) {
      fprintf(stderr, "axon-bench: built without the pipe benchmark\n");
      return 2;
    }
    return ax_bench_pipe_main(argc - 1, argv + 1);
  }
  if (argc >= 2 && strcmp(argv[1], "gemm") == 0) {
    if (!ax_bench_gemm_main) {
      fprintf(stderr, "axon-bench: built without the gemm benchmark\n");
      return 2;
    }
    return ax_bench_gemm_main(argc - 1, argv + 1);
  }
  if (argc >= 2 && strcmp(argv[1], "split") == 0 && ax_bench_split_main)
    return ax_bench_split_main(argc - 1, argv + 1);
  if (argc >= 2 && strcmp(argv[1], "join") == 0 && ax_bench_join_main)
    return ax_bench_join_main(argc - 1, argv + 1);
  fprintf(argc >= 2 && strcmp(argv[1], "--help") == 0 ? stdout : stderr,
          "usage: axon-bench train|rpc|dist|pipe|gemm|split|join [options]  "
          "(--help after the command "
          "for its options)\n");
  return argc >= 2 && strcmp(argv[1], "--help") == 0 ? 0 : 2;
}
