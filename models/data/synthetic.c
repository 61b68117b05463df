/* "synthetic": standard-normal inputs of a configured shape and uniform
 * labels, generated on demand. Example i of a split is drawn from its own
 * stream (seed, split, i), so a batch does not depend on which other
 * examples are in it or in what order they are asked for. */
#include <stdlib.h>

#include "axon/models/data/dataset-impl.h"

typedef struct synth {
  int ndim; /* dims per example: 1 (D) or 3 (C, H, W) */
  int64_t dims[3];
  size_t numel; /* floats per example */
  uint64_t seed;
} synth;

static void synth_close(ax_dataset *ds) {
  free(ds->priv);
  ds->priv = NULL;
}

static int synth_open(ax_dataset *ds, const ax_config *cfg, int split) {
  int err = AX_OK;
  int64_t dims[4];
  int nd = ax_config_ints(cfg, "shape", dims, 4, &err);
  int64_t classes = ax_config_int(cfg, "classes", 10, &err);
  int64_t examples = ax_config_int(cfg, "examples", 1024, &err);
  int64_t seed = ax_config_int(cfg, "seed", 0, &err);
  if (err != AX_OK)
    return err;
  if (nd == 0) { /* default: 1x28x28, like Fashion-MNIST */
    nd = 3;
    dims[0] = 1, dims[1] = 28, dims[2] = 28;
  }
  if (nd != 1 && nd != 3)
    return ax_seterr(AX_EINVAL,
                     "synthetic: shape needs C/H/W or D, got %d "
                     "entries",
                     nd);
  size_t numel = 1;
  for (int i = 0; i < nd; i++) {
    if (dims[i] <= 0 || dims[i] > (1 << 24))
      return ax_seterr(AX_EINVAL, "synthetic: bad shape entry %lld",
                       (long long)dims[i]);
    numel *= (size_t)dims[i];
  }
  if (classes < 1 || classes > (1 << 24) || examples < 1)
    return ax_seterr(AX_EINVAL,
                     "synthetic: classes=%lld, examples=%lld "
                     "must be positive",
                     (long long)classes, (long long)examples);
  synth *s = calloc(1, sizeof *s);
  if (!s)
    return ax_seterr(AX_ENOMEM, "synthetic: out of memory");
  s->ndim = nd;
  for (int i = 0; i < nd; i++)
    s->dims[i] = dims[i];
  s->numel = numel;
  /* The test split draws from different streams than the train split. */
  s->seed = (uint64_t)seed ^ (split == AX_SPLIT_TEST ? 0x7e57da7a5eedull : 0);
  ds->priv = s;
  ds->size = examples;
  ds->classes = (int)classes;
  return AX_OK;
}

static int synth_batch(const ax_dataset *ds, const int64_t *idx, int64_t n,
                       ax_tlist *inputs, ax_tlist *labels) {
  const synth *s = ds->priv;
  int64_t xs[4] = {n}, ys[1] = {n};
  for (int i = 0; i < s->ndim; i++)
    xs[1 + i] = s->dims[i];
  ax_tensor *x = axi_tlist_push(inputs, AX_F32, 1 + s->ndim, xs);
  ax_tensor *y = x ? axi_tlist_push(labels, AX_I32, 1, ys) : NULL;
  if (!y)
    return AX_ENOMEM;
  float *xp = ax_f32(x);
  int32_t *yp = ax_i32(y);
#pragma omp parallel for schedule(static) if (n >= 16)
  for (int64_t b = 0; b < n; b++) {
    ax_rng r;
    ax_rng_seed2(&r, s->seed, (uint64_t)idx[b]);
    yp[b] = (int32_t)ax_rng_below(&r, (uint64_t)ds->classes);
    float *dst = xp + (size_t)b * s->numel;
    for (size_t i = 0; i < s->numel; i++)
      dst[i] = (float)ax_rng_normal(&r);
  }
  return AX_OK;
}

const axi_dataset_ops axi_ds_synthetic = {
    /* .name = */ "synthetic",
    /* .open = */ synth_open,
    /* .batch = */ synth_batch,
    /* .close = */ synth_close,
};
