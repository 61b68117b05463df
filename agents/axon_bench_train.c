/* axon-bench train: full training steps of one model in one process.
 *
 *   axon-bench train --model resnet20|bert|gpt|mlp [--batch N] [--steps N]
 *                    [--warmup N] [--threads N] [--device DEV]
 *                    [--model-config K=V,..] [--seq N]
 *                    [--precision fp32|bf16] [--peak | --peak-gflops G]
 *
 * Times `steps` training steps (forward, loss, backward, the tied
 * parameters' gradients summed, SGD with momentum) after `warmup` untimed
 * ones, on one synthetic batch of the model's shape, in the net's precision
 * (--precision; bf16 is mixed precision, models/module.h), and prints one
 * line: step_ms, the process's CPU seconds per step (all threads),
 * samples/s, tokens/s for BERT and GPT, and the process's peak resident
 * memory (getrusage's ru_maxrss, as scripts/torch_train_bench.py reports
 * PyTorch's). For GPT it also prints the GEMM FLOPs of a step
 * (agents/axon_bench_flops.c derives them) and the GFLOP/s they make over
 * the measured step, from the wall clock and from the CPU time per thread
 * (which a loaded machine's preemption does not inflate, though threads
 * spinning at a barrier for a preempted one count); with the CPU's
 * multiply-add peak, measured here with --peak (axon-bench peak's loop of
 * the run's arithmetic, fp32 FMA or bf16 dot products, on the same
 * threads, before the steps) or given with --peak-gflops, the share of
 * that peak. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "agents/axon_bench_flops.h"
#include "agents/axon_bench_peak.h"
#include "axon/kernels/clock.h"
#include "axon/models/gpt-impl.h"
#include "axon/models/loss.h"
#include "axon/models/model.h"
#include "axon/models/optim.h"

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
  } else if (strcmp(model, "gpt") == 0) {
    axi_gpt_sizes g;
    AX_TRY(axi_gpt_sizes_of(cfg, &g));
    int64_t bs[2] = {batch, g.seq}, flat = (int64_t)batch * g.seq;
    in->n = 1;
    in->t[0] = rand_i32(&r, 2, bs, 0, g.vocab);
    lab->n = 1;
    lab->t[0] = rand_i32(&r, 1, &flat, 0, g.vocab);
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

/* The seconds of CPU time this process has used, all threads. */
static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The seconds of the timed steps: wall clock, and the process's CPU time
 * (every thread's; time others ran on the cores does not count). */
typedef struct step_time {
  double wall, cpu;
} step_time;

/* Runs warmup + steps training steps of net on the batch (in, lab) on
 * dev; *dt gets the seconds of the last `steps`. */
static int time_steps(ax_net *net, ax_optim *opt, ax_tlist *in,
                      const ax_tlist *lab, const ax_model_info *info,
                      ax_device dev, int warmup, int steps, step_time *dt) {
  ax_slot *slot = ax_slot_new();
  ax_tlist din = {0};
  double t0 = 0.0, c0 = 0.0;
  int rc = AX_OK;
  for (int s = 0; rc == AX_OK && s < warmup + steps; s++) {
    if (s == warmup) {
      t0 = ax_clock_s();
      c0 = cpu_seconds();
    }
    ax_tlist dout = {0};
    ax_loss_result res;
    ax_exec ex = ax_net_exec(net, 1);
    ex.seed = (uint64_t)s;
    rc = ax_net_zero_grad(net);
    if (rc == AX_OK)
      rc = ax_forward_xent(net->root, &ex, slot, in, lab, info->ignore_index,
                           NULL, 1.0f, &res, &dout);
    if (rc == AX_OK)
      rc = ax_net_backward(net, slot, (uint64_t)s, 0, &dout, &din);
    if (rc == AX_OK)
      rc = ax_model_tie_grads(info, 1, (int[]){0, info->n_blocks}, &net, NULL);
    if (rc == AX_OK)
      rc = ax_optim_step(opt, net->params, net->grads);
    if (rc == AX_OK)
      rc = ax_device_synchronize(dev);
    ax_tlist_clear(&dout);
    ax_tlist_clear(&din);
    ax_slot_reset(slot);
  }
  dt->wall = ax_clock_s() - t0;
  dt->cpu = cpu_seconds() - c0;
  ax_slot_free(slot);
  return rc;
}

/* The options of `train`. */
typedef struct train_args {
  const char *model, *mconf;
  int batch, steps, warmup, threads, seq;
  ax_device dev;
  int precision;      /* ax_precision (models/module.h) */
  int peak;           /* --peak: measure the peak here */
  double peak_gflops; /* --peak-gflops: the peak given */
} train_args;

/* Parses train's options into t: -1, or the exit status. */
static int parse_train(int argc, char **argv, train_args *t) {
  *t = (train_args){.model = "resnet20",
                    .steps = 10,
                    .warmup = 2,
                    .dev = AX_CPU,
                    .precision = AX_PREC_FP32};
  static const struct option opts[] = {{"model", 1, 0, 'm'},
                                       {"model-config", 1, 0, 'M'},
                                       {"batch", 1, 0, 'b'},
                                       {"steps", 1, 0, 's'},
                                       {"warmup", 1, 0, 'w'},
                                       {"threads", 1, 0, 't'},
                                       {"device", 1, 0, 'v'},
                                       {"seq", 1, 0, 'q'},
                                       {"precision", 1, 0, 'p'},
                                       {"peak", 0, 0, 'k'},
                                       {"peak-gflops", 1, 0, 'G'},
                                       {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
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
    case 'p':
      if (ax_precision_parse(optarg, &t->precision) != AX_OK) {
        fprintf(stderr, "axon-bench: --precision: %s\n", ax_errmsg());
        return 2;
      }
      break;
    case 'k':
      t->peak = 1;
      break;
    case 'G':
      t->peak_gflops = atof(optarg);
      break;
    case 'v':
      if (ax_device_parse(optarg, &t->dev) != AX_OK) {
        fprintf(stderr, "axon-bench: %s\n", ax_errmsg());
        return 2;
      }
      break;
    case 'h':
      printf("usage: axon-bench train --model resnet20|bert|gpt|mlp "
             "[--batch N] [--steps N] [--warmup N] [--threads N] "
             "[--device DEV] [--seq N] [--model-config K=V,..] "
             "[--precision fp32|bf16] [--peak | --peak-gflops G]\n"
             "  --seq N          bert, gpt: the sequence length\n"
             "  --precision P    fp32 (default) or bf16 mixed precision\n"
             "  --peak           measure the CPU's multiply-add peak of the "
             "precision on the\n                   same threads (axon-bench "
             "peak) and print the share of it\n                   the GEMMs "
             "reach\n"
             "  --peak-gflops G  the same share of a peak of G GFLOP/s\n");
      return 0;
    default:
      return 2;
    }
  }
  return -1;
}

/* The sequence length of a batch of model under cfg, or 0 when its
 * examples are no sequences. */
static int seq_of(const char *model, const ax_config *cfg) {
  axi_gpt_sizes g;
  if (strcmp(model, "gpt") == 0)
    return axi_gpt_sizes_of(cfg, &g) == AX_OK ? g.seq : 0;
  if (strcmp(model, "bert") == 0)
    return (int)ax_config_int(cfg, "seq", 128, NULL);
  return 0;
}

/* The peak of t's options: given (the same figure for wall and CPU time),
 * measured on the bench's threads for its precision's arithmetic, or 0 for
 * none. */
static axi_peak peak_of(const train_args *t) {
  axi_peak p = {t->peak_gflops, t->peak_gflops};
  if (t->peak_gflops > 0.0 || !t->peak)
    return p;
  int kind = t->precision == AX_PREC_BF16 ? AXI_PEAK_BF16 : AXI_PEAK_FP32;
  if (axi_bench_peak(kind, ax_cpu_threads(), 3, &p) != AX_OK) {
    fprintf(stderr, "axon-bench: no peak: %s\n", ax_errmsg());
    p = (axi_peak){0.0, 0.0};
  }
  return p;
}

/* Prints the line of a timed run (train's header comment). */
static void report(const train_args *t, const ax_config *cfg, const ax_net *net,
                   const ax_model_info *info, int batch, step_time dt,
                   axi_peak peak) {
  double sps = (double)t->steps * batch / dt.wall;
  char dname[16];
  /* params: each tied parameter once; stored: the floats the net holds */
  printf("bench train: model=%s batch=%d threads=%d device=%s params=%zu "
         "stored_params=%zu precision=%s step_ms=%.2f samples_per_s=%.2f",
         t->model, batch, ax_cpu_threads(),
         ax_device_str(t->dev, dname, sizeof dname),
         net->n_params - ax_model_tied_floats(info, 0, info->n_blocks),
         net->n_params, ax_precision_name(t->precision),
         1000.0 * dt.wall / t->steps, sps);
  printf(" cpu_s_per_step=%.3f", dt.cpu / t->steps);
  int seq = seq_of(t->model, cfg);
  if (seq > 0)
    printf(" tokens_per_s=%.1f", sps * seq);
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) == 0)
    printf(" peak_rss_mb=%.0f", (double)ru.ru_maxrss / 1024.0);
  double flops = axi_bench_train_flops(t->model, cfg, batch);
  if (flops > 0.0) {
    /* CPU-time GFLOP/s: over the CPU time per thread, as axon-bench peak's
     * cpu_gflops (spinning threads count, preemption does not) */
    double gflops = flops * t->steps / dt.wall / 1e9;
    double cpu = flops * t->steps / (dt.cpu / ax_cpu_threads()) / 1e9;
    printf(" gemm_gflop_per_step=%.2f gflops=%.1f cpu_gflops=%.1f", flops / 1e9,
           gflops, cpu);
    if (peak.gflops > 0.0)
      printf(" peak_gflops=%.1f share_of_peak=%.3f peak_cpu_gflops=%.1f "
             "cpu_share_of_peak=%.3f",
             peak.gflops, gflops / peak.gflops, peak.cpu_gflops,
             cpu / peak.cpu_gflops);
  }
  printf("\n");
}

int ax_bench_train_main(int argc, char **argv) {
  train_args t;
  int rc = parse_train(argc, argv, &t);
  if (rc >= 0)
    return rc;
  const char *model = t.model, *mconf = t.mconf;
  ax_cpu_set_threads(t.threads);
  const ax_model_def *def = ax_model_find(model);
  ax_config cfg;
  char over[256] = "";
  if (def && (!strcmp(model, "bert") || !strcmp(model, "gpt")) && t.seq > 0)
    snprintf(over, sizeof over, "seq=%d%s%s", t.seq, mconf ? "," : "",
             mconf ? mconf : "");
  else if (mconf)
    snprintf(over, sizeof over, "%s", mconf);
  if (!def || ax_model_config(def, over, &cfg) != AX_OK) {
    fprintf(stderr, "axon-bench: %s\n", ax_errmsg());
    return 2;
  }
  int batch = t.batch > 0 ? t.batch : seq_of(model, &cfg) > 0 ? 8 : 128;
  axi_peak peak = peak_of(&t);
  ax_model_info info;
  ax_net *net = NULL;
  ax_tlist in = {0}, lab = {0};
  rc = ax_model_describe(def, &cfg, &info);
  if (rc == AX_OK)
    rc = ax_model_stage(def, &cfg, 0, info.n_blocks, t.dev, 1, &net);
  if (rc == AX_OK)
    net->precision = t.precision;
  if (rc == AX_OK)
    rc = make_batch(model, &cfg, batch, &in, &lab);
  for (int i = 0; rc == AX_OK && i < in.n; i++) {
    ax_tensor *d = ax_tensor_to(in.t[i], t.dev);
    ax_tensor_release(in.t[i]);
    in.t[i] = d;
  }
  ax_optim_cfg ocfg = ax_optim_defaults(AX_OPT_SGD);
  ocfg.lr = 1e-4f;
  ocfg.momentum = 0.9f;
  ax_optim *opt = net ? ax_optim_new(&ocfg, net->n_params, t.dev) : NULL;
  step_time dt = {0.0, 0.0};
  if (rc == AX_OK)
    rc = time_steps(net, opt, &in, &lab, &info, t.dev, t.warmup, t.steps, &dt);
  if (rc == AX_OK)
    report(&t, &cfg, net, &info, batch, dt, peak);
  else
    fprintf(stderr, "axon-bench: %s: %s\n", ax_strerror(rc), ax_errmsg());
  ax_optim_free(opt);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lab);
  ax_net_free(net);
  return rc == AX_OK ? 0 : 1;
}
