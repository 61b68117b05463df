/* The schedule text parser (sched_text.h): the header, the rank lines and
 * every check of one flushed mini-batch, each error at its line and
 * column. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/error.h"
#include "axon/runtime/pipeline/schedule/sched_text-impl.h"

/* What a unit of a stage has seen so far (bits of unit_seen). */
enum { SEEN_F = 1, SEEN_B = 2, SEEN_I = 4, SEEN_W = 8 };
enum { H_RANKS, H_STAGES, H_MICRO, H_PLACEMENT, H_UPDATE, H_MODE, H_COUNT };
static const char *const g_keys[H_COUNT] = {"ranks",     "stages", "micro",
                                            "placement", "update", "mode"};

typedef struct word { /* a word of a line: its bytes and column */
  const char *p;
  size_t n;
  size_t col;
} word;

typedef struct parser {
  const char *name;
  int line;
  int given[H_COUNT]; /* the line of each setting, 0: not given */
  int K, S, U, mode;  /* mode -1: the default */
  int place;          /* AX_PLACE_LOOP, AX_PLACE_V, or -1: explicit */
  int explicit_n, explicit_rank[AX_PIPE_PLAN_MAX_STAGES];
  int body; /* 1 once the first rank line was read */
  int rank_line[AX_PIPE_PLAN_MAX_STAGES]; /* the line of each rank, 0: none */
  unsigned char *seen;                    /* (S, U): SEEN_* of each unit */
  int step_seen[AX_PIPE_PLAN_MAX_STAGES];
  ax_pipe_sched *s;
  word *w; /* the words of the line (wcap of them) */
  int wcap;
} parser;

static int at(const parser *p, int err, size_t col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int at(const parser *p, int err, size_t col, const char *fmt, ...) {
  char m[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  return ax_seterr(err, "%.200s:%d:%zu: %s", p->name, p->line, col, m);
}

/* A whole decimal number of at most 6 digits in w, or -1. */
static long number(const char *s, size_t n) {
  if (n < 1 || n > 6)
    return -1;
  long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v;
}

static int word_is(const word *w, const char *s) {
  return w->n == strlen(s) && !memcmp(w->p, s, w->n);
}

/* Splits line[0 .. n) (its comment removed) into p->w, their count in
 * *nw; refuses a byte that is not printable outside a comment. */
static int split_words(parser *p, const char *line, size_t n, int *nw) {
  int k = 0;
  for (size_t i = 0; i < n;) {
    unsigned char c = (unsigned char)line[i];
    if (c == '#')
      break;
    if (c == ' ' || c == '\t' || c == '\r') {
      i++;
      continue;
    }
    size_t j = i;
    while (j < n && line[j] > ' ' && line[j] < 0x7f && line[j] != '#')
      j++;
    if (j == i)
      return at(p, AX_EFORMAT, i + 1, "unexpected byte 0x%02x", c);
    if (k == p->wcap) { /* a line of n bytes has at most n / 2 + 1 words */
      int cap = p->wcap ? 2 * p->wcap : 256;
      word *w = realloc(p->w, sizeof *w * (size_t)cap);
      if (!w)
        return ax_seterr(AX_ENOMEM, "schedule: out of memory");
      p->w = w;
      p->wcap = cap;
    }
    p->w[k++] = (word){line + i, j - i, i + 1};
    i = j;
  }
  *nw = k;
  return AX_OK;
}

/* One header line: w[0] is its key. */
static int header(parser *p, const word *w, int n) {
  int h = 0;
  while (h < H_COUNT && !word_is(&w[0], g_keys[h]))
    h++;
  if (h == H_COUNT)
    return at(p, AX_EFORMAT, w[0].col,
              "'%.*s': expected ranks, stages, micro, placement, update, "
              "mode or 'rank R:'",
              (int)(w[0].n > 40 ? 40 : w[0].n), w[0].p);
  if (p->body)
    return at(p, AX_EINVAL, w[0].col, "%s after the first rank line",
              g_keys[h]);
  if (p->given[h])
    return at(p, AX_EINVAL, w[0].col, "%s given twice (first on line %d)",
              g_keys[h], p->given[h]);
  p->given[h] = p->line;
  if (n < 2)
    return at(p, AX_EFORMAT, w[0].col + w[0].n, "%s needs a value", g_keys[h]);
  if (h == H_PLACEMENT && n == 2 &&
      (word_is(&w[1], "loop") || word_is(&w[1], "v"))) {
    p->place = word_is(&w[1], "v") ? AX_PLACE_V : AX_PLACE_LOOP;
    return AX_OK;
  }
  if (h == H_PLACEMENT) { /* every stage's rank */
    if (n - 1 > AX_PIPE_PLAN_MAX_STAGES)
      return at(p, AX_EINVAL, w[1].col, "placement of more than %d stages",
                AX_PIPE_PLAN_MAX_STAGES);
    for (int i = 1; i < n; i++) {
      long r = number(w[i].p, w[i].n);
      if (r < 0 || r >= AX_PIPE_PLAN_MAX_STAGES)
        return at(p, AX_EFORMAT, w[i].col,
                  "placement: expected loop, v or every stage's rank");
      p->explicit_rank[i - 1] = (int)r;
    }
    p->place = -1;
    p->explicit_n = n - 1;
    return AX_OK;
  }
  if (n > 2)
    return at(p, AX_EFORMAT, w[2].col, "%s takes one value", g_keys[h]);
  if (h == H_UPDATE)
    return word_is(&w[1], "flushed")
               ? AX_OK
               : at(p, AX_EINVAL, w[1].col,
                    "only 'update flushed' runs: an asynchronous mode's "
                    "lists span mini-batches, a schedule is one mini-batch");
  if (h == H_MODE) {
    char name[32];
    snprintf(name, sizeof name, "%.*s", (int)(w[1].n > 31 ? 31 : w[1].n),
             w[1].p);
    p->mode = ax_pipe_mode_index(name);
    if (p->mode < 0)
      return at(p, AX_EINVAL, w[1].col, "unknown mode '%s' (valid: %s)", name,
                ax_pipe_mode_list());
    if (!ax_pipe_flushes(p->mode))
      return at(p, AX_EINVAL, w[1].col,
                "mode %s does not flush: a schedule runs with a flushed "
                "mode's stages",
                name);
    return AX_OK;
  }
  long v = number(w[1].p, w[1].n);
  long hi = h == H_MICRO ? AX_PIPE_SCHED_MAX_UNITS : AX_PIPE_PLAN_MAX_STAGES;
  if (v < 0)
    return at(p, AX_EFORMAT, w[1].col, "%s: expected a number", g_keys[h]);
  if (v < 1 || v > hi)
    return at(p, AX_EINVAL, w[1].col, "%s: expected a number in 1..%ld",
              g_keys[h], hi);
  *(h == H_RANKS ? &p->K : h == H_STAGES ? &p->S : &p->U) = (int)v;
  return AX_OK;
}

/* The header is complete (at the first rank line, column col): the
 * stages, their ranks, the mode; the lists' room. */
static int header_done(parser *p, size_t col) {
  if (!p->given[H_RANKS] || !p->given[H_MICRO])
    return at(p, AX_EINVAL, col,
              "the header needs 'ranks K' and 'micro U' "
              "before the first rank line");
  int K = p->K, S = p->given[H_STAGES]       ? p->S
                    : p->place == AX_PLACE_V ? 2 * K
                    : p->place < 0           ? p->explicit_n
                                             : K;
  int pl = p->given[H_PLACEMENT];
  if (p->given[H_STAGES] && p->place < 0 && S != p->explicit_n)
    return ax_seterr(AX_EINVAL,
                     "%.200s:%d:1: placement names %d stages, "
                     "stages says %d",
                     p->name, pl, p->explicit_n, S);
  if (S < K || S > AX_PIPE_PLAN_MAX_STAGES ||
      (p->place == AX_PLACE_V && S != 2 * K))
    return ax_seterr(AX_EINVAL,
                     "%.200s:%d:1: %d stages on %d ranks (at least one per "
                     "rank, at most %d; a V has 2K)",
                     p->name, p->given[H_STAGES] ? p->given[H_STAGES] : pl, S,
                     K, AX_PIPE_PLAN_MAX_STAGES);
  p->S = S;
  int held[AX_PIPE_PLAN_MAX_STAGES] = {0};
  for (int i = 0; i < S; i++) {
    int r = p->place < 0             ? p->explicit_rank[i]
            : p->place == AX_PLACE_V ? (i < K ? i : 2 * K - 1 - i)
                                     : i % K;
    if (r >= K)
      return ax_seterr(AX_EINVAL,
                       "%.200s:%d:1: placement puts stage %d on "
                       "rank %d of %d",
                       p->name, pl, i, r, K);
    p->s->stage_rank[i] = r;
    held[r]++;
  }
  for (int r = 0; r < K; r++)
    if (!held[r])
      return ax_seterr(AX_EINVAL, "%.200s:%d:1: rank %d holds no stage",
                       p->name, pl ? pl : p->given[H_RANKS], r);
  if (p->mode >= 0 && ax_pipe_units(p->mode, p->U) != p->U)
    return ax_seterr(AX_EINVAL,
                     "%.200s:%d:1: mode %s runs %d unit(s) per "
                     "mini-batch, micro says %d",
                     p->name, p->given[H_MODE], ax_pipe_mode_name(p->mode),
                     ax_pipe_units(p->mode, p->U), p->U);
  p->s->K = K;
  p->s->S = S;
  p->s->U = p->U;
  p->seen = calloc((size_t)S * (size_t)p->U, 1);
  for (int r = 0; r < K; r++)
    p->s->ops[r] =
        malloc(sizeof(ax_pipe_op) * (size_t)held[r] * (3 * (size_t)p->U + 1));
  for (int r = 0; r < K; r++)
    if (!p->s->ops[r])
      return ax_seterr(AX_ENOMEM, "schedule: out of memory");
  p->body = 1;
  return p->seen ? AX_OK : ax_seterr(AX_ENOMEM, "schedule: out of memory");
}

/* One action "<stage><F|B|I|W><micro>" or "STEP<stage>" at q[0 .. n). */
static int action(const parser *p, const char *q, size_t n, size_t col,
                  ax_pipe_op *o) {
  *o = (ax_pipe_op){0};
  if (n > 4 && !memcmp(q, "STEP", 4)) {
    o->kind = AX_OP_STEP;
    o->stage = (int)number(q + 4, n - 4);
  } else {
    size_t i = 0;
    while (i < n && q[i] >= '0' && q[i] <= '9')
      i++;
    const char *kinds = "FBIW", *k = i < n ? memchr(kinds, q[i], 4) : NULL;
    if (!k || !i)
      return at(p, AX_EFORMAT, col,
                "'%.*s': expected <stage><F|B|I|W><micro> (0F3), STEP<stage> "
                "or a composite 0F3+7B1",
                (int)(n > 40 ? 40 : n), q);
    o->kind = (int)(k - kinds); /* AX_OP_FWD, BWD, INPUT_GRAD, WEIGHT_GRAD */
    o->stage = (int)number(q, i);
    o->micro = (int)number(q + i + 1, n - i - 1);
    if (o->micro < 0)
      return at(p, AX_EFORMAT, col, "'%.*s': expected a micro-batch number",
                (int)(n > 40 ? 40 : n), q);
  }
  if (o->stage < 0 || o->stage >= p->S)
    return at(p, AX_EINVAL, col, "'%.*s': stage outside 0..%d",
              (int)(n > 40 ? 40 : n), q, p->S - 1);
  if (o->micro >= p->U)
    return at(p, AX_EINVAL, col, "'%.*s': micro-batch outside 0..%d",
              (int)(n > 40 ? 40 : n), q, p->U - 1);
  return AX_OK;
}

/* Checks action o of rank r (at col) against what its stage saw, and
 * books it. */
static int book(parser *p, int r, const ax_pipe_op *o, size_t col) {
  static const char kc[] = "FBIW";
  int s = o->stage, u = o->micro;
  if (p->s->stage_rank[s] != r)
    return at(p, AX_EINVAL, col,
              "rank %d does not hold stage %d (rank %d "
              "does)",
              r, s, p->s->stage_rank[s]);
  if (p->step_seen[s] && o->kind == AX_OP_STEP)
    return at(p, AX_EINVAL, col, "STEP%d twice (first at column %d)", s,
              p->step_seen[s]);
  if (p->step_seen[s])
    return at(p, AX_EINVAL, col,
              "stage %d acts after its STEP%d (column "
              "%d): the update ends the mini-batch",
              s, s, p->step_seen[s]);
  if (o->kind == AX_OP_STEP) {
    p->step_seen[s] = (int)col;
    return AX_OK;
  }
  unsigned char *seen = &p->seen[(size_t)s * p->U + u];
  static const unsigned char bit[4] = {SEEN_F, SEEN_B, SEEN_I, SEEN_W};
  char k = kc[o->kind];
  if (*seen & bit[o->kind])
    return at(p, AX_EINVAL, col, "%d%c%d twice", s, k, u);
  if (o->kind == AX_OP_FWD && (*seen & (SEEN_B | SEEN_I)))
    return at(p, AX_EINVAL, col,
              "%dF%d after its backward %d%c%d: a unit's "
              "forward comes first",
              s, u, s, *seen & SEEN_B ? 'B' : 'I', u);
  if (o->kind == AX_OP_BWD && (*seen & (SEEN_I | SEEN_W)))
    return at(p, AX_EINVAL, col,
              "%dB%d mixed with %dI%d: a unit's backward "
              "is B, or I and W",
              s, u, s, u);
  if (o->kind >= AX_OP_INPUT_GRAD && (*seen & SEEN_B))
    return at(p, AX_EINVAL, col,
              "%d%c%d mixed with %dB%d: a unit's "
              "backward is B, or I and W",
              s, k, u, s, u);
  if (o->kind == AX_OP_WEIGHT_GRAD && !(*seen & SEEN_I))
    return at(p, AX_EINVAL, col, "%dW%d before its input half %dI%d", s, u, s,
              u);
  if (o->kind >= AX_OP_INPUT_GRAD && p->mode >= 0 &&
      !ax_pipe_mode_get(p->mode)->split)
    return at(p, AX_EINVAL, col,
              "%d%c%d: mode %s (line %d) does not split "
              "the backward; name a split mode (zb-h1, zbv) or none",
              s, k, u, ax_pipe_mode_name(p->mode), p->given[H_MODE]);
  p->s->split |= o->kind >= AX_OP_INPUT_GRAD;
  *seen |= bit[o->kind];
  return AX_OK;
}

/* Every stage rank r holds has each unit's F and B (or I and W) and its
 * STEP; col: the end of the rank's line. */
static int rank_done(const parser *p, int r, size_t col) {
  for (int s = 0; s < p->S; s++) {
    if (p->s->stage_rank[s] != r)
      continue;
    for (int u = 0; u < p->U; u++) {
      unsigned char seen = p->seen[(size_t)s * p->U + u];
      if (!(seen & SEEN_F))
        return at(p, AX_EINVAL, col, "rank %d: no %dF%d", r, s, u);
      if (!(seen & (SEEN_B | SEEN_I)))
        return at(p, AX_EINVAL, col,
                  "rank %d: no %dB%d (nor %dI%d and "
                  "%dW%d)",
                  r, s, u, s, u, s, u);
      if ((seen & SEEN_I) && !(seen & SEEN_W))
        return at(p, AX_EINVAL, col, "rank %d: %dI%d has no %dW%d", r, s, u, s,
                  u);
    }
    if (!p->step_seen[s])
      return at(p, AX_EINVAL, col, "rank %d: no STEP%d", r, s);
  }
  return AX_OK;
}

/* "rank R:" then the actions; w[0] is "rank". */
static int rank_line(parser *p, const word *w, int n) {
  if (!p->body)
    AX_TRY(header_done(p, w[0].col));
  long r = -1;
  if (n >= 2 && w[1].n >= 2 && w[1].p[w[1].n - 1] == ':')
    r = number(w[1].p, w[1].n - 1);
  if (r < 0)
    return at(p, AX_EFORMAT, n >= 2 ? w[1].col : w[0].col + 4,
              "expected 'rank R:'");
  if (r >= p->K)
    return at(p, AX_EINVAL, w[1].col, "rank %ld of %d ranks", r, p->K);
  if (p->rank_line[r])
    return at(p, AX_EINVAL, w[0].col, "rank %ld twice (first on line %d)", r,
              p->rank_line[r]);
  p->rank_line[r] = p->line;
  ax_pipe_sched *s = p->s;
  for (int i = 2; i < n; i++) {
    const char *plus = memchr(w[i].p, '+', w[i].n);
    size_t n1 = plus ? (size_t)(plus - w[i].p) : w[i].n;
    ax_pipe_op o[2];
    AX_TRY(action(p, w[i].p, n1, w[i].col, &o[0]));
    int parts = 1;
    if (plus) {
      size_t n2 = w[i].n - n1 - 1, c2 = w[i].col + n1 + 1;
      if (memchr(plus + 1, '+', n2))
        return at(p, AX_EFORMAT, w[i].col, "a composite joins two actions");
      AX_TRY(action(p, plus + 1, n2, c2, &o[1]));
      if (o[0].kind == AX_OP_STEP || o[1].kind == AX_OP_STEP)
        return at(p, AX_EINVAL, w[i].col,
                  "a composite joins two actions, "
                  "neither a STEP");
      o[0].with_next = 1;
      parts = 2;
    }
    for (int j = 0; j < parts; j++) {
      AX_TRY(book(p, (int)r, &o[j], j ? w[i].col + n1 + 1 : w[i].col));
      s->ops[r][s->len[r]++] = o[j];
    }
  }
  return rank_done(p, (int)r, w[n - 1].col + w[n - 1].n);
}

static int parse_lines(parser *p, const char *text, size_t len) {
  /* A UTF-8 byte-order mark (some editors start every file with one) is
   * not part of the first line: its columns count after it. */
  size_t start = len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3) ? 3 : 0;
  for (size_t i = start; i < len;) {
    const char *nl = memchr(text + i, '\n', len - i);
    size_t n = nl ? (size_t)(nl - (text + i)) : len - i;
    p->line++;
    int k = 0;
    AX_TRY(split_words(p, text + i, n, &k));
    i += n + (nl != NULL);
    if (k == 0)
      continue;
    const word *w = p->w;
    AX_TRY(word_is(&w[0], "rank") ? rank_line(p, w, k) : header(p, w, k));
  }
  p->line++; /* errors at the end: the line after the last */
  if (!p->body)
    AX_TRY(header_done(p, 1));
  for (int r = 0; r < p->K; r++)
    if (!p->rank_line[r])
      return at(p, AX_EINVAL, 1, "no line for rank %d", r);
  if (p->mode < 0)
    p->mode = p->s->split ? AX_MODE_ZBH1 : AX_MODE_1F1B;
  p->s->mode = p->mode;
  return AX_OK;
}

int ax_pipe_sched_parse(const char *text, size_t len, const char *name,
                        ax_pipe_sched **out) {
  *out = NULL;
  parser p = {
      .name = name ? name : "schedule", .mode = -1, .place = AX_PLACE_LOOP};
  if (!text && len)
    return ax_seterr(AX_EINVAL, "%.200s: no text", p.name);
  if (len > AX_PIPE_SCHED_MAX_BYTES)
    return ax_seterr(AX_EFORMAT, "%.200s: %zu bytes, at most %d", p.name, len,
                     AX_PIPE_SCHED_MAX_BYTES);
  if (!(p.s = axi_pipe_sched_alloc()))
    return ax_seterr(AX_ENOMEM, "schedule: out of memory");
  int err = parse_lines(&p, text, len);
  free(p.seen);
  free(p.w);
  if (err != AX_OK) {
    ax_pipe_sched_free(p.s);
    return err;
  }
  *out = p.s;
  return AX_OK;
}

int ax_pipe_sched_load(const char *path, ax_pipe_sched **out) {
  *out = NULL;
  FILE *f = path ? fopen(path, "rb") : NULL;
  if (!f)
    return ax_seterr(AX_EIO, "schedule %.300s: cannot open: %s",
                     path ? path : "", path ? strerror(errno) : "no path");
  char *buf = malloc(AX_PIPE_SCHED_MAX_BYTES + 1);
  size_t n = buf ? fread(buf, 1, AX_PIPE_SCHED_MAX_BYTES + 1, f) : 0;
  int bad = ferror(f) ? (errno ? errno : EIO) : 0; /* a directory: EISDIR */
  fclose(f);
  int err = !buf  ? ax_seterr(AX_ENOMEM, "schedule: out of memory")
            : bad ? ax_seterr(AX_EIO, "schedule %.300s: cannot read: %s", path,
                              strerror(bad))
                  : ax_pipe_sched_parse(buf, n, path, out);
  free(buf);
  return err;
}
