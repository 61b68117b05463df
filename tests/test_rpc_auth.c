/* Shared-secret authentication against real agents: a world whose members
 * hold the token (AXON_TOKEN_FILE, generated here) works on both channels;
 * a stranger without it cannot join, call or forge replies, and its
 * connection is closed right after the hello; a member's name claimed from
 * another address is refused even with the token; the dialling side sends
 * nothing past its hello to an acceptor that does not prove the secret in turn.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "axon/rpc/codec-impl.h"
#include "axon/rpc/rpc-debug.h"
#include "harness.h"
#include "tests/mp_testutil.h"

enum { W1, W2, NAG };
static const char *g_names[NAG] = {"w1", "w2"};
static pid_t g_pids[NAG];
static ax_node *g_drv;
static int g_port;
static char g_tok[64] = "/tmp/axon-token-XXXXXX";
static char g_bad[64] = "/tmp/axon-token-XXXXXX";

/* A fresh random secret in a private file. */
static int make_token(char *path) {
  int fd = mkstemp(path);
  if (fd < 0)
    return -1;
  uint8_t r[24];
  int u = open("/dev/urandom", O_RDONLY);
  ssize_t got = u >= 0 ? read(u, r, sizeof r) : -1;
  if (u >= 0)
    close(u);
  char hex[64];
  for (int i = 0; i < 24; i++)
    snprintf(hex + 2 * i, 3, "%02x", r[i]);
  int ok = got == (ssize_t)sizeof r && write(fd, hex, 48) == 48;
  close(fd);
  return ok ? 0 : -1;
}

/* The agent answers a trivial call. */
static void assert_alive(const char *name) {
  AX_ASSERT_OK(rt_alive(g_drv, name));
}

static void test_members_work(void **state) {
  assert_alive("w1");
  assert_alive("w2");
  /* A large tensor over the data channel, and a chain between agents. */
  int64_t n = 1 << 20;
  ax_tensor *t = ax_tensor_zeros(AX_F32, 1, &n, AX_CPU);
  ax_values *a = ax_values_new(), *r = NULL;
  ax_values_add_tensor(a, t);
  AX_ASSERT_OK(ax_rpc_sync(g_drv, "w2", "axon.test.checksum", a, NULL, &r));
  ax_values_free(r);
  ax_values_free(a);
  ax_tensor_release(t);
  a = ax_values_new();
  ax_values_add_i64(a, 4);
  ax_values_add_str(a, "w1,w2");
  AX_ASSERT_OK(ax_rpc_sync(g_drv, "w1", "axon.test.chain", a, NULL, &r));
  ax_values_free(r);
  ax_values_free(a);
}

/* A node of this process that tries to join with token file tok (""
 * for none) under name; returns the join's outcome. */
static int stranger_join(const char *name, const char *tok) {
  ax_node_opts o;
  ax_node_opts_init(&o);
  char master[64];
  snprintf(master, sizeof master, "127.0.0.1:%d", g_port);
  o.name = name;
  o.master = master;
  o.world_size = 0;
  o.token_file = tok;
  ax_node *s = NULL;
  int rc = ax_node_create(&o, &s);
  if (rc == AX_OK)
    rc = ax_node_join(s, 3000);
  ax_node_destroy(s);
  return rc;
}

/* Each stranger is refused at the proof (the counter grows for each), not
 * merely by the full world. */
static void test_stranger_cannot_join(void **state) {
  const char *toks[2] = {g_bad, ""}; /* another secret, none */
  for (int i = 0; i < 2; i++) {
    ax_node_stats before, after;
    ax_node_stats_get(g_drv, &before);
    assert_int_not_equal(stranger_join("intruder", toks[i]), AX_OK);
    ax_node_stats_get(g_drv, &after);
    fprintf(stderr, "stranger %d: driver refused %llu connections\n", i,
            (unsigned long long)(after.auth_refused - before.auth_refused));
    assert_true(after.auth_refused > before.auth_refused);
  }
  assert_int_equal(ax_node_world_size(g_drv), NAG + 1);
  assert_alive("w1");
}

/* With the token, but under a member's name from another address. */
static void test_name_of_a_member_refused(void **state) {
  ax_node_stats before, after;
  ax_node_stats_get(g_drv, &before);
  assert_int_not_equal(stranger_join("w1", g_tok), AX_OK);
  ax_node_stats_get(g_drv, &after);
  assert_true(after.auth_refused > before.auth_refused);
  assert_alive("w1");
}

/* A holder of the token that is not a member (the world is full) says
 * hello with its own addresses, and stays up: the driver keeps no address
 * from the hello, so a call to that name fails at once and nothing reaches
 * the latecomer (addresses come only from the membership). Fails with a
 * hello's addresses kept: the call then dials the latecomer. */
static void test_hello_address_not_dialled(void **state) {
  ax_node_opts o;
  ax_node_opts_init(&o);
  char master[64];
  snprintf(master, sizeof master, "127.0.0.1:%d", g_port);
  o.name = "latecomer";
  o.master = master;
  o.world_size = 0;
  o.token_file = g_tok;
  ax_node *s = NULL;
  AX_ASSERT_OK(ax_node_create(&o, &s));
  assert_int_not_equal(ax_node_join(s, 3000), AX_OK); /* the world is full */
  char ctl[128] = "x", bulk[128] = "x";
  if (ax_rpc_debug_peer_addrs(g_drv, "latecomer", ctl, sizeof ctl, bulk,
                              sizeof bulk) == AX_OK) {
    assert_string_equal(ctl, "");
    assert_string_equal(bulk, "");
  }
  ax_node_stats before, after;
  ax_node_stats_get(s, &before);
  int64_t t0 = ax_clock_ms();
  ax_values *r = NULL;
  ax_call_opts co = {.timeout_ms = 10000};
  assert_int_not_equal(
      ax_rpc_sync(g_drv, "latecomer", "axon.rendezvous.stats", NULL, &co, &r),
      AX_OK);
  fprintf(stderr, "call to the latecomer: %s\n", ax_errmsg());
  assert_true(ax_clock_ms() - t0 < 5000);
  ax_values_free(r);
  ax_node_stats_get(s, &after);
  assert_int_equal(after.calls_in, before.calls_in);
  ax_node_destroy(s);
  assert_alive("w1");
}

/* A fake data-channel acceptor that does not hold the secret: it sends a
 * challenge, takes the hello, answers with garbage where its proof goes,
 * and then counts what else the dialler sends. */
typedef struct fake_acceptor {
  int lfd, port;
  int mode;     /* 0: a bad proof; 1: no challenge at all */
  size_t after; /* bytes received after the hello */
  int got_hello;
} fake_acceptor;

static void *fake_main(void *arg) {
  fake_acceptor *f = arg;
  int fd = accept(f->lfd, NULL, NULL);
  if (fd < 0)
    return NULL;
  uint8_t buf[4096];
  if (f->mode == 0) {
    uint8_t chal[20] = {'A', 'X', 'B', 'C'};
    for (int i = 4; i < 20; i++)
      chal[i] = (uint8_t)(i * 37);
    if (write(fd, chal, sizeof chal) != (ssize_t)sizeof chal)
      goto out;
    uint8_t hdr[8];
    if (read(fd, hdr, 8) != 8)
      goto out;
    uint32_t nl;
    memcpy(&nl, hdr + 4, 4);
    size_t want = nl + 32 + 16, have = 0;
    while (have < want) {
      ssize_t r =
          read(fd, buf, want - have < sizeof buf ? want - have : sizeof buf);
      if (r <= 0)
        goto out;
      have += (size_t)r;
    }
    f->got_hello = 1;
    uint8_t ack[36] = {'A', 'X', 'B', 'P'}; /* a proof of nothing */
    if (write(fd, ack, sizeof ack) != (ssize_t)sizeof ack)
      goto out;
  }
  for (ssize_t r; (r = read(fd, buf, sizeof buf)) > 0;)
    f->after += (size_t)r;
out:
  close(fd);
  return NULL;
}

static void fake_start(fake_acceptor *f, int mode, pthread_t *th) {
  memset(f, 0, sizeof *f);
  f->mode = mode;
  f->lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  assert_int_equal(bind(f->lfd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(f->lfd, 4), 0);
  getsockname(f->lfd, (struct sockaddr *)&a, &al);
  f->port = ntohs(a.sin_port);
  assert_int_equal(pthread_create(th, NULL, fake_main, f), 0);
}

/* The dialling side checks the acceptor too: an acceptor that cannot prove
 * the secret (or sends no challenge) gets the hello at most, never a
 * frame; a real member's acceptor proves it. */
static void test_acceptor_must_prove(void **state) {
  for (int mode = 0; mode < 2; mode++) {
    fake_acceptor f;
    pthread_t th;
    fake_start(&f, mode, &th);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", f.port);
    int64_t t0 = ax_clock_ms();
    assert_int_equal(ax_rpc_debug_data_handshake(g_drv, addr), AX_EPEERDOWN);
    fprintf(stderr, "fake acceptor %d: %s (%lld ms)\n", mode, ax_errmsg(),
            (long long)(ax_clock_ms() - t0));
    pthread_join(th, NULL);
    close(f.lfd);
    assert_int_equal(f.got_hello, mode == 0);
    assert_int_equal(f.after, 0);
  }
  char ctl[128], bulk[128];
  AX_ASSERT_OK(
      ax_rpc_debug_peer_addrs(g_drv, "w1", ctl, sizeof ctl, bulk, sizeof bulk));
  AX_ASSERT_OK(ax_rpc_debug_data_handshake(g_drv, bulk));
  assert_alive("w1");
}

static int dial(const char *addr) {
  int fd = rt_dial(addr);
  assert_true(fd >= 0);
  return fd;
}

/* A raw data connection: a hello with a wrong proof, then a request and a
 * burst of forged replies. The agent closes it after the hello; the
 * driver's calls meanwhile all succeed. */
static void test_stranger_cannot_call_or_forge(void **state) {
  char ctl[128], bulk[128];
  AX_ASSERT_OK(
      ax_rpc_debug_peer_addrs(g_drv, "w1", ctl, sizeof ctl, bulk, sizeof bulk));
  const char *targets[2] = {bulk, ax_rpc_debug_bulk_addr(g_drv)};
  for (int k = 0; k < 2; k++) {
    int fd = dial(targets[k]);
    uint8_t chal[20];
    assert_int_equal(read(fd, chal, sizeof chal), (ssize_t)sizeof chal);
    char body[64];
    int nl =
        snprintf(body, sizeof body, "stranger\n127.0.0.1:1\n127.0.0.1:1\n1");
    uint8_t h[8 + 64 + 32];
    uint32_t magic = 0x48425841u, len = (uint32_t)nl;
    memcpy(h, &magic, 4);
    memcpy(h + 4, &len, 4);
    memcpy(h + 8, body, nl);
    memset(h + 8 + nl, 0x5a, 32); /* not the proof */
    assert_true(write(fd, h, 8 + nl + 32) == 8 + nl + 32);
    for (uint64_t id = 1; id < 2000; id++) {
      axi_msg m = {.kind = AXI_RESPONSE,
                   .call_id = id,
                   .err = AX_EIO,
                   .errmsg = "forged",
                   .node = "w1"};
      uint8_t *p;
      size_t l, blob;
      AX_ASSERT_OK(axi_frame_encode(&m, 4, 0, &p, &l, &blob));
      uint32_t bm = AXI_BULK_MAGIC;
      memcpy(p, &bm, 4);
      ssize_t w = write(fd, p, l);
      free(p);
      if (w <= 0)
        break; /* closed already */
      if (id % 200 == 0)
        assert_alive("w1");
    }
    assert_true(rt_closed_by_peer(fd));
    close(fd);
  }
  ax_node_stats s;
  ax_node_stats_get(g_drv, &s);
  assert_int_equal(s.forged, 0); /* none reached the dispatcher */
  assert_alive("w1");
}

static void test_zero_live(void **state) {
  for (int i = 0; i < NAG; i++)
    AX_ASSERT_OK(rt_remote_zero(g_drv, g_names[i]));
  AX_ASSERT_OK(rt_local_zero());
}

int main(void) {
  if (make_token(g_tok) || make_token(g_bad)) {
    perror("token");
    return 1;
  }
  setenv("AXON_TOKEN_FILE", g_tok, 1); /* the agents and the driver */
  signal(SIGPIPE, SIG_IGN); /* raw writes to connections the agent closed */
  g_port = rt_free_port();
  for (int i = 0; i < NAG; i++)
    g_pids[i] = rt_spawn_agent(g_names[i], g_port, NULL);
  int rc = rt_driver("driver", g_port, NAG + 1, &g_drv);
  if (rc != AX_OK) {
    fprintf(stderr, "driver: %s: %s\n", ax_strerror(rc), ax_errmsg());
    for (int i = 0; i < NAG; i++)
      rt_stop_agent(g_pids[i], SIGKILL, 5000);
    unlink(g_tok);
    unlink(g_bad);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_members_work),
      cmocka_unit_test(test_stranger_cannot_join),
      cmocka_unit_test(test_name_of_a_member_refused),
      cmocka_unit_test(test_hello_address_not_dialled),
      cmocka_unit_test(test_acceptor_must_prove),
      cmocka_unit_test(test_stranger_cannot_call_or_forge),
      cmocka_unit_test(test_zero_live),
  };
  int failed = AX_TEST_MAIN(tests);
  for (int i = 0; i < NAG; i++)
    failed += mt_stop_checked(g_names[i], g_pids[i]);
  ax_node_destroy(g_drv);
  unlink(g_tok);
  unlink(g_bad);
  return failed || ax_rpc_live_calls() || ax_future_live_count();
}
