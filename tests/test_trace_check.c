/* The stage-event oracle of the pipeline tests (tests/pipe_eventcheck.h)
 * can fail: traces simulated from the mode's action lists (every mode,
 * chunked and split ones included) pass it, and each rule rejects a trace
 * that breaks it (a consumer that computes before its input arrived, also
 * across the turn of zbv's V on one agent, overlapping compute, also of two
 * chunks of one agent, another order, also across chunks, a missing
 * recompute, optimizer step or W, a duplicate W, a W before its I, a stage
 * on the wrong agent, live states or weight versions above the table's
 * bounds, a duplicate or misaddressed transfer, a send before its compute
 * ended, no forward locking). In-process, no agents. */
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

/* Runs the check; want = NULL: it must pass, else it must fail with a
 * message containing want. */
static void expect_v(const sim *m, int mode, int K, int v, int M, int rc,
                     long n, const char *want) {
  char msg[512] = "";
  int bad = pt_stage_events_check_v(m->ev, m->n, mode, K, v, M, rc, n, g_agents,
                                    msg, sizeof msg);
  if (!want && bad)
    fail_msg("a valid %s trace fails: %s", ax_pipe_mode_name(mode), msg);
  if (want && !bad)
    fail_msg("a broken %s trace passes (want \"%s\")", ax_pipe_mode_name(mode),
             want);
  if (want && !strstr(msg, want))
    fail_msg("want \"%s\", got: %s", want, msg);
  if (want)
    fprintf(stderr, "  rejected: %s\n", msg);
}

static void expect(const sim *m, int mode, int K, int M, int rc, long n,
                   const char *want) {
  expect_v(m, mode, K, 1, M, rc, n, want);
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

static void valid_traces_pass(void **state) {
  (void)state;
  for (int mode = 0; mode <= AX_MODE_PIPEDREAM; mode++)
    for (int K = 1; K <= 4; K++)
      for (int M = 1; M <= 4; M += 3)
        for (int rc = 0; rc <= AX_RECOMPUTE_EXCEPT_LAST; rc++) {
          if (rc && mode != AX_MODE_GPIPE)
            continue;
          sim m = simulate(mode, K, M, rc, 5, 0);
          /* The check sorts: hand it the events backwards. */
          for (size_t i = 0; i < m.n / 2; i++) {
            ax_trace_event e = m.ev[i];
            m.ev[i] = m.ev[m.n - 1 - i];
            m.ev[m.n - 1 - i] = e;
          }
          expect(&m, mode, K, M, rc, 5, NULL);
          free(m.ev);
        }
}

static void data_dependencies_fail(void **state) {
  (void)state;
  /* Consumers that do not wait for their input. */
  int modes[] = {AX_MODE_SEQUENTIAL, AX_MODE_GPIPE, AX_MODE_1F1B,
                 AX_MODE_PIPEDREAM};
  for (int i = 0; i < 4; i++) {
    sim m = simulate(modes[i], 3, 4, 0, 3, SIM_NO_DATA_DEPS);
    expect(&m, modes[i], 3, 4, 0, 3, "started sending them");
    free(m.ev);
  }
  sim m = simulate(AX_MODE_GPIPE, 3, 4, 0, 2, 0);
  /* The consumer starts computing before its receive ended. */
  size_t r = find(&m, 2, 1, "recv", 1, 2);
  m.ev[r].dur_us += 1000;
  expect(&m, AX_MODE_GPIPE, 3, 4, 0, 2, "before its activations arrived");
  m.ev[r].dur_us -= 1000;
  /* A gradient received twice, then never. */
  r = find(&m, 0, 1, "recv", 0, 3);
  ax_trace_event dup = m.ev[r];
  sim_push(&m, &dup);
  expect(&m, AX_MODE_GPIPE, 3, 4, 0, 2, "received its gradient 2 times");
  m.n--;
  drop(&m, r);
  expect(&m, AX_MODE_GPIPE, 3, 4, 0, 2, "received its gradient 0 times");
  free(m.ev);
  /* A send that starts before its forward ended. */
  m = simulate(AX_MODE_1F1B, 3, 2, 0, 2, 0);
  size_t sd = find(&m, 1, 2, "send", 1, 1);
  m.ev[sd].ts_us -= 5;
  expect(&m, AX_MODE_1F1B, 3, 2, 0, 2, "before its forward ended");
  m.ev[sd].ts_us += 5;
  /* A transfer to a stage that is not a neighbour. */
  m.ev[sd].peer = 3;
  expect(&m, AX_MODE_1F1B, 3, 2, 0, 2, "not a neighbour");
  free(m.ev);
}

static void stage_order_fails(void **state) {
  (void)state;
  sim m = simulate(AX_MODE_GPIPE, 3, 4, AX_RECOMPUTE_ALWAYS, 2, 0);
  /* Recompute where the mode has none, and none where it has. */
  expect(&m, AX_MODE_GPIPE, 3, 4, AX_RECOMPUTE_NEVER, 2, "is recompute");
  expect(&m, AX_MODE_GPIPE, 3, 4, AX_RECOMPUTE_ALWAYS, 2, NULL);
  drop(&m, find(&m, 1, 0, "recompute", 1, 2));
  expect(&m, AX_MODE_GPIPE, 3, 4, AX_RECOMPUTE_ALWAYS, 2, "wants recompute");
  free(m.ev);
  /* No optimizer step after the flush. */
  m = simulate(AX_MODE_GPIPE, 3, 4, 0, 2, 0);
  drop(&m, find(&m, 2, 0, "optim", 0, 0));
  expect(&m, AX_MODE_GPIPE, 3, 4, 0, 2, "no optim event");
  free(m.ev);
  /* Two forwards in the other order (labels swapped). */
  m = simulate(AX_MODE_1F1B, 4, 4, 0, 2, 0);
  size_t a = find(&m, 1, 0, "forward", 0, 1),
         b = find(&m, 1, 0, "forward", 0, 2);
  m.ev[a].micro = 2;
  m.ev[b].micro = 1;
  expect(&m, AX_MODE_1F1B, 4, 4, 0, 2, "the mode's order wants forward");
  free(m.ev);
  /* Overlapping compute on one stage. */
  m = simulate(AX_MODE_PIPEDREAM, 3, 1, 0, 4, 0);
  m.ev[find(&m, 1, 0, "forward", 1, 0)].dur_us += 500;
  expect(&m, AX_MODE_PIPEDREAM, 3, 1, 0, 4, "overlap");
  free(m.ev);
  /* An event of a mini-batch that was not trained. */
  m = simulate(AX_MODE_SEQUENTIAL, 2, 1, 0, 3, 0);
  expect(&m, AX_MODE_SEQUENTIAL, 2, 1, 0, 2, "beyond the 2 trained");
  free(m.ev);
}

static void forward_locking_fails(void **state) {
  (void)state;
  for (int mode = AX_MODE_DDG; mode <= AX_MODE_FR; mode++) {
    sim m = simulate(mode, 3, 1, 0, 6, SIM_NO_LOCK);
    expect(&m, mode, 3, 1, 0, 6, "forward locking");
    free(m.ev);
  }
  /* Pipedream has no forward locking: the same trace passes. */
  sim m = simulate(AX_MODE_PIPEDREAM, 3, 1, 0, 6, SIM_NO_LOCK);
  expect(&m, AX_MODE_PIPEDREAM, 3, 1, 0, 6, NULL);
  free(m.ev);
}

/* 2bw and the chunked and split modes: the simulated traces pass. */
static void valid_new_traces_pass(void **state) {
  (void)state;
  for (int K = 1; K <= 4; K++) {
    int ms[] = {1, 3, 4, 5};
    for (int i = 0; i < 4; i++) {
      int M = ms[i];
      if (M >= ax_pipe_min_units(AX_MODE_2BW, K)) {
        sim m = simulate_v(AX_MODE_2BW, K, 1, M, 0, 4, 0);
        expect_v(&m, AX_MODE_2BW, K, 1, M, 0, 4, NULL);
        free(m.ev);
      }
      for (int mode = AX_MODE_ZBH1; mode <= AX_MODE_ZBV; mode++) {
        sim m = simulate_v(mode, K, 2, M, 0, 3, 0);
        expect_v(&m, mode, K, 2, M, 0, 3, NULL);
        free(m.ev);
      }
    }
    for (int v = 2; v <= 3; v++)
      for (int M = K; M <= 2 * K; M += K) {
        sim m = simulate_v(AX_MODE_INTERLEAVED, K, v, M, 0, 3, 0);
        expect_v(&m, AX_MODE_INTERLEAVED, K, v, M, 0, 3, NULL);
        free(m.ev);
      }
  }
}

/* The index of stage s's compute event of category cat for (b, mi). */
static size_t find_c(const sim *m, int s, const char *cat, long b, int mi) {
  return find(m, s, 0, cat, b, mi);
}

static void new_modes_rules_fail(void **state) {
  (void)state;
  /* Placement: zbv's stage K is on agent K - 1 (the V), not on agent 0. */
  sim m = simulate_v(AX_MODE_ZBV, 3, 2, 4, 0, 2, 0);
  expect_v(&m, AX_MODE_ZBV, 3, 2, 4, 0, 2, NULL);
  size_t i = find_c(&m, 3, "forward", 1, 2);
  m.ev[i].peer = g_agents[0];
  expect_v(&m, AX_MODE_ZBV, 3, 2, 4, 0, 2, "placement puts it on agent 2");
  m.ev[i].peer = g_agents[2];
  /* A W that never ran, and one that ran twice. */
  i = find_c(&m, 4, "weight", 1, 3);
  ax_trace_event w = m.ev[i];
  drop(&m, i);
  expect_v(&m, AX_MODE_ZBV, 3, 2, 4, 0, 2, "wants weight of W1/3 on stage 4");
  sim_push(&m, &w);
  sim_push(&m, &w);
  expect_v(&m, AX_MODE_ZBV, 3, 2, 4, 0, 2, "overlap");
  w.ts_us = w.ts_us + 100000;
  m.ev[m.n - 1] = w;
  expect_v(&m, AX_MODE_ZBV, 3, 2, 4, 0, 2, "beyond the mode's order");
  m.n -= 1;
  /* A unit's W before its I (their labels swapped). */
  size_t a = find_c(&m, 5, "backward", 0, 1), b = find_c(&m, 5, "weight", 0, 1);
  strcpy(m.ev[a].cat, "weight");
  strcpy(m.ev[b].cat, "backward");
  expect_v(&m, AX_MODE_ZBV, 3, 2, 4, 0, 2, "is weight");
  strcpy(m.ev[a].cat, "backward");
  strcpy(m.ev[b].cat, "weight");
  /* A consumer across the V's turn (stages 2 and 3, both on agent 2) that
   * computes before its activations arrived. */
  i = find(&m, 3, 1, "recv", 1, 0);
  m.ev[i].dur_us += 1000;
  expect_v(&m, AX_MODE_ZBV, 3, 2, 4, 0, 2, "before its activations arrived");
  m.ev[i].dur_us -= 1000;
  /* The I's gradient from the turn received twice. */
  for (i = 0; m.ev[i].pid != 2 || m.ev[i].tid != 1 || m.ev[i].peer != 3 ||
              m.ev[i].step != 0 || m.ev[i].micro != 2;)
    i++; /* the simulation has it */
  ax_trace_event g = m.ev[i];
  sim_push(&m, &g);
  expect_v(&m, AX_MODE_ZBV, 3, 2, 4, 0, 2, "received its gradient 2 times");
  m.n--;
  /* Live states and weight versions above the table's bounds. */
  i = find_c(&m, 1, "forward", 1, 3);
  int64_t keep = m.ev[i].stash;
  m.ev[i].stash = ax_pipe_live_bound(AX_MODE_ZBV, 6, 1, 4) + 1;
  expect_v(&m, AX_MODE_ZBV, 3, 2, 4, 0, 2, "live states");
  m.ev[i].stash = keep;
  expect_v(&m, AX_MODE_ZBV, 3, 2, 4, 0, 2, NULL);
  free(m.ev);
  m = simulate_v(AX_MODE_2BW, 3, 1, 4, 0, 4, 0);
  m.ev[find_c(&m, 1, "backward", 2, 1)].bytes = 3;
  expect_v(&m, AX_MODE_2BW, 3, 1, 4, 0, 4, "3 weight versions");
  free(m.ev);
  /* Interleaved: consumers that do not wait; two chunks of one agent in
   * the other order (stage 0's and stage 2's forwards of a unit swapped);
   * one agent's chunks overlapping. */
  m = simulate_v(AX_MODE_INTERLEAVED, 2, 2, 4, 0, 2, SIM_NO_DATA_DEPS);
  expect_v(&m, AX_MODE_INTERLEAVED, 2, 2, 4, 0, 2, "started sending them");
  free(m.ev);
  m = simulate_v(AX_MODE_INTERLEAVED, 2, 2, 4, 0, 2, 0);
  a = find_c(&m, 0, "forward", 1, 0);
  b = find_c(&m, 2, "forward", 1, 0);
  m.ev[a].pid = 2;
  m.ev[b].pid = 0;
  expect_v(&m, AX_MODE_INTERLEAVED, 2, 2, 4, 0, 2,
           "the mode's order wants forward");
  m.ev[a].pid = 0;
  m.ev[b].pid = 2;
  expect_v(&m, AX_MODE_INTERLEAVED, 2, 2, 4, 0, 2, NULL);
  m.ev[find_c(&m, 0, "forward", 0, 1)].dur_us += 15;
  expect_v(&m, AX_MODE_INTERLEAVED, 2, 2, 4, 0, 2, "of agent 0 overlap");
  free(m.ev);
  /* zb-h1: an I without its W (relabelled a full backward). */
  m = simulate_v(AX_MODE_ZBH1, 3, 1, 4, 0, 2, 0);
  strcpy(m.ev[find_c(&m, 1, "weight", 1, 2)].cat, "backward");
  expect_v(&m, AX_MODE_ZBH1, 3, 1, 4, 0, 2, "wants weight");
  free(m.ev);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(valid_traces_pass),
      cmocka_unit_test(data_dependencies_fail),
      cmocka_unit_test(stage_order_fails),
      cmocka_unit_test(forward_locking_fails),
      cmocka_unit_test(valid_new_traces_pass),
      cmocka_unit_test(new_modes_rules_fail),
  };
  return AX_TEST_MAIN(t);
}
