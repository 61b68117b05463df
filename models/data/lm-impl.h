/* Internals of the language-model data sets "text" (lm_text.c) and
 * "tokens" (lm_tokens.c): a token sequence, in one or more pieces (a file,
 * a shard), cut into windows of seq + 1 tokens. Not part of the public API.
 *
 * A reader adds the pieces of the whole sequence in order
 * (axi_lm_piece), then axi_lm_finish keeps the split's part of it (the
 * head or the held-out tail) and counts its windows: window w of a piece
 * starts at token w * seq of it, so windows never overlap but in their last
 * token (a window's labels are its inputs shifted by one) and never cross
 * from one piece into the next. */
#ifndef AX_DATA_LM_IMPL_H
#define AX_DATA_LM_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "axon/models/data/dataset-impl.h"

typedef struct axi_lm_seg {
  const unsigned char *p; /* token k: width bytes at p + k * width, LE */
  int64_t n;              /* tokens */
  int64_t first;          /* the split's index of its first window */
} axi_lm_seg;

typedef struct axi_lm {
  int width; /* bytes per token: 1 (bytes) or 2 (uint16) */
  int seq;   /* tokens per example (T) */
  int bytes; /* the ids are bytes (vocab 256): decode gives text */
  int nseg, cap;
  axi_lm_seg *seg;
  /* What the pieces point into: a malloc'd buffer, mapped files. */
  unsigned char *buf;
  int nmaps;
  void **maps;
  size_t *map_len;
} axi_lm;

extern const axi_dataset_ops axi_ds_text;
extern const axi_dataset_ops axi_ds_tokens;

/* A new axi_lm for tokens of `width` bytes and windows of seq + 1; NULL
 * (ax_errmsg set) when out of memory. */
axi_lm *axi_lm_new(int width, int seq, int bytes);
/* Appends a piece of n tokens at p (owned by lm: its buf or maps). */
int axi_lm_piece(axi_lm *lm, const unsigned char *p, int64_t n);
/* Keeps the split's part of the pieces and counts its windows into
 * ds->size; with tail_frac > 0 the last floor(tail_frac * N) of all N
 * tokens are the test split and the rest the train split, else every
 * token belongs to `split`. AX_EFORMAT naming `what` when the part has no
 * window of seq + 1 tokens. Sets ds->priv = lm on success. */
int axi_lm_finish(ax_dataset *ds, axi_lm *lm, double tail_frac, int split,
                  const char *what);
/* Frees lm and what it owns (NULL-safe). */
void axi_lm_free(axi_lm *lm);

/* The ops both kinds share: inputs {i32 (B, T)}, labels {i32 (B * T)}
 * (the next token of each position), and the close. */
int axi_lm_batch(const ax_dataset *ds, const int64_t *idx, int64_t n,
                 ax_tlist *inputs, ax_tlist *labels);
void axi_lm_close(ax_dataset *ds);

/* The axi_lm of an open "text" or "tokens" data set, NULL for others. */
const axi_lm *axi_lm_of(const ax_dataset *ds);
/* ax_dataset_token for a byte-level data set: a one-byte string. */
const char *axi_lm_token(const ax_dataset *ds, int id);

#endif
