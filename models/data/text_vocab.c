/* Sentences as token ids and the frequency-ranked vocabulary (text-impl.h).
 *
 * Pass 1 interns every token in a hash table (raw ids in order of first
 * appearance) while recording the sentences. Pass 2 counts the tokens of the
 * train sentences, ranks them (count descending, then byte order), keeps the
 * top ones and rewrites the sentences with final ids. */
#include <stdlib.h>
#include <string.h>

#include "axon/models/data/text-impl.h"

static const char *const specials[AX_TOK_SPECIALS] = {"[PAD]", "[UNK]", "[CLS]",
                                                      "[SEP]", "[MASK]"};

typedef struct entry {
  int64_t off; /* into the arena */
  int32_t len;
  uint32_t hash;
  int64_t count;
} entry;

typedef struct builder {
  char *arena;
  int64_t arena_n, arena_cap;
  entry *ent;
  int32_t n_ent, ent_cap;
  int32_t *table; /* raw ids + 1; 0 = empty */
  uint32_t mask;
  int32_t *ids;
  int64_t n_ids, ids_cap;
  int64_t *start;
  int64_t n_sent, start_cap;
  int64_t sent_words; /* word tokens in the open sentence */
  int oom;
} builder;

static uint32_t hash_bytes(const char *s, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)s[i]) * 16777619u;
  return h;
}

/* Grows *p (elements of size sz, capacity *cap) to hold need elements. */
static int grow(void **p, int64_t *cap, int64_t need, size_t sz) {
  if (need <= *cap)
    return 1;
  int64_t nc = *cap ? *cap : 1024;
  while (nc < need)
    nc *= 2;
  void *q = realloc(*p, (size_t)nc * sz);
  if (!q)
    return 0;
  *p = q;
  *cap = nc;
  return 1;
}

static int rehash(builder *b, uint32_t size) {
  int32_t *t = calloc(size, sizeof *t);
  if (!t)
    return 0;
  for (int32_t i = 0; i < b->n_ent; i++) {
    uint32_t k = b->ent[i].hash & (size - 1);
    while (t[k])
      k = (k + 1) & (size - 1);
    t[k] = i + 1;
  }
  free(b->table);
  b->table = t;
  b->mask = size - 1;
  return 1;
}

static int32_t intern(builder *b, const char *s, size_t n) {
  uint32_t h = hash_bytes(s, n), k = h & b->mask;
  for (; b->table[k]; k = (k + 1) & b->mask) {
    entry *e = &b->ent[b->table[k] - 1];
    if (e->hash == h && (size_t)e->len == n &&
        memcmp(b->arena + e->off, s, n) == 0)
      return b->table[k] - 1;
  }
  int64_t ecap = b->ent_cap;
  if (!grow((void **)&b->ent, &ecap, b->n_ent + 1, sizeof *b->ent) ||
      !grow((void **)&b->arena, &b->arena_cap, b->arena_n + (int64_t)n + 1, 1))
    return -1;
  b->ent_cap = (int32_t)ecap;
  entry *e = &b->ent[b->n_ent];
  e->off = b->arena_n;
  e->len = (int32_t)n;
  e->hash = h;
  e->count = 0;
  memcpy(b->arena + b->arena_n, s, n);
  b->arena[b->arena_n + (int64_t)n] = '\0';
  b->arena_n += (int64_t)n + 1;
  b->table[k] = ++b->n_ent;
  if ((uint32_t)b->n_ent * 2 > b->mask && !rehash(b, (b->mask + 1) * 2))
    return -1;
  return b->n_ent - 1;
}

/* Keeps the open sentence when it has at least 3 tokens and 2 words. */
static void close_sentence(builder *b) {
  int64_t s0 = b->start[b->n_sent];
  if (b->n_ids - s0 >= 3 && b->sent_words >= 2) {
    if (!grow((void **)&b->start, &b->start_cap, b->n_sent + 2,
              sizeof *b->start)) {
      b->oom = 1;
      return;
    }
    b->start[++b->n_sent] = b->n_ids;
  } else {
    b->n_ids = s0;
  }
  b->sent_words = 0;
}

static void on_token(const char *tok, size_t n, int eos, void *arg) {
  builder *b = arg;
  if (b->oom)
    return;
  int32_t id = intern(b, tok, n);
  if (id < 0 ||
      !grow((void **)&b->ids, &b->ids_cap, b->n_ids + 1, sizeof *b->ids)) {
    b->oom = 1;
    return;
  }
  b->ids[b->n_ids++] = id;
  unsigned char c = (unsigned char)tok[0];
  b->sent_words +=
      (c >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z'));
  if (eos)
    close_sentence(b);
}

/* Orders raw ids by count (descending), then by their bytes. */
static int rank_cmp(const void *pa, const void *pb, void *arg) {
  const builder *rank_ctx = arg;
  const entry *a = &rank_ctx->ent[*(const int32_t *)pa];
  const entry *b = &rank_ctx->ent[*(const int32_t *)pb];
  if (a->count != b->count)
    return a->count > b->count ? -1 : 1;
  return strcmp(rank_ctx->arena + a->off, rank_ctx->arena + b->off);
}

static void builder_free(builder *b) {
  free(b->arena);
  free(b->ent);
  free(b->table);
  free(b->ids);
  free(b->start);
}

/* Builds the final vocabulary strings and lookup table from ranked ids. */
static int finish_vocab(axi_corpus *c, const builder *b, const int32_t *order,
                        int keep) {
  c->vocab = AX_TOK_SPECIALS + keep;
  size_t bytes = 0;
  for (int i = 0; i < AX_TOK_SPECIALS; i++)
    bytes += strlen(specials[i]) + 1;
  for (int i = 0; i < keep; i++)
    bytes += (size_t)b->ent[order[i]].len + 1;
  uint32_t size = 1;
  while (size < (uint32_t)c->vocab * 2)
    size *= 2;
  c->arena = malloc(bytes);
  c->tokens = malloc(sizeof *c->tokens * (size_t)c->vocab);
  c->table = calloc(size, sizeof *c->table);
  if (!c->arena || !c->tokens || !c->table)
    return ax_seterr(AX_ENOMEM, "text: out of memory for the vocabulary");
  c->mask = size - 1;
  char *p = c->arena;
  for (int id = 0; id < c->vocab; id++) {
    const char *s = id < AX_TOK_SPECIALS
                        ? specials[id]
                        : b->arena + b->ent[order[id - AX_TOK_SPECIALS]].off;
    size_t n = strlen(s);
    memcpy(p, s, n + 1);
    c->tokens[id] = p;
    p += n + 1;
    uint32_t k = hash_bytes(s, n) & c->mask;
    while (c->table[k])
      k = (k + 1) & c->mask;
    c->table[k] = id + 1;
  }
  return AX_OK;
}

int axi_corpus_build(const char *text, size_t len, int max_vocab,
                     double test_frac, axi_corpus *out) {
  memset(out, 0, sizeof *out);
  if (max_vocab <= AX_TOK_SPECIALS)
    return ax_seterr(AX_EINVAL,
                     "text: vocab=%d leaves no room beside the "
                     "%d special tokens",
                     max_vocab, AX_TOK_SPECIALS);
  builder b = {0};
  b.start = malloc(sizeof *b.start * 1024);
  b.start_cap = 1024;
  b.oom = !b.start || !rehash(&b, 1u << 16);
  if (!b.oom)
    b.start[0] = 0;
  for (size_t pos = 0; pos < len && !b.oom;) {
    const char *nl = memchr(text + pos, '\n', len - pos);
    size_t end = nl ? (size_t)(nl - text) : len;
    axi_tokenize_line(text + pos, end - pos, on_token, &b);
    if (!b.oom)
      close_sentence(&b); /* a paragraph end ends a sentence */
    pos = end + 1;
  }
  int rc = AX_OK;
  if (b.oom)
    rc = ax_seterr(AX_ENOMEM, "text: out of memory while tokenizing");
  else if (b.n_sent < 4)
    rc = ax_seterr(AX_EFORMAT, "text: only %lld sentences found (need 4)",
                   (long long)b.n_sent);
  int32_t *order = NULL, *remap = NULL;
  if (rc == AX_OK) {
    int64_t n_test = (int64_t)(test_frac * (double)b.n_sent);
    if (n_test < 2)
      n_test = 2;
    if (b.n_sent - n_test < 2)
      n_test = b.n_sent - 2;
    out->n_sent = b.n_sent;
    out->n_train = b.n_sent - n_test;
    for (int64_t i = 0; i < b.start[out->n_train]; i++)
      b.ent[b.ids[i]].count++;
    order = malloc(sizeof *order * (size_t)(b.n_ent + 1));
    remap = malloc(sizeof *remap * (size_t)(b.n_ent + 1));
    if (!order || !remap)
      rc = ax_seterr(AX_ENOMEM, "text: out of memory for the vocabulary");
  }
  if (rc == AX_OK) {
    int n = 0;
    for (int32_t i = 0; i < b.n_ent; i++)
      if (b.ent[i].count > 0)
        order[n++] = i;
    qsort_r(order, (size_t)n, sizeof *order, rank_cmp, &b);
    int keep =
        n < max_vocab - AX_TOK_SPECIALS ? n : max_vocab - AX_TOK_SPECIALS;
    for (int32_t i = 0; i < b.n_ent; i++)
      remap[i] = AX_TOK_UNK;
    for (int i = 0; i < keep; i++)
      remap[order[i]] = AX_TOK_SPECIALS + i;
    for (int64_t i = 0; i < b.n_ids; i++)
      b.ids[i] = remap[b.ids[i]];
    rc = finish_vocab(out, &b, order, keep);
  }
  free(order);
  free(remap);
  if (rc == AX_OK) {
    out->ids = b.ids;
    out->start = b.start;
    b.ids = NULL;
    b.start = NULL;
  }
  builder_free(&b);
  if (rc != AX_OK)
    axi_corpus_free(out);
  return rc;
}

void axi_corpus_free(axi_corpus *c) {
  if (!c)
    return;
  free(c->ids);
  free(c->start);
  free(c->tokens);
  free(c->arena);
  free(c->table);
  memset(c, 0, sizeof *c);
}

int axi_corpus_lookup(const axi_corpus *c, const char *tok, size_t len) {
  if (!c->table)
    return AX_TOK_UNK;
  uint32_t k = hash_bytes(tok, len) & c->mask;
  for (; c->table[k]; k = (k + 1) & c->mask) {
    const char *s = c->tokens[c->table[k] - 1];
    if (strlen(s) == len && memcmp(s, tok, len) == 0)
      return c->table[k] - 1;
  }
  return AX_TOK_UNK;
}
