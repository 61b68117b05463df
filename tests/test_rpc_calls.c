/* Three axon-agent processes and this driver (the master) on loopback:
 * sync and async calls with every value type, a 64 MiB tensor each way
 * (checksums), agent-to-agent nested calls 16 deep with 2 worker threads,
 * the /healthz and /metrics endpoints, the caller a handler sees, a data
 * transport chosen by name, and zero live calls and futures on every node at
 * the end. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "agents/axon_agent.h"
#include "harness.h"
#include "tests/mp_testutil.h"

#define NAGENTS 3
static const char *g_names[NAGENTS] = {"w1", "w2", "w3"};
static pid_t g_pids[NAGENTS];
static int g_metrics_port;
static ax_node *g_drv;

static void test_every_type_sync_async(void **state) {
  int64_t shape[3] = {2, 3, 4};
  ax_tensor *t = ax_test_randn(3, 1.0f, 3, shape);
  ax_tensor *ti = ax_test_randint(4, -50, 50, 2, shape);
  ax_values *args = ax_values_new();
  AX_ASSERT_OK(ax_values_add_i64(args, INT64_MIN));
  AX_ASSERT_OK(ax_values_add_f64(args, -0.125));
  AX_ASSERT_OK(ax_values_add_str(args, "axon"));
  AX_ASSERT_OK(ax_values_add_str(args, ""));
  AX_ASSERT_OK(ax_values_add_bytes(args, "\xff\0z", 3));
  AX_ASSERT_OK(ax_values_add_tensor(args, t));
  AX_ASSERT_OK(ax_values_add_tensor(args, ti));
  ax_future *f[NAGENTS];
  for (int i = 0; i < NAGENTS; i++)
    AX_ASSERT_OK(
        ax_rpc_async(g_drv, g_names[i], "axon.test.echo", args, NULL, &f[i]));
  for (int i = 0; i < NAGENTS + 1; i++) {
    ax_values *r = NULL;
    if (i < NAGENTS) {
      AX_ASSERT_OK(ax_future_wait(f[i], 30000));
      r = ax_future_take_values(f[i]);
      ax_future_release(f[i]);
    } else { /* and once synchronously */
      AX_ASSERT_OK(ax_rpc_sync(g_drv, "w2", "axon.test.echo", args, NULL, &r));
    }
    assert_int_equal(ax_values_count(r), 7);
    int64_t x;
    double d;
    const char *s;
    const void *p;
    size_t n;
    ax_tensor *u;
    AX_ASSERT_OK(ax_values_get_i64(r, 0, &x));
    assert_true(x == INT64_MIN);
    AX_ASSERT_OK(ax_values_get_f64(r, 1, &d));
    assert_true(d == -0.125);
    AX_ASSERT_OK(ax_values_get_str(r, 2, &s));
    assert_string_equal(s, "axon");
    AX_ASSERT_OK(ax_values_get_str(r, 3, &s));
    assert_string_equal(s, "");
    AX_ASSERT_OK(ax_values_get_bytes(r, 4, &p, &n));
    assert_int_equal(n, 3);
    assert_memory_equal(p, "\xff\0z", 3);
    AX_ASSERT_OK(ax_values_get_tensor(r, 5, &u));
    assert_true(ax_tensor_same_shape(u, t) && u->dtype == AX_F32);
    assert_memory_equal(u->data, t->data, ax_tensor_nbytes(t));
    AX_ASSERT_OK(ax_values_get_tensor(r, 6, &u));
    assert_true(ax_tensor_same_shape(u, ti) && u->dtype == AX_I32);
    assert_memory_equal(u->data, ti->data, ax_tensor_nbytes(ti));
    ax_values_free(r);
  }
  ax_values_free(args);
  ax_tensor_release(t);
  ax_tensor_release(ti);
}

/* 64 MiB to every agent (checksum computed there), and 64 MiB back. */
static void test_big_tensor(void **state) {
  int64_t n = 16 << 20; /* f32: 64 MiB */
  ax_tensor *t = ax_tensor_new(AX_F32, 1, &n, AX_CPU);
  assert_non_null(t);
  for (int64_t i = 0; i < n; i++)
    ax_f32(t)[i] = (float)(i * 7 % 100003) * 0.5f;
  uint64_t want = ax_agent_checksum(t->data, ax_tensor_nbytes(t));
  ax_values *args = ax_values_new();
  ax_values_add_tensor(args, t);
  ax_future *f[NAGENTS];
  for (int i = 0; i < NAGENTS; i++)
    AX_ASSERT_OK(ax_rpc_async(g_drv, g_names[i], "axon.test.checksum", args,
                              NULL, &f[i]));
  for (int i = 0; i < NAGENTS; i++) {
    AX_ASSERT_OK(ax_future_wait(f[i], 60000));
    int64_t c, nb;
    AX_ASSERT_OK(ax_values_get_i64(ax_future_values(f[i]), 0, &c));
    AX_ASSERT_OK(ax_values_get_i64(ax_future_values(f[i]), 1, &nb));
    assert_true((uint64_t)c == want);
    assert_int_equal(nb, 64 << 20);
    ax_future_release(f[i]);
  }
  ax_values_free(args);
  /* A 64 MiB result: make_tensor(n, seed) on w3. */
  args = ax_values_new();
  ax_values_add_i64(args, n);
  ax_values_add_i64(args, 11);
  ax_values *r = NULL;
  AX_ASSERT_OK(
      ax_rpc_sync(g_drv, "w3", "axon.test.make_tensor", args, NULL, &r));
  ax_tensor *u;
  AX_ASSERT_OK(ax_values_get_tensor(r, 0, &u));
  assert_int_equal(ax_tensor_numel(u), n);
  for (int64_t i = 0; i < n; i += 4099)
    assert_true(ax_f32(u)[i] == (float)(11 + i % 1000003));
  assert_true(ax_f32(u)[n - 1] == (float)(11 + (n - 1) % 1000003));
  ax_values_free(r);
  ax_values_free(args);
  ax_tensor_release(t);
}

/* The agents run with --threads 2: sixteen nested levels of chain across
 * w1 -> w2 -> w3 -> w1 ... hold no worker while they wait. */
static void test_nested_16(void **state) {
  for (int rep = 0; rep < 3; rep++) {
    ax_values *args = ax_values_new();
    ax_values_add_i64(args, 16);
    ax_values_add_str(args, "w1,w2,w3");
    ax_future *f[4];
    for (int k = 0; k < 4; k++) /* several chains at once */
      AX_ASSERT_OK(ax_rpc_async(g_drv, g_names[k % NAGENTS], "axon.test.chain",
                                args, NULL, &f[k]));
    for (int k = 0; k < 4; k++) {
      AX_ASSERT_OK(ax_future_wait(f[k], 60000));
      int64_t d;
      AX_ASSERT_OK(ax_values_get_i64(ax_future_values(f[k]), 0, &d));
      assert_int_equal(d, 16);
      ax_future_release(f[k]);
    }
    ax_values_free(args);
  }
}

static int http_get(int port, const char *path, char *buf, size_t len) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
    close(fd);
    return -1;
  }
  char req[256];
  int n = snprintf(req, sizeof req,
                   "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n", path);
  if (write(fd, req, n) != n) {
    close(fd);
    return -1;
  }
  size_t got = 0;
  ssize_t r;
  while (got + 1 < len && (r = read(fd, buf + got, len - 1 - got)) > 0)
    got += r;
  buf[got] = 0;
  close(fd);
  return (int)got;
}

static void test_metrics(void **state) {
  static char buf[1 << 16];
  assert_true(http_get(g_metrics_port, "/healthz", buf, sizeof buf) > 0);
  assert_non_null(strstr(buf, "200"));
  assert_non_null(strstr(buf, "ok"));
  assert_true(http_get(g_metrics_port, "/metrics", buf, sizeof buf) > 0);
  assert_non_null(
      strstr(buf, "axon_calls_total{node=\"w1\",fn=\"axon.test.echo\"}"));
  assert_non_null(strstr(buf, "axon_call_latency_seconds_bucket"));
  assert_non_null(strstr(buf, "axon_bytes_in_total"));
  assert_non_null(strstr(buf, "axon_live_futures"));
  assert_non_null(strstr(buf, "axon_call_errors_total"));
  assert_true(http_get(g_metrics_port, "/nothing", buf, sizeof buf) > 0);
  assert_non_null(strstr(buf, "404"));
}

static int h_whoami(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                    void *user) {
  return ax_values_add_str(out, ax_call_caller(ctx));
}

/* ax_call_caller: this node for its own calls, the named node for a call
 * re-run on its behalf (the RRef owner's held calls), and the transport's
 * peer for a remote call (on_behalf_of is ignored there). */
static void test_caller_identity(void **state) {
  static int registered;
  if (!registered++)
    AX_ASSERT_OK(ax_rpc_register(g_drv, "whoami", h_whoami, NULL));
  const char *want[2] = {"driver", "w2"};
  for (int i = 0; i < 2; i++) {
    ax_call_opts o = {.on_behalf_of = i ? "w2" : NULL};
    ax_values *r = NULL;
    const char *s;
    AX_ASSERT_OK(ax_rpc_sync(g_drv, "driver", "whoami", NULL, &o, &r));
    AX_ASSERT_OK(ax_values_get_str(r, 0, &s));
    assert_string_equal(s, want[i]);
    ax_values_free(r);
  }
}

/* Transports are chosen by name from one table; an unknown name is refused
 * with the known ones listed, and nothing is left running. */
static void test_transport_by_name(void **state) {
  ax_node_opts o;
  ax_node_opts_init(&o);
  o.name = "pigeon-node";
  o.data_transport = "carrier-pigeon";
  ax_node *n = NULL;
  assert_int_equal(ax_node_create(&o, &n), AX_EINVAL);
  assert_null(n);
  assert_non_null(strstr(ax_errmsg(), "carrier-pigeon"));
  assert_non_null(strstr(ax_errmsg(), "tcp"));
  o.data_transport = "tcp";
  AX_ASSERT_OK(ax_node_create(&o, &n));
  ax_node_destroy(n);
}

static void test_zero_live(void **state) {
  for (int i = 0; i < NAGENTS; i++)
    AX_ASSERT_OK(rt_remote_zero(g_drv, g_names[i]));
  AX_ASSERT_OK(rt_local_zero());
}

int main(void) {
  int port = rt_free_port(), mport = rt_free_port();
  char ms[16];
  snprintf(ms, sizeof ms, "%d", mport);
  g_metrics_port = mport;
  /* Children first: gRPC must not be initialised before fork. */
  for (int i = 0; i < NAGENTS; i++)
    g_pids[i] = rt_spawn_agent(g_names[i], port, "--threads", "2",
                               i == 0 ? "--metrics-port" : NULL, ms, NULL);
  int rc = rt_driver("driver", port, NAGENTS + 1, &g_drv);
  if (rc != AX_OK) {
    fprintf(stderr, "driver: %s: %s\n", ax_strerror(rc), ax_errmsg());
    for (int i = 0; i < NAGENTS; i++)
      rt_stop_agent(g_pids[i], SIGKILL, 5000);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_type_sync_async),
      cmocka_unit_test(test_big_tensor),
      cmocka_unit_test(test_nested_16),
      cmocka_unit_test(test_metrics),
      cmocka_unit_test(test_caller_identity),
      cmocka_unit_test(test_transport_by_name),
      cmocka_unit_test(test_zero_live),
  };
  int failed = AX_TEST_MAIN(tests);
  for (int i = 0; i < NAGENTS; i++) /* a clean exit on SIGTERM */
    failed += mt_stop_checked(g_names[i], g_pids[i]);
  ax_node_destroy(g_drv);
  if (ax_rpc_live_calls() || ax_future_live_count()) {
    fprintf(stderr, "driver: %ld live calls, %ld live futures at exit\n",
            ax_rpc_live_calls(), ax_future_live_count());
    failed++;
  }
  return failed;
}
