/* Per-step metrics from synthetic event lists with known answers
 * (runtime/pipeline/trace/metrics.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "axon/runtime/pipeline/trace/metrics.h"
#include "harness.h"

static ax_trace_event ev(const char *cat, int pid, int64_t a, int64_t b,
                         int64_t stash) {
  ax_trace_event e = ax_trace_event_make("x", cat, pid, 0, a, b);
  e.stash = stash;
  return e;
}

static void busy_and_bubble(void **state) {
  (void)state;
  /* Window [1000, 2000]: stage 0 computes 400 us (two events, one clipped
   * at the window start), stage 1 computes 500 us with an overlap counted
   * once, stage 2 only sends (busy 0); events of pid 5 are ignored. */
  ax_trace_event e[] = {
      ev("forward", 0, 800, 1100, 1),    /* 100 inside */
      ev("backward", 0, 1500, 1800, 0),  /* 300 */
      ev("forward", 1, 1000, 1300, 2),   /* 300 */
      ev("recompute", 1, 1200, 1400, 3), /* +100 beyond the overlap */
      ev("backward", 1, 1900, 2100, 1),  /* 100 inside */
      ev("send", 2, 1000, 2000, 4),      ev("forward", 5, 1000, 2000, 9),
      ev("backward", 0, 2500, 2600, 7), /* outside the window */
  };
  ax_step_metrics m;
  AX_ASSERT_OK(ax_metrics_init(&m, 3, 3));
  m.samples = 64;
  AX_ASSERT_OK(
      ax_metrics_from_events(&m, e, sizeof e / sizeof e[0], 1000, 2000));
  AX_ASSERT_CLOSE(m.wall_s, 0.001, 1e-12, 0);
  AX_ASSERT_CLOSE(m.samples_per_s, 64000, 1e-6, 0);
  AX_ASSERT_CLOSE(m.busy[0], 0.4, 1e-12, 0);
  AX_ASSERT_CLOSE(m.busy[1], 0.5, 1e-12, 0);
  AX_ASSERT_CLOSE(m.busy[2], 0.0, 1e-12, 0);
  AX_ASSERT_CLOSE(m.bubble, 1.0 - 0.9 / 3, 1e-12, 0);
  assert_int_equal(m.live_stash[0], 1);
  assert_int_equal(m.live_stash[1], 3);
  assert_int_equal(m.live_stash[2], 4);
  /* No events: fully idle; bad windows and K are rejected. */
  AX_ASSERT_OK(ax_metrics_init(&m, 0, 2));
  AX_ASSERT_OK(ax_metrics_from_events(&m, NULL, 0, 0, 10));
  AX_ASSERT_CLOSE(m.bubble, 1.0, 1e-12, 0);
  assert_int_equal(m.live_stash[0], -1);
  AX_ASSERT_ERR(ax_metrics_from_events(&m, NULL, 0, 10, 10), AX_EINVAL);
  AX_ASSERT_ERR(ax_metrics_init(&m, 0, 0), AX_EINVAL);
  AX_ASSERT_ERR(ax_metrics_init(&m, 0, 65), AX_EINVAL);
}

static void gpipe_bubble(void **state) {
  (void)state;
  /* An ideal GPipe step, K = 4, M = 8, t_f = 1, t_b = 2 (ms): busy =
   * M (t_f + t_b) / ((M + K - 1)(t_f + t_b)) = 8 / 11 on every stage. */
  int K = 4, M = 8;
  ax_trace_event e[64];
  size_t n = 0;
  for (int s = 0; s < K; s++)
    for (int m = 0; m < M; m++) {
      int64_t f0 = (s + m) * 1000;
      int64_t b0 = (M + K - 1) * 1000 + (K - 1 - s + m) * 2000;
      e[n++] = ev("forward", s, f0, f0 + 1000, -1);
      e[n++] = ev("backward", s, b0, b0 + 2000, -1);
    }
  ax_step_metrics m;
  AX_ASSERT_OK(ax_metrics_init(&m, 0, K));
  AX_ASSERT_OK(ax_metrics_from_events(&m, e, n, 0, 11 * 3000));
  for (int s = 0; s < K; s++)
    AX_ASSERT_CLOSE(m.busy[s], 8.0 / 11.0, 1e-12, 0);
  AX_ASSERT_CLOSE(m.bubble, 3.0 / 11.0, 1e-12, 0);
}

static void csv_and_summary(void **state) {
  (void)state;
  char path[128];
  snprintf(path, sizeof path, "/tmp/axon_metrics_%d.csv", (int)getpid());
  ax_metrics_csv *w;
  AX_ASSERT_OK(ax_metrics_csv_open(path, 2, &w));
  ax_step_metrics m;
  for (int i = 0; i < 3; i++) {
    AX_ASSERT_OK(ax_metrics_init(&m, i, 2));
    m.wall_s = 0.5;
    m.samples = 32;
    m.samples_per_s = 64;
    m.loss = 2.0 - i;
    m.busy[0] = 0.75, m.busy[1] = 0.25, m.bubble = 0.5;
    m.peak_mem[0] = 3 << 20;
    m.live_stash[0] = 2, m.live_stash[1] = 1;
    m.coord_bytes = 1 << 20;
    AX_ASSERT_OK(ax_metrics_csv_row(w, &m));
  }
  ax_step_metrics bad;
  AX_ASSERT_OK(ax_metrics_init(&bad, 0, 3));
  AX_ASSERT_ERR(ax_metrics_csv_row(w, &bad), AX_EINVAL);
  AX_ASSERT_OK(ax_metrics_csv_close(w));
  FILE *f = fopen(path, "r");
  char line[512];
  assert_non_null(fgets(line, sizeof line, f));
  assert_string_equal(line, "step,wall_s,samples,samples_per_s,loss,lr,bubble,"
                            "coord_bytes,busy_0,busy_1,peak_mem_0,peak_mem_1,"
                            "live_stash_0,live_stash_1\n");
  int rows = 0;
  while (fgets(line, sizeof line, f))
    rows++;
  assert_int_equal(rows, 3);
  fclose(f);
  remove(path);
  AX_ASSERT_ERR(ax_metrics_csv_open("/nonexistent/m.csv", 2, &w), AX_EIO);
  char buf[256];
  ax_metrics_summary(&m, buf, sizeof buf);
  assert_string_equal(buf, "step 2: 64.0 samples/s, loss 0.0000, bubble "
                           "50.0%, busy 75%/25%, peak MiB 3.0/0.0, stash "
                           "2/1, coordinator 1.00 MiB");
  ax_metrics_summary(&m, buf, 10); /* truncates safely */
  assert_int_equal(strlen(buf), 9);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(busy_and_bubble),
      cmocka_unit_test(gpipe_bubble),
      cmocka_unit_test(csv_and_summary),
  };
  return AX_TEST_MAIN(t);
}
