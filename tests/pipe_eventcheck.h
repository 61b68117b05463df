/* The pipeline's schedule oracle on the stages' OWN trace events
 * (ax_pipe_trace; stage_events.h: per stage pid, lane 0 forward, backward
 * (in split modes the input half I), weight (W), recompute and optim, each
 * with the node rank of the agent that ran it (peer), the live states
 * (stash) and weight versions (bytes) after it; lane 1 receives, lane 2
 * sends, each with step = mini-batch, micro and peer). Local agents share
 * CLOCK_MONOTONIC with the test, so events of different stages compare
 * directly. Header-only; the data dependencies and forward locking are in
 * pipe_eventdeps.h.
 *
 * pt_stage_events_check_v checks the events of one ax_pipe_train of n
 * mini-batches (batch indices 0 .. n-1, i.e. the pipe's first train) of
 * mode over K agents holding v stages each (S = K v stages; v = 1 but for
 * chunked modes):
 *  - per agent, the compute events of all its stages do not overlap and
 *    follow its action list (ax_pipe_schedule_chunks) exactly: F(s, t, m),
 *    or [R] B(s, t, m), or [R] I(s, t, m) and later W(s, t, m) in split
 *    modes, with a recompute exactly where the mode replays (fr; gpipe with
 *    recompute always, or except-last for every micro-batch but the last)
 *    and an optimizer step exactly where the list has a STEP. So every
 *    (stage, chunk, unit, F/B/I/W) ran exactly once, a unit's W after its I
 *    ended on the same stage, and chunk boundaries on one agent keep the
 *    list's order;
 *  - placement: every compute event of stage s carries the node rank of
 *    the agent the placement gives (pe_place: stage i on agent
 *    i mod K; zbv's V: agent r holds r and 2K-1-r), not the coordinator's
 *    ax_pipe_stage_rank (agents[r] is agent r's node rank; NULL skips this
 *    rule);
 *  - bounds: the live states (stash) and weight versions (bytes) a stage
 *    reports after each compute event are within ax_pipe_live_bound and
 *    ax_pipe_version_bound (of S stages);
 *  - data dependencies (pipe_eventdeps.h), across chunk boundaries too.
 * It returns 0, or 1 with the first violation in msg (naming the mode,
 * stage, unit and times in microseconds since the first event), so that
 * tests/test_trace_check.c can show each rule fails on a broken trace.
 * pt_stage_events_check is the same for v = 1 without placement.
 * pt_check_stage_trace(_v) collects a pipe's events and fails the test on
 * a violation. */
#ifndef AX_PIPE_EVENTCHECK_H
#define AX_PIPE_EVENTCHECK_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/node.h"
#include "axon/runtime/pipeline/coord/coordinator.h"
#include "harness.h"

/* What the stages recorded about one operation (-1: nothing yet). */
typedef struct pe_op {
  int64_t start;      /* first compute event (the recompute, if any) */
  int64_t end;        /* end of the forward, backward or weight event */
  int64_t done;       /* end of its last compute event (optim included) */
  int64_t recv_end;   /* end of the receive of its input */
  int64_t send_start; /* start of the send of its output */
  int nrecv, nsend;
} pe_op;

/* Operation slots per (stage, unit): F, B or I, W. */
enum { PE_F = 0, PE_B = 1, PE_W = 2, PE_SLOTS = 3 };

typedef struct pe_ctx {
  int mode, K, v, S, M, U, recompute; /* K agents of v stages, S = K v */
  long n;
  const int *agents; /* node rank of agent r, or NULL */
  int64_t t0;        /* first event, for messages */
  pe_op *ops;
  char *msg;
  size_t len;
} pe_ctx;

/* Writes the violation into c->msg; returns 1. */
static inline int pe_fail(pe_ctx *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = c->v > 1 ? snprintf(c->msg, c->len,
                              "%s K=%d v=%d M=%d: ", ax_pipe_mode_name(c->mode),
                              c->K, c->v, c->M)
                   : snprintf(c->msg, c->len,
                              "%s K=%d M=%d: ", ax_pipe_mode_name(c->mode),
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
  static const char *order[] = {"forward", "recompute", "backward", "weight",
                                "optim"};
  for (int i = 0; i < 5; i++)
    if (!strcmp(cat, order[i]))
      return i;
  return 5;
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
 * mode table's rule; never before a W). */
static inline int pe_replays(int mode, int recompute, int U,
                             const ax_pipe_op *o) {
  return o->kind != AX_OP_WEIGHT_GRAD &&
         ax_pipe_replays(mode, recompute, U, o->micro);
}

static inline int pe_slot(int kind) {
  return kind == AX_OP_FWD ? PE_F : kind == AX_OP_WEIGHT_GRAD ? PE_W : PE_B;
}

static inline pe_op *pe_at(const pe_ctx *c, int s, int slot, long batch,
                           int micro) {
  return &c->ops[((long)(s * PE_SLOTS + slot) * c->n + batch) * c->U + micro];
}

static inline char pe_letter(int kind) {
  return "FBIWS"[kind < 0 || kind >= AX_OP_KINDS ? AX_OP_STEP : kind];
}

/* The agent that holds stage s, from the definition and NOT from
 * ax_pipe_stage_rank (which the coordinator places by): piece i on agent
 * i mod K, or for a V agent r holds stages r and 2K - 1 - r. */
static inline int pe_place(const pe_ctx *c, int s) {
  if (ax_pipe_mode_get(c->mode)->placement == AX_PLACE_V)
    return s < c->K ? s : 2 * c->K - 1 - s;
  return s % c->K;
}

/* The live-state and weight-version bounds on compute event x of stage s. */
static inline int pe_bounds(pe_ctx *c, int s, const ax_trace_event *x) {
  int live = ax_pipe_live_bound(c->mode, c->S, s, c->M),
      vers = ax_pipe_version_bound(c->mode, c->S, s, c->M);
  if (x->stash > live)
    return pe_fail(c,
                   "stage %d keeps %lld live states after %s, above the "
                   "table's bound %d",
                   s, (long long)x->stash, x->name, live);
  if (x->bytes > vers)
    return pe_fail(c,
                   "stage %d holds %lld weight versions after %s, above "
                   "the table's bound %d",
                   s, (long long)x->bytes, x->name, vers);
  return 0;
}

/* Compute event x (the j-th of agent r) against action o of r's list:
 * the stage, category, unit, agent and bounds. */
static inline int pe_match(pe_ctx *c, int r, size_t j, const ax_trace_event *x,
                           const ax_pipe_op *o, const char *want) {
  if (o->kind == AX_OP_STEP &&
      (x->pid != o->stage || strcmp(x->cat, want) || x->step != o->batch))
    return pe_fail(c,
                   "stage %d: no optim event for the STEP of batch %d "
                   "(compute event %zu of agent %d is %s %s of stage %d)",
                   o->stage, o->batch, j, r, x->cat, x->name, x->pid);
  if (x->pid != o->stage || strcmp(x->cat, want) || x->step != o->batch ||
      (o->kind != AX_OP_STEP && x->micro != o->micro))
    return pe_fail(c,
                   "stage %d: compute event %zu of agent %d is %s %s (stage "
                   "%d step %lld micro %lld), the mode's order wants %s of "
                   "%c%d/%d on stage %d",
                   x->pid, j, r, x->cat, x->name, x->pid, (long long)x->step,
                   (long long)x->micro, want, pe_letter(o->kind), o->batch,
                   o->micro, o->stage);
  if (c->agents && x->peer != c->agents[r])
    return pe_fail(c,
                   "stage %d ran %s on the agent of node rank %lld; its "
                   "placement puts it on agent %d (node rank %d)",
                   x->pid, x->name, (long long)x->peer, r, c->agents[r]);
  return pe_bounds(c, x->pid, x);
}

/* Checks agent r's compute events (sorted) against its action list and
 * fills the compute times of its operations. */
static inline int pe_agent_compute(pe_ctx *c, int r, const ax_trace_event *e,
                                   size_t ne) {
  for (size_t i = 1; i < ne; i++)
    if (e[i].ts_us < e[i - 1].ts_us + e[i - 1].dur_us)
      return pe_fail(c,
                     "stage %d: %s starts at +%lld us, before %s of stage %d "
                     "ended at +%lld us (compute events of agent %d overlap)",
                     e[i].pid, e[i].name, pe_rel(c, e[i].ts_us), e[i - 1].name,
                     e[i - 1].pid, pe_rel(c, e[i - 1].ts_us + e[i - 1].dur_us),
                     r);
  long nops = ax_pipe_nops_rank(c->mode, c->K, c->v, r, c->M, c->n);
  ax_pipe_op *sch = malloc((size_t)(nops ? nops : 1) * sizeof *sch);
  pe_op **last = calloc((size_t)c->S, sizeof *last); /* per stage: the
                                                        unit a STEP ends */
  if (!sch || !last ||
      ax_pipe_schedule_chunks(c->mode, c->K, c->v, r, c->M, c->n, sch, nops)) {
    free(sch);
    free(last);
    return pe_fail(c, "agent %d: no schedule", r);
  }
  size_t j = 0;
  int bad = 0;
  for (long i = 0; !bad && i < nops; i++) {
    const ax_pipe_op *o = &sch[i];
    const char *want[2] = {NULL, NULL};
    switch (o->kind) {
    case AX_OP_FWD:
      want[0] = "forward";
      break;
    case AX_OP_WEIGHT_GRAD:
      want[0] = "weight";
      break;
    case AX_OP_STEP:
      want[0] = "optim";
      break;
    default:
      want[0] = "backward";
    }
    if (pe_replays(c->mode, c->recompute, c->U, o) && o->kind != AX_OP_FWD &&
        o->kind != AX_OP_STEP) {
      want[1] = want[0];
      want[0] = "recompute";
    }
    pe_op *op = o->kind == AX_OP_STEP
                    ? NULL
                    : pe_at(c, o->stage, pe_slot(o->kind), o->batch, o->micro);
    for (int w = 0; !bad && w < 2 && want[w]; w++, j++) {
      if (j >= ne) {
        bad = pe_fail(c,
                      "stage %d: no %s event for %c%d.%d (operation %ld of "
                      "%ld in agent %d's order)",
                      o->stage, want[w], pe_letter(o->kind), o->batch, o->micro,
                      i, nops, r);
        break;
      }
      const ax_trace_event *x = &e[j];
      if ((bad = pe_match(c, r, j, x, o, want[w])))
        break;
      if (!op) { /* the update ends the unit's work before it */
        if (last[o->stage])
          last[o->stage]->done = x->ts_us + x->dur_us;
        continue;
      }
      if (w == 0)
        op->start = x->ts_us;
      if (strcmp(want[w], "recompute"))
        op->end = x->ts_us + x->dur_us;
      op->done = x->ts_us + x->dur_us;
    }
    if (op && o->kind != AX_OP_FWD && o->kind != AX_OP_INPUT_GRAD)
      last[o->stage] = op;
  }
  free(sch);
  free(last);
  if (!bad && j != ne)
    bad = pe_fail(c,
                  "stage %d: %zu compute events of agent %d beyond the "
                  "mode's order (%s first)",
                  e[j].pid, ne - j, r, e[j].name);
  return bad;
}

#include "tests/pipe_eventdeps.h"

/* The whole check on the events ev[0 .. ne) (any order). 0, or 1 with the
 * first violation in msg. */
static inline int pt_stage_events_check_v(const ax_trace_event *ev, size_t ne,
                                          int mode, int K, int v, int M,
                                          int recompute, long n,
                                          const int *agents, char *msg,
                                          size_t len) {
  v = ax_pipe_chunks(mode, v);
  pe_ctx c = {mode,   K, v,    K * v, M,  ax_pipe_units(mode, M), recompute, n,
              agents, 0, NULL, msg,   len};
  size_t nops = (size_t)c.S * PE_SLOTS * (size_t)n * (size_t)c.U;
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
  for (size_t i = 0; !bad && i < ne; i++)
    if (ev[i].pid < 0 || ev[i].pid >= c.S)
      bad = pe_fail(&c, "event %s of stage %d", ev[i].name, ev[i].pid);
  for (int r = 0; !bad && r < K; r++) {
    size_t nc = 0;
    for (size_t i = 0; !bad && i < ne; i++) {
      if (pe_place(&c, ev[i].pid) != r || ev[i].step < 0)
        continue; /* another agent's, or evaluation (negative ids) */
      if (ev[i].step >= n)
        bad = pe_fail(&c,
                      "stage %d: event %s of mini-batch %lld, beyond "
                      "the %ld trained",
                      ev[i].pid, ev[i].name, (long long)ev[i].step, n);
      else if (ev[i].tid == 0)
        comp[nc++] = ev[i];
      else if (ev[i].tid == 1 || ev[i].tid == 2)
        bad = pe_xfer(&c, &ev[i]);
    }
    qsort(comp, nc, sizeof *comp, pe_cmp);
    bad = bad || pe_agent_compute(&c, r, comp, nc);
  }
  bad = bad || pe_transfers(&c);
  if (!bad && ax_pipe_mode_get(mode)->forward_lock)
    bad = pe_forward_lock(&c);
  free(comp);
  free(c.ops);
  return bad;
}

/* The check for v = 1 without the placement rule. */
static inline int pt_stage_events_check(const ax_trace_event *ev, size_t ne,
                                        int mode, int K, int M, int recompute,
                                        long n, char *msg, size_t len) {
  return pt_stage_events_check_v(ev, ne, mode, K, 1, M, recompute, n, NULL, msg,
                                 len);
}

/* Drains p's stage events (ax_pipe_trace) and fails the test on the first
 * violation of pt_stage_events_check_v. With drv and the agents' names
 * (names[r] holds agent r's stages), the placement is checked too. */
static inline void pt_check_stage_trace_v(ax_pipe *p, int mode, int K, int v,
                                          int M, int recompute, long n,
                                          const ax_node *drv,
                                          const char *const *names) {
  int agents[AX_PIPE_MAX_STAGES];
  for (int r = 0; names && r < K; r++)
    AX_ASSERT_OK(ax_node_rank_of(drv, names[r], &agents[r]));
  ax_trace *tr = ax_trace_new(0);
  assert_non_null(tr);
  AX_ASSERT_OK(ax_pipe_trace(p, tr));
  ax_trace_event *ev = NULL;
  size_t ne = 0;
  AX_ASSERT_OK(ax_trace_events(tr, &ev, &ne));
  ax_trace_free(tr);
  char msg[512];
  int bad = pt_stage_events_check_v(ev, ne, mode, K, v, M, recompute, n,
                                    names ? agents : NULL, msg, sizeof msg);
  free(ev);
  if (bad)
    fail_msg("stage events: %s", msg);
}

static inline void pt_check_stage_trace(ax_pipe *p, int mode, int K, int M,
                                        int recompute, long n) {
  pt_check_stage_trace_v(p, mode, K, 1, M, recompute, n, NULL, NULL);
}

#endif
