/* The Chrome-trace writer, reader, encoding and merging
 * (runtime/pipeline/trace/trace.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "axon/runtime/pipeline/trace/trace.h"
#include "harness.h"

static void tmp_path(char *buf, size_t len, const char *tag) {
  snprintf(buf, len, "/tmp/axon_trace_%s_%d.json", tag, (int)getpid());
}

/* Validates the file with python's json module when python3 exists. */
static void check_json(const char *path) {
  if (access("/usr/bin/python3", X_OK) != 0)
    return;
  char cmd[512];
  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 -c 'import json,sys; "
           "d=json.load(open(sys.argv[1])); assert \"traceEvents\" in d' %s",
           path);
  assert_int_equal(system(cmd), 0);
}

static void fill(ax_trace *t, int pid, int n, int64_t base) {
  for (int i = 0; i < n; i++) {
    ax_trace_event e = ax_trace_event_make(
        i % 2 ? "B" : "F \"quoted\"\\", i % 2 ? "backward" : "forward", pid, 0,
        base + 100 * i, base + 100 * i + 40);
    e.step = i / 2;
    e.micro = i % 3 ? i % 3 : -1;
    e.bytes = 1024 * i;
    e.stash = i % 4;
    e.peer = pid + 1;
    AX_ASSERT_OK(ax_trace_add(t, &e));
  }
}

static void same_event(const ax_trace_event *a, const ax_trace_event *b) {
  assert_string_equal(a->name, b->name);
  assert_string_equal(a->cat, b->cat);
  assert_true(a->pid == b->pid && a->tid == b->tid);
  assert_true(a->ts_us == b->ts_us && a->dur_us == b->dur_us);
  assert_true(a->step == b->step && a->micro == b->micro);
  assert_true(a->bytes == b->bytes && a->stash == b->stash &&
              a->peer == b->peer);
}

static void json_round_trip(void **state) {
  (void)state;
  ax_trace *t = ax_trace_new(0);
  AX_ASSERT_OK(ax_trace_name_process(t, 0, "w1 \"stage 0\""));
  AX_ASSERT_OK(ax_trace_name_process(t, 1, "w2"));
  AX_ASSERT_OK(ax_trace_name_thread(t, 1, 2, "sender"));
  fill(t, 0, 10, 1000);
  fill(t, 1, 7, 1050);
  AX_ASSERT_OK(ax_trace_record(t, "opt", "optim", 1, 0, 5000, 5100, 3, -1, -1));
  char path[128];
  tmp_path(path, sizeof path, "rt");
  AX_ASSERT_OK(ax_trace_write(t, path));
  check_json(path);
  ax_trace *r = NULL;
  AX_ASSERT_OK(ax_trace_read(path, &r));
  ax_trace_event *a, *b;
  size_t na, nb;
  AX_ASSERT_OK(ax_trace_events(t, &a, &na));
  AX_ASSERT_OK(ax_trace_events(r, &b, &nb));
  assert_int_equal(na, 18);
  assert_int_equal(nb, na);
  for (size_t i = 0; i < na; i++)
    same_event(&a[i], &b[i]);
  char name[64];
  AX_ASSERT_OK(ax_trace_get_name(r, 0, -1, name, sizeof name));
  assert_string_equal(name, "w1 \"stage 0\"");
  AX_ASSERT_OK(ax_trace_get_name(r, 1, 2, name, sizeof name));
  assert_string_equal(name, "sender");
  AX_ASSERT_ERR(ax_trace_get_name(r, 7, -1, name, sizeof name), AX_ENOTFOUND);
  free(a);
  free(b);
  ax_trace_free(r);
  ax_trace_free(t);
  remove(path);
  /* A file that is not a trace. */
  FILE *f = fopen(path, "w");
  fputs("{\"hello\": [1, 2\n", f);
  fclose(f);
  AX_ASSERT_ERR(ax_trace_read(path, &r), AX_EFORMAT);
  remove(path);
  AX_ASSERT_ERR(ax_trace_read("/nonexistent/x.json", &r), AX_EIO);
}

static void encode_merge(void **state) {
  (void)state;
  ax_trace *stage = ax_trace_new(0), *coord = ax_trace_new(0);
  AX_ASSERT_OK(ax_trace_name_process(stage, 2, "w3"));
  fill(stage, 2, 5, 10000);
  ax_trace_set_clock_offset(stage, 7);
  void *buf;
  size_t len;
  AX_ASSERT_OK(ax_trace_encode(stage, 1, &buf, &len));
  assert_int_equal(ax_trace_count(stage), 0); /* cleared */
  fill(coord, 0, 3, 0);
  AX_ASSERT_OK(ax_trace_merge(coord, buf, len, 100));
  assert_int_equal(ax_trace_count(coord), 8);
  ax_trace_event *ev;
  size_t n;
  AX_ASSERT_OK(ax_trace_events(coord, &ev, &n));
  int seen = 0;
  for (size_t i = 0; i < n; i++)
    if (ev[i].pid == 2) {
      assert_true((ev[i].ts_us - 10000 - 107) % 100 == 0);
      assert_int_equal(ev[i].peer, 3);
      seen++;
    }
  assert_int_equal(seen, 5);
  char name[16];
  AX_ASSERT_OK(ax_trace_get_name(coord, 2, -1, name, sizeof name));
  assert_string_equal(name, "w3");
  /* Every truncation of the buffer is rejected and adds nothing. */
  for (size_t cut = 0; cut < len; cut += 7)
    AX_ASSERT_ERR(ax_trace_merge(coord, buf, cut, 0), AX_EFORMAT);
  ((char *)buf)[0] = 'X';
  AX_ASSERT_ERR(ax_trace_merge(coord, buf, len, 0), AX_EFORMAT);
  assert_int_equal(ax_trace_count(coord), 8);
  free(buf);
  free(ev);
  ax_trace_free(stage);
  ax_trace_free(coord);
}

typedef struct worker {
  ax_trace *t;
  int id;
} worker;

static void *record_many(void *arg) {
  worker *w = arg;
  for (int i = 0; i < 2000; i++) {
    int64_t now = ax_clock_us();
    ax_trace_record(w->t, "F", "forward", w->id, i % 3, now, now + 1, i, -1,
                    -1);
    if (i % 500 == 0)
      ax_trace_name_process(w->t, w->id, "agent");
  }
  return NULL;
}

static void concurrent_recording(void **state) {
  (void)state;
  ax_trace *t = ax_trace_new(0);
  pthread_t th[8];
  worker w[8];
  for (int i = 0; i < 8; i++) {
    w[i] = (worker){t, i};
    pthread_create(&th[i], NULL, record_many, &w[i]);
  }
  for (int i = 0; i < 8; i++)
    pthread_join(th[i], NULL);
  assert_int_equal(ax_trace_count(t), 16000);
  ax_trace_event *ev;
  size_t n;
  AX_ASSERT_OK(ax_trace_events(t, &ev, &n));
  int count[8] = {0};
  for (size_t i = 0; i < n; i++) {
    count[ev[i].pid]++;
    if (i)
      assert_true(ev[i - 1].ts_us <= ev[i].ts_us);
  }
  for (int i = 0; i < 8; i++)
    assert_int_equal(count[i], 2000);
  char path[128];
  tmp_path(path, sizeof path, "mt");
  AX_ASSERT_OK(ax_trace_write(t, path));
  check_json(path);
  remove(path);
  free(ev);
  ax_trace_free(t);
  /* The event limit drops and counts. */
  t = ax_trace_new(5);
  fill(t, 0, 9, 0);
  assert_int_equal(ax_trace_count(t), 5);
  assert_int_equal(ax_trace_dropped(t), 4);
  ax_trace_free(t);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(json_round_trip),
      cmocka_unit_test(encode_merge),
      cmocka_unit_test(concurrent_recording),
  };
  return AX_TEST_MAIN(t);
}
