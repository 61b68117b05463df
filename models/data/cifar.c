/* CIFAR-10, binary version: records of 1 label byte then 3072 pixel bytes
 * (1024 red, 1024 green, 1024 blue, each row-major 32x32). The train split
 * is data_batch_1.bin .. data_batch_5.bin, the test split test_batch.bin;
 * each may also be gzip-compressed (name.bin.gz). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/models/data/dataset-impl.h"

#define REC 3073
#define PLANE 1024

/* The per-channel mean and standard deviation of the CIFAR-10 training set
 * (x = byte / 255), as used by the usual torchvision recipes. The std is the
 * true pixel std (0.247, 0.243, 0.261), not the often-copied
 * (0.2023, 0.1994, 0.2010), which is a std of per-image means. */
static const float cifar_mean[3] = {0.4914f, 0.4822f, 0.4465f};
static const float cifar_std[3] = {0.2470f, 0.2435f, 0.2616f};

typedef struct cifar {
  unsigned char *recs; /* all records of the split, back to back */
} cifar;

/* Appends one batch file's records to *buf (size *len). */
static int read_batch_file(const char *dir, const char *name,
                           unsigned char **buf, size_t *len) {
  char path[512];
  AX_TRY(axi_find_file(dir, name, path, sizeof path));
  unsigned char *p;
  size_t n;
  AX_TRY(axi_read_file(path, 0, &p, &n));
  int rc = AX_OK;
  if (n == 0 || n % REC != 0)
    rc = ax_seterr(AX_EFORMAT,
                   "%s: truncated at byte %zu (not a whole number of "
                   "%d-byte records)",
                   path, n, REC);
  for (size_t r = 0; rc == AX_OK && r < n / REC; r++)
    if (p[r * REC] >= 10)
      rc = ax_seterr(AX_EFORMAT, "%s: label %u of record %zu not in [0, 10)",
                     path, p[r * REC], r);
  if (rc == AX_OK) {
    unsigned char *q = realloc(*buf, *len + n);
    if (!q)
      rc = ax_seterr(AX_ENOMEM, "%s: out of memory", path);
    else {
      memcpy(q + *len, p, n);
      *buf = q;
      *len += n;
    }
  }
  free(p);
  return rc;
}

static void cifar_close(ax_dataset *ds) {
  cifar *c = ds->priv;
  if (!c)
    return;
  free(c->recs);
  free(c);
  ds->priv = NULL;
}

static int cifar_open(ax_dataset *ds, const ax_config *cfg, int split) {
  int err = AX_OK;
  const char *dir = ax_config_str(cfg, "dir", "data/cifar-10-batches-bin");
  int64_t limit = ax_config_int(cfg, "limit", 0, &err);
  if (err != AX_OK)
    return err;
  if (limit < 0)
    return ax_seterr(AX_EINVAL, "cifar10: limit=%lld < 0", (long long)limit);
  cifar *c = calloc(1, sizeof *c);
  if (!c)
    return ax_seterr(AX_ENOMEM, "cifar10: out of memory");
  ds->priv = c;
  size_t len = 0;
  int rc = AX_OK;
  if (split == AX_SPLIT_TEST) {
    rc = read_batch_file(dir, "test_batch.bin", &c->recs, &len);
  } else {
    for (int i = 1; i <= 5 && rc == AX_OK; i++) {
      char name[32];
      snprintf(name, sizeof name, "data_batch_%d.bin", i);
      rc = read_batch_file(dir, name, &c->recs, &len);
    }
  }
  if (rc != AX_OK) {
    cifar_close(ds);
    return rc;
  }
  ds->size = (int64_t)(len / REC);
  if (limit > 0 && limit < ds->size)
    ds->size = limit;
  ds->classes = 10;
  return AX_OK;
}

static int cifar_batch(const ax_dataset *ds, const int64_t *idx, int64_t n,
                       ax_tlist *inputs, ax_tlist *labels) {
  const cifar *c = ds->priv;
  int64_t xs[4] = {n, 3, 32, 32}, ys[1] = {n};
  ax_tensor *x = axi_tlist_push(inputs, AX_F32, 4, xs);
  ax_tensor *y = x ? axi_tlist_push(labels, AX_I32, 1, ys) : NULL;
  if (!y)
    return AX_ENOMEM;
  float lut[3][256];
  for (int ch = 0; ch < 3; ch++)
    for (int v = 0; v < 256; v++)
      lut[ch][v] = ((float)v / 255.0f - cifar_mean[ch]) / cifar_std[ch];
  float *xp = ax_f32(x);
  int32_t *yp = ax_i32(y);
#pragma omp parallel for schedule(static) if (n >= 64)
  for (int64_t b = 0; b < n; b++) {
    const unsigned char *rec = c->recs + (size_t)idx[b] * REC;
    float *dst = xp + (size_t)b * 3 * PLANE;
    for (int ch = 0; ch < 3; ch++)
      for (int i = 0; i < PLANE; i++)
        dst[ch * PLANE + i] = lut[ch][rec[1 + ch * PLANE + i]];
    yp[b] = rec[0];
  }
  return AX_OK;
}

const axi_dataset_ops axi_ds_cifar10 = {
    /* .name = */ "cifar10",
    /* .open = */ cifar_open,
    /* .batch = */ cifar_batch,
    /* .close = */ cifar_close,
};
