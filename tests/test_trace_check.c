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
#include "tests/pipe_tracesim.h"

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
