/* Hostile input against real agents: join ranks
 * chosen to crash or bloat the master, partial and oversized frames from
 * strangers on the bulk port, too many values, a peer over its in-flight
 * budget, forged replies sprayed at the coordinator, deadlines (INT64_MAX,
 * inherited, self-calls), a self-call storm and SIGTERM during one, and an
 * oversized control-plane (gRPC) message. After each, the agent keeps
 * serving its members; where memory is at stake its resident set returns
 * to within a stated bound. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/codec-impl.h"
#include "axon/rpc/rpc-debug.h"
#include "harness.h"
#include "tests/mp_testutil.h"

#if defined(__SANITIZE_ADDRESS__)
#define RSS_SLACK_KIB(kib) (64 * 1024)
#else
#define RSS_SLACK_KIB(kib) (kib)
#endif

/* "boss" is the master (an agent), with small limits; w1 and w2 join it, and
 * so does this process's node "driver". */
enum { BOSS, W1, W2, NAG };
static const char *g_names[NAG] = {"boss", "w1", "w2"};
static pid_t g_pids[NAG];
static ax_node *g_drv;
static int g_port;

/* A /proc/PID/status field ("VmRSS:", "VmSize:") of process pid in KiB,
 * or -1. */
static long status_kib(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, field, strlen(field)))
      kib = atol(line + strlen(field));
  if (f)
    fclose(f);
  return kib;
}

/* Resident memory of process pid in KiB, or -1. */
static long rss_kib(pid_t pid) { return status_kib(pid, "VmRSS:"); }

/* The agent answers a trivial call. */
static void assert_alive(const char *name) {
  AX_ASSERT_OK(rt_alive(g_drv, name));
}

/* ---- raw connections to an agent's bulk port --------------------------- */
static int dial(const char *addr) {
  int fd = rt_dial(addr);
  assert_true(fd >= 0);
  return fd;
}

static void put_all(int fd, const void *p, size_t n) {
  const char *q = p;
  while (n) {
    ssize_t w = write(fd, q, n);
    if (w <= 0)
      return; /* the agent closed it: the caller checks what it expects */
    q += w;
    n -= (size_t)w;
  }
}

/* The bulk hello: "AXBH", length, "name\naddr\nbulk\nincarnation". */
static void hello_inc(int fd, const char *name, const char *addr,
                      uint64_t inc) {
  char body[256];
  int n = snprintf(body, sizeof body, "%s\n%s\n127.0.0.1:1\n%llu", name, addr,
                   (unsigned long long)inc);
  uint8_t h[8];
  uint32_t magic = 0x48425841u, len = (uint32_t)n;
  memcpy(h, &magic, 4);
  memcpy(h + 4, &len, 4);
  put_all(fd, h, 8);
  put_all(fd, body, (size_t)n);
}

static void hello(int fd, const char *name) {
  hello_inc(fd, name, "127.0.0.1:1", 1);
}

/* A bulk frame head (magic, prefix, header) announcing a REQUEST
 * "axon.test.checksum" with one f32 tensor of `elems` elements; its bytes
 * are not included. Caller frees. */
static uint8_t *tensor_head(int64_t elems, uint64_t id, size_t *len) {
  static float dummy;
  ax_tensor *t = ax_tensor_from_blob(AX_F32, 1, &elems, AX_CPU, &dummy, NULL,
                                     NULL); /* never read: no blob encoded */
  ax_values *v = ax_values_new();
  ax_values_add_tensor(v, t);
  axi_msg m = {.kind = AXI_REQUEST,
               .call_id = id,
               .fn = "axon.test.checksum",
               .timeout_ms = 10000,
               .values = v,
               .node = "stranger"};
  uint8_t *buf;
  size_t blob;
  AX_ASSERT_OK(axi_frame_encode(&m, 4, 0, &buf, len, &blob));
  uint32_t magic = AXI_BULK_MAGIC;
  memcpy(buf, &magic, 4);
  ax_values_free(v);
  ax_tensor_release(t);
  return buf;
}

static void bulk_addr_of(const char *name, char *bulk) {
  char ctl[128];
  AX_ASSERT_OK(
      ax_rpc_debug_peer_addrs(g_drv, name, ctl, sizeof ctl, bulk, 128));
  assert_true(*bulk);
}

/* ---- hostile joins ------------------------------------------------------ */
/* A join as `name` (incarnation inc; -1: none given at all). */
static int join_inc(const char *name, int64_t rank, const char *addr,
                    int64_t inc, ax_values **res) {
  ax_values *a = ax_values_new();
  ax_values_add_str(a, name);
  ax_values_add_i64(a, rank);
  ax_values_add_str(a, addr);
  ax_values_add_str(a, "");
  ax_values_add_i64(a, 0);
  if (inc >= 0)
    ax_values_add_i64(a, inc);
  ax_call_opts o = {.timeout_ms = 20000};
  int rc = ax_rpc_sync(g_drv, "boss", "axon.rendezvous.join", a, &o, res);
  ax_values_free(a);
  return rc;
}

static int join_as(const char *name, int64_t rank, const char *addr,
                   ax_values **res) {
  return join_inc(name, rank, addr, 1, res);
}

static void test_hostile_join_ranks(void **state) {
  long before = rss_kib(g_pids[BOSS]);
  const int64_t ranks[] = {2147483647LL, 1000000, -5, NAG + 1, -2147483648LL};
  for (size_t i = 0; i < sizeof ranks / sizeof ranks[0]; i++) {
    AX_ASSERT_ERR(join_as("evil", ranks[i], "127.0.0.1:1", NULL), AX_EINVAL);
    assert_non_null(strstr(ax_errmsg(), "rank"));
  }
  /* A new name in a full world gets no rank either. */
  AX_ASSERT_ERR(join_as("evil", -1, "127.0.0.1:1", NULL), AX_ESTATE);
  long after = rss_kib(g_pids[BOSS]);
  fprintf(stderr, "hostile joins: boss RSS %ld -> %ld KiB\n", before, after);
  assert_true(after - before < 8 * 1024); /* bound: 8 MiB */
  /* Joins as a live member from another process: without an incarnation,
   * with 0, with an earlier one, or a newer one while w1 is up. */
  char ctl[128], bulk[128];
  uint64_t inc = 0;
  AX_ASSERT_OK(
      ax_rpc_debug_peer_addrs(g_drv, "w1", ctl, sizeof ctl, bulk, sizeof bulk));
  AX_ASSERT_OK(ax_node_member_incarnation(g_drv, "w1", &inc));
  assert_true(inc > 0);
  assert_int_not_equal(join_inc("w1", -1, ctl, -1, NULL), AX_OK);
  AX_ASSERT_ERR(join_inc("w1", -1, ctl, 0, NULL), AX_EINVAL);
  AX_ASSERT_ERR(join_inc("w1", -1, ctl, (int64_t)inc - 1, NULL), AX_ESTATE);
  assert_non_null(strstr(ax_errmsg(), "earlier process"));
  AX_ASSERT_ERR(join_inc("w1", -1, ctl, (int64_t)inc + 1, NULL), AX_ESTATE);
  assert_non_null(strstr(ax_errmsg(), "taken"));
  /* The world is intact: w1's own (retried) join gets the membership of
   * NAG + 1 nodes back. */
  ax_values *res = NULL;
  AX_ASSERT_OK(join_inc("w1", -1, ctl, (int64_t)inc, &res));
  int64_t world = 0;
  AX_ASSERT_OK(ax_values_get_i64(res, 0, &world));
  assert_int_equal(world, NAG + 1);
  ax_values_free(res);
  assert_int_equal(ax_node_world_size(g_drv), NAG + 1);
  assert_alive("boss");
}

/* ---- frames from strangers ---------------------------------------------- */
#define NCONN 100

/* 100 connections each announce a 256 MiB tensor and send 64 of its bytes;
 * no storage is allocated for them, while open or after they close. */
static void test_partial_frames(void **state) {
  char bulk[128];
  bulk_addr_of("boss", bulk);
  assert_alive("boss");
  long before = rss_kib(g_pids[BOSS]);
  long vm_before = status_kib(g_pids[BOSS], "VmSize:");
  size_t hl;
  uint8_t *head = tensor_head((int64_t)64 << 20, 7, &hl);
  uint8_t bytes[64] = {1};
  int fds[NCONN];
  for (int i = 0; i < NCONN; i++) {
    char name[32];
    snprintf(name, sizeof name, "stranger%d", i);
    fds[i] = dial(bulk);
    hello(fds[i], name);
    put_all(fds[i], head, hl);
    put_all(fds[i], bytes, sizeof bytes);
  }
  free(head);
  rt_sleep_ms(1000);
  long open_kib = rss_kib(g_pids[BOSS]);
  /* Not even address space is reserved for the announced tensors (resident
   * memory alone would not show it where huge pages are off). */
  long vm_open = status_kib(g_pids[BOSS], "VmSize:");
  for (int i = 0; i < NCONN; i++)
    close(fds[i]);
  rt_sleep_ms(1000);
  assert_alive("boss"); /* also makes the agent sweep the closed ones */
  long after = rss_kib(g_pids[BOSS]);
  fprintf(stderr,
          "%d partial 256 MiB frames: boss RSS %ld KiB before, %ld while open, "
          "%ld after close\n",
          NCONN, before, open_kib, after);
  fprintf(stderr, "virtual size %ld -> %ld KiB while open\n", vm_before,
          vm_open);
  assert_true(vm_open - vm_before < 1024 * 1024); /* not 100 x 256 MiB */
  /* Bounds: 32 MiB while open, 16 MiB after close; under ASan (the RPC
   * tests also run there) its quarantine holds freed blocks back, so 64
   * MiB (the eager allocation cost +186 MiB). */
  assert_true(open_kib - before < RSS_SLACK_KIB(32 * 1024));
  assert_true(after - before < RSS_SLACK_KIB(16 * 1024));
}

/* A header over --max-hdr-bytes (1 MiB) closes the connection at once. */
static void test_oversized_header(void **state) {
  char bulk[128];
  bulk_addr_of("boss", bulk);
  int fd = dial(bulk);
  hello(fd, "stranger");
  uint8_t f[4 + AXI_PREFIX_LEN];
  uint32_t magic = AXI_BULK_MAGIC;
  memcpy(f, &magic, 4);
  axi_prefix x = {.kind = AXI_REQUEST, .hdr_len = 8u << 20, .call_id = 1};
  axi_prefix_put(f + 4, &x);
  put_all(fd, f, sizeof f);
  assert_true(rt_closed_by_peer(fd));
  close(fd);
  assert_alive("boss");
}

/* More values than --max-values: the frame is refused with AX_ETOOBIG and
 * the caller keeps its connection. */
static void test_too_many_values(void **state) {
  ax_values *a = ax_values_new();
  for (int i = 0; i < 70000; i++)
    ax_values_add_i64(a, i);
  ax_call_opts o = {.timeout_ms = 20000};
  AX_ASSERT_ERR(ax_rpc_sync(g_drv, "boss", "axon.test.echo", a, &o, NULL),
                AX_ETOOBIG);
  assert_non_null(strstr(ax_errmsg(), "values"));
  ax_values_free(a);
  assert_alive("boss");
}

/* A stranger over the in-flight budget (--max-inflight-bytes 8M): a 16 MiB
 * tensor is refused once its first MiB arrived, and the memory goes. */
static void test_inflight_budget(void **state) {
  char bulk[128];
  bulk_addr_of("boss", bulk);
  long before = rss_kib(g_pids[BOSS]);
  size_t hl;
  uint8_t *head = tensor_head(4 << 20, 9, &hl);
  int fd = dial(bulk);
  hello(fd, "stranger");
  put_all(fd, head, hl);
  free(head);
  static uint8_t chunk[2 << 20];
  put_all(fd, chunk, sizeof chunk);
  assert_true(rt_closed_by_peer(fd));
  close(fd);
  assert_alive("boss");
  long after = rss_kib(g_pids[BOSS]);
  fprintf(stderr, "over the in-flight budget: boss RSS %ld -> %ld KiB\n",
          before, after);
  assert_true(after - before < 16 * 1024);
}

/* ---- other processes under a member's name ------------------------------ */
/* 1 if fd is still open after ms: nothing to read, no end. */
static int still_open(int fd, int ms) {
  struct timeval tv = {0, ms * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char b;
  ssize_t r = read(fd, &b, 1);
  return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* Data connections to the master under w1's name and control address,
 * without a token (only the incarnation tells processes apart): one from
 * an earlier process, one from a newer process while w1 is up. Both are
 * closed at the hello; w1's own incarnation is taken, and w1 keeps being
 * served. */
static void test_other_incarnation(void **state) {
  char ctl[128], bulk[128];
  uint64_t inc = 0;
  AX_ASSERT_OK(
      ax_rpc_debug_peer_addrs(g_drv, "w1", ctl, sizeof ctl, bulk, sizeof bulk));
  AX_ASSERT_OK(ax_node_member_incarnation(g_drv, "w1", &inc));
  bulk_addr_of("boss", bulk);
  const uint64_t others[] = {inc - 1, 1, inc + 1};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
    int fd = dial(bulk);
    hello_inc(fd, "w1", ctl, others[i]);
    assert_true(rt_closed_by_peer(fd));
    close(fd);
    assert_alive("w1");
  }
  int fd = dial(bulk); /* the control: w1's own incarnation stays open */
  hello_inc(fd, "w1", ctl, inc);
  assert_true(still_open(fd, 300));
  close(fd);
  assert_alive("w1");
}

/* ---- forged replies ------------------------------------------------------ */
static volatile int g_spray_stop;

/* Sprays error replies for call ids 1..5000 (every id this test uses) at the
 * driver's bulk port, under a name that is not the callee's, until told to
 * stop. */
static void *spray(void *arg) {
  const char *addr = arg;
  int fd = dial(addr);
  hello(fd, "forger");
  static uint8_t buf[64 << 10];
  while (!g_spray_stop) {
    for (uint64_t id = 1; id <= 5000 && !g_spray_stop;) {
      size_t off = 0;
      for (; off + 256 < sizeof buf && id <= 5000; id++) {
        axi_msg m = {.kind = AXI_RESPONSE,
                     .call_id = id,
                     .err = AX_EIO,
                     .errmsg = "forged",
                     .node = "w1"};
        uint8_t *p;
        size_t len, blob;
        if (axi_frame_encode(&m, 4, 0, &p, &len, &blob) != AX_OK)
          break;
        uint32_t magic = AXI_BULK_MAGIC;
        memcpy(p, &magic, 4);
        memcpy(buf + off, p, len);
        off += len;
        free(p);
      }
      put_all(fd, buf, off);
      /* A steady stream, not a flood: the test is about which replies
       * complete calls, not about out-receiving the driver (which, on 2
       * loaded cores or under ASan, would delay the real replies past
       * their deadline). */
      struct timespec ts = {0, 2000000};
      nanosleep(&ts, NULL);
    }
  }
  close(fd);
  return NULL;
}

static void test_forged_replies(void **state) {
  pthread_t th;
  g_spray_stop = 0;
  AX_ASSERT_OK(
      pthread_create(&th, NULL, spray, (void *)ax_rpc_debug_bulk_addr(g_drv))
          ? AX_EIO
          : AX_OK);
  ax_values *a = ax_values_new();
  ax_values_add_i64(a, 2);
  for (int i = 0; i < 300; i++) {
    ax_call_opts o = {.timeout_ms = 20000};
    AX_ASSERT_OK(ax_rpc_sync(g_drv, "w1", "axon.test.sleep_ms", a, &o, NULL));
  }
  ax_values_free(a);
  g_spray_stop = 1;
  pthread_join(th, NULL);
  ax_node_stats s;
  ax_node_stats_get(g_drv, &s);
  fprintf(stderr, "forged replies dropped: %llu\n",
          (unsigned long long)s.forged);
  assert_true(s.forged > 0);
  assert_alive("w1");
}

/* ---- deadlines ----------------------------------------------------------- */
static int g_nested_rc;
static int64_t g_nested_ms;

/* Sleeps past its caller's deadline, then calls w1 with the default
 * timeout: the nested call must fail at once with AX_ETIMEOUT. */
static int late_nest(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                     void *user) {
  rt_sleep_ms(400);
  int64_t t0 = ax_clock_ms();
  __atomic_store_n(
      &g_nested_rc,
      ax_rpc_sync(ax_call_node(ctx), "w1", "axon.test.add", args, NULL, NULL),
      __ATOMIC_RELEASE);
  __atomic_store_n(&g_nested_ms, ax_clock_ms() - t0, __ATOMIC_RELEASE);
  return AX_OK;
}

static int sleepy(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                  void *user) {
  rt_sleep_ms(2000);
  return AX_OK;
}

static void test_deadlines(void **state) {
  /* INT64_MAX: no practical limit, not "already expired". */
  ax_values *a = ax_values_new(), *r = NULL;
  ax_values_add_i64(a, 1);
  ax_values_add_i64(a, 2);
  ax_call_opts inf = {.timeout_ms = INT64_MAX};
  AX_ASSERT_OK(ax_rpc_sync(g_drv, "w1", "axon.test.add", a, &inf, &r));
  ax_values_free(r);
  AX_ASSERT_OK(ax_rpc_sync(g_drv, "driver", "add_local", a, &inf, &r));
  ax_values_free(r);
  /* A negative (exhausted) timeout is an error, not the default. */
  ax_call_opts neg = {.timeout_ms = -1};
  AX_ASSERT_ERR(ax_rpc_sync(g_drv, "w1", "axon.test.add", a, &neg, NULL),
                AX_ETIMEOUT);
  /* A nested call inherits the remaining time: none left is AX_ETIMEOUT. */
  g_nested_rc = -1;
  ax_call_opts shortd = {.timeout_ms = 150};
  AX_ASSERT_ERR(ax_rpc_sync(g_drv, "driver", "late_nest", a, &shortd, NULL),
                AX_ETIMEOUT);
  for (int i = 0;
       i < 200 && __atomic_load_n(&g_nested_rc, __ATOMIC_ACQUIRE) < 0; i++)
    rt_sleep_ms(50);
  assert_int_equal(g_nested_rc, AX_ETIMEOUT);
  assert_true(g_nested_ms < 5000);
  /* A self-call expires at its deadline although its handler still runs. */
  ax_future *f;
  ax_call_opts d = {.timeout_ms = 200};
  int64_t t0 = ax_clock_ms();
  AX_ASSERT_OK(ax_rpc_async(g_drv, "driver", "sleepy", NULL, &d, &f));
  AX_ASSERT_ERR(ax_future_wait(f, 1500), AX_ETIMEOUT);
  assert_true(ax_future_is_done(f));
  assert_true(ax_clock_ms() - t0 < 1500);
  ax_future_release(f);
  ax_values_free(a);
  rt_sleep_ms(2200); /* sleepy returns; its late reply is dropped */
}

static ax_values *chain_args(int64_t depth, const char *nodes) {
  ax_values *a = ax_values_new();
  ax_values_add_i64(a, depth);
  ax_values_add_str(a, nodes);
  return a;
}

/* A chain of calls an agent makes to itself ends at the depth limit with a
 * clear error, and the agent keeps serving. */
static void test_self_call_storm(void **state) {
  ax_values *a = chain_args(1000000, "w2");
  int64_t t0 = ax_clock_ms();
  AX_ASSERT_ERR(ax_rpc_sync(g_drv, "w2", "axon.test.chain", a, NULL, NULL),
                AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "call depth"));
  assert_true(ax_clock_ms() - t0 < 20000);
  ax_values_free(a);
  assert_alive("w2");
  AX_ASSERT_OK(rt_remote_zero(g_drv, "w2"));
}

static void test_zero_live(void **state) {
  for (int i = 0; i < NAG; i++)
    AX_ASSERT_OK(rt_remote_zero(g_drv, g_names[i]));
}

/* SIGTERM stops an agent in the middle of self-call storms. */
static void test_sigterm_during_storm(void **state) {
  ax_future *f[8];
  ax_values *a = chain_args(1000000, "w2");
  for (int i = 0; i < 8; i++)
    AX_ASSERT_OK(ax_rpc_async(g_drv, "w2", "axon.test.chain", a, NULL, &f[i]));
  ax_values_free(a);
  int st = rt_stop_agent(g_pids[W2], SIGTERM, 15000);
  g_pids[W2] = 0;
  assert_true(WIFEXITED(st)); /* not SIGKILLed after 15 s */
  for (int i = 0; i < 8; i++) {
    assert_int_not_equal(ax_future_wait(f[i], 20000), AX_OK);
    ax_future_release(f[i]);
  }
}

/* A control-plane message (12 MiB) over boss's gRPC limit (4 MiB) ends that
 * stream; boss keeps serving its other members (w1 reaches it). gRPC core
 * checks the limit only once the message is whole, so the memory bound is
 * the transport's resource quota (2 x the limit, at least 16 MiB). A
 * message larger than the quota stays bounded too but stalls every stream
 * of the server until it ends (members may miss heartbeats), so it is not
 * sent here. */
static void test_oversized_grpc(void **state) {
  long before = rss_kib(g_pids[BOSS]);
  size_t n = 12u << 20;
  uint8_t *p = calloc(1, n);
  axi_prefix x = {.kind = AXI_REQUEST, .hdr_len = 0, .blob_len = n - 24};
  axi_prefix_put(p, &x);
  ax_future *f;
  AX_ASSERT_OK(ax_rpc_debug_send_raw(g_drv, "boss", p, n, 10000, &f));
  free(p);
  assert_int_not_equal(ax_future_wait(f, 20000), AX_OK);
  ax_future_release(f);
  ax_values *a = chain_args(1, "w1,boss"), *r = NULL;
  AX_ASSERT_OK(ax_rpc_sync(g_drv, "w1", "axon.test.chain", a, NULL, &r));
  ax_values_free(r);
  ax_values_free(a);
  long after = rss_kib(g_pids[BOSS]);
  fprintf(stderr,
          "12 MiB gRPC message over a 4 MiB limit: boss RSS %ld -> "
          "%ld KiB\n",
          before, after);
  assert_true(after - before < 24 * 1024); /* bound: 24 MiB */
  AX_ASSERT_OK(rt_remote_zero(g_drv, "w1"));
  AX_ASSERT_OK(rt_local_zero());
}

static int add_local(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                     void *user) {
  return AX_OK;
}

int main(void) {
  /* What any peer that reached the ports (or passed authentication) can
   * do: this world runs without a token (test_rpc_auth covers strangers). */
  setenv("AXON_TOKEN_FILE", "", 1);
  signal(SIGPIPE, SIG_IGN); /* raw writes to connections the agent closed */
  g_port = rt_free_port();
  char listen[64], port_s[16], master[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", g_port);
  snprintf(port_s, sizeof port_s, "%d", NAG + 1);
  g_pids[BOSS] = rt_spawn_agent("boss", g_port, "--listen", listen,
                                "--world-size", port_s, "--rank", "0",
                                "--max-hdr-bytes", "1M", "--max-inflight-bytes",
                                "8M", "--max-grpc-msg-bytes", "4M", NULL);
  g_pids[W1] = rt_spawn_agent("w1", g_port, NULL);
  g_pids[W2] = rt_spawn_agent("w2", g_port, "--threads", "2", NULL);
  ax_node_opts o;
  ax_node_opts_init(&o);
  snprintf(master, sizeof master, "127.0.0.1:%d", g_port);
  o.name = "driver";
  o.master = master;
  o.world_size = 0;
  o.threads = 4;
  int rc = ax_node_create(&o, &g_drv);
  if (rc == AX_OK)
    rc = ax_rpc_register(g_drv, "late_nest", late_nest, NULL);
  if (rc == AX_OK)
    rc = ax_rpc_register(g_drv, "sleepy", sleepy, NULL);
  if (rc == AX_OK)
    rc = ax_rpc_register(g_drv, "add_local", add_local, NULL);
  if (rc == AX_OK)
    rc = ax_node_join(g_drv, 90000);
  if (rc != AX_OK) {
    fprintf(stderr, "driver: %s: %s\n", ax_strerror(rc), ax_errmsg());
    for (int i = 0; i < NAG; i++)
      rt_stop_agent(g_pids[i], SIGKILL, 5000);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hostile_join_ranks),
      cmocka_unit_test(test_partial_frames),
      cmocka_unit_test(test_oversized_header),
      cmocka_unit_test(test_too_many_values),
      cmocka_unit_test(test_inflight_budget),
      cmocka_unit_test(test_forged_replies),
      cmocka_unit_test(test_other_incarnation),
      cmocka_unit_test(test_deadlines),
      cmocka_unit_test(test_self_call_storm),
      cmocka_unit_test(test_zero_live),
      cmocka_unit_test(test_sigterm_during_storm),
      cmocka_unit_test(test_oversized_grpc),
  };
  int failed = AX_TEST_MAIN(tests);
  for (int i = NAG - 1; i >= 0; i--) /* the master (boss) last */
    if (g_pids[i])
      failed += mt_stop_checked(g_names[i], g_pids[i]);
  ax_node_destroy(g_drv);
  return failed || ax_rpc_live_calls() || ax_future_live_count();
}
