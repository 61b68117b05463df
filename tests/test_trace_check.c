/* The stage-event oracle of the pipeline tests (tests/pipe_eventcheck.h)
 * can fail: traces simulated from the mode's schedules pass it, and each
 * rule rejects a trace that breaks it (a consumer that computes before its
 * input arrived, overlapping compute, another order, a missing recompute
 * or optimizer step, a duplicate or misaddressed transfer, a send before
 * its compute ended, no forward locking). In-process, no agents. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tests/pipe_eventcheck.h"

enum { SIM_NO_DATA_DEPS = 1, SIM_NO_LOCK = 2 };

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

/* An event as the stage host records it (stage_events.c). */
static void sim_add(sim *m, const char *cat, int s, int tid, int64_t t0,
                    int64_t t1, const ax_pipe_op *o, int peer) {
  char name[32];
  if (tid) /* "send A1.2": activations or gradient */
    snprintf(name, sizeof name, "%s %c%d.%d", cat, o->kind ? 'G' : 'A',
             o->batch, o->micro);
  else /* "R1.2": forward, backward, recompute or update */
    snprintf(name, sizeof name, "%c%d.%d",
             cat[0] == 'o' ? 'U' : cat[0] - 'a' + 'A', o->batch, o->micro);
  ax_trace_event e = ax_trace_event_make(name, cat, s, tid, t0, t1);
  e.step = o->batch;
  e.micro = o->micro;
  e.peer = tid ? peer : -1;
  sim_push(m, &e);
}

/* A stage trace of n mini-batches as the stage host records it: each
 * stage walks its schedule; an operation starts when the stage is free,
 * its input arrived (1 us after the producer started sending, i.e. before
 * the producer stamps the end of its send) and, for ddg and fr, round t-1
 * is over. Forward 10 us, recompute 5, backward 10, optimizer 2, send 2.
 * SIM_NO_DATA_DEPS: consumers do not wait for their input (they "receive"
 * it as soon as they are free); SIM_NO_LOCK: no forward locking. */
static sim simulate(int mode, int K, int M, int rc, long n, int flags) {
  sim m = {0};
  int U = ax_pipe_units(mode, M);
  long nops = ax_pipe_nops(mode, M, n), idx[AX_PIPE_MAX_STAGES] = {0};
  int64_t free_at[AX_PIPE_MAX_STAGES] = {0};
  ax_pipe_op *ops[AX_PIPE_MAX_STAGES];
  size_t units = (size_t)n * U;
  /* Per (stage, kind, unit): when the op's output send started, and when
   * the op was done (optimizer included); -1 before it ran. */
  int64_t *sent = malloc(2 * K * units * sizeof *sent);
  int64_t *done = malloc(2 * K * units * sizeof *done);
  for (size_t i = 0; i < 2 * K * units; i++)
    sent[i] = done[i] = -1;
#define AT(s, k, b, u) (((size_t)(s)*2 + (k)) * units + (size_t)(b)*U + (u))
  for (int s = 0; s < K; s++) {
    ops[s] = malloc((size_t)nops * sizeof *ops[s]);
    AX_ASSERT_OK(ax_pipe_schedule(mode, K, s, M, n, ops[s], nops));
  }
  for (int progress = 1; progress;) {
    progress = 0;
    for (int s = 0; s < K; s++) {
      if (idx[s] == nops)
        continue;
      const ax_pipe_op *o = &ops[s][idx[s]];
      if (o->kind == AX_OP_STEP) { /* the update, after its backwards */
        int64_t t = free_at[s];
        sim_add(&m, "optim", s, 0, t, t + 2, o, -1);
        done[AT(s, AX_OP_BWD, o->batch, 0)] = t + 2; /* lock: B + update */
        free_at[s] = t + 2;
        idx[s]++;
        progress = 1;
        continue;
      }
      int fwd = o->kind == AX_OP_FWD, from = fwd ? s - 1 : s + 1;
      int64_t start = free_at[s], arrive = -1, lock = 0;
      if (from >= 0 && from < K) {
        arrive = sent[AT(from, o->kind, o->batch, o->micro)];
        if (arrive < 0 && !(flags & SIM_NO_DATA_DEPS))
          continue; /* its input is not sent yet */
        arrive = flags & SIM_NO_DATA_DEPS ? start : arrive + 1;
      }
      if (fwd && s == 0 && o->batch > 0 && !(flags & SIM_NO_LOCK) &&
          ax_pipe_mode_get(mode)->forward_lock) {
        long r = o->batch - 1;
        lock = done[AT(K - 1, AX_OP_FWD, r, 0)];
        for (int j = 0; j < K && lock >= 0; j++) {
          long b = r - (K - 1 - j);
          int64_t d = b >= 0 ? done[AT(j, AX_OP_BWD, b, 0)] : 0;
          lock = d < 0 ? -1 : d > lock ? d : lock;
        }
        if (lock < 0)
          continue; /* round t-1 is not over */
      }
      if (arrive >= 0) {
        int64_t got = arrive > start ? arrive : start;
        sim_add(&m, "recv", s, 1, start, got, o, from);
        start = got;
      }
      start = lock > start ? lock : start;
      int64_t t = start;
      if (!fwd && pe_replays(mode, rc, U, o)) {
        sim_add(&m, "recompute", s, 0, t, t + 5, o, -1);
        t += 5;
      }
      sim_add(&m, fwd ? "forward" : "backward", s, 0, t, t + 10, o, -1);
      t += 10;
      /* A backward is done with the STEP right after it (the lock). */
      if (fwd || idx[s] + 1 == nops || ops[s][idx[s] + 1].kind != AX_OP_STEP)
        done[AT(s, o->kind, o->batch, o->micro)] = t;
      int to = fwd ? s + 1 : s - 1;
      if (to >= 0 && to < K) {
        sent[AT(s, o->kind, o->batch, o->micro)] = t;
        sim_add(&m, "send", s, 2, t, t + 2, o, to);
        t += 2;
      }
      free_at[s] = t;
      idx[s]++;
      progress = 1;
    }
  }
#undef AT
  for (int s = 0; s < K; s++) {
    assert_int_equal(idx[s], nops); /* the simulation did not deadlock */
    free(ops[s]);
  }
  free(sent);
  free(done);
  return m;
}

/* Runs the check; want = NULL: it must pass, else it must fail with a
 * message containing want. */
static void expect(const sim *m, int mode, int K, int M, int rc, long n,
                   const char *want) {
  char msg[512] = "";
  int bad =
      pt_stage_events_check(m->ev, m->n, mode, K, M, rc, n, msg, sizeof msg);
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

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(valid_traces_pass),
      cmocka_unit_test(data_dependencies_fail),
      cmocka_unit_test(stage_order_fails),
      cmocka_unit_test(forward_locking_fails),
  };
  return AX_TEST_MAIN(t);
}
