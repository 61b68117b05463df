/* The engine of the typed stage messages (stage_msg_codec-impl.h): the
 * bounds-checked decoder and the encoder that walk a message's table of
 * fields. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "axon/runtime/pipeline/stage/stage_msg-impl.h"
#include "axon/runtime/pipeline/stage/stage_msg_codec-impl.h"

/* A refusal naming the message, the field and the value's index:
 * AX_EBADARG for a list received, AX_EINVAL for a struct to send. */
static int bad(int code, const axi_pipe_msgdef *m, const axi_pipe_field *f,
               size_t at, const char *fmt, ...) {
  char d[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d, sizeof d, fmt, ap);
  va_end(ap);
  return ax_seterr(code, "%s: %s (value %zu): %s", m->name,
                   f ? f->name : "the list", at, d);
}

static int range(int code, const axi_pipe_msgdef *m, const axi_pipe_field *f,
                 size_t at, int64_t x, int64_t lo, int64_t hi) {
  if (x >= lo && x <= hi)
    return AX_OK;
  return bad(code, m, f, at, "%lld is out of range %lld..%lld", (long long)x,
             (long long)lo, (long long)hi);
}

/* Decoding. */
typedef struct rd { /* a cursor over a received list */
  const axi_pipe_msgdef *m;
  const axi_pipe_field *f;
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

/* An RRef, or i64 0 for none (AXP_K_RREF). */
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
  const axi_pipe_field *f = r->f;
  int64_t n;
  switch (f->kind) {
  case AXP_K_I64:
    return rd_i64(r, f->lo, f->hi, (int64_t *)p);
  case AXP_K_F64:
    AX_TRY(want(r, AX_VAL_F64));
    return ax_values_get_f64(r->v, r->at++, (double *)p);
  case AXP_K_STR:
    return rd_str(r, f->lo, f->hi, (const char **)p);
  case AXP_K_BYTES: {
    axi_pipe_bytes *b = (axi_pipe_bytes *)p;
    AX_TRY(want(r, AX_VAL_BYTES));
    AX_TRY(ax_values_get_bytes(r->v, r->at, &b->p, &b->n));
    if ((uint64_t)b->n > (uint64_t)f->hi)
      return bad(AX_EBADARG, r->m, f, r->at, "%zu bytes, at most %lld", b->n,
                 (long long)f->hi);
    r->at++;
    return AX_OK;
  }
  case AXP_K_TENSOR:
    return rd_tensor(r, (ax_tensor **)p);
  case AXP_K_RREF:
    return rd_rref(r, (ax_rref **)p);
  case AXP_K_TLIST:
    AX_TRY(rd_i64(r, f->lo, f->hi, &n));
    return rd_tensors(r, n, (ax_tlist *)p);
  case AXP_K_LABELS: {
    axi_pipe_labels *l = (axi_pipe_labels *)p;
    AX_TRY(rd_i64(r, f->lo, f->hi, &n));
    AX_TRY(rd_tensors(r, n, &l->t));
    for (int64_t i = 0; i < n; i++)
      AX_TRY(rd_i64(r, 0, INT64_MAX, &l->norm[i]));
    return AX_OK;
  }
  case AXP_K_MEMBERS:
    return rd_group(r, f->lo, f->hi, (axi_pipe_group *)p);
  case AXP_K_TIES: {
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
 * message's AXP_K_OPT fields not yet read (seen, by field index) that comes
 * after the last one read (field index last; -1: none) in the table.
 * *part: its field index. */
static int rd_part(rd *r, int last, uint64_t seen, int *part) {
  const axi_pipe_msgdef *m = r->m;
  r->f = NULL;
  int parts = 0;
  for (int k = 0; k < m->nf; k++)
    parts += m->f[k].kind == AXP_K_OPT;
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
    if (m->f[k].kind != AXP_K_OPT || strcmp(m->f[k].name, name) != 0)
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
  for (; i < r->m->nf && r->m->f[i].kind != AXP_K_OPT; i++) {
    r->f = &r->m->f[i];
    AX_TRY(rd_field(r, (char *)out + r->f->off));
  }
  return AX_OK;
}

int axi_pipe_msgdef_decode(const axi_pipe_msgdef *m, const ax_values *v,
                           void *out) {
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
  const axi_pipe_msgdef *m;
  const axi_pipe_field *f;
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
  const axi_pipe_field *f = w->f;
  switch (f->kind) {
  case AXP_K_I64:
    return wr_i64(w, *(const int64_t *)p, f->lo, f->hi);
  case AXP_K_F64:
    w->at++;
    return ax_values_add_f64(w->out, *(const double *)p);
  case AXP_K_STR:
    return wr_str(w, *(const char *const *)p, f->lo, f->hi);
  case AXP_K_BYTES: {
    const axi_pipe_bytes *b = (const axi_pipe_bytes *)p;
    if ((uint64_t)b->n > (uint64_t)f->hi || (!b->p && b->n))
      return bad(AX_EINVAL, w->m, f, w->at, "%zu bytes, at most %lld", b->n,
                 (long long)f->hi);
    w->at++;
    return ax_values_add_bytes(w->out, b->p ? b->p : "", b->n);
  }
  case AXP_K_TENSOR:
    return wr_tensor(w, *(ax_tensor *const *)p);
  case AXP_K_RREF: {
    ax_rref *r = *(ax_rref *const *)p;
    w->at++;
    return r ? ax_values_add_rref(w->out, r) : ax_values_add_i64(w->out, 0);
  }
  case AXP_K_TLIST:
    return wr_tensors(w, (const ax_tlist *)p, f->lo, f->hi);
  case AXP_K_LABELS: {
    const axi_pipe_labels *l = (const axi_pipe_labels *)p;
    AX_TRY(wr_tensors(w, &l->t, f->lo, f->hi));
    for (int i = 0; i < l->t.n; i++)
      AX_TRY(wr_i64(w, l->norm[i], 0, INT64_MAX));
    return AX_OK;
  }
  case AXP_K_MEMBERS:
    return wr_group(w, f->lo, f->hi, (const axi_pipe_group *)p);
  case AXP_K_TIES: {
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

int axi_pipe_msgdef_encode(const axi_pipe_msgdef *m, const void *in,
                           ax_values *out) {
  if (!out)
    return ax_seterr(AX_EINVAL, "%s: no list to append to", m->name);
  wr w = {m, NULL, out, 0};
  int absent = 0; /* the fields of an absent optional part follow */
  for (int i = 0; i < m->nf; i++) {
    w.f = &m->f[i];
    const char *p = (const char *)in + w.f->off;
    if (w.f->kind == AXP_K_OPT) {
      absent = !*(const int *)p;
      if (!absent) /* a present part starts with its name */
        AX_TRY(wr_str(&w, w.f->name, 0, INT64_MAX));
    } else if (!absent) {
      AX_TRY(wr_field(&w, p));
    }
  }
  return AX_OK;
}
