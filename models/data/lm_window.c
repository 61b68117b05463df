/* The windows of the language-model data sets (lm-impl.h): the split's
 * part of a token sequence, its examples, and the byte-level helpers of
 * dataset.h (token unit, decode, encode). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "axon/models/data/lm-impl.h"

axi_lm *axi_lm_new(int width, int seq, int bytes) {
  axi_lm *lm = calloc(1, sizeof *lm);
  if (!lm) {
    ax_seterr(AX_ENOMEM, "dataset: out of memory");
    return NULL;
  }
  lm->width = width;
  lm->seq = seq;
  lm->bytes = bytes;
  return lm;
}

void axi_lm_free(axi_lm *lm) {
  if (!lm)
    return;
  for (int i = 0; i < lm->nmaps; i++)
    munmap(lm->maps[i], lm->map_len[i]);
  free(lm->maps);
  free(lm->map_len);
  free(lm->buf);
  free(lm->seg);
  free(lm);
}

int axi_lm_piece(axi_lm *lm, const unsigned char *p, int64_t n) {
  if (lm->nseg == lm->cap) {
    int cap = lm->cap ? 2 * lm->cap : 4;
    axi_lm_seg *s = realloc(lm->seg, sizeof *s * (size_t)cap);
    if (!s)
      return ax_seterr(AX_ENOMEM, "dataset: out of memory");
    lm->seg = s;
    lm->cap = cap;
  }
  lm->seg[lm->nseg++] = (axi_lm_seg){p, n, 0};
  return AX_OK;
}

int axi_lm_finish(ax_dataset *ds, axi_lm *lm, double tail_frac, int split,
                  const char *what) {
  int64_t total = 0;
  for (int i = 0; i < lm->nseg; i++)
    total += lm->seg[i].n;
  int64_t lo = 0, hi = total;
  if (tail_frac > 0) {
    int64_t cut = total - (int64_t)floor(tail_frac * (double)total);
    lo = split == AX_SPLIT_TRAIN ? 0 : cut;
    hi = split == AX_SPLIT_TRAIN ? cut : total;
  }
  /* Clip every piece to [lo, hi) of the whole sequence; drop the ones
   * without a window. */
  int64_t at = 0, windows = 0;
  int kept = 0;
  for (int i = 0; i < lm->nseg; i++) {
    axi_lm_seg s = lm->seg[i];
    int64_t a = at > lo ? at : lo, b = at + s.n < hi ? at + s.n : hi;
    at += s.n;
    if (b - a < lm->seq + 1)
      continue;
    s.p += (a - (at - s.n)) * lm->width;
    s.n = b - a;
    s.first = windows;
    windows += (s.n - 1) / lm->seq;
    lm->seg[kept++] = s;
  }
  lm->nseg = kept;
  if (windows == 0)
    return ax_seterr(AX_EFORMAT,
                     "%s: the %s split has %lld tokens, too few for one "
                     "window of seq + 1 = %d",
                     what, split == AX_SPLIT_TRAIN ? "train" : "test",
                     (long long)(hi - lo), lm->seq + 1);
  ds->size = windows;
  ds->priv = lm;
  return AX_OK;
}

void axi_lm_close(ax_dataset *ds) {
  axi_lm_free(ds->priv);
  ds->priv = NULL;
}

static int32_t tok(const axi_lm *lm, const unsigned char *p, int64_t k) {
  if (lm->width == 1)
    return p[k];
  return (int32_t)(p[2 * k] | (unsigned)p[2 * k + 1] << 8);
}

/* The segment holding window w (binary search over the first windows). */
static const axi_lm_seg *seg_of(const axi_lm *lm, int64_t w) {
  int lo = 0, hi = lm->nseg - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (lm->seg[mid].first <= w)
      lo = mid;
    else
      hi = mid - 1;
  }
  return &lm->seg[lo];
}

int axi_lm_batch(const ax_dataset *ds, const int64_t *idx, int64_t n,
                 ax_tlist *inputs, ax_tlist *labels) {
  const axi_lm *lm = ds->priv;
  int64_t T = lm->seq, bt[2] = {n, T}, flat[1] = {n * T};
  ax_tensor *x = axi_tlist_push(inputs, AX_I32, 2, bt);
  ax_tensor *y = x ? axi_tlist_push(labels, AX_I32, 1, flat) : NULL;
  if (!y)
    return AX_ENOMEM;
  for (int64_t b = 0; b < n; b++) {
    const axi_lm_seg *s = seg_of(lm, idx[b]);
    int64_t start = (idx[b] - s->first) * T;
    int32_t *xi = ax_i32(x) + b * T, *yi = ax_i32(y) + b * T;
    for (int64_t j = 0; j < T; j++) {
      xi[j] = tok(lm, s->p, start + j);
      yi[j] = tok(lm, s->p, start + j + 1);
    }
  }
  return AX_OK;
}

const axi_lm *axi_lm_of(const ax_dataset *ds) {
  return ds && (ds->ops == &axi_ds_text || ds->ops == &axi_ds_tokens) ? ds->priv
                                                                      : NULL;
}

const char *axi_lm_token(const ax_dataset *ds, int id) {
  /* Every byte as a string of its own: "a", "\n", ... ("" for byte 0). */
  static const char bytes[256][2] = {
#define B4(i) {(char)(i)}, {(char)(i + 1)}, {(char)(i + 2)}, {(char)(i + 3)}
#define B16(i) B4(i), B4(i + 4), B4(i + 8), B4(i + 12)
#define B64(i) B16(i), B16(i + 16), B16(i + 32), B16(i + 48)
      B64(0), B64(64), B64(128), B64(192)
#undef B64
#undef B16
#undef B4
  };
  const axi_lm *lm = axi_lm_of(ds);
  return lm && lm->bytes && id >= 0 && id < 256 ? bytes[id] : NULL;
}

const char *ax_dataset_token_unit(const ax_dataset *ds) {
  const axi_lm *lm = axi_lm_of(ds);
  return lm ? (lm->bytes ? "byte" : "token") : NULL;
}

double ax_bits_per_token(double nats) { return nats / log(2.0); }

int64_t ax_dataset_decode(const ax_dataset *ds, const int32_t *ids, int64_t n,
                          char *out, size_t cap) {
  const axi_lm *lm = axi_lm_of(ds);
  if (!lm || !lm->bytes || n < 0 || (n > 0 && (!ids || !out)))
    return -1;
  int64_t k = 0;
  for (; k < n && (size_t)k < cap; k++) {
    if (ids[k] < 0 || ids[k] > 255)
      return -1;
    out[k] = (char)ids[k];
  }
  return k;
}

int64_t ax_dataset_encode(const ax_dataset *ds, const char *s, size_t len,
                          int32_t *ids, int64_t cap) {
  const axi_lm *lm = axi_lm_of(ds);
  if (!lm || !lm->bytes || (len > 0 && (!s || !ids)))
    return -1;
  int64_t k = 0;
  for (; (size_t)k < len && k < cap; k++)
    ids[k] = (unsigned char)s[k];
  return k;
}
