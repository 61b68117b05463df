/* ax_loader: deterministic (seed, epoch) shuffled batches over a data set. */
#include <stdlib.h>

#include "axon/models/data/dataset-impl.h"

struct ax_loader {
  const ax_dataset *ds;
  int64_t batch;
  int shuffle;
  int drop_last;
  uint64_t seed;
  int64_t n;     /* examples in the data set */
  int64_t pos;   /* next position in perm */
  int32_t *perm; /* this epoch's order */
  int64_t *idx;  /* scratch for one batch of indices */
};

int ax_loader_new(const ax_dataset *ds, int64_t batch, int shuffle,
                  int drop_last, uint64_t seed, ax_loader **out) {
  if (out)
    *out = NULL;
  if (!ds || !out || batch <= 0)
    return ax_seterr(AX_EINVAL, "loader: missing data set or batch %lld <= 0",
                     (long long)batch);
  if (ds->size > INT32_MAX)
    return ax_seterr(AX_EINVAL, "loader: %lld examples is too many",
                     (long long)ds->size);
  ax_loader *ld = calloc(1, sizeof *ld);
  if (!ld)
    return ax_seterr(AX_ENOMEM, "loader: out of memory");
  ld->ds = ds;
  ld->batch = batch;
  ld->shuffle = shuffle;
  ld->drop_last = drop_last;
  ld->seed = seed;
  ld->n = ds->size;
  ld->perm = malloc(sizeof *ld->perm * (size_t)(ld->n ? ld->n : 1));
  ld->idx = malloc(sizeof *ld->idx * (size_t)batch);
  if (!ld->perm || !ld->idx) {
    ax_loader_free(ld);
    return ax_seterr(AX_ENOMEM, "loader: out of memory");
  }
  ax_loader_start(ld, 0);
  *out = ld;
  return AX_OK;
}

void ax_loader_free(ax_loader *ld) {
  if (!ld)
    return;
  free(ld->perm);
  free(ld->idx);
  free(ld);
}

void ax_loader_start(ax_loader *ld, int epoch) {
  for (int64_t i = 0; i < ld->n; i++)
    ld->perm[i] = (int32_t)i;
  if (ld->shuffle) {
    /* The order depends on (seed, epoch) only, so every process that shares
     * the seed sees the same batches. */
    ax_rng r;
    ax_rng_seed2(&r, ld->seed, (uint64_t)(uint32_t)epoch);
    ax_rng_shuffle_i32(&r, ld->perm, ld->n);
  }
  ld->pos = 0;
}

int ax_loader_next(ax_loader *ld, ax_tlist *inputs, ax_tlist *labels) {
  if (!ld || !inputs || !labels)
    return ax_seterr(AX_EINVAL, "loader: missing loader or output lists");
  inputs->n = labels->n = 0;
  int64_t left = ld->n - ld->pos;
  if (left <= 0 || (ld->drop_last && left < ld->batch))
    return AX_ECLOSED;
  int64_t b = left < ld->batch ? left : ld->batch;
  for (int64_t i = 0; i < b; i++)
    ld->idx[i] = ld->perm[ld->pos + i];
  AX_TRY(ax_dataset_batch(ld->ds, ld->idx, b, inputs, labels));
  ld->pos += b;
  return AX_OK;
}

int64_t ax_loader_batches(const ax_loader *ld) {
  if (!ld)
    return 0;
  return ld->drop_last ? ld->n / ld->batch
                       : (ld->n + ld->batch - 1) / ld->batch;
}
