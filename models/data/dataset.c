/* The data-set front end: the registry of kinds, argument checks, and the
 * file helpers the readers share. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "axon/models/data/lm-impl.h"

static const axi_dataset_ops *const kinds[] = {
    &axi_ds_fashion_mnist, &axi_ds_cifar10,   &axi_ds_gcide, &axi_ds_text,
    &axi_ds_tokens,        &axi_ds_synthetic, NULL};

int ax_dataset_open(const char *name, const ax_config *cfg, int split,
                    ax_dataset **out) {
  if (out)
    *out = NULL;
  if (!name || !out)
    return ax_seterr(AX_EINVAL, "dataset: missing name or out");
  if (split != AX_SPLIT_TRAIN && split != AX_SPLIT_TEST)
    return ax_seterr(AX_EINVAL, "dataset %s: bad split %d", name, split);
  const axi_dataset_ops *ops = NULL;
  for (int i = 0; kinds[i]; i++)
    if (strcmp(kinds[i]->name, name) == 0)
      ops = kinds[i];
  if (!ops)
    return ax_seterr(AX_ENOTFOUND,
                     "dataset: unknown name '%s' (known: fashion-mnist, "
                     "cifar10, gcide, text, tokens, synthetic)",
                     name);
  ax_dataset *ds = calloc(1, sizeof *ds);
  if (!ds)
    return ax_seterr(AX_ENOMEM, "dataset %s: out of memory", name);
  ds->ops = ops;
  ds->split = split;
  int rc = ops->open(ds, cfg, split);
  if (rc != AX_OK) {
    free(ds);
    return rc;
  }
  *out = ds;
  return AX_OK;
}

void ax_dataset_close(ax_dataset *ds) {
  if (!ds)
    return;
  if (ds->ops->close)
    ds->ops->close(ds);
  free(ds);
}

int64_t ax_dataset_size(const ax_dataset *ds) { return ds ? ds->size : 0; }
int ax_dataset_classes(const ax_dataset *ds) { return ds ? ds->classes : 0; }
int ax_dataset_vocab(const ax_dataset *ds) { return ds ? ds->vocab : 0; }

int ax_dataset_batch(const ax_dataset *ds, const int64_t *idx, int64_t n,
                     ax_tlist *inputs, ax_tlist *labels) {
  if (!inputs || !labels)
    return ax_seterr(AX_EINVAL, "dataset batch: missing output lists");
  inputs->n = labels->n = 0;
  if (!ds || !idx || n <= 0)
    return ax_seterr(AX_EINVAL, "dataset batch: no data set or empty batch");
  for (int64_t i = 0; i < n; i++)
    if (idx[i] < 0 || idx[i] >= ds->size)
      return ax_seterr(AX_EINVAL,
                       "dataset %s: index %lld out of range [0, %lld)",
                       ds->ops->name, (long long)idx[i], (long long)ds->size);
  int rc = ds->ops->batch(ds, idx, n, inputs, labels);
  if (rc != AX_OK) {
    ax_tlist_clear(inputs);
    ax_tlist_clear(labels);
  }
  return rc;
}

ax_tensor *axi_tlist_push(ax_tlist *l, ax_dtype dtype, int ndim,
                          const int64_t *shape) {
  if (l->n >= AX_TLIST_MAX) {
    ax_seterr(AX_EINTERNAL, "dataset: tensor list full");
    return NULL;
  }
  ax_tensor *t = ax_tensor_new(dtype, ndim, shape, AX_CPU);
  if (!t) {
    ax_seterr(AX_ENOMEM, "dataset: cannot allocate a batch tensor");
    return NULL;
  }
  l->t[l->n++] = t;
  return t;
}

int64_t axi_config_bytes(const ax_config *cfg, const char *key, int64_t dflt,
                         int *err) {
  const char *v = ax_config_str(cfg, key, NULL);
  if (!v)
    return dflt;
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  int64_t mul = 1;
  if (*end == 'k' || *end == 'K')
    mul = 1 << 10, end++;
  else if (*end == 'm' || *end == 'M')
    mul = 1 << 20, end++;
  else if (*end == 'g' || *end == 'G')
    mul = 1 << 30, end++;
  if (errno || end == v || *end || x < 0) {
    if (err)
      *err = ax_seterr(AX_EINVAL, "config: %s=%s is not a byte count", key, v);
    return dflt;
  }
  return (int64_t)x * mul;
}

int axi_find_file(const char *dir, const char *name, char *out, size_t len) {
  struct stat st;
  snprintf(out, len, "%s/%s.gz", dir, name);
  if (stat(out, &st) == 0)
    return AX_OK;
  snprintf(out, len, "%s/%s", dir, name);
  if (stat(out, &st) == 0)
    return AX_OK;
  return ax_seterr(AX_ENOTFOUND, "%s/%s(.gz): no such file", dir, name);
}

/* zlib's message without the "path: " prefix gzerror puts in front. */
static const char *zmsg(const char *path, const char *msg) {
  size_t n = strlen(path);
  if (strncmp(msg, path, n) == 0 && msg[n] == ':' && msg[n + 1] == ' ')
    return msg + n + 2;
  return msg;
}

int axi_read_file(const char *path, size_t max_bytes, unsigned char **buf,
                  size_t *len) {
  *buf = NULL;
  *len = 0;
  struct stat st;
  if (stat(path, &st) != 0)
    return ax_seterr(errno == ENOENT || errno == ENOTDIR ? AX_ENOTFOUND
                                                         : AX_EIO,
                     "%s: %s", path, strerror(errno));
  if (S_ISDIR(st.st_mode))
    return ax_seterr(AX_EIO, "%s: is a directory", path);
  gzFile gz = gzopen(path, "rb");
  if (!gz)
    return ax_seterr(AX_EIO, "%s: cannot open: %s", path, strerror(errno));
  gzbuffer(gz, 1 << 18);
  /* Start from a guess of the decompressed size and grow geometrically. */
  size_t cap = (size_t)st.st_size * 4 + 4096, n = 0;
  if (max_bytes && cap > max_bytes)
    cap = max_bytes;
  unsigned char *p = malloc(cap ? cap : 1);
  int rc = p ? AX_OK : ax_seterr(AX_ENOMEM, "%s: out of memory", path);
  while (rc == AX_OK && (!max_bytes || n < max_bytes)) {
    if (n == cap) {
      size_t ncap = cap * 2;
      if (max_bytes && ncap > max_bytes)
        ncap = max_bytes;
      unsigned char *q = realloc(p, ncap);
      if (!q) {
        rc = ax_seterr(AX_ENOMEM, "%s: out of memory", path);
        break;
      }
      p = q;
      cap = ncap;
    }
    size_t want = cap - n;
    if (want > (1u << 30))
      want = 1u << 30;
    int got = gzread(gz, p + n, (unsigned)want);
    if (got < 0) {
      int zerr;
      const char *msg = gzerror(gz, &zerr);
      rc = zerr == Z_ERRNO
               ? ax_seterr(AX_EIO, "%s: read error: %s", path, strerror(errno))
               : ax_seterr(AX_EFORMAT, "%s: corrupt gzip data (%s)", path,
                           zmsg(path, msg));
      break;
    }
    n += (size_t)got;
    if (got == 0)
      break;
  }
  if (rc == AX_OK && (!max_bytes || n < max_bytes)) {
    /* A stream that ended early is reported by gzerror, not by gzread. */
    int zerr;
    const char *msg = gzerror(gz, &zerr);
    if (zerr != Z_OK && zerr != Z_STREAM_END)
      rc = ax_seterr(AX_EFORMAT, "%s: truncated or corrupt gzip data (%s)",
                     path, zmsg(path, msg));
  }
  gzclose(gz);
  if (rc != AX_OK) {
    free(p);
    return rc;
  }
  *buf = p;
  *len = n;
  return AX_OK;
}
