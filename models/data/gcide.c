/* "gcide": BERT pre-training examples (masked language model + next
 * sentence prediction) from the running text of dict-gcide's dictionary.
 *
 * Opening reads the first max_bytes of the (decompressed) corpus, cleans it,
 * tokenizes it and builds the vocabulary (text-impl.h). The last tenth of the
 * sentences belongs to the test split, the rest to the train split, so the
 * two never share a sentence. Example e of a split is drawn from the stream
 * (seed, e) alone: a batch is the same whatever else is in it and in
 * whatever order the examples are asked for. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/models/data/lm-impl.h"
#include "axon/models/data/text-impl.h"

#define TEST_FRAC 0.1
#define MLM_PROB 0.15
/* Decompressed corpus bytes read by default: the first 16 MiB of the 40 MB
 * corpus (headwords A to about F), ~120k sentences and ~1.9M tokens, which
 * open in about a second; max_bytes=0 reads all of it (~2 s). */
#define DEFAULT_MAX_BYTES (16ll << 20)

typedef struct text_ds {
  axi_corpus c;
  int seq;
  int64_t lo, hi; /* this split's sentences */
  uint64_t seed;
} text_ds;

static void text_close(ax_dataset *ds) {
  text_ds *t = ds->priv;
  if (!t)
    return;
  axi_corpus_free(&t->c);
  free(t);
  ds->priv = NULL;
}

static int text_open(ax_dataset *ds, const ax_config *cfg, int split) {
  int err = AX_OK;
  const char *path =
      ax_config_str(cfg, "file", "/usr/share/dictd/gcide.dict.dz");
  int64_t seq = ax_config_int(cfg, "seq", 128, &err);
  int64_t vocab = ax_config_int(cfg, "vocab", 8192, &err);
  int64_t examples = ax_config_int(
      cfg, "examples", split == AX_SPLIT_TRAIN ? 20000 : 2000, &err);
  int64_t max_bytes =
      axi_config_bytes(cfg, "max_bytes", DEFAULT_MAX_BYTES, &err);
  int64_t seed = ax_config_int(cfg, "seed", 0, &err);
  if (err != AX_OK)
    return err;
  if (seq < 8 || seq > (1 << 16))
    return ax_seterr(AX_EINVAL, "gcide: seq=%lld not in [8, 65536]",
                     (long long)seq);
  if (vocab <= AX_TOK_SPECIALS || vocab > (1 << 24))
    return ax_seterr(AX_EINVAL, "gcide: vocab=%lld not in [%d, 2^24]",
                     (long long)vocab, AX_TOK_SPECIALS + 1);
  if (examples < 1)
    return ax_seterr(AX_EINVAL, "gcide: examples=%lld < 1",
                     (long long)examples);
  unsigned char *raw;
  size_t raw_len, len;
  AX_TRY(axi_read_file(path, (size_t)max_bytes, &raw, &raw_len));
  char *text = axi_text_clean((const char *)raw, raw_len, &len);
  free(raw);
  if (!text)
    return ax_seterr(AX_ENOMEM, "%s: out of memory", path);
  text_ds *t = calloc(1, sizeof *t);
  if (!t) {
    free(text);
    return ax_seterr(AX_ENOMEM, "%s: out of memory", path);
  }
  int rc = axi_corpus_build(text, len, (int)vocab, TEST_FRAC, &t->c);
  free(text);
  if (rc != AX_OK) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s", ax_errmsg());
    free(t);
    return ax_seterr(rc, "%s: %s", path, msg);
  }
  t->seq = (int)seq;
  t->lo = split == AX_SPLIT_TRAIN ? 0 : t->c.n_train;
  t->hi = split == AX_SPLIT_TRAIN ? t->c.n_train : t->c.n_sent;
  t->seed = (uint64_t)seed ^ (split == AX_SPLIT_TEST ? 0x7e57da7a5eedull : 0);
  ds->priv = t;
  ds->size = examples;
  ds->vocab = t->c.vocab;
  return AX_OK;
}

/* Writes example e: token ids, segment ids, attention mask, MLM labels
 * (rows of seq) and returns the NSP label (1 = B is a random sentence). */
static int make_example(const text_ds *t, int64_t e, int32_t *ids, int32_t *seg,
                        float *att, int32_t *mlm) {
  const axi_corpus *c = &t->c;
  int T = t->seq;
  ax_rng r;
  ax_rng_seed2(&r, t->seed, (uint64_t)e);
  int64_t n = t->hi - t->lo;
  int64_t a = t->lo + (int64_t)ax_rng_below(&r, (uint64_t)(n - 1)), b;
  int nsp = ax_rng_uniform(&r) >= 0.5;
  if (!nsp) {
    b = a + 1;
  } else {
    do
      b = t->lo + (int64_t)ax_rng_below(&r, (uint64_t)n);
    while (b == a + 1);
  }
  /* Truncate the longer sentence first until [CLS] A [SEP] B [SEP] fits. */
  int64_t la = c->start[a + 1] - c->start[a];
  int64_t lb = c->start[b + 1] - c->start[b];
  while (la + lb > T - 3) {
    if (la > lb)
      la--;
    else
      lb--;
  }
  int p = 0;
  ids[p] = AX_TOK_CLS, seg[p++] = 0;
  for (int64_t i = 0; i < la; i++)
    ids[p] = c->ids[c->start[a] + i], seg[p++] = 0;
  ids[p] = AX_TOK_SEP, seg[p++] = 0;
  for (int64_t i = 0; i < lb; i++)
    ids[p] = c->ids[c->start[b] + i], seg[p++] = 1;
  ids[p] = AX_TOK_SEP, seg[p++] = 1;
  for (int i = 0; i < T; i++)
    att[i] = i < p ? 1.0f : 0.0f;
  for (int i = p; i < T; i++)
    ids[i] = AX_TOK_PAD, seg[i] = 0;
  /* Masking: each ordinary token is selected with probability 0.15; a
   * selected token becomes [MASK] (80%), a random ordinary token (10%) or
   * stays (10%), and its label is the original id. */
  for (int i = 0; i < T; i++) {
    mlm[i] = AX_MLM_IGNORE;
    if (ids[i] < AX_TOK_SPECIALS || ax_rng_uniform(&r) >= MLM_PROB)
      continue;
    mlm[i] = ids[i];
    double u = ax_rng_uniform(&r);
    if (u < 0.8)
      ids[i] = AX_TOK_MASK;
    else if (u < 0.9)
      ids[i] =
          AX_TOK_SPECIALS +
          (int32_t)ax_rng_below(&r, (uint64_t)(c->vocab - AX_TOK_SPECIALS));
  }
  return nsp;
}

static int text_batch(const ax_dataset *ds, const int64_t *idx, int64_t n,
                      ax_tlist *inputs, ax_tlist *labels) {
  const text_ds *t = ds->priv;
  int64_t T = t->seq, bt[2] = {n, T}, flat[1] = {n * T}, bn[1] = {n};
  ax_tensor *ids = axi_tlist_push(inputs, AX_I32, 2, bt);
  ax_tensor *seg = ids ? axi_tlist_push(inputs, AX_I32, 2, bt) : NULL;
  ax_tensor *att = seg ? axi_tlist_push(inputs, AX_F32, 2, bt) : NULL;
  ax_tensor *mlm = att ? axi_tlist_push(labels, AX_I32, 1, flat) : NULL;
  ax_tensor *nsp = mlm ? axi_tlist_push(labels, AX_I32, 1, bn) : NULL;
  if (!nsp)
    return AX_ENOMEM;
#pragma omp parallel for schedule(static) if (n >= 16)
  for (int64_t b = 0; b < n; b++)
    ax_i32(nsp)[b] =
        make_example(t, idx[b], ax_i32(ids) + b * T, ax_i32(seg) + b * T,
                     ax_f32(att) + b * T, ax_i32(mlm) + b * T);
  return AX_OK;
}

const axi_dataset_ops axi_ds_gcide = {
    /* .name = */ "gcide",
    /* .open = */ text_open,
    /* .batch = */ text_batch,
    /* .close = */ text_close,
};

const axi_corpus *axi_text_corpus(const ax_dataset *ds) {
  return ds && ds->ops == &axi_ds_gcide ? &((const text_ds *)ds->priv)->c
                                        : NULL;
}

const char *ax_dataset_token(const ax_dataset *ds, int id) {
  const axi_corpus *c = axi_text_corpus(ds);
  if (!c)
    return axi_lm_token(ds, id);
  return id >= 0 && id < c->vocab ? c->tokens[id] : NULL;
}

int ax_dataset_token_id(const ax_dataset *ds, const char *tok) {
  const axi_corpus *c = axi_text_corpus(ds);
  if (!c || !tok)
    return -1;
  return axi_corpus_lookup(c, tok, strlen(tok));
}
