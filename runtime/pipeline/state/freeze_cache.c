/* The frozen prefix of a pipeline and its AutoCache (freeze.h): the prefix
 * net runs in inference mode on the coordinator's CPU, and every example's
 * output is kept under a SHA-256 of the example's inputs. A mini-batch is
 * cut into examples by its first input's rows (a tensor of k B rows holds
 * k rows per example, as everywhere in the pipeline); the examples the
 * cache lacks run through the prefix as one smaller batch. Contract in
 * coordinator-impl.h. */
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/digest.h"
#include "axon/runtime/pipeline/coord/coordinator-impl.h"

typedef struct centry {
  uint8_t key[AX_SHA256_LEN];
  uint8_t *data; /* the example's output rows, tensor after tensor; NULL:
                    empty slot */
} centry;

struct axi_pipe_frozen {
  ax_net *net;
  int blocks;
  pthread_mutex_t mu;
  int64_t budget, bytes;
  long hits, misses;
  centry *tab;
  size_t cap, used;
  /* The outputs' shape per example, from the first batch the prefix ran:
   * dtype, dims after the first, rows per example and bytes per example. */
  int nout;
  ax_dtype dtype[AX_TLIST_MAX];
  int ndim[AX_TLIST_MAX];
  int64_t dims[AX_TLIST_MAX][AX_MAX_DIMS];
  int64_t rows[AX_TLIST_MAX];
  size_t exb[AX_TLIST_MAX], ex_bytes;
};

int axi_pipe_frozen_new(ax_net *net, int blocks, int64_t budget,
                        axi_pipe_frozen **out) {
  axi_pipe_frozen *f = calloc(1, sizeof *f);
  if (!f) {
    ax_net_free(net);
    return AX_ENOMEM;
  }
  f->net = net;
  f->blocks = blocks;
  f->budget = budget == 0 ? (int64_t)1 << 30 : budget;
  pthread_mutex_init(&f->mu, NULL);
  *out = f;
  return AX_OK;
}

void axi_pipe_frozen_free(axi_pipe_frozen *f) {
  if (!f)
    return;
  axi_pipe_frozen_clear_cache(f);
  ax_net_free(f->net);
  pthread_mutex_destroy(&f->mu);
  free(f);
}

int axi_pipe_frozen_blocks(const axi_pipe_frozen *f) {
  return f ? f->blocks : 0;
}
ax_net *axi_pipe_frozen_net(axi_pipe_frozen *f) { return f->net; }

void axi_pipe_frozen_counts(axi_pipe_frozen *f, long *hits, long *misses,
                            int64_t *bytes) {
  pthread_mutex_lock(&f->mu);
  *hits = f->hits;
  *misses = f->misses;
  *bytes = f->bytes;
  pthread_mutex_unlock(&f->mu);
}

void axi_pipe_frozen_clear_cache(axi_pipe_frozen *f) {
  pthread_mutex_lock(&f->mu);
  for (size_t i = 0; i < f->cap; i++)
    free(f->tab[i].data);
  free(f->tab);
  f->tab = NULL;
  f->cap = f->used = 0;
  f->bytes = 0;
  pthread_mutex_unlock(&f->mu);
}

/* ---- the table: open addressing on the key's first bytes ----------------- */

static centry *slot_of(centry *tab, size_t cap, const uint8_t *key) {
  size_t h;
  memcpy(&h, key, sizeof h);
  for (size_t i = h & (cap - 1);; i = (i + 1) & (cap - 1))
    if (!tab[i].data || !memcmp(tab[i].key, key, AX_SHA256_LEN))
      return &tab[i];
}

static const uint8_t *lookup(axi_pipe_frozen *f, const uint8_t *key) {
  if (!f->cap)
    return NULL;
  centry *e = slot_of(f->tab, f->cap, key);
  return e->data;
}

/* Keeps a copy of the example's output rows (nothing past the budget). */
static void insert(axi_pipe_frozen *f, const uint8_t *key,
                   const uint8_t *rows) {
  int64_t cost = (int64_t)(f->ex_bytes + sizeof(centry));
  if (f->budget < 0 || f->bytes + cost > f->budget)
    return;
  if (2 * (f->used + 1) > f->cap) { /* grow to keep the load under 1/2 */
    size_t cap = f->cap ? 2 * f->cap : 1024;
    centry *t = calloc(cap, sizeof *t);
    if (!t)
      return;
    for (size_t i = 0; i < f->cap; i++)
      if (f->tab[i].data)
        *slot_of(t, cap, f->tab[i].key) = f->tab[i];
    free(f->tab);
    f->bytes += (int64_t)((cap - f->cap) * sizeof(centry));
    f->tab = t;
    f->cap = cap;
  }
  centry *e = slot_of(f->tab, f->cap, key);
  if (e->data)
    return;
  if (!(e->data = malloc(f->ex_bytes)))
    return;
  memcpy(e->key, key, AX_SHA256_LEN);
  memcpy(e->data, rows, f->ex_bytes);
  f->used++;
  f->bytes += (int64_t)f->ex_bytes;
}

/* ---- examples ------------------------------------------------------------ */

/* Bytes of one example of t (B examples). */
static int example_bytes(const ax_tensor *t, int64_t B, size_t *out) {
  if (t->ndim < 1 || B < 1 || t->shape[0] % B || t->device.type != AX_DEV_CPU)
    return ax_seterr(AX_ESHAPE,
                     "frozen prefix: a CPU tensor of %lld rows "
                     "for %lld examples",
                     (long long)(t->ndim ? t->shape[0] : 0), (long long)B);
  *out = ax_tensor_nbytes(t) / (size_t)B;
  return AX_OK;
}

/* The key of example e: the SHA-256 of its rows of every input, with each
 * input's dtype and shape after the first dim. */
static int key_of(const ax_tlist *in, const size_t *exb, int64_t e,
                  uint8_t *scratch, uint8_t *key) {
  size_t at = 0;
  for (int i = 0; i < in->n; i++) {
    const ax_tensor *t = in->t[i];
    int32_t hdr[1 + AX_MAX_DIMS] = {(int32_t)t->dtype};
    for (int d = 1; d < t->ndim; d++)
      hdr[d] = (int32_t)t->shape[d];
    memcpy(scratch + at, hdr, sizeof hdr);
    at += sizeof hdr;
    memcpy(scratch + at, (const uint8_t *)t->data + (size_t)e * exb[i], exb[i]);
    at += exb[i];
  }
  return ax_sha256(scratch, at, key);
}

/* Examples idx[0 .. k - 1] of in as a new batch. */
static int gather(const ax_tlist *in, const size_t *exb, const int64_t *idx,
                  int64_t k, int64_t B, ax_tlist *out) {
  memset(out, 0, sizeof *out);
  for (int i = 0; i < in->n; i++) {
    const ax_tensor *t = in->t[i];
    int64_t shape[AX_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[0] = t->shape[0] / B * k;
    ax_tensor *g = ax_tensor_new(t->dtype, t->ndim, shape, AX_CPU);
    if (!g)
      return AX_ENOMEM;
    out->t[out->n++] = g;
    for (int64_t j = 0; j < k; j++)
      memcpy((uint8_t *)g->data + (size_t)j * exb[i],
             (const uint8_t *)t->data + (size_t)idx[j] * exb[i], exb[i]);
  }
  return AX_OK;
}

/* Records the outputs' per-example shape (the first time), or checks it. */
static int template_of(axi_pipe_frozen *f, const ax_tlist *y, int64_t k) {
  if (f->nout) {
    if (y->n != f->nout)
      return ax_seterr(AX_EINTERNAL, "frozen prefix: %d outputs, then %d",
                       f->nout, y->n);
    return AX_OK;
  }
  f->ex_bytes = 0;
  for (int i = 0; i < y->n; i++) {
    const ax_tensor *t = y->t[i];
    AX_TRY(example_bytes(t, k, &f->exb[i]));
    f->dtype[i] = t->dtype;
    f->ndim[i] = t->ndim;
    memcpy(f->dims[i], t->shape, sizeof f->dims[i]);
    f->rows[i] = t->shape[0] / k;
    f->ex_bytes += f->exb[i];
  }
  f->nout = y->n;
  return AX_OK;
}

/* The prefix forward of a batch (inference mode). */
static int run_prefix(axi_pipe_frozen *f, const ax_tlist *in, ax_tlist *y) {
  ax_exec ex = ax_net_exec(f->net, 0);
  return ax_forward(f->net->root, &ex, NULL, in, y);
}

/* Fills out (B examples) from the cache (hit[e]) and, in order, the
 * prefix's outputs y of the examples it lacked; keeps the new ones. */
static int assemble(axi_pipe_frozen *f, int64_t B,
                    uint8_t (*keys)[AX_SHA256_LEN], const uint8_t **hit,
                    const ax_tlist *y, ax_tlist *out) {
  memset(out, 0, sizeof *out);
  for (int i = 0; i < f->nout; i++) {
    int64_t shape[AX_MAX_DIMS];
    memcpy(shape, f->dims[i], sizeof shape);
    shape[0] = f->rows[i] * B;
    if (!(out->t[out->n++] =
              ax_tensor_new(f->dtype[i], f->ndim[i], shape, AX_CPU)))
      return AX_ENOMEM;
  }
  uint8_t *row = malloc(f->ex_bytes + 1);
  if (!row)
    return AX_ENOMEM;
  for (int64_t e = 0, m = 0; e < B; e++) {
    const uint8_t *src = hit[e];
    if (!src) { /* the prefix's output of this example */
      size_t at = 0;
      for (int i = 0; i < f->nout; i++) {
        memcpy(row + at, (const uint8_t *)y->t[i]->data + (size_t)m * f->exb[i],
               f->exb[i]);
        at += f->exb[i];
      }
      m++;
      insert(f, keys[e], row);
      src = row;
    }
    size_t at = 0;
    for (int i = 0; i < f->nout; i++) {
      memcpy((uint8_t *)out->t[i]->data + (size_t)e * f->exb[i], src + at,
             f->exb[i]);
      at += f->exb[i];
    }
  }
  free(row);
  return AX_OK;
}

static int apply_cached(axi_pipe_frozen *f, ax_tlist *in) {
  int64_t B = in->t[0]->shape[0];
  size_t exb[AX_TLIST_MAX], all = 0;
  for (int i = 0; i < in->n; i++) {
    AX_TRY(example_bytes(in->t[i], B, &exb[i]));
    all += exb[i] + sizeof(int32_t) * (1 + AX_MAX_DIMS);
  }
  uint8_t(*keys)[AX_SHA256_LEN] = malloc((size_t)B * sizeof *keys);
  const uint8_t **hit = calloc((size_t)B, sizeof *hit);
  int64_t *miss = malloc((size_t)B * sizeof *miss);
  uint8_t *scratch = malloc(all + 1);
  ax_tlist sub = {0}, y = {0}, out = {0};
  int err = keys && hit && miss && scratch ? AX_OK : AX_ENOMEM;
  int64_t k = 0;
  for (int64_t e = 0; err == AX_OK && e < B; e++) {
    err = key_of(in, exb, e, scratch, keys[e]);
    if (err == AX_OK && !(hit[e] = lookup(f, keys[e])))
      miss[k++] = e;
  }
  if (err == AX_OK && k) {
    err = k == B ? run_prefix(f, in, &y) : gather(in, exb, miss, k, B, &sub);
    if (err == AX_OK && k < B)
      err = run_prefix(f, &sub, &y);
    if (err == AX_OK)
      err = template_of(f, &y, k);
  }
  if (err == AX_OK && !f->nout)
    err = ax_seterr(AX_EINTERNAL, "frozen prefix: a hit before any output");
  if (err == AX_OK)
    err = assemble(f, B, keys, hit, &y, &out);
  if (err == AX_OK) {
    f->hits += (long)(B - k);
    f->misses += (long)k;
    ax_tlist_clear(in);
    *in = out;
    memset(&out, 0, sizeof out);
  }
  ax_tlist_clear(&sub);
  ax_tlist_clear(&y);
  ax_tlist_clear(&out);
  free(keys);
  free(hit);
  free(miss);
  free(scratch);
  return err;
}

int axi_pipe_frozen_apply(axi_pipe_frozen *f, ax_tlist *in) {
  if (in->n < 1 || !in->t[0])
    return ax_seterr(AX_EINVAL, "frozen prefix: a batch without inputs");
  pthread_mutex_lock(&f->mu);
  int err;
  if (f->budget < 0) { /* no cache: the prefix on the whole batch */
    ax_tlist y = {0};
    err = run_prefix(f, in, &y);
    if (err == AX_OK) {
      f->misses += (long)in->t[0]->shape[0];
      ax_tlist_clear(in);
      *in = y;
    }
  } else {
    err = apply_cached(f, in);
  }
  pthread_mutex_unlock(&f->mu);
  return err;
}

int axi_pipe_frozen_batch(void *feed, long t, ax_tlist *in, ax_tlist *lab) {
  axi_pipe_frozen_feed *w = feed;
  AX_TRY(w->batch(w->user, t, in, lab));
  int err = axi_pipe_frozen_apply(w->f, in);
  if (err != AX_OK) {
    ax_tlist_clear(in);
    ax_tlist_clear(lab);
  }
  return err;
}

void axi_pipe_frozen_step(void *feed, const ax_pipe_step_info *si) {
  axi_pipe_frozen_feed *w = feed;
  if (w->step)
    w->step(w->user, si);
}
