/* Stage traces simulated from the mode's action lists, as the stage hosts
 * record them (stage_events.c), for tests/test_trace_check.c: a valid
 * trace of any mode (chunked and split ones included) and helpers to break
 * it. Header-only, static functions. */
#ifndef AX_PIPE_TRACESIM_H
#define AX_PIPE_TRACESIM_H

#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tests/pipe_eventcheck.h"

enum { SIM_NO_DATA_DEPS = 1, SIM_NO_LOCK = 2 };

/* The node ranks the simulated agents have (agent r: node rank 10 + r). */
static const int g_agents[AX_PIPE_MAX_STAGES] = {10, 11, 12, 13, 14, 15, 16,
                                                 17, 18, 19, 20, 21, 22, 23};

typedef struct sim {
  ax_trace_event *ev;
  size_t n, cap;
} sim;

static void sim_push(sim *m, const ax_trace_event *e) {
  if (m->n == m->cap) {
    m->cap = m->cap ? 2 * m->cap : 256;
    m->ev = realloc(m->ev, m->cap * sizeof *m->ev);
    assert_non_null(m->ev);
  }
  m->ev[m->n++] = *e;
}

/* An event as the stage host records it (stage_events.c): a transfer with
 * its peer stage, or a compute event with its agent's node rank, the live
 * states after it (stash, -1 absent) and one weight version. */
static void sim_add(sim *m, const char *cat, int s, int tid, int64_t t0,
                    int64_t t1, const ax_pipe_op *o, int peer, int stash) {
  char name[32];
  if (tid) /* "send A1.2": activations or gradient */
    snprintf(name, sizeof name, "%s %c%d.%d", cat,
             o->kind == AX_OP_FWD ? 'A' : 'G', o->batch, o->micro);
  else /* "R1.2": forward, backward, weight, recompute or update */
    snprintf(name, sizeof name, "%c%d.%d",
             cat[0] == 'o' ? 'U' : cat[0] - 'a' + 'A', o->batch, o->micro);
  ax_trace_event e = ax_trace_event_make(name, cat, s, tid, t0, t1);
  e.step = o->batch;
  e.micro = o->micro;
  e.peer = peer;
  if (!tid) {
    e.stash = stash;
    e.bytes = cat[0] == 'r' ? -1 : 1;
  }
  sim_push(m, &e);
}

/* A stage trace of n mini-batches as the stage hosts record it: each of K
 * agents (v stages each) walks its action list; an operation starts when
 * the agent is free, its input arrived (1 us after the producer started
 * sending, i.e. before the producer stamps the end of its send) and, for
 * ddg and fr, round t-1 is over. Forward 10 us, recompute 5, backward (or
 * I, or W) 10, optimizer 2, send 2. SIM_NO_DATA_DEPS: consumers do not
 * wait for their input (they "receive" it as soon as they are free);
 * SIM_NO_LOCK: no forward locking. */
static sim simulate_v(int mode, int K, int v, int M, int rc, long n,
                      int flags) {
  sim m = {0};
  v = ax_pipe_chunks(mode, v);
  int U = ax_pipe_units(mode, M), S = K * v, live[AX_PIPE_MAX_STAGES] = {0};
  long nops = ax_pipe_nops_chunks(mode, v, M, n), idx[AX_PIPE_MAX_STAGES] = {0};
  int64_t free_at[AX_PIPE_MAX_STAGES] = {0};
  ax_pipe_op *ops[AX_PIPE_MAX_STAGES];
  size_t units = (size_t)n * U, cells = (size_t)PE_SLOTS * S * units;
  /* Per (stage, slot, unit): when the op's output send started, and when
   * the op was done (optimizer included); -1 before it ran. */
  int64_t *sent = malloc(cells * sizeof *sent);
  int64_t *done = malloc(cells * sizeof *done);
  for (size_t i = 0; i < cells; i++)
    sent[i] = done[i] = -1;
#define AT(s, k, b, u)                                                         \
  (((size_t)(s)*PE_SLOTS + (k)) * units + (size_t)(b)*U + (u))
  for (int r = 0; r < K; r++) {
    ops[r] = malloc((size_t)nops * sizeof *ops[r]);
    AX_ASSERT_OK(ax_pipe_schedule_chunks(mode, K, v, r, M, n, ops[r], nops));
  }
  for (int progress = 1; progress;) {
    progress = 0;
    for (int r = 0; r < K; r++) {
      if (idx[r] == nops)
        continue;
      const ax_pipe_op *o = &ops[r][idx[r]];
      int s = o->stage, agent = g_agents[r];
      if (o->kind == AX_OP_STEP || o->kind == AX_OP_WEIGHT_GRAD) {
        int64_t t = free_at[r], d = o->kind == AX_OP_STEP ? 2 : 10;
        if (o->kind == AX_OP_STEP) { /* the update, after its backwards */
          sim_add(&m, "optim", s, 0, t, t + d, o, agent, -1);
          done[AT(s, PE_B, o->batch, 0)] = t + d; /* lock: B + update */
        } else {
          sim_add(&m, "weight", s, 0, t, t + d, o, agent, --live[s]);
        }
        free_at[r] = t + d;
        idx[r]++;
        progress = 1;
        continue;
      }
      int fwd = o->kind == AX_OP_FWD, from = fwd ? s - 1 : s + 1;
      int slot = fwd ? PE_F : PE_B;
      int64_t start = free_at[r], arrive = -1, lock = 0;
      if (from >= 0 && from < S) {
        arrive = sent[AT(from, slot, o->batch, o->micro)];
        if (arrive < 0 && !(flags & SIM_NO_DATA_DEPS))
          continue; /* its input is not sent yet */
        arrive = flags & SIM_NO_DATA_DEPS ? start : arrive + 1;
      }
      if (fwd && s == 0 && o->batch > 0 && !(flags & SIM_NO_LOCK) &&
          ax_pipe_mode_get(mode)->forward_lock) {
        long b0 = o->batch - 1;
        lock = done[AT(S - 1, PE_F, b0, 0)];
        for (int j = 0; j < S && lock >= 0; j++) {
          long b = b0 - (S - 1 - j);
          int64_t d = b >= 0 ? done[AT(j, PE_B, b, 0)] : 0;
          lock = d < 0 ? -1 : d > lock ? d : lock;
        }
        if (lock < 0)
          continue; /* round t-1 is not over */
      }
      if (arrive >= 0) {
        int64_t got = arrive > start ? arrive : start;
        sim_add(&m, "recv", s, 1, start, got, o, from, -1);
        start = got;
      }
      start = lock > start ? lock : start;
      int64_t t = start;
      if (!fwd && pe_replays(mode, rc, U, o)) {
        sim_add(&m, "recompute", s, 0, t, t + 5, o, agent, -1);
        t += 5;
      }
      live[s] += fwd ? 1 : o->kind == AX_OP_BWD ? -1 : 0;
      sim_add(&m, fwd ? "forward" : "backward", s, 0, t, t + 10, o, agent,
              live[s]);
      t += 10;
      /* A backward is done with the STEP right after it (the lock). */
      if (fwd || idx[r] + 1 == nops || ops[r][idx[r] + 1].kind != AX_OP_STEP)
        done[AT(s, slot, o->batch, o->micro)] = t;
      int to = fwd ? s + 1 : s - 1;
      if (to >= 0 && to < S) {
        sent[AT(s, slot, o->batch, o->micro)] = t;
        sim_add(&m, "send", s, 2, t, t + 2, o, to, -1);
        t += 2;
      }
      free_at[r] = t;
      idx[r]++;
      progress = 1;
    }
  }
#undef AT
  for (int r = 0; r < K; r++) {
    assert_int_equal(idx[r], nops); /* the simulation did not deadlock */
    free(ops[r]);
  }
  free(sent);
  free(done);
  return m;
}

static sim simulate(int mode, int K, int M, int rc, long n, int flags) {
  return simulate_v(mode, K, 1, M, rc, n, flags);
}

/* The index of the first event of stage s on lane tid with cat, unit
 * (b, m), or fails. */
static size_t find(const sim *m, int s, int tid, const char *cat, long b,
                   int mi) {
  for (size_t i = 0; i < m->n; i++)
    if (m->ev[i].pid == s && m->ev[i].tid == tid &&
        !strcmp(m->ev[i].cat, cat) && m->ev[i].step == b &&
        m->ev[i].micro == mi)
      return i;
  fail_msg("no %s of %ld/%d on stage %d", cat, b, mi, s);
  return 0;
}

static void drop(sim *m, size_t i) {
  memmove(&m->ev[i], &m->ev[i + 1], (m->n - i - 1) * sizeof *m->ev);
  m->n--;
}

#endif
