/* Schedules (sched_text.h) from built-in modes, their text, and the plans
 * built from them. The parser is sched_text.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/error.h"
#include "axon/runtime/pipeline/schedule/sched_text-impl.h"

ax_pipe_sched *axi_pipe_sched_alloc(void) {
  ax_pipe_sched *s = calloc(1, sizeof *s);
  if (s)
    s->mode = -1;
  return s;
}

void ax_pipe_sched_free(ax_pipe_sched *s) {
  if (!s)
    return;
  for (int r = 0; r < AX_PIPE_PLAN_MAX_STAGES; r++)
    free(s->ops[r]);
  free(s);
}

int ax_pipe_sched_copy(const ax_pipe_sched *s, ax_pipe_sched **out) {
  *out = NULL;
  ax_pipe_sched *c = axi_pipe_sched_alloc();
  if (!c)
    return ax_seterr(AX_ENOMEM, "schedule: out of memory");
  *c = *s;
  for (int r = 0; r < AX_PIPE_PLAN_MAX_STAGES; r++)
    c->ops[r] = NULL;
  for (int r = 0; r < s->K; r++) {
    c->ops[r] = malloc(sizeof *c->ops[r] * ((size_t)s->len[r] + 1));
    if (!c->ops[r]) {
      ax_pipe_sched_free(c);
      return ax_seterr(AX_ENOMEM, "schedule: out of memory");
    }
    if (s->len[r])
      memcpy(c->ops[r], s->ops[r], sizeof *c->ops[r] * (size_t)s->len[r]);
  }
  *out = c;
  return AX_OK;
}

int ax_pipe_sched_ranks(const ax_pipe_sched *s) { return s->K; }
int ax_pipe_sched_stages(const ax_pipe_sched *s) { return s->S; }
int ax_pipe_sched_units(const ax_pipe_sched *s) { return s->U; }
int ax_pipe_sched_mode(const ax_pipe_sched *s) { return s->mode; }
int ax_pipe_sched_split(const ax_pipe_sched *s) { return s->split; }
int ax_pipe_sched_stage_rank(const ax_pipe_sched *s, int i) {
  return i >= 0 && i < s->S ? s->stage_rank[i] : -1;
}
const ax_pipe_op *ax_pipe_sched_actions(const ax_pipe_sched *s, int r,
                                        long *len) {
  *len = r >= 0 && r < s->K ? s->len[r] : 0;
  return r >= 0 && r < s->K ? s->ops[r] : NULL;
}

int ax_pipe_sched_plan(const ax_pipe_sched *s, long n, ax_pipe_plan **out) {
  const ax_pipe_op *lists[AX_PIPE_PLAN_MAX_STAGES];
  for (int r = 0; r < s->K; r++)
    lists[r] = s->ops[r];
  return ax_pipe_plan_new_lists(s->mode, s->K, s->S, s->stage_rank, s->U, n,
                                lists, s->len, out);
}

int ax_pipe_sched_verify(const ax_pipe_sched *s, ax_pipe_verify_report *r) {
  ax_pipe_plan *p = NULL;
  AX_TRY(ax_pipe_sched_plan(s, 2, &p));
  int err = ax_pipe_verify(p, NULL, r);
  ax_pipe_plan_free(p);
  return err;
}

/* The first mini-batch of flushed plan p (its actions of batch 0). */
static int sched_of_plan(const ax_pipe_plan *p, ax_pipe_sched **out) {
  ax_pipe_sched *s = axi_pipe_sched_alloc();
  if (!s)
    return ax_seterr(AX_ENOMEM, "schedule: out of memory");
  s->mode = ax_pipe_plan_mode(p);
  s->K = ax_pipe_plan_ranks(p);
  s->S = ax_pipe_plan_stages(p);
  s->U = ax_pipe_plan_units(p);
  for (int i = 0; i < s->S; i++)
    s->stage_rank[i] = ax_pipe_plan_stage_rank(p, i);
  for (int r = 0; r < s->K; r++) {
    long n = 0;
    const ax_pipe_op *l = ax_pipe_plan_actions(p, r, &n);
    if (!(s->ops[r] = malloc(sizeof *l * ((size_t)n + 1)))) {
      ax_pipe_sched_free(s);
      return ax_seterr(AX_ENOMEM, "schedule: out of memory");
    }
    for (long i = 0; i < n; i++)
      if (l[i].batch == 0) {
        s->split |=
            l[i].kind == AX_OP_INPUT_GRAD || l[i].kind == AX_OP_WEIGHT_GRAD;
        s->ops[r][s->len[r]++] = l[i];
      }
  }
  *out = s;
  return AX_OK;
}

int ax_pipe_sched_from_mode(int mode, int K, int v, int M,
                            ax_pipe_sched **out) {
  *out = NULL;
  if (!ax_pipe_mode_get(mode))
    return AX_EINVAL;
  if (!ax_pipe_flushes(mode))
    return ax_seterr(AX_EUNSUPPORTED,
                     "schedule: %s does not flush: its lists span "
                     "mini-batches, a schedule is one flushed mini-batch",
                     ax_pipe_mode_name(mode));
  ax_pipe_plan *p = NULL;
  AX_TRY(ax_pipe_plan_new(mode, K, v, M, 1, &p));
  int err = sched_of_plan(p, out);
  ax_pipe_plan_free(p);
  return err;
}

/* ---- text ---------------------------------------------------------------- */
typedef struct text {
  char *p;
  size_t n, cap;
  int err;
} text;

static void put(text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
  for (int tries = 0; t->err == AX_OK && tries < 2; tries++) {
    va_list ap;
    va_start(ap, fmt);
    int k =
        vsnprintf(t->p ? t->p + t->n : NULL, t->p ? t->cap - t->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
      t->err = AX_EINTERNAL;
    } else if (t->p && t->n + (size_t)k < t->cap) {
      t->n += (size_t)k;
      return;
    } else {
      size_t cap = (t->cap ? 2 * t->cap : 4096) + (size_t)k + 1;
      char *q = realloc(t->p, cap);
      if (!q)
        t->err = AX_ENOMEM;
      else
        t->p = q, t->cap = cap;
    }
  }
}

/* The header's placement: loop, v, or every stage's rank. */
static void put_placement(text *t, int K, int S, const int *rank) {
  int loop = 1, v = S == 2 * K;
  for (int i = 0; i < S; i++) {
    loop &= rank[i] == i % K;
    v &= rank[i] == (i < K ? i : 2 * K - 1 - i);
  }
  if (loop || v) {
    put(t, "placement %s\n", loop ? "loop" : "v");
    return;
  }
  put(t, "placement");
  for (int i = 0; i < S; i++)
    put(t, " %d", rank[i]);
  put(t, "\n");
}

/* Rank r's line of n actions; global: units numbered t U + m. */
static void put_rank(text *t, int r, const ax_pipe_op *l, long n, int U,
                     int global) {
  put(t, "rank %d:", r);
  for (long i = 0; i < n && t->err == AX_OK; i++) {
    char tok[48]; /* a composite's second part comes next, after a "+" */
    put(t, "%s%s", i > 0 && l[i - 1].with_next ? "+" : " ",
        ax_pipe_op_text(&l[i], global ? U : 0, tok, sizeof tok));
  }
  put(t, "\n");
}

static void put_header(text *t, int mode, int K, int S, int U, const int *rank,
                       const char *update) {
  put(t, "mode %s\nranks %d\nstages %d\nmicro %d\n", ax_pipe_mode_name(mode), K,
      S, U);
  put_placement(t, K, S, rank);
  put(t, "update %s\n", update);
}

static int text_done(text *t, char **out) {
  if (t->err != AX_OK) {
    free(t->p);
    return ax_seterr(t->err, "schedule: cannot write its text");
  }
  *out = t->p;
  return AX_OK;
}

int ax_pipe_sched_text(const ax_pipe_sched *s, char **out) {
  *out = NULL;
  text t = {0};
  put(&t, "# axon pipeline schedule: one flushed mini-batch per rank, "
          "repeated (docs/MODES.md)\n");
  put_header(&t, s->mode, s->K, s->S, s->U, s->stage_rank, "flushed");
  for (int r = 0; r < s->K; r++)
    put_rank(&t, r, s->ops[r], s->len[r], s->U, 0);
  return text_done(&t, out);
}

int ax_pipe_plan_text(const ax_pipe_plan *p, char **out) {
  *out = NULL;
  int mode = ax_pipe_plan_mode(p);
  if (ax_pipe_flushes(mode)) {
    ax_pipe_sched *s = NULL;
    AX_TRY(sched_of_plan(p, &s));
    int err = ax_pipe_sched_text(s, out);
    ax_pipe_sched_free(s);
    return err;
  }
  int K = ax_pipe_plan_ranks(p), S = ax_pipe_plan_stages(p),
      U = ax_pipe_plan_units(p), rank[AX_PIPE_PLAN_MAX_STAGES];
  for (int i = 0; i < S; i++)
    rank[i] = ax_pipe_plan_stage_rank(p, i);
  text t = {0};
  put(&t,
      "# %s does not flush: %ld mini-batches, for viewing only (units "
      "numbered t*%d+m; it does not parse: a schedule is one flushed "
      "mini-batch)\n",
      ax_pipe_mode_name(mode), ax_pipe_plan_batches(p), U);
  put_header(&t, mode, K, S, U, rank, "async");
  for (int r = 0; r < K; r++) {
    long n = 0;
    const ax_pipe_op *l = ax_pipe_plan_actions(p, r, &n);
    put_rank(&t, r, l, n, U, 1);
  }
  return text_done(&t, out);
}
