/* Fashion-MNIST from its IDX files (gzip-compressed or plain).
 *
 * An IDX file is a big-endian header (magic 0x00000801 for u8 labels,
 * 0x00000803 for u8 images, then the count, then rows and columns for
 * images) followed by the raw bytes. Both files are read whole, checked
 * byte for byte against their headers, and the raw pixels are kept; batches
 * normalise them on the fly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/models/data/dataset-impl.h"

/* Fashion-MNIST train-set pixel statistics of x = byte / 255 over all 60000
 * images: mean 0.28604, std 0.35302 (computed from train-images-idx3-ubyte;
 * tests/test_data.c recomputes them and checks normalised data has mean 0 and
 * std 1). */
#define FMNIST_MEAN 0.2860f
#define FMNIST_STD 0.3530f

#define IDX_LABELS 0x00000801u
#define IDX_IMAGES 0x00000803u

typedef struct mnist {
  unsigned char *img_buf; /* whole images file; pixels start at byte 16 */
  unsigned char *lab_buf; /* whole labels file; labels start at byte 8 */
  int rows, cols;
  int pad; /* pixels of zero padding on each side */
} mnist;

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         (uint32_t)p[3];
}

/* Reads one IDX file and checks its magic, dimensions and exact length.
 * dims receives count[, rows, cols]. */
static int read_idx(const char *dir, const char *name, uint32_t magic,
                    unsigned char **buf, uint32_t dims[3]) {
  char path[512];
  AX_TRY(axi_find_file(dir, name, path, sizeof path));
  size_t len;
  AX_TRY(axi_read_file(path, 0, buf, &len));
  int nd = magic == IDX_IMAGES ? 3 : 1;
  size_t hdr = 4 + 4 * (size_t)nd;
  int rc = AX_OK;
  if (len < hdr) {
    rc = ax_seterr(AX_EFORMAT, "%s: truncated at byte %zu (header needs %zu)",
                   path, len, hdr);
  } else if (be32(*buf) != magic) {
    rc = ax_seterr(AX_EFORMAT, "%s: bad magic 0x%08x, expected 0x%08x", path,
                   be32(*buf), magic);
  } else {
    size_t want = 1;
    for (int i = 0; i < nd; i++) {
      dims[i] = be32(*buf + 4 + 4 * i);
      want *= dims[i];
    }
    if (nd == 3 &&
        (dims[1] == 0 || dims[2] == 0 || dims[1] > 1024 || dims[2] > 1024))
      rc = ax_seterr(AX_EFORMAT, "%s: bad image size %ux%u", path, dims[1],
                     dims[2]);
    else if (dims[0] == 0)
      rc = ax_seterr(AX_EFORMAT, "%s: holds no examples", path);
    else if (len < hdr + want)
      rc = ax_seterr(AX_EFORMAT, "%s: truncated at byte %zu (header says %zu)",
                     path, len, hdr + want);
    else if (len > hdr + want)
      rc = ax_seterr(AX_EFORMAT, "%s: %zu trailing bytes after the data", path,
                     len - hdr - want);
  }
  if (rc != AX_OK) {
    free(*buf);
    *buf = NULL;
  }
  return rc;
}

static void mnist_close(ax_dataset *ds) {
  mnist *m = ds->priv;
  if (!m)
    return;
  free(m->img_buf);
  free(m->lab_buf);
  free(m);
  ds->priv = NULL;
}

static int mnist_open(ax_dataset *ds, const ax_config *cfg, int split) {
  int err = AX_OK;
  const char *dir =
      ax_config_str(cfg, "dir", "/usr/share/datasets/fashion-mnist");
  int64_t pad = ax_config_int(cfg, "pad", 0, &err);
  int64_t limit = ax_config_int(cfg, "limit", 0, &err);
  if (err != AX_OK)
    return err;
  if (pad != 0 && pad != 1)
    return ax_seterr(AX_EINVAL, "fashion-mnist: pad=%lld, expected 0 or 1",
                     (long long)pad);
  if (limit < 0)
    return ax_seterr(AX_EINVAL, "fashion-mnist: limit=%lld < 0",
                     (long long)limit);
  const char *pre = split == AX_SPLIT_TRAIN ? "train" : "t10k";
  char iname[64], lname[64];
  snprintf(iname, sizeof iname, "%s-images-idx3-ubyte", pre);
  snprintf(lname, sizeof lname, "%s-labels-idx1-ubyte", pre);
  mnist *m = calloc(1, sizeof *m);
  if (!m)
    return ax_seterr(AX_ENOMEM, "fashion-mnist: out of memory");
  ds->priv = m;
  uint32_t idim[3] = {0}, ldim[3] = {0};
  int rc = read_idx(dir, lname, IDX_LABELS, &m->lab_buf, ldim);
  if (rc == AX_OK)
    rc = read_idx(dir, iname, IDX_IMAGES, &m->img_buf, idim);
  if (rc == AX_OK && idim[0] != ldim[0])
    rc = ax_seterr(AX_EFORMAT, "%s/%s: %u images but %s has %u labels", dir,
                   iname, idim[0], lname, ldim[0]);
  for (uint32_t i = 0; rc == AX_OK && i < ldim[0]; i++)
    if (m->lab_buf[8 + i] >= 10)
      rc = ax_seterr(AX_EFORMAT, "%s/%s: label %u of example %u not in [0, 10)",
                     dir, lname, m->lab_buf[8 + i], i);
  if (rc != AX_OK) {
    mnist_close(ds);
    return rc;
  }
  m->rows = (int)idim[1];
  m->cols = (int)idim[2];
  m->pad = pad ? (32 - m->rows) / 2 : 0;
  if (pad && (m->rows > 32 || m->cols != m->rows)) {
    mnist_close(ds);
    return ax_seterr(AX_EFORMAT, "fashion-mnist: cannot pad %dx%d to 32x32",
                     (int)idim[1], (int)idim[2]);
  }
  ds->size = idim[0];
  if (limit > 0 && limit < ds->size)
    ds->size = limit;
  ds->classes = 10;
  return AX_OK;
}

static int mnist_batch(const ax_dataset *ds, const int64_t *idx, int64_t n,
                       ax_tlist *inputs, ax_tlist *labels) {
  const mnist *m = ds->priv;
  int H = m->rows + 2 * m->pad, W = m->cols + 2 * m->pad;
  int64_t xs[4] = {n, 1, H, W}, ys[1] = {n};
  ax_tensor *x = axi_tlist_push(inputs, AX_F32, 4, xs);
  ax_tensor *y = x ? axi_tlist_push(labels, AX_I32, 1, ys) : NULL;
  if (!y)
    return AX_ENOMEM;
  /* Normalise through a table of the 256 byte values: identical results on
   * every thread and every run. The padding is the background (byte 0). */
  float lut[256];
  for (int v = 0; v < 256; v++)
    lut[v] = ((float)v / 255.0f - FMNIST_MEAN) / FMNIST_STD;
  size_t plane = (size_t)m->rows * m->cols;
  float *xp = ax_f32(x);
  int32_t *yp = ax_i32(y);
#pragma omp parallel for schedule(static) if (n >= 64)
  for (int64_t b = 0; b < n; b++) {
    const unsigned char *src = m->img_buf + 16 + plane * (size_t)idx[b];
    float *dst = xp + (size_t)b * H * W;
    if (m->pad)
      for (int i = 0; i < H * W; i++)
        dst[i] = lut[0];
    for (int r = 0; r < m->rows; r++)
      for (int c = 0; c < m->cols; c++)
        dst[(size_t)(r + m->pad) * W + c + m->pad] = lut[src[r * m->cols + c]];
    yp[b] = m->lab_buf[8 + idx[b]];
  }
  return AX_OK;
}

const axi_dataset_ops axi_ds_fashion_mnist = {
    /* .name = */ "fashion-mnist",
    /* .open = */ mnist_open,
    /* .batch = */ mnist_batch,
    /* .close = */ mnist_close,
};
