/* The pipeline's schedule oracle on the stages' OWN trace events
 * (ax_pipe_trace; stage_events.h: per stage pid, lane 0 forward, backward,
 * recompute and optim, lane 1 receives, lane 2 sends, each with step =
 * mini-batch, micro and peer). Local agents share CLOCK_MONOTONIC with the
 * test, so events of different stages compare directly. Header-only.
 *
 * pt_check_stage_trace checks, for one ax_pipe_train of n mini-batches
 * (batch indices 0 .. n-1, i.e. the pipe's first train):
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
 * A violation fails with a message naming the mode, stage, unit and
 * times (microseconds since the first event). */
#ifndef AX_PIPE_EVENTCHECK_H
#define AX_PIPE_EVENTCHECK_H

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

/* 1 when stage backwards of op replay the forward first. */
static inline int pe_replays(int mode, int recompute, int U,
                             const ax_pipe_op *o) {
  if (mode == AX_MODE_FR)
    return 1;
  return mode == AX_MODE_GPIPE &&
         (recompute == AX_RECOMPUTE_ALWAYS ||
          (recompute == AX_RECOMPUTE_EXCEPT_LAST && o->micro != U - 1));
}

typedef struct pe_ctx {
  int mode, K, M, U;
  long n;
  int64_t t0; /* first event, for messages */
  pe_op *ops;
} pe_ctx;

static inline pe_op *pe_at(const pe_ctx *c, int s, int kind, long batch,
                           int micro) {
  return &c->ops[((long)(s * 2 + kind) * c->n + batch) * c->U + micro];
}

/* Checks one stage's compute events (sorted) against its schedule and
 * fills the compute times of its operations. */
static inline void pe_stage_compute(pe_ctx *c, int s, int recompute,
                                    const ax_trace_event *e, size_t ne) {
  const char *mn = ax_pipe_mode_name(c->mode);
  for (size_t i = 1; i < ne; i++)
    if (e[i].ts_us < e[i - 1].ts_us + e[i - 1].dur_us)
      fail_msg("%s stage %d: %s starts at +%lld us, before %s ended at "
               "+%lld us (compute events overlap)",
               mn, s, e[i].name, (long long)(e[i].ts_us - c->t0), e[i - 1].name,
               (long long)(e[i - 1].ts_us + e[i - 1].dur_us - c->t0));
  long nops = ax_pipe_nops(c->mode, c->M, c->n);
  ax_pipe_op *sch = malloc((size_t)nops * sizeof *sch);
  assert_non_null(sch);
  AX_ASSERT_OK(ax_pipe_schedule(c->mode, c->K, s, c->M, c->n, sch, nops));
  size_t j = 0;
  for (long i = 0; i < nops; i++) {
    const ax_pipe_op *o = &sch[i];
    pe_op *r = pe_at(c, s, o->kind, o->batch, o->micro);
    const char *want[3] = {o->kind == AX_OP_FWD ? "forward" : "backward", NULL,
                           NULL};
    if (o->kind == AX_OP_BWD && pe_replays(c->mode, recompute, c->U, o)) {
      want[0] = "recompute";
      want[1] = "backward";
    }
    if (o->kind == AX_OP_BWD && o->step)
      want[want[1] ? 2 : 1] = "optim";
    for (int w = 0; w < 3 && want[w]; w++, j++) {
      if (j >= ne)
        fail_msg("%s stage %d: no %s event for %c%d.%d (operation %ld of "
                 "%ld in the mode's order)",
                 mn, s, want[w], o->kind ? 'B' : 'F', o->batch, o->micro, i,
                 nops);
      const ax_trace_event *x = &e[j];
      if (strcmp(x->cat, want[w]) || x->step != o->batch ||
          x->micro != o->micro)
        fail_msg("%s stage %d: event %zu is %s %s (step %lld micro %lld), "
                 "the mode's order wants %s of %d/%d",
                 mn, s, j, x->cat, x->name, (long long)x->step,
                 (long long)x->micro, want[w], o->batch, o->micro);
      if (w == 0)
        r->start = x->ts_us;
      if (!strcmp(want[w], "forward") || !strcmp(want[w], "backward"))
        r->end = x->ts_us + x->dur_us;
      r->done = x->ts_us + x->dur_us;
    }
  }
  if (j != ne)
    fail_msg("%s stage %d: %zu compute events beyond the mode's order (%s "
             "first)",
             mn, s, ne - j, e[j].name);
  free(sch);
}

/* A receive or send event: the operation it belongs to. */
static inline void pe_xfer(pe_ctx *c, const ax_trace_event *x) {
  int s = x->pid, send = x->tid == 2;
  long b = (long)x->step;
  int m = (int)x->micro;
  if (m < 0 || m >= c->U)
    fail_msg("stage %d: %s with micro %d outside [0, %d)", s, x->name, m, c->U);
  int kind = AX_OP_FWD;
  if (x->peer == s + 1)
    kind = send ? AX_OP_FWD : AX_OP_BWD; /* activations out, gradient in */
  else if (x->peer == s - 1)
    kind = send ? AX_OP_BWD : AX_OP_FWD; /* gradient out, activations in */
  else
    fail_msg("stage %d: %s with peer %lld, not a neighbour", s, x->name,
             (long long)x->peer);
  if (x->peer < 0 || x->peer >= c->K)
    fail_msg("stage %d: %s with peer %lld outside [0, %d)", s, x->name,
             (long long)x->peer, c->K);
  pe_op *r = pe_at(c, s, kind, b, m);
  if (send) {
    r->nsend++;
    r->send_start = x->ts_us;
  } else {
    r->nrecv++;
    r->recv_end = x->ts_us + x->dur_us;
  }
}

/* The data dependency of consumer op (s, kind, u) on producer stage p. */
static inline void pe_dep(const pe_ctx *c, int s, int kind, long b, int m,
                          int p) {
  const char *mn = ax_pipe_mode_name(c->mode);
  const char *what = kind == AX_OP_FWD ? "activations" : "gradient";
  const char *op = kind == AX_OP_FWD ? "forward" : "backward";
  const pe_op *q = pe_at(c, p, kind, b, m), *r = pe_at(c, s, kind, b, m);
  long long t0 = c->t0;
  if (r->nrecv != 1 || q->nsend != 1)
    fail_msg("%s K=%d: %s of %ld/%d: stage %d received its %s %d times, "
             "stage %d sent them %d times (want 1 and 1)",
             mn, c->K, op, b, m, s, what, r->nrecv, p, q->nsend);
  if (q->send_start < q->end)
    fail_msg("%s K=%d: stage %d started sending the %s of %ld/%d at +%lld "
             "us, before its %s ended at +%lld us",
             mn, c->K, p, what, b, m, q->send_start - t0, op, q->end - t0);
  if (r->recv_end < q->send_start)
    fail_msg("%s K=%d: stage %d received the %s of %ld/%d at +%lld us, "
             "before stage %d started sending them at +%lld us",
             mn, c->K, s, what, b, m, r->recv_end - t0, p, q->send_start - t0);
  if (r->start < r->recv_end)
    fail_msg("%s K=%d: stage %d started computing its %s of %ld/%d at +%lld "
             "us, before its %s arrived (receive ended +%lld us; stage %d's "
             "%s ended +%lld us)",
             mn, c->K, s, op, b, m, r->start - t0, what, r->recv_end - t0, p,
             op, q->end - t0);
}

/* ddg and fr: stage 0's F(t) waits for the end of round t - 1. */
static inline void pe_forward_lock(const pe_ctx *c) {
  for (long t = 1; t < c->n; t++) {
    const pe_op *f = pe_at(c, 0, AX_OP_FWD, t, 0);
    const pe_op *last = pe_at(c, c->K - 1, AX_OP_FWD, t - 1, 0);
    if (f->start < last->done)
      fail_msg("%s: stage 0 started F%ld at +%lld us, before stage %d's "
               "F%ld ended at +%lld us (forward locking)",
               ax_pipe_mode_name(c->mode), t, (long long)(f->start - c->t0),
               c->K - 1, t - 1, (long long)(last->done - c->t0));
    for (int j = 0; j < c->K; j++) {
      long b = t - 1 - (c->K - 1 - j);
      const pe_op *bw = b >= 0 ? pe_at(c, j, AX_OP_BWD, b, 0) : NULL;
      if (bw && f->start < bw->done)
        fail_msg("%s: stage 0 started F%ld at +%lld us, before stage %d's "
                 "B%ld (and its update) ended at +%lld us (forward locking)",
                 ax_pipe_mode_name(c->mode), t, (long long)(f->start - c->t0),
                 j, b, (long long)(bw->done - c->t0));
    }
  }
}

/* The whole check (see the top of this file). Drains the stages' events
 * (ax_pipe_trace). */
static inline void pt_check_stage_trace(ax_pipe *p, int mode, int K, int M,
                                        int recompute, long n) {
  pe_ctx c = {mode, K, M, ax_pipe_units(mode, M), n, 0, NULL};
  size_t nops = (size_t)K * 2 * (size_t)n * (size_t)c.U;
  c.ops = malloc((nops ? nops : 1) * sizeof *c.ops);
  assert_non_null(c.ops);
  memset(c.ops, 0xff, (nops ? nops : 1) * sizeof *c.ops); /* all -1 */
  for (size_t i = 0; i < nops; i++)
    c.ops[i].nrecv = c.ops[i].nsend = 0;
  ax_trace *tr = ax_trace_new(0);
  assert_non_null(tr);
  AX_ASSERT_OK(ax_pipe_trace(p, tr));
  ax_trace_event *ev = NULL, *comp = NULL;
  size_t ne = 0;
  AX_ASSERT_OK(ax_trace_events(tr, &ev, &ne));
  assert_true(ne > 0);
  c.t0 = ev[0].ts_us;
  comp = malloc(ne * sizeof *comp);
  assert_non_null(comp);
  for (int s = 0; s < K; s++) {
    size_t nc = 0;
    for (size_t i = 0; i < ne; i++) {
      if (ev[i].pid != s || ev[i].step < 0) /* evaluation: negative ids */
        continue;
      if (ev[i].step >= n)
        fail_msg("stage %d: event %s of mini-batch %lld, beyond the %ld "
                 "trained",
                 s, ev[i].name, (long long)ev[i].step, n);
      if (ev[i].tid == 0)
        comp[nc++] = ev[i];
      else if (ev[i].tid == 1 || ev[i].tid == 2)
        pe_xfer(&c, &ev[i]);
    }
    qsort(comp, nc, sizeof *comp, pe_cmp);
    pe_stage_compute(&c, s, recompute, comp, nc);
  }
  for (int s = 0; s < K; s++)
    for (long b = 0; b < n; b++)
      for (int m = 0; m < c.U; m++) {
        if (s > 0)
          pe_dep(&c, s, AX_OP_FWD, b, m, s - 1);
        else if (pe_at(&c, s, AX_OP_FWD, b, m)->nrecv)
          fail_msg("stage 0 received activations for %ld/%d", b, m);
        if (s < K - 1)
          pe_dep(&c, s, AX_OP_BWD, b, m, s + 1);
        else if (pe_at(&c, s, AX_OP_BWD, b, m)->nrecv ||
                 pe_at(&c, s, AX_OP_FWD, b, m)->nsend)
          fail_msg("the last stage sent activations or received a "
                   "gradient for %ld/%d",
                   b, m);
        if (s == 0 && pe_at(&c, s, AX_OP_BWD, b, m)->nsend)
          fail_msg("stage 0 sent a gradient for %ld/%d", b, m);
      }
  if (mode == AX_MODE_DDG || mode == AX_MODE_FR)
    pe_forward_lock(&c);
  free(comp);
  free(ev);
  free(c.ops);
  ax_trace_free(tr);
}

#endif
