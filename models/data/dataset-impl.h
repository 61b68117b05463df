/* Internals shared by the data-set readers: the dataset struct body, the
 * per-kind vtable, and file helpers. Not part of the public API. */
#ifndef AX_DATASET_IMPL_H
#define AX_DATASET_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "axon/models/data/dataset.h"

/* One vtable per data-set kind. */
typedef struct axi_dataset_ops {
  const char *name;
  /* Fills ds->size, classes, vocab and priv from cfg. On error it frees what
   * it allocated itself (close is not called). */
  int (*open)(ax_dataset *ds, const ax_config *cfg, int split);
  /* Gathers the (already range-checked) examples idx[0..n) into new CPU
   * tensors appended to the empty lists inputs and labels. Must not modify
   * ds: several threads may call it at once. On error the caller clears
   * both lists. */
  int (*batch)(const ax_dataset *ds, const int64_t *idx, int64_t n,
               ax_tlist *inputs, ax_tlist *labels);
  /* Frees priv. May be NULL. */
  void (*close)(ax_dataset *ds);
} axi_dataset_ops;

struct ax_dataset {
  const axi_dataset_ops *ops;
  int64_t size;
  int classes;
  int vocab;
  int split;
  void *priv;
};

extern const axi_dataset_ops axi_ds_fashion_mnist;
extern const axi_dataset_ops axi_ds_cifar10;
extern const axi_dataset_ops axi_ds_gcide;
extern const axi_dataset_ops axi_ds_synthetic;

/* Reads a whole file, gzip-compressed or plain (zlib reads both), into a new
 * malloc'd buffer (*buf, *len; the caller frees *buf). When max_bytes > 0
 * reading stops after max_bytes decompressed bytes. Errors name the file:
 * AX_ENOTFOUND (missing), AX_EIO (unreadable), AX_EFORMAT (corrupt or
 * truncated gzip stream), AX_ENOMEM. */
int axi_read_file(const char *path, size_t max_bytes, unsigned char **buf,
                  size_t *len);

/* Looks for dir/name.gz, then dir/name; writes the path found into out.
 * AX_ENOTFOUND naming both candidates when neither exists. */
int axi_find_file(const char *dir, const char *name, char *out, size_t len);

/* Appends a new CPU tensor of the given shape to list l; returns it, or NULL
 * (ax_errmsg set) when out of memory or the list is full. */
ax_tensor *axi_tlist_push(ax_tlist *l, ax_dtype dtype, int ndim,
                          const int64_t *shape);

/* Parses a byte count with an optional k/m/g suffix ("16m"); dflt when the
 * key is absent. AX_EINVAL in *err on a bad value. */
int64_t axi_config_bytes(const ax_config *cfg, const char *key, int64_t dflt,
                         int *err);

#endif
