/* Failures and bad input against real agents: deadline exceeded, unknown
 * function, wrong argument type, remote errors, malformed frames (inside a
 * valid stream, and raw garbage on the control and bulk ports), oversized
 * messages, kill -9 and a frozen peer (heartbeats). After each, the agents
 * still answer; at the end no calls or futures are alive anywhere. */
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/codec-impl.h"
#include "axon/rpc/rpc-debug.h"
#include "harness.h"
#include "tests/mp_testutil.h"

enum { W1, W2, VICTIM, FROZEN, NAG };
static const char *g_names[NAG] = {"w1", "w2", "victim", "frozen"};
static pid_t g_pids[NAG];
static ax_node *g_drv;

/* The agent answers a trivial call. */
static void assert_alive(const char *name) {
  AX_ASSERT_OK(rt_alive(g_drv, name));
}

static void test_deadline(void **state) {
  ax_values *a = ax_values_new();
  ax_values_add_i64(a, 3000);
  ax_call_opts o = {.timeout_ms = 300};
  int64_t t0 = ax_clock_ms();
  AX_ASSERT_ERR(ax_rpc_sync(g_drv, "w1", "axon.test.sleep_ms", a, &o, NULL),
                AX_ETIMEOUT);
  int64_t dt = ax_clock_ms() - t0;
  assert_true(dt >= 290 && dt < 2500);
  assert_non_null(strstr(ax_errmsg(), "axon.test.sleep_ms"));
  ax_values_free(a);
  assert_alive("w1"); /* the other worker thread answers */
}

static void test_unknown_function(void **state) {
  AX_ASSERT_ERR(ax_rpc_sync(g_drv, "w1", "no_such_fn", NULL, NULL, NULL),
                AX_ENOFUNC);
  assert_non_null(strstr(ax_errmsg(), "w1"));
  assert_non_null(strstr(ax_errmsg(), "no_such_fn"));
  AX_ASSERT_ERR(ax_rpc_sync(g_drv, "nobody", "axon.test.add", NULL, NULL, NULL),
                AX_ENOTFOUND);
  assert_alive("w1");
}

static void test_wrong_argument_type(void **state) {
  ax_values *a = ax_values_new();
  ax_values_add_str(a, "x");
  ax_values_add_i64(a, 1);
  AX_ASSERT_ERR(ax_rpc_sync(g_drv, "w1", "axon.test.add", a, NULL, NULL),
                AX_EBADARG);
  assert_non_null(strstr(ax_errmsg(), "w1: axon.test.add: argument 0 is str"));
  ax_values_free(a);
  AX_ASSERT_ERR(ax_rpc_sync(g_drv, "w1", "axon.test.add", NULL, NULL, NULL),
                AX_EBADARG);
  /* A remote error keeps its code, the node and the function name. */
  a = ax_values_new();
  ax_values_add_i64(a, AX_EIO);
  ax_values_add_str(a, "disk on fire");
  AX_ASSERT_ERR(ax_rpc_sync(g_drv, "w2", "axon.test.fail", a, NULL, NULL),
                AX_EIO);
  assert_string_equal(ax_errmsg(), "w2: axon.test.fail: disk on fire");
  ax_values_free(a);
  assert_alive("w1");
}

static void raw_frame_expect(const uint8_t *p, size_t len, int code) {
  ax_future *f;
  AX_ASSERT_OK(ax_rpc_debug_send_raw(g_drv, "w1", p, len, 10000, &f));
  int rc = ax_future_wait(f, 20000);
  ax_future_release(f);
  AX_ASSERT_ERR(rc, code);
}

static void garbage_to(const char *addr, const void *p, size_t len) {
  const char *c = strrchr(addr, ':');
  assert_non_null(c);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons(atoi(c + 1))};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_true(write(fd, p, len) == (ssize_t)len);
  /* The agent closes the connection (or keeps it); either way it serves. */
  struct timeval tv = {2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[256];
  while (read(fd, buf, sizeof buf) > 0)
    ;
  close(fd);
}

static void test_malformed_frames(void **state) {
  /* A valid prefix (REQUEST) with a garbage protobuf body. */
  uint8_t f1[64];
  axi_prefix x = {.kind = AXI_REQUEST, .hdr_len = 40, .call_id = 0};
  axi_prefix_put(f1, &x);
  for (int i = AXI_PREFIX_LEN; i < 64; i++)
    f1[i] = (uint8_t)(0xA5 ^ i * 37);
  raw_frame_expect(f1, sizeof f1, AX_EMALFORMED);
  /* A truncated frame: the prefix promises more than is there. */
  x.hdr_len = 1000;
  axi_prefix_put(f1, &x);
  raw_frame_expect(f1, sizeof f1, AX_EMALFORMED);
  /* A well-formed body whose tensor sizes do not add up to the blob. */
  x.hdr_len = 0;
  x.blob_len = 8;
  axi_prefix_put(f1, &x);
  raw_frame_expect(f1, AXI_PREFIX_LEN + 8, AX_EMALFORMED);
  assert_alive("w1");
  /* Garbage on a raw connection to the control port and the bulk port. */
  char ctl[128], bulk[128];
  AX_ASSERT_OK(
      ax_rpc_debug_peer_addrs(g_drv, "w1", ctl, sizeof ctl, bulk, sizeof bulk));
  assert_true(*ctl && *bulk);
  static uint8_t junk[70000];
  for (size_t i = 0; i < sizeof junk; i++)
    junk[i] = (uint8_t)(i * 2654435761u >> 13);
  garbage_to(ctl, junk, sizeof junk);
  garbage_to(bulk, junk, sizeof junk);
  const char pre[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x04\x08garbage";
  garbage_to(ctl, pre, sizeof pre);
  uint8_t hello[16] = {
      'A', 'X', 'B', 'H', 2,   0,   0,   0,
      'w', '9', 'Z', 'Z', 'Z', 'Z', 'Z', 'Z'}; /* then a bad magic */
  garbage_to(bulk, hello, sizeof hello);
  assert_alive("w1");
  assert_alive("w2");
}

/* w2 runs with --max-msg-bytes 1000000. */
static void test_oversized(void **state) {
  for (int big = 0; big < 2; big++) {
    int64_t n = big ? (2 << 20) / 4 : 1040000 / 4; /* bulk / inline path */
    ax_tensor *t = ax_tensor_zeros(AX_F32, 1, &n, AX_CPU);
    ax_values *a = ax_values_new();
    ax_values_add_tensor(a, t);
    AX_ASSERT_ERR(ax_rpc_sync(g_drv, "w2", "axon.test.checksum", a, NULL, NULL),
                  AX_ETOOBIG);
    ax_values_free(a);
    ax_tensor_release(t);
    assert_alive("w2");
  }
}

static void test_kill9(void **state) {
  ax_future *f[4];
  ax_values *a = ax_values_new();
  ax_values_add_i64(a, 30000);
  for (int i = 0; i < 3; i++)
    AX_ASSERT_OK(
        ax_rpc_async(g_drv, "victim", "axon.test.sleep_ms", a, NULL, &f[i]));
  ax_values_free(a);
  int64_t n = 8 << 20; /* 32 MiB in flight too */
  ax_tensor *t = ax_tensor_zeros(AX_F32, 1, &n, AX_CPU);
  a = ax_values_new();
  ax_values_add_tensor(a, t);
  ax_values_add_i64(a, 1);
  AX_ASSERT_OK(
      ax_rpc_async(g_drv, "victim", "axon.test.sleep_ms", a, NULL, &f[3]));
  ax_values_free(a);
  ax_tensor_release(t);
  rt_sleep_ms(300);
  int64_t t0 = ax_clock_ms();
  kill(g_pids[VICTIM], SIGKILL);
  for (int i = 0; i < 4; i++) {
    int rc = ax_future_wait(f[i], 5000);
    /* The tensor call may have answered AX_EBADARG before the kill. */
    if (!(i == 3 && rc == AX_EBADARG))
      AX_ASSERT_ERR(rc, AX_EPEERDOWN);
    ax_future_release(f[i]);
  }
  int64_t dt = ax_clock_ms() - t0;
  fprintf(stderr, "kill -9: futures failed after %lld ms\n", (long long)dt);
  assert_true(dt < 5000);
  waitpid(g_pids[VICTIM], NULL, 0);
  g_pids[VICTIM] = 0;
  assert_true(ax_node_peer_is_down(g_drv, "victim"));
  ax_future *g;
  int rc = ax_rpc_async(g_drv, "victim", "axon.test.add", NULL, NULL, &g);
  assert_int_equal(rc, AX_EPEERDOWN);
  assert_alive("w1");
  assert_alive("w2");
}

/* A stopped (not dead) process: only the heartbeats can tell. */
static void test_frozen_peer(void **state) {
  assert_alive("frozen");
  ax_values *a = ax_values_new();
  ax_values_add_i64(a, 1);
  ax_future *f;
  AX_ASSERT_OK(
      ax_rpc_async(g_drv, "frozen", "axon.test.sleep_ms", a, NULL, &f));
  ax_values_free(a);
  kill(g_pids[FROZEN], SIGSTOP);
  rt_sleep_ms(50);
  a = ax_values_new();
  ax_values_add_i64(a, 1);
  ax_future *g;
  AX_ASSERT_OK(
      ax_rpc_async(g_drv, "frozen", "axon.test.sleep_ms", a, NULL, &g));
  ax_values_free(a);
  int64_t t0 = ax_clock_ms();
  AX_ASSERT_ERR(ax_future_wait(g, 15000), AX_EPEERDOWN);
  fprintf(stderr, "frozen peer: down after %lld ms\n",
          (long long)(ax_clock_ms() - t0));
  ax_future_wait(f, 1000);
  ax_future_release(f);
  ax_future_release(g);
  kill(g_pids[FROZEN], SIGKILL);
  waitpid(g_pids[FROZEN], NULL, 0);
  g_pids[FROZEN] = 0;
  assert_alive("w1");
}

static void test_zero_live(void **state) {
  rt_sleep_ms(3000); /* let w1's 3 s sleep_ms from the deadline test end */
  AX_ASSERT_OK(rt_remote_zero(g_drv, "w1"));
  AX_ASSERT_OK(rt_remote_zero(g_drv, "w2"));
  AX_ASSERT_OK(rt_local_zero());
}

int main(void) {
  int port = rt_free_port();
  g_pids[W1] = rt_spawn_agent("w1", port, "--threads", "2", NULL);
  g_pids[W2] = rt_spawn_agent("w2", port, "--max-msg-bytes", "1000000", NULL);
  g_pids[VICTIM] = rt_spawn_agent("victim", port, NULL);
  g_pids[FROZEN] = rt_spawn_agent("frozen", port, NULL);
  int rc = rt_driver("driver", port, NAG + 1, &g_drv);
  if (rc != AX_OK) {
    fprintf(stderr, "driver: %s: %s\n", ax_strerror(rc), ax_errmsg());
    for (int i = 0; i < NAG; i++)
      rt_stop_agent(g_pids[i], SIGKILL, 5000);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deadline),
      cmocka_unit_test(test_unknown_function),
      cmocka_unit_test(test_wrong_argument_type),
      cmocka_unit_test(test_malformed_frames),
      cmocka_unit_test(test_oversized),
      cmocka_unit_test(test_kill9),
      cmocka_unit_test(test_frozen_peer),
      cmocka_unit_test(test_zero_live),
  };
  int failed = AX_TEST_MAIN(tests);
  for (int i = 0; i < NAG; i++) {
    if (!g_pids[i])
      continue;
    if (i <= W2)
      failed += mt_stop_checked(g_names[i], g_pids[i]);
    else
      rt_stop_agent(g_pids[i], SIGTERM, 15000);
  }
  ax_node_destroy(g_drv);
  return failed || ax_rpc_live_calls() || ax_future_live_count();
}
