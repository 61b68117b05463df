/* axon-bench split: the cost of running a backward as its two halves.
 *
 *   axon-bench split --model resnet20|bert|mlp [--batch N] [--reps N]
 *                    [--threads N] [--device DEV] [--model-config K=V,..]
 *
 * Every block of the model is built as its own net and fed the previous
 * block's output (synthetic inputs for block 0). For each block, reps
 * times: a training forward (not timed) then the fused backward
 * (ax_backward), and a training forward then the input half
 * (ax_backward_input) and the weight half (ax_backward_weight), each
 * timed; the two orders alternate. Prints per block the median fused, B
 * and W times (a loaded host gives outliers) and (B + W) / fused, then the
 * model's totals (sums of the blocks' medians). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/models/model.h"

typedef struct split_opts {
  const char *model, *mconf;
  int batch, reps, threads;
  ax_device dev;
} split_opts;

/* Synthetic block-0 inputs of the model's shape on dev. */
static int first_inputs(const split_opts *o, const ax_config *cfg,
                        ax_tlist *in) {
  ax_rng r;
  ax_rng_seed(&r, 12345);
  int err = AX_OK, B = o->batch;
  ax_tensor *h[3] = {0};
  if (strcmp(o->model, "bert") == 0) {
    int seq = (int)ax_config_int(cfg, "seq", 128, &err);
    int vocab = (int)ax_config_int(cfg, "vocab", 8192, &err);
    int64_t bs[2] = {B, seq};
    in->n = 3;
    for (int i = 0; i < 2; i++)
      if ((h[i] = ax_tensor_new(AX_I32, 2, bs, AX_CPU)))
        for (size_t j = 0; j < ax_tensor_numel(h[i]); j++)
          ax_i32(h[i])[j] = (int32_t)ax_rng_below(&r, i ? 2 : (uint64_t)vocab);
    if ((h[2] = ax_tensor_new(AX_F32, 2, bs, AX_CPU)))
      ax_tensor_fill(h[2], 1.0f);
  } else {
    int64_t s[4] = {B, 0, 0, 0}, w[32];
    int nd = 2;
    if (strcmp(o->model, "resnet20") == 0) {
      s[1] = ax_config_int(cfg, "in_channels", 1, &err);
      s[2] = s[3] = ax_config_int(cfg, "image", 32, &err);
      nd = 4;
    } else if (ax_config_ints(cfg, "widths", w, 32, &err) >= 1) {
      s[1] = w[0];
    }
    in->n = 1;
    if ((h[0] = ax_tensor_new(AX_F32, nd, s, AX_CPU)))
      for (size_t j = 0; j < ax_tensor_numel(h[0]); j++)
        ax_f32(h[0])[j] = (float)ax_rng_normal(&r);
  }
  int rc = err;
  for (int i = 0; i < in->n; i++) {
    if (rc == AX_OK && !h[i])
      rc = ax_seterr(AX_ENOMEM, "bench split: no memory for inputs");
    if (rc == AX_OK && !(in->t[i] = ax_tensor_to(h[i], o->dev)))
      rc = ax_seterr(AX_ENOMEM, "bench split: cannot move inputs");
    ax_tensor_release(h[i]);
  }
  return rc;
}

/* Output gradients of ones for the f32 outputs of `out`, on their device. */
static int ones_like(const ax_tlist *out, ax_tlist *dout) {
  dout->n = out->n;
  for (int i = 0; i < out->n; i++) {
    ax_tensor *t = out->t[i];
    dout->t[i] = NULL;
    if (!t || t->dtype != AX_F32)
      continue;
    if (!(dout->t[i] = ax_tensor_like(t)))
      return AX_ENOMEM;
    AX_TRY(ax_tensor_fill(dout->t[i], 1.0f / (float)ax_tensor_numel(t)));
  }
  return AX_OK;
}

/* The median of n values (sorts v). */
static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Times one block: med[0] fused, med[1] input half, med[2] weight half
 * (median seconds over reps). *out receives the block's output for the
 * next block. */
static int time_block(const split_opts *o, ax_net *net, const ax_tlist *in,
                      ax_tlist *out, double med[3]) {
  double *t[3] = {0};
  for (int i = 0; i < 3; i++)
    if (!(t[i] = calloc((size_t)o->reps, sizeof(double)))) {
      for (int j = 0; j < i; j++)
        free(t[j]);
      return ax_seterr(AX_ENOMEM, "bench split: no memory");
    }
  ax_exec ex = ax_net_exec(net, 1);
  ex.update_stats = 0;
  ex.need_dx = 1;
  ax_slot *slot = ax_slot_new();
  ax_tlist dout = {0}, din = {0};
  int rc = slot ? ax_forward(net->root, &ex, slot, in, out) : AX_ENOMEM;
  if (rc == AX_OK)
    rc = ones_like(out, &dout);
  if (rc == AX_OK)
    rc = ax_backward(net->root, &ex, slot, &dout, &din); /* warm-up */
  ax_tlist_clear(&din);
  for (int r = 0; rc == AX_OK && r < 2 * o->reps; r++) {
    int split = (r & 1) ^ ((r >> 1) & 1); /* fused/split, split/fused, ... */
    ax_tlist y = {0};
    rc = ax_forward(net->root, &ex, slot, in, &y);
    ax_tlist_clear(&y);
    if (rc == AX_OK)
      rc = ax_device_synchronize(o->dev);
    double t0 = ax_clock_s(), t1 = t0;
    if (rc == AX_OK && !split)
      rc = ax_backward(net->root, &ex, slot, &dout, &din);
    if (rc == AX_OK && split) {
      rc = ax_backward_input(net->root, &ex, slot, &dout, &din);
      if (rc == AX_OK)
        rc = ax_device_synchronize(o->dev);
      t1 = ax_clock_s();
      if (rc == AX_OK)
        rc = ax_backward_weight(net->root, &ex, slot);
    }
    if (rc == AX_OK)
      rc = ax_device_synchronize(o->dev);
    double t2 = ax_clock_s();
    if (split) {
      t[1][r / 2] = t1 - t0;
      t[2][r / 2] = t2 - t1;
    } else {
      t[0][r / 2] = t2 - t0;
    }
    ax_tlist_clear(&din);
  }
  ax_tlist_clear(&dout);
  ax_slot_free(slot);
  for (int i = 0; i < 3; i++) {
    med[i] = median(t[i], o->reps);
    free(t[i]);
  }
  return rc;
}

static int run(const split_opts *o) {
  const ax_model_def *def = ax_model_find(o->model);
  ax_config cfg;
  ax_model_info info;
  if (!def)
    return AX_EINVAL;
  AX_TRY(ax_model_config(def, o->mconf, &cfg));
  AX_TRY(ax_model_describe(def, &cfg, &info));
  ax_tlist cur = {0};
  AX_TRY(first_inputs(o, &cfg, &cur));
  double total[3] = {0};
  int rc = AX_OK;
  for (int b = 0; rc == AX_OK && b < info.n_blocks; b++) {
    ax_net *net = NULL;
    ax_tlist out = {0};
    double t[3] = {0};
    rc = ax_model_stage(def, &cfg, b, b + 1, o->dev, 1, &net);
    if (rc == AX_OK)
      rc = time_block(o, net, &cur, &out, t);
    ax_net_free(net);
    ax_tlist_clear(&cur);
    cur = out;
    if (rc != AX_OK)
      break;
    for (int i = 0; i < 3; i++)
      total[i] += t[i];
    printf("bench split: block=%s fused_ms=%.3f b_ms=%.3f w_ms=%.3f "
           "ratio=%.3f\n",
           info.block_names[b], 1e3 * t[0], 1e3 * t[1], 1e3 * t[2],
           (t[1] + t[2]) / t[0]);
  }
  ax_tlist_clear(&cur);
  if (rc == AX_OK)
    printf("bench split: model=%s batch=%d threads=%d reps=%d "
           "fused_ms=%.3f b_ms=%.3f w_ms=%.3f ratio=%.3f\n",
           o->model, o->batch, ax_cpu_threads(), o->reps, 1e3 * total[0],
           1e3 * total[1], 1e3 * total[2], (total[1] + total[2]) / total[0]);
  return rc;
}

int ax_bench_split_main(int argc, char **argv) {
  split_opts o = {"resnet20", NULL, 0, 10, 0, AX_CPU};
  static const struct option opts[] = {
      {"model", 1, 0, 'm'},   {"model-config", 1, 0, 'M'},
      {"batch", 1, 0, 'b'},   {"reps", 1, 0, 'r'},
      {"threads", 1, 0, 't'}, {"device", 1, 0, 'v'},
      {"help", 0, 0, 'h'},    {0, 0, 0, 0}};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'm':
      o.model = optarg;
      break;
    case 'M':
      o.mconf = optarg;
      break;
    case 'b':
      o.batch = atoi(optarg);
      break;
    case 'r':
      o.reps = atoi(optarg);
      break;
    case 't':
      o.threads = atoi(optarg);
      break;
    case 'v':
      if (ax_device_parse(optarg, &o.dev) != AX_OK) {
        fprintf(stderr, "axon-bench split: %s\n", ax_errmsg());
        return 2;
      }
      break;
    case 'h':
      printf("usage: axon-bench split --model resnet20|bert|mlp [--batch N] "
             "[--reps N] [--threads N] [--device DEV] "
             "[--model-config K=V,..]\n");
      return 0;
    default:
      return 2;
    }
  }
  if (o.reps <= 0) {
    fprintf(stderr, "axon-bench split: --reps must be positive\n");
    return 2;
  }
  if (o.batch <= 0)
    o.batch = strcmp(o.model, "bert") == 0 ? 8 : 128;
  ax_cpu_set_threads(o.threads);
  int rc = run(&o);
  if (rc != AX_OK) {
    fprintf(stderr, "axon-bench split: %s: %s\n", ax_strerror(rc), ax_errmsg());
    return 1;
  }
  return 0;
}
