/* Typed stage messages (stage_msg-impl.h): one table of fields per
 * message, and one encoder and one bounds-checked decoder that walk it. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "axon/runtime/pipeline/schedule/mode.h"
#include "axon/runtime/pipeline/stage/stage_host.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"

/* How a field travels. */
enum {
  K_I64,     /* an i64 in [lo, hi] */
  K_F64,     /* an f64 */
  K_STR,     /* a string of lo .. hi characters */
  K_BYTES,   /* bytes, at most hi */
  K_TENSOR,  /* a tensor */
  K_RREF,    /* an RRef, or i64 0 for none (NULL) */
  K_TLIST,   /* [n in lo .. hi, n tensors] (ax_tlist) */
  K_LABELS,  /* [n in lo .. hi, n tensors, n i64 >= 0] (axi_pipe_labels) */
  K_MEMBERS, /* [n in lo .. hi, rank in 0 .. n - 1, tag, n names]
              * (axi_pipe_group) */
  K_TIES,    /* [n in lo .. hi, n x (tie, a group of 2 as K_MEMBERS)]
              * (axi_pipe_ties) */
  K_OPT,     /* an optional part starts: its int has_ flag at off; on the
              * wire its name (a string, the field's name), then the fields
              * up to the next K_OPT */
};

typedef struct field {
  const char *name;
  int kind;
  size_t off;
  int64_t lo, hi;
} field;

typedef struct message {
  const char *name;
  size_t size; /* of its struct */
  const field *f;
  int nf;
} message;

/* A refusal naming the message, the field and the value's index:
 * AX_EBADARG for a list received, AX_EINVAL for a struct to send. */
static int bad(int code, const message *m, const field *f, size_t at,
               const char *fmt, ...) {
  char d[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d, sizeof d, fmt, ap);
  va_end(ap);
  return ax_seterr(code, "%s: %s (value %zu): %s", m->name,
                   f ? f->name : "the list", at, d);
}

static int range(int code, const message *m, const field *f, size_t at,
                 int64_t x, int64_t lo, int64_t hi) {
  if (x >= lo && x <= hi)
    return AX_OK;
  return bad(code, m, f, at, "%lld is out of range %lld..%lld", (long long)x,
             (long long)lo, (long long)hi);
}

/* Decoding. */
typedef struct rd { /* a cursor over a received list */
  const message *m;
  const field *f;
  const ax_values *v;
  size_t at, n;
} rd;

/* The value at the cursor has type t (or a refusal naming what it is). */
static int want(rd *r, ax_value_type t) {
  if (r->at >= r->n)
    return bad(AX_EBADARG, r->m, r->f, r->at,
               "missing (the list has %zu values)", r->n);
  ax_value_type have = ax_values_type(r->v, r->at);
  if (have != t)
    return bad(AX_EBADARG, r->m, r->f, r->at, "%s, expected %s",
               ax_value_type_name(have), ax_value_type_name(t));
  return AX_OK;
}

static int rd_i64(rd *r, int64_t lo, int64_t hi, int64_t *x) {
  AX_TRY(want(r, AX_VAL_I64));
  AX_TRY(ax_values_get_i64(r->v, r->at, x));
  AX_TRY(range(AX_EBADARG, r->m, r->f, r->at, *x, lo, hi));
  r->at++;
  return AX_OK;
}

static int rd_str(rd *r, int64_t lo, int64_t hi, const char **s) {
  AX_TRY(want(r, AX_VAL_STR));
  AX_TRY(ax_values_get_str(r->v, r->at, s));
  size_t len = strlen(*s);
  if ((int64_t)len < lo || (uint64_t)len > (uint64_t)hi)
    return bad(AX_EBADARG, r->m, r->f, r->at,
               "a string of %zu characters, expected %lld..%lld", len,
               (long long)lo, (long long)hi);
  r->at++;
  return AX_OK;
}

static int rd_tensor(rd *r, ax_tensor **t) {
  AX_TRY(want(r, AX_VAL_TENSOR));
  AX_TRY(ax_values_get_tensor(r->v, r->at, t));
  r->at++;
  return AX_OK;
}

/* An RRef, or i64 0 for none (K_RREF). */
static int rd_rref(rd *r, ax_rref **out) {
  *out = NULL;
  ax_value_type t = ax_values_type(r->v, r->at);
  int64_t zero = 1;
  if (t == AX_VAL_I64 && ax_values_get_i64(r->v, r->at, &zero) == AX_OK &&
      zero == 0) {
    r->at++;
    return AX_OK;
  }
  if (r->at >= r->n)
    return bad(AX_EBADARG, r->m, r->f, r->at,
               "missing, expected an RRef or i64 0");
  if (t == AX_VAL_EXT && ax_values_get_rref(r->v, r->at, out) == AX_OK) {
    r->at++;
    return AX_OK;
  }
  const char *have = t == AX_VAL_EXT   ? "an extension value"
                     : t == AX_VAL_I64 ? "an i64 other than 0"
                                       : ax_value_type_name(t);
  return bad(AX_EBADARG, r->m, r->f, r->at, "%s, expected an RRef or i64 0",
             have);
}

static int rd_tensors(rd *r, int64_t n, ax_tlist *l) {
  for (l->n = 0; l->n < n; l->n++)
    AX_TRY(rd_tensor(r, &l->t[l->n]));
  return AX_OK;
}

/* [n in lo .. hi, rank in 0 .. n - 1, tag, n names] (axi_pipe_group). */
static int rd_group(rd *r, int64_t lo, int64_t hi, axi_pipe_group *g) {
  AX_TRY(rd_i64(r, lo, hi, &g->n));
  AX_TRY(rd_i64(r, 0, g->n - 1, &g->rank));
  AX_TRY(rd_str(r, 0, INT64_MAX, &g->tag));
  for (int64_t i = 0; i < g->n; i++)
    AX_TRY(rd_str(r, 0, INT64_MAX, &g->names[i]));
  return AX_OK;
}

static int rd_field(rd *r, char *p) {
  const field *f = r->f;
  int64_t n;
  switch (f->kind) {
  case K_I64:
    return rd_i64(r, f->lo, f->hi, (int64_t *)p);
  case K_F64:
    AX_TRY(want(r, AX_VAL_F64));
    return ax_values_get_f64(r->v, r->at++, (double *)p);
  case K_STR:
    return rd_str(r, f->lo, f->hi, (const char **)p);
  case K_BYTES: {
    axi_pipe_bytes *b = (axi_pipe_bytes *)p;
    AX_TRY(want(r, AX_VAL_BYTES));
    AX_TRY(ax_values_get_bytes(r->v, r->at, &b->p, &b->n));
    if ((uint64_t)b->n > (uint64_t)f->hi)
      return bad(AX_EBADARG, r->m, f, r->at, "%zu bytes, at most %lld", b->n,
                 (long long)f->hi);
    r->at++;
    return AX_OK;
  }
  case K_TENSOR:
    return rd_tensor(r, (ax_tensor **)p);
  case K_RREF:
    return rd_rref(r, (ax_rref **)p);
  case K_TLIST:
    AX_TRY(rd_i64(r, f->lo, f->hi, &n));
    return rd_tensors(r, n, (ax_tlist *)p);
  case K_LABELS: {
    axi_pipe_labels *l = (axi_pipe_labels *)p;
    AX_TRY(rd_i64(r, f->lo, f->hi, &n));
    AX_TRY(rd_tensors(r, n, &l->t));
    for (int64_t i = 0; i < n; i++)
      AX_TRY(rd_i64(r, 0, INT64_MAX, &l->norm[i]));
    return AX_OK;
  }
  case K_MEMBERS:
    return rd_group(r, f->lo, f->hi, (axi_pipe_group *)p);
  case K_TIES: {
    axi_pipe_ties *t = (axi_pipe_ties *)p;
    AX_TRY(rd_i64(r, f->lo, f->hi, &t->n));
    for (int64_t i = 0; i < t->n; i++) {
      AX_TRY(rd_i64(r, 0, AX_MODEL_MAX_TIES - 1, &t->t[i].tie));
      AX_TRY(rd_group(r, 2, 2, &t->t[i].g));
    }
    return AX_OK;
  }
  }
  return ax_seterr(AX_EINTERNAL, "%s: field %s", r->m->name, f->name);
}

/* The name of an optional part at the cursor (r->at < r->n): one of the
 * message's K_OPT fields not yet read (seen, by field index) that comes
 * after the last one read (field index last; -1: none) in the table.
 * *part: its field index. */
static int rd_part(rd *r, int last, uint64_t seen, int *part) {
  const message *m = r->m;
  r->f = NULL;
  int parts = 0;
  for (int k = 0; k < m->nf; k++)
    parts += m->f[k].kind == K_OPT;
  if (!parts)
    return bad(AX_EBADARG, m, NULL, r->at, "%zu values, %zu more than it holds",
               r->n, r->n - r->at);
  ax_value_type t = ax_values_type(r->v, r->at);
  const char *name;
  if (t != AX_VAL_STR || ax_values_get_str(r->v, r->at, &name) != AX_OK)
    return bad(AX_EBADARG, m, NULL, r->at,
               "%s, expected the name of an optional part",
               ax_value_type_name(t));
  for (int k = 0; k < m->nf; k++) {
    if (m->f[k].kind != K_OPT || strcmp(m->f[k].name, name) != 0)
      continue;
    r->f = &m->f[k];
    if (seen >> k & 1)
      return bad(AX_EBADARG, m, r->f, r->at, "the optional part is repeated");
    if (k < last)
      return bad(AX_EBADARG, m, r->f, r->at, "out of order: it comes before %s",
                 m->f[last].name);
    *part = k;
    r->at++;
    return AX_OK;
  }
  return bad(AX_EBADARG, m, NULL, r->at, "unknown optional part '%.40s'", name);
}

/* Reads the fields from index i up to the next optional part or the end. */
static int rd_fields(rd *r, int i, void *out) {
  for (; i < r->m->nf && r->m->f[i].kind != K_OPT; i++) {
    r->f = &r->m->f[i];
    AX_TRY(rd_field(r, (char *)out + r->f->off));
  }
  return AX_OK;
}

static int decode(const message *m, const ax_values *v, void *out) {
  if (out)
    memset(out, 0, m->size);
  rd r = {m, NULL, v, 0, ax_values_count(v)};
  int part = -1;
  uint64_t seen = 0; /* the optional parts read, by field index */
  AX_TRY(rd_fields(&r, 0, out));
  while (r.at < r.n) { /* named optional parts, in the table's order */
    AX_TRY(rd_part(&r, part, seen, &part));
    seen |= (uint64_t)1 << part;
    *(int *)((char *)out + m->f[part].off) = 1;
    AX_TRY(rd_fields(&r, part + 1, out));
  }
  return AX_OK;
}

/* Encoding. */
typedef struct wr { /* a message being appended */
  const message *m;
  const field *f;
  ax_values *out;
  size_t at; /* values of the message appended so far */
} wr;

static int wr_i64(wr *w, int64_t x, int64_t lo, int64_t hi) {
  AX_TRY(range(AX_EINVAL, w->m, w->f, w->at, x, lo, hi));
  w->at++;
  return ax_values_add_i64(w->out, x);
}

static int wr_str(wr *w, const char *s, int64_t lo, int64_t hi) {
  size_t len = s ? strlen(s) : 0;
  if (!s || (int64_t)len < lo || (uint64_t)len > (uint64_t)hi)
    return bad(AX_EINVAL, w->m, w->f, w->at,
               "no string or %zu characters, expected %lld..%lld", len,
               (long long)lo, (long long)hi);
  w->at++;
  return ax_values_add_str(w->out, s);
}

static int wr_tensor(wr *w, ax_tensor *t) {
  if (!t)
    return bad(AX_EINVAL, w->m, w->f, w->at, "no tensor");
  w->at++;
  return ax_values_add_tensor(w->out, t);
}

/* The count, then the tensors. */
static int wr_tensors(wr *w, const ax_tlist *l, int64_t lo, int64_t hi) {
  AX_TRY(wr_i64(w, l->n, lo, hi));
  for (int i = 0; i < l->n; i++)
    AX_TRY(wr_tensor(w, l->t[i]));
  return AX_OK;
}

static int wr_group(wr *w, int64_t lo, int64_t hi, const axi_pipe_group *g) {
  AX_TRY(wr_i64(w, g->n, lo, hi));
  AX_TRY(wr_i64(w, g->rank, 0, g->n - 1));
  AX_TRY(wr_str(w, g->tag, 0, INT64_MAX));
  for (int64_t i = 0; i < g->n; i++)
    AX_TRY(wr_str(w, g->names[i], 0, INT64_MAX));
  return AX_OK;
}

static int wr_field(wr *w, const char *p) {
  const field *f = w->f;
  switch (f->kind) {
  case K_I64:
    return wr_i64(w, *(const int64_t *)p, f->lo, f->hi);
  case K_F64:
    w->at++;
    return ax_values_add_f64(w->out, *(const double *)p);
  case K_STR:
    return wr_str(w, *(const char *const *)p, f->lo, f->hi);
  case K_BYTES: {
    const axi_pipe_bytes *b = (const axi_pipe_bytes *)p;
    if ((uint64_t)b->n > (uint64_t)f->hi || (!b->p && b->n))
      return bad(AX_EINVAL, w->m, f, w->at, "%zu bytes, at most %lld", b->n,
                 (long long)f->hi);
    w->at++;
    return ax_values_add_bytes(w->out, b->p ? b->p : "", b->n);
  }
  case K_TENSOR:
    return wr_tensor(w, *(ax_tensor *const *)p);
  case K_RREF: {
    ax_rref *r = *(ax_rref *const *)p;
    w->at++;
    return r ? ax_values_add_rref(w->out, r) : ax_values_add_i64(w->out, 0);
  }
  case K_TLIST:
    return wr_tensors(w, (const ax_tlist *)p, f->lo, f->hi);
  case K_LABELS: {
    const axi_pipe_labels *l = (const axi_pipe_labels *)p;
    AX_TRY(wr_tensors(w, &l->t, f->lo, f->hi));
    for (int i = 0; i < l->t.n; i++)
      AX_TRY(wr_i64(w, l->norm[i], 0, INT64_MAX));
    return AX_OK;
  }
  case K_MEMBERS:
    return wr_group(w, f->lo, f->hi, (const axi_pipe_group *)p);
  case K_TIES: {
    const axi_pipe_ties *t = (const axi_pipe_ties *)p;
    AX_TRY(wr_i64(w, t->n, f->lo, f->hi));
    for (int64_t i = 0; i < t->n; i++) {
      AX_TRY(wr_i64(w, t->t[i].tie, 0, AX_MODEL_MAX_TIES - 1));
      AX_TRY(wr_group(w, 2, 2, &t->t[i].g));
    }
    return AX_OK;
  }
  }
  return ax_seterr(AX_EINTERNAL, "%s: field %s", w->m->name, f->name);
}

static int encode(const message *m, const void *in, ax_values *out) {
  if (!out)
    return ax_seterr(AX_EINVAL, "%s: no list to append to", m->name);
  wr w = {m, NULL, out, 0};
  int absent = 0; /* the fields of an absent optional part follow */
  for (int i = 0; i < m->nf; i++) {
    w.f = &m->f[i];
    const char *p = (const char *)in + w.f->off;
    if (w.f->kind == K_OPT) {
      absent = !*(const int *)p;
      if (!absent) /* a present part starts with its name */
        AX_TRY(wr_str(&w, w.f->name, 0, INT64_MAX));
    } else if (!absent) {
      AX_TRY(wr_field(&w, p));
    }
  }
  return AX_OK;
}

/* The messages: each one's table, encoder and decoder. A field names its
 * message's struct by its short name (fwd: axi_pipe_fwd_msg). */
#define F(msg, m, name, kind, ...)                                             \
  { name, kind, offsetof(axi_pipe_##msg##_msg, m), __VA_ARGS__ }
#define ANY INT64_MIN, INT64_MAX
#define NONNEG 0, INT64_MAX
#define INT INT32_MIN, INT32_MAX
#define MICRO 0, AXP_UNITS_MAX - 1
#define I64(msg, m, name, ...) F(msg, m, name, K_I64, __VA_ARGS__)
#define STR(msg, m, name) F(msg, m, name, K_STR, NONNEG)
#define SHA(msg, m) F(msg, m, "sha256", K_STR, AXP_SHA_HEX, AXP_SHA_HEX)
#define ONE(msg, m, name, kind) F(msg, m, name, kind, 0, 0)
#define MSG(msg, name, ...)                                                    \
  _Static_assert(sizeof(axi_pipe_##msg##_msg) <= AXP_MSG_MAX, #msg);           \
  static const field g_##msg##_f[] = {__VA_ARGS__};                            \
  _Static_assert(sizeof g_##msg##_f / sizeof g_##msg##_f[0] <= 64, #msg);      \
  static const message g_##msg = {                                             \
      name, sizeof(axi_pipe_##msg##_msg), g_##msg##_f,                         \
      (int)(sizeof g_##msg##_f / sizeof g_##msg##_f[0])};                      \
  int axi_pipe_##msg##_encode(const axi_pipe_##msg##_msg *m, ax_values *out) { \
    return encode(&g_##msg, m, out);                                           \
  }                                                                            \
  int axi_pipe_##msg##_decode(const ax_values *v, axi_pipe_##msg##_msg *m) {   \
    return decode(&g_##msg, v, m);                                             \
  }

MSG(setup, "axon.pipe.stage setup",
    I64(setup, mode, "mode", 0, AX_MODE_COUNT - 1),
    I64(setup, recompute, "recompute", AX_RECOMPUTE_NEVER,
        AX_RECOMPUTE_EXCEPT_LAST),
    STR(setup, optim, "optim config"), ONE(setup, prev, "prev", K_RREF),
    ONE(setup, next, "next", K_RREF), I64(setup, self_id, "self id", ANY),
    I64(setup, order, "sum order", 0, AX_SUM_ORDERS - 1),
    ONE(setup, has_stale, "staleness", K_OPT),
    I64(setup, stale, "staleness", INT), I64(setup, delay, "delay", INT),
    ONE(setup, gamma, "gamma", K_F64), I64(setup, warmup, "warm-up", INT),
    ONE(setup, has_replicas, "replicas", K_OPT),
    F(setup, replicas, "replicas", K_MEMBERS, 1, AX_PIPE_MAX_REPLICAS),
    ONE(setup, has_zero, "zero", K_OPT), I64(setup, zero, "zero", 0, 2),
    ONE(setup, has_tp, "tp", K_OPT),
    F(setup, tp, "tensor-parallel members", K_MEMBERS, 1, AX_PIPE_MAX_REPLICAS),
    ONE(setup, has_precision, "precision", K_OPT),
    I64(setup, precision, "precision", 0, AX_PREC_COUNT - 1),
    ONE(setup, has_ties, "ties", K_OPT),
    F(setup, ties, "ties", K_TIES, 0, AX_MODEL_MAX_TIES))
MSG(fwd, "axon.pipe.stage fwd", I64(fwd, batch, "batch", ANY),
    I64(fwd, micro, "micro", MICRO), I64(fwd, seed, "seed", ANY),
    I64(fwd, flags, "flags", 0, AX_PIPE_FLAG_TRAIN | AX_PIPE_FLAG_RECOMPUTE),
    F(fwd, in, "inputs", K_TLIST, 0, AX_TLIST_MAX),
    ONE(fwd, has_labels, "labels", K_OPT),
    F(fwd, lab, "labels", K_LABELS, 1, AX_TLIST_MAX),
    ONE(fwd, has_scale, "scale", K_OPT), ONE(fwd, scale, "scale", K_F64))
#define BWD(msg)                                                               \
  I64(msg, batch, "batch", ANY), I64(msg, micro, "micro", MICRO),              \
      I64(msg, step, "step", 0, 1), I64(msg, units, "units", 1, AXP_UNITS_MAX)
MSG(bwd, "axon.pipe.stage bwd", BWD(bwd))
MSG(bwdw, "axon.pipe.stage bwdw", BWD(bwdw))
MSG(bwdi, "axon.pipe.stage bwdi", I64(bwdi, batch, "batch", ANY),
    I64(bwdi, micro, "micro", MICRO))
MSG(step, "axon.pipe.stage step", I64(step, batch, "batch", ANY),
    I64(step, units, "units", 1, AXP_UNITS_MAX))
MSG(report, "stage report", I64(report, busy_us, "busy_us", ANY),
    I64(report, cpu_us, "cpu_us", ANY),
    I64(report, live, "live states", NONNEG),
    I64(report, versions, "weight versions", NONNEG),
    I64(report, state_bytes, "state bytes", NONNEG),
    ONE(report, has_loss, "loss", K_OPT), ONE(report, loss, "loss", K_F64),
    I64(report, correct, "correct", NONNEG),
    I64(report, count, "count", NONNEG))
MSG(offload, "axon.pipe.stage offload",
    ONE(offload, optim, "optimizer", K_RREF))
MSG(state, "axon.pipe.stage state_save reply",
    ONE(state, params, "params", K_TENSOR),
    ONE(state, buffers, "buffers", K_TENSOR))
MSG(trace, "axon.pipe.stage trace reply",
    F(trace, events, "events", K_BYTES, NONNEG))
MSG(ckpt_save, "axon.pipe.stage ckpt_save", STR(ckpt_save, dir, "dir"),
    STR(ckpt_save, name, "name"), ONE(ckpt_save, has_send, "send", K_OPT),
    I64(ckpt_save, send, "send", 0, 1),
    ONE(ckpt_save, has_async, "async", K_OPT),
    I64(ckpt_save, async, "async", 0, 1),
    ONE(ckpt_save, has_optim_only, "optim_only", K_OPT),
    I64(ckpt_save, optim_only, "optim_only", 0, 1))
MSG(ckpt_wait, "axon.pipe.stage ckpt_wait", STR(ckpt_wait, path, "path"))
MSG(file, "checkpoint file reply", I64(file, size, "size", NONNEG),
    SHA(file, sha), ONE(file, has_file, "file", K_OPT),
    ONE(file, file, "file", K_TENSOR))
MSG(ckpt_load, "axon.pipe.stage ckpt_load", STR(ckpt_load, path, "path"),
    I64(ckpt_load, size, "size", -1, INT64_MAX),
    F(ckpt_load, sha, "sha256", K_STR, 0, AXP_SHA_HEX),
    ONE(ckpt_load, has_file, "file", K_OPT),
    ONE(ckpt_load, file, "file", K_TENSOR))
MSG(mem_save, "axon.pipe.stage ckpt_mem_save", STR(mem_save, key, "key"),
    STR(mem_save, peer, "peer"))
MSG(mem_load, "axon.pipe.stage ckpt_mem_load", STR(mem_load, key, "key"),
    STR(mem_load, holder, "holder"), I64(mem_load, size, "size", NONNEG),
    SHA(mem_load, sha))
MSG(mem_keep, "axon.pipe.mem_keep", STR(mem_keep, owner, "owner"),
    STR(mem_keep, key, "key"), I64(mem_keep, size, "size", NONNEG),
    SHA(mem_keep, sha), ONE(mem_keep, file, "file", K_TENSOR))
MSG(mem_fetch, "axon.pipe.mem_fetch", STR(mem_fetch, owner, "owner"),
    STR(mem_fetch, key, "key"))
MSG(optim_init, "axon.pipe.optim init", STR(optim_init, config, "optim config"),
    ONE(optim_init, params, "params", K_TENSOR))
MSG(optim_step, "axon.pipe.optim step",
    ONE(optim_step, grads, "grads", K_TENSOR),
    ONE(optim_step, lr_scale, "lr scale", K_F64))
MSG(optim_reply, "axon.pipe.optim step reply",
    ONE(optim_reply, params, "params", K_TENSOR))
MSG(optim_state, "axon.pipe.optim state", ONE(optim_state, m, "m", K_TENSOR),
    ONE(optim_state, v, "v", K_TENSOR),
    I64(optim_state, steps, "steps", NONNEG),
    ONE(optim_state, has_params, "params", K_OPT),
    ONE(optim_state, params, "params", K_TENSOR))
MSG(boundary, "axon.pipe.stage boundary",
    I64(boundary, op, "op", AXP_BOUNDARY_KEEP, AXP_BOUNDARY_REWIND),
    I64(boundary, batch, "batch", -1, INT64_MAX))
MSG(boundary_reply, "axon.pipe.stage boundary reply",
    I64(boundary_reply, last_step, "last step", -1, INT64_MAX),
    I64(boundary_reply, kept, "kept", -1, INT64_MAX))
MSG(decode, "axon.pipe.stage decode", I64(decode, session, "session", NONNEG),
    I64(decode, pos, "pos", 0, INT32_MAX), I64(decode, n, "n", 1, INT32_MAX),
    F(decode, in, "inputs", K_TLIST, 0, AX_TLIST_MAX))
MSG(decode_end, "axon.pipe.stage decode_end",
    I64(decode_end, session, "session", NONNEG))
MSG(decode_reply, "axon.pipe.stage decode reply",
    I64(decode_reply, busy_us, "busy_us", ANY),
    I64(decode_reply, cpu_us, "cpu_us", ANY),
    I64(decode_reply, sessions, "sessions", NONNEG),
    I64(decode_reply, cache_bytes, "cache bytes", NONNEG),
    ONE(decode_reply, has_logits, "logits", K_OPT),
    ONE(decode_reply, logits, "logits", K_TENSOR))
/* The messages without fields: an encoder that appends nothing and a
 * decoder that checks the list is empty. */
#define EMPTY(msg, name)                                                       \
  static const message g_##msg = {name, 0, NULL, 0};                           \
  int axi_pipe_##msg##_encode(ax_values *out) {                                \
    return encode(&g_##msg, NULL, out);                                        \
  }                                                                            \
  int axi_pipe_##msg##_decode(const ax_values *v) {                            \
    return decode(&g_##msg, v, NULL);                                          \
  }
EMPTY(settle, "axon.pipe.stage settle")
EMPTY(mem_forget, "axon.pipe.mem_forget")

/* Every message by number. */
static const message *const g_all[] = {
    &g_setup,       &g_fwd,         &g_bwd,          &g_bwdi,
    &g_bwdw,        &g_step,        &g_report,       &g_offload,
    &g_state,       &g_trace,       &g_ckpt_save,    &g_ckpt_wait,
    &g_file,        &g_ckpt_load,   &g_mem_save,     &g_mem_load,
    &g_mem_keep,    &g_mem_fetch,   &g_optim_init,   &g_optim_step,
    &g_optim_reply, &g_optim_state, &g_boundary,     &g_boundary_reply,
    &g_decode,      &g_decode_end,  &g_decode_reply, &g_settle,
    &g_mem_forget};
#define N_MSG ((int)(sizeof g_all / sizeof g_all[0]))

static const message *msg_at(int id) {
  return id >= 0 && id < N_MSG ? g_all[id] : NULL;
}

int axi_pipe_msg_count(void) { return N_MSG; }

const char *axi_pipe_msg_name(int id) {
  return msg_at(id) ? msg_at(id)->name : NULL;
}

size_t axi_pipe_msg_size(int id) { return msg_at(id) ? msg_at(id)->size : 0; }

int axi_pipe_msg_encode(int id, const void *m, ax_values *out) {
  if (!msg_at(id))
    return ax_seterr(AX_EINVAL, "stage messages: no message %d", id);
  return encode(msg_at(id), m, out);
}

int axi_pipe_msg_decode(int id, const ax_values *v, void *m) {
  if (!msg_at(id))
    return ax_seterr(AX_EINVAL, "stage messages: no message %d", id);
  return decode(msg_at(id), v, m);
}
