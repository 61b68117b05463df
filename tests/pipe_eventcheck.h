/* The pipeline's schedule oracle on the stages' OWN trace events
 * (ax_pipe_trace; stage_events.h: per stage pid, lane 0 forward, backward,
 * recompute and optim, lane 1 receives, lane 2 sends, each with step =
 * mini-batch, micro and peer). Local agents share CLOCK_MONOTONIC with the
 * test, so events of different stages compare directly. Header-only.
 *
 * pt_stage_events_check checks the events of one ax_pipe_train of n
 * mini-batches (batch indices 0 .. n-1, i.e. the pipe's first train):
 *  - per stage, the compute events do not overlap and follow the mode's
 *    order (ax_pipe_schedule): F(t, m), or [R(t, m)] B(t, m) [U(t, m)],
 *    with a recompute exactly where the mode replays (fr; gpipe with
 *    recompute always, or except-last for every micro-batch but the last)
 *    and an optimizer step exactly after the backwards that update;
 *  - data dependencies, from the test's own definition and NOT from
 *    ax_pipe_deps (which the coordinator waits on): stage s > 0 receives
 *    unit u's activations exactly once from s - 1 and stage s < K - 1 its
 *    gradient exactly once from s + 1; the producer's compute of u ended
 *    before it started sending, the receive ended after that send started
 *    and before the consumer started computing (its recompute, when it
 *    replays). So the consumer started computing after the producer
 *    finished. The send's END is not used: the bytes may be taken by the
 *    consumer before the producer's thread stamps the end of its send;
 *  - ddg and fr forward locking (schedule.h): stage 0's F(t) starts after
 *    F(K-1, t-1) and every backward of round t-1 (B(j, t-1-(K-1-j))) and
 *    its optimizer step ended.
 * It returns 0, or 1 with the first violation in msg (naming the mode,
 * stage, unit and times in microseconds since the first event), so that
 * tests/test_trace_check.c can show each rule fails on a broken trace.
 * pt_check_stage_trace collects a pipe's events and fails the test on a
 * violation. */
#ifndef AX_PIPE_EVENTCHECK_H
#define AX_PIPE_EVENTCHECK_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "runtime/pipeline/coordinator.h"

/* What the stages recorded about one operation (-1: nothing yet). */
typedef struct pe_op {
  int64_t start;      /* first compute event (the recompute, if any) */
  int64_t end;        /* end of the forward or backward event */
  int64_t done;       /* end of its last compute event (optim included) */
  int64_t recv_end;   /* end of the receive of its input */
  int64_t send_start; /* start of the send of its output */
  int nrecv, nsend;
} pe_op;

typedef struct pe_ctx {
  int mode, K, M, U, recompute;
  long n;
  int64_t t0; /* first event, for messages */
  pe_op *ops;
  char *msg;
  size_t len;
} pe_ctx;

/* Writes the violation into c->msg; returns 1. */
static inline int pe_fail(pe_ctx *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = snprintf(c->msg, c->len, "%s K=%d M=%d: ", ax_pipe_mode_name(c->mode),
                   c->K, c->M);
  if (k >= 0 && (size_t)k < c->len)
    vsnprintf(c->msg + k, c->len - (size_t)k, fmt, ap);
  va_end(ap);
  return 1;
}

static inline long long pe_rel(const pe_ctx *c, int64_t t) {
  return (long long)(t - c->t0);
}

static inline int pe_rank(const char *cat) {
  static const char *order[] = {"forward", "recompute", "backward", "optim"};
  for (int i = 0; i < 4; i++)
    if (!strcmp(cat, order[i]))
      return i;
  return 4;
}

/* Start, then end, then the order within one operation (zero-length
 * events of one backward keep recompute < backward < optim). */
static inline int pe_cmp(const void *a, const void *b) {
  const ax_trace_event *x = a, *y = b;
  if (x->ts_us != y->ts_us)
    return x->ts_us < y->ts_us ? -1 : 1;
  if (x->ts_us + x->dur_us != y->ts_us + y->dur_us)
    return x->ts_us + x->dur_us < y->ts_us + y->dur_us ? -1 : 1;
  return pe_rank(x->cat) - pe_rank(y->cat);
}

/* 1 when the stage replays the forward of o before its backward (the
 * mode table's rule). */
static inline int pe_replays(int mode, int recompute, int U,
                             const ax_pipe_op *o) {
  return ax_pipe_replays(mode, recompute, U, o->micro);
}

static inline pe_op *pe_at(const pe_ctx *c, int s, int kind, long batch,
                           int micro) {
  return &c->ops[((long)(s * 2 + kind) * c->n + batch) * c->U + micro];
}

/* Checks one stage's compute events (sorted) against its schedule and
 * fills the compute times of its operations. */
static inline int pe_stage_compute(pe_ctx *c, int s, const ax_trace_event *e,
                                   size_t ne) {
  for (size_t i = 1; i < ne; i++)
    if (e[i].ts_us < e[i - 1].ts_us + e[i - 1].dur_us)
      return pe_fail(c,
                     "stage %d: %s starts at +%lld us, before %s ended at "
                     "+%lld us (compute events overlap)",
                     s, e[i].name, pe_rel(c, e[i].ts_us), e[i - 1].name,
                     pe_rel(c, e[i - 1].ts_us + e[i - 1].dur_us));
  long nops = ax_pipe_nops(c->mode, c->M, c->n);
  ax_pipe_op *sch = malloc((size_t)(nops ? nops : 1) * sizeof *sch);
  if (!sch || ax_pipe_schedule(c->mode, c->K, s, c->M, c->n, sch, nops)) {
    free(sch);
    return pe_fail(c, "stage %d: no schedule", s);
  }
  size_t j = 0;
  int bad = 0;
  pe_op *last_b = NULL; /* the backward a STEP follows */
  for (long i = 0; !bad && i < nops; i++) {
    const ax_pipe_op *o = &sch[i];
    if (o->kind == AX_OP_STEP) { /* an "optim" event of that batch */
      if (j >= ne || strcmp(e[j].cat, "optim") || e[j].step != o->batch) {
        bad = pe_fail(c, "stage %d: no optim event for the STEP of batch %d "
                      "(operation %ld of %ld in the mode's order)", s,
                      o->batch, i, nops);
        break;
      }
      if (last_b) /* the update ends the backward's work */
        last_b->done = e[j].ts_us + e[j].dur_us;
      j++;
      continue;
    }
    pe_op *r = pe_at(c, s, o->kind, o->batch, o->micro);
    if (o->kind == AX_OP_BWD)
      last_b = r;
    const char *want[2] = {o->kind == AX_OP_FWD ? "forward" : "backward",
                           NULL};
    if (o->kind == AX_OP_BWD && pe_replays(c->mode, c->recompute, c->U, o)) {
      want[0] = "recompute";
      want[1] = "backward";
    }
    for (int w = 0; !bad && w < 2 && want[w]; w++, j++) {
      if (j >= ne) {
        bad = pe_fail(c,
                      "stage %d: no %s event for %c%d.%d (operation %ld of "
                      "%ld in the mode's order)",
                      s, want[w], o->kind ? 'B' : 'F', o->batch, o->micro, i,
                      nops);
        break;
      }
      const ax_trace_event *x = &e[j];
      if (strcmp(x->cat, want[w]) || x->step != o->batch ||
          x->micro != o->micro) {
        bad = pe_fail(c,
                      "stage %d: compute event %zu is %s %s (step %lld micro "
                      "%lld), the mode's order wants %s of %d/%d",
                      s, j, x->cat, x->name, (long long)x->step,
                      (long long)x->micro, want[w], o->batch, o->micro);
        break;
      }
      if (w == 0)
        r->start = x->ts_us;
      if (!strcmp(want[w], "forward") || !strcmp(want[w], "backward"))
        r->end = x->ts_us + x->dur_us;
      r->done = x->ts_us + x->dur_us;
    }
  }
  free(sch);
  if (!bad && j != ne)
    bad = pe_fail(c,
                  "stage %d: %zu compute events beyond the mode's order "
                  "(%s first)",
                  s, ne - j, e[j].name);
  return bad;
}

/* A receive or send event: counted for the operation it belongs to. */
static inline int pe_xfer(pe_ctx *c, const ax_trace_event *x) {
  int s = x->pid, send = x->tid == 2, m = (int)x->micro, kind;
  if (m < 0 || m >= c->U)
    return pe_fail(c, "stage %d: %s with micro %d outside [0, %d)", s, x->name,
                   m, c->U);
  if (x->peer == s + 1 && x->peer < c->K)
    kind = send ? AX_OP_FWD : AX_OP_BWD; /* activations out, gradient in */
  else if (x->peer == s - 1 && x->peer >= 0)
    kind = send ? AX_OP_BWD : AX_OP_FWD; /* gradient out, activations in */
  else
    return pe_fail(c, "stage %d: %s with peer %lld, not a neighbour", s,
                   x->name, (long long)x->peer);
  pe_op *r = pe_at(c, s, kind, (long)x->step, m);
  if (send) {
    r->nsend++;
    r->send_start = x->ts_us;
  } else {
    r->nrecv++;
    r->recv_end = x->ts_us + x->dur_us;
  }
  return 0;
}

/* The data dependency of consumer op (s, kind, b, m) on producer stage p. */
static inline int pe_dep(pe_ctx *c, int s, int kind, long b, int m, int p) {
  const char *what = kind == AX_OP_FWD ? "activations" : "gradient";
  const char *op = kind == AX_OP_FWD ? "forward" : "backward";
  const pe_op *q = pe_at(c, p, kind, b, m), *r = pe_at(c, s, kind, b, m);
  if (r->nrecv != 1 || q->nsend != 1)
    return pe_fail(c,
                   "%s of %ld/%d: stage %d received its %s %d times, stage "
                   "%d sent them %d times (want 1 and 1)",
                   op, b, m, s, what, r->nrecv, p, q->nsend);
  if (q->send_start < q->end)
    return pe_fail(c,
                   "stage %d started sending the %s of %ld/%d at +%lld us, "
                   "before its %s ended at +%lld us",
                   p, what, b, m, pe_rel(c, q->send_start), op,
                   pe_rel(c, q->end));
  if (r->recv_end < q->send_start)
    return pe_fail(c,
                   "stage %d received the %s of %ld/%d at +%lld us, before "
                   "stage %d started sending them at +%lld us",
                   s, what, b, m, pe_rel(c, r->recv_end), p,
                   pe_rel(c, q->send_start));
  if (r->start < r->recv_end)
    return pe_fail(c,
                   "stage %d started computing its %s of %ld/%d at +%lld "
                   "us, before its %s arrived (receive ended +%lld us)",
                   s, op, b, m, pe_rel(c, r->start), what,
                   pe_rel(c, r->recv_end));
  return 0;
}

/* ddg and fr: stage 0's F(t) waits for the end of round t - 1. */
static inline int pe_forward_lock(pe_ctx *c) {
  for (long t = 1; t < c->n; t++) {
    const pe_op *f = pe_at(c, 0, AX_OP_FWD, t, 0);
    const pe_op *last = pe_at(c, c->K - 1, AX_OP_FWD, t - 1, 0);
    if (f->start < last->done)
      return pe_fail(c,
                     "stage 0 started F%ld at +%lld us, before stage %d's "
                     "F%ld ended at +%lld us (forward locking)",
                     t, pe_rel(c, f->start), c->K - 1, t - 1,
                     pe_rel(c, last->done));
    for (int j = 0; j < c->K; j++) {
      long b = t - 1 - (c->K - 1 - j);
      const pe_op *bw = b >= 0 ? pe_at(c, j, AX_OP_BWD, b, 0) : NULL;
      if (bw && f->start < bw->done)
        return pe_fail(c,
                       "stage 0 started F%ld at +%lld us, before stage %d's "
                       "B%ld (and its update) ended at +%lld us (forward "
                       "locking)",
                       t, pe_rel(c, f->start), j, b, pe_rel(c, bw->done));
    }
  }
  return 0;
}

/* Every transfer and data dependency of the run. */
static inline int pe_transfers(pe_ctx *c) {
  for (int s = 0; s < c->K; s++)
    for (long b = 0; b < c->n; b++)
      for (int m = 0; m < c->U; m++) {
        if (s > 0 && pe_dep(c, s, AX_OP_FWD, b, m, s - 1))
          return 1;
        if (s < c->K - 1 && pe_dep(c, s, AX_OP_BWD, b, m, s + 1))
          return 1;
        if (s == 0 && (pe_at(c, s, AX_OP_FWD, b, m)->nrecv ||
                       pe_at(c, s, AX_OP_BWD, b, m)->nsend))
          return pe_fail(c,
                         "stage 0 received activations or sent a "
                         "gradient for %ld/%d",
                         b, m);
        if (s == c->K - 1 && (pe_at(c, s, AX_OP_BWD, b, m)->nrecv ||
                              pe_at(c, s, AX_OP_FWD, b, m)->nsend))
          return pe_fail(c,
                         "the last stage sent activations or received "
                         "a gradient for %ld/%d",
                         b, m);
      }
  return 0;
}

/* The whole check on the events ev[0 .. ne) (any order). 0, or 1 with the
 * first violation in msg. */
static inline int pt_stage_events_check(const ax_trace_event *ev, size_t ne,
                                        int mode, int K, int M, int recompute,
                                        long n, char *msg, size_t len) {
  pe_ctx c = {mode, K,   M,  ax_pipe_units(mode, M), recompute, n, 0,
              NULL, msg, len};
  size_t nops = (size_t)K * 2 * (size_t)n * (size_t)c.U;
  c.ops = malloc((nops ? nops : 1) * sizeof *c.ops);
  ax_trace_event *comp = malloc((ne ? ne : 1) * sizeof *comp);
  if (!c.ops || !comp) {
    free(c.ops);
    free(comp);
    return pe_fail(&c, "no memory");
  }
  for (size_t i = 0; i < nops; i++)
    c.ops[i] = (pe_op){-1, -1, -1, -1, -1, 0, 0};
  c.t0 = ne ? ev[0].ts_us : 0;
  for (size_t i = 0; i < ne; i++)
    c.t0 = ev[i].ts_us < c.t0 ? ev[i].ts_us : c.t0;
  int bad = 0;
  for (int s = 0; !bad && s < K; s++) {
    size_t nc = 0;
    for (size_t i = 0; !bad && i < ne; i++) {
      if (ev[i].pid != s || ev[i].step < 0) /* evaluation: negative ids */
        continue;
      if (ev[i].step >= n)
        bad = pe_fail(&c,
                      "stage %d: event %s of mini-batch %lld, beyond "
                      "the %ld trained",
                      s, ev[i].name, (long long)ev[i].step, n);
      else if (ev[i].tid == 0)
        comp[nc++] = ev[i];
      else if (ev[i].tid == 1 || ev[i].tid == 2)
        bad = pe_xfer(&c, &ev[i]);
    }
    qsort(comp, nc, sizeof *comp, pe_cmp);
    bad = bad || pe_stage_compute(&c, s, comp, nc);
  }
  for (size_t i = 0; !bad && i < ne; i++)
    if (ev[i].pid < 0 || ev[i].pid >= K)
      bad = pe_fail(&c, "event %s of stage %d", ev[i].name, ev[i].pid);
  bad = bad || pe_transfers(&c);
  if (!bad && ax_pipe_mode_get(mode)->forward_lock)
    bad = pe_forward_lock(&c);
  free(comp);
  free(c.ops);
  return bad;
}

/* Drains p's stage events (ax_pipe_trace) and fails the test on the first
 * violation of pt_stage_events_check. */
static inline void pt_check_stage_trace(ax_pipe *p, int mode, int K, int M,
                                        int recompute, long n) {
  ax_trace *tr = ax_trace_new(0);
  assert_non_null(tr);
  AX_ASSERT_OK(ax_pipe_trace(p, tr));
  ax_trace_event *ev = NULL;
  size_t ne = 0;
  AX_ASSERT_OK(ax_trace_events(tr, &ev, &ne));
  ax_trace_free(tr);
  char msg[512];
  int bad =
      pt_stage_events_check(ev, ne, mode, K, M, recompute, n, msg, sizeof msg);
  free(ev);
  if (bad)
    fail_msg("stage events: %s", msg);
}

#endif
