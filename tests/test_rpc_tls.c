/* Mutual TLS against real agents (certificates from scripts/make_certs.sh
 * in a temporary directory), in two worlds one after the other: with the
 * shared token as well (both are checked), and with TLS alone. A TLS world runs
 * calls over both channels; a stranger without a certificate, one with a
 * certificate from another CA, a member whose certificate names someone else
 * and a plaintext node can neither join nor call, on the control plane or the
 * data channel, and the agents keep serving their members. Also the option
 * checks of ax_node_create. */
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "axon/rpc/auth-impl.h"
#include "axon/rpc/bulk-impl.h"
#include "axon/rpc/rpc-debug.h"
#include "harness.h"
#include "tests/mp_testutil.h"

enum { W1, W2, NAG };
static const char *g_names[NAG] = {"w1", "w2"};
static pid_t g_pids[2][NAG]; /* the agents of both worlds */
static ax_node *g_drv;
static int g_port, g_token; /* the current world's; with a token or not */
static char g_dir[64] = "/tmp/axon-tls-XXXXXX"; /* our CA's certificates */
static char g_other[128];                       /* another CA's */
static char g_why[512]; /* the message of the last try_join */

/* DIR/NAME.pem or .key into buf (static rotating buffers). */
static const char *pem(const char *dir, const char *name, const char *ext) {
  static char b[8][256];
  static int k;
  char *p = b[k++ % 8];
  snprintf(p, 256, "%s/%s.%s", dir, name, ext);
  return p;
}

/* A node of this process named `name` with the given TLS files (NULL: no
 * TLS) that tries to join the driver; returns the join's outcome and
 * prints its message. */
static int try_join(const char *name, const char *ca, const char *cert,
                    const char *key) {
  ax_node_opts o;
  ax_node_opts_init(&o);
  char master[64];
  snprintf(master, sizeof master, "127.0.0.1:%d", g_port);
  o.name = name;
  o.master = master;
  o.world_size = 0;
  o.tls_ca = ca;
  o.tls_cert = cert;
  o.tls_key = key;
  ax_node *s = NULL;
  int rc = ax_node_create(&o, &s);
  if (rc == AX_OK)
    rc = ax_node_join(s, 5000);
  snprintf(g_why, sizeof g_why, "%s", ax_errmsg());
  fprintf(stderr, "join as %s: %s: %s\n", name, ax_strerror(rc), g_why);
  ax_node_destroy(s);
  return rc;
}

static void test_members_work(void **state) {
  AX_ASSERT_OK(rt_alive(g_drv, "w1"));
  AX_ASSERT_OK(rt_alive(g_drv, "w2"));
  /* The data channel is up (TLS) and carries a 4 MiB tensor both ways. */
  assert_true(ax_rpc_debug_bulk_addr(g_drv)[0] != 0);
  int64_t n = 1 << 20;
  ax_tensor *t = ax_tensor_zeros(AX_F32, 1, &n, AX_CPU);
  float *d = t->data;
  for (int64_t i = 0; i < n; i++)
    d[i] = (float)(i % 1000);
  ax_values *a = ax_values_new(), *r = NULL;
  ax_values_add_tensor(a, t);
  AX_ASSERT_OK(ax_rpc_sync(g_drv, "w2", "axon.test.echo", a, NULL, &r));
  assert_int_equal(ax_values_count(r), 1);
  ax_tensor *back = NULL;
  AX_ASSERT_OK(ax_values_get_tensor(r, 0, &back));
  assert_int_equal(ax_tensor_nbytes(back), ax_tensor_nbytes(t));
  assert_memory_equal(back->data, t->data, ax_tensor_nbytes(t));
  ax_values_free(r);
  ax_values_free(a);
  ax_tensor_release(t);
  /* A chain between agents: their own channels, both ways. */
  a = ax_values_new();
  ax_values_add_i64(a, 4);
  ax_values_add_str(a, "w1,w2");
  AX_ASSERT_OK(ax_rpc_sync(g_drv, "w1", "axon.test.chain", a, NULL, &r));
  ax_values_free(r);
  ax_values_free(a);
}

/* No certificate (plaintext, with the token), a certificate from another
 * CA: the join fails, the world is unchanged, the members still answer. */
static void test_strangers_cannot_join(void **state) {
  assert_int_not_equal(try_join("intruder", NULL, NULL, NULL), AX_OK);
  assert_non_null(strstr(g_why, "no TLS")); /* says what to check */
  assert_int_not_equal(try_join("intruder", pem(g_other, "ca", "pem"),
                                pem(g_other, "intruder", "pem"),
                                pem(g_other, "intruder", "key")),
                       AX_OK);
  assert_non_null(strstr(g_why, "same CA"));
  assert_int_equal(ax_node_world_size(g_drv), NAG + 1);
  AX_ASSERT_OK(rt_alive(g_drv, "w1"));
  AX_ASSERT_OK(rt_alive(g_drv, "w2"));
}

/* A valid certificate for w3 saying hello as w9 on the control plane. */
static void test_hello_under_another_name(void **state) {
  ax_node_stats before, after;
  ax_node_stats_get(g_drv, &before);
  ax_rpc_debug_tls_any_cn(1);
  int rc = try_join("w9", pem(g_dir, "ca", "pem"), pem(g_dir, "w3", "pem"),
                    pem(g_dir, "w3", "key"));
  ax_rpc_debug_tls_any_cn(0);
  assert_int_not_equal(rc, AX_OK);
  ax_node_stats_get(g_drv, &after);
  assert_true(after.auth_refused > before.auth_refused);
  AX_ASSERT_OK(rt_alive(g_drv, "w1"));
}

/* A raw TLS client: ca (NULL: no verification of the server), cert/key
 * (NULL: none). Returns the session after the handshake, or NULL. */
static SSL *tls_dial(int fd, const char *ca, const char *cert, const char *key,
                     SSL_CTX **ctx) {
  *ctx = SSL_CTX_new(TLS_client_method());
  if (ca)
    SSL_CTX_load_verify_locations(*ctx, ca, NULL);
  SSL_CTX_set_verify(*ctx, ca ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
  if (cert) {
    SSL_CTX_use_certificate_file(*ctx, cert, SSL_FILETYPE_PEM);
    SSL_CTX_use_PrivateKey_file(*ctx, key, SSL_FILETYPE_PEM);
  }
  SSL *s = SSL_new(*ctx);
  SSL_set_fd(s, fd);
  int fl = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  int r = SSL_connect(s);
  ERR_clear_error();
  if (r != 1) {
    SSL_free(s);
    return NULL;
  }
  return s;
}

/* The driver's data port refuses each stranger, counts it, and the
 * connection ends: a plaintext hello, no certificate, another CA's, and
 * our CA's certificate for w3 with a hello as w1 that carries a valid
 * proof of the token if there is one (so that only the name check can
 * refuse it). */
static void test_data_channel_strangers(void **state) {
  const char *bulk = ax_rpc_debug_bulk_addr(g_drv);
  for (int k = 0; k < 4; k++) {
    ax_node_stats before, after;
    ax_node_stats_get(g_drv, &before);
    int fd = rt_dial(bulk);
    assert_true(fd >= 0);
    struct timeval tv = {10, 0}; /* a connection left open fails below */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    SSL_CTX *ctx = NULL;
    SSL *s = NULL;
    if (k == 0) { /* plaintext: a bulk hello without TLS */
      uint8_t h[64] = {0x41, 0x58, 0x42, 0x48, 20, 0, 0, 0};
      memcpy(h + 8, "w1\n127.0.0.1:1\n127.0.0:1", 20);
      assert_true(write(fd, h, 28) == 28);
    } else if (k == 1) {
      s = tls_dial(fd, NULL, NULL, NULL, &ctx);
    } else if (k == 2) {
      s = tls_dial(fd, NULL, pem(g_other, "intruder", "pem"),
                   pem(g_other, "intruder", "key"), &ctx);
    } else {
      s = tls_dial(fd, pem(g_dir, "ca", "pem"), pem(g_dir, "w3", "pem"),
                   pem(g_dir, "w3", "key"), &ctx);
      assert_non_null(s); /* a valid member certificate */
      /* w1's own addresses and incarnation: only the certificate tells
       * it apart. */
      char addr[128], baddr[128];
      uint64_t inc = 0;
      AX_ASSERT_OK(ax_rpc_debug_peer_addrs(g_drv, "w1", addr, sizeof addr,
                                           baddr, sizeof baddr));
      AX_ASSERT_OK(ax_node_member_incarnation(g_drv, "w1", &inc));
      /* With a token: the proof, then the dialler's own nonce. */
      uint8_t mac[AXI_MAC_LEN + AXI_NONCE_LEN] = {0};
      int ml = g_token ? AXI_MAC_LEN + AXI_NONCE_LEN : 0;
      if (g_token) {
        uint8_t chal[4 + AXI_NONCE_LEN];
        assert_int_equal(SSL_read(s, chal, sizeof chal), (int)sizeof chal);
        axi_auth_mac(g_drv, AXI_AUTH_BULK, chal + 4, "w1", addr, baddr, inc,
                     mac);
      }
      char body[300];
      int nl = snprintf(body, sizeof body, "w1\n%s\n%s\n%llu", addr, baddr,
                        (unsigned long long)inc);
      uint8_t h[8 + 300 + AXI_MAC_LEN + AXI_NONCE_LEN];
      uint32_t magic = AXI_BULK_HELLO_MAGIC, len = (uint32_t)nl;
      memcpy(h, &magic, 4);
      memcpy(h + 4, &len, 4);
      memcpy(h + 8, body, nl);
      memcpy(h + 8 + nl, mac, ml);
      assert_int_equal(SSL_write(s, h, 8 + nl + ml), 8 + nl + ml);
    }
    int ended = 1;
    if (s) { /* whatever the client believes, the server ends it */
      char tmp[64];
      int r;
      while ((r = SSL_read(s, tmp, sizeof tmp)) > 0)
        ;
      ended = SSL_get_error(s, r) != SSL_ERROR_WANT_READ; /* not timed out */
      SSL_free(s);
    }
    ERR_clear_error();
    SSL_CTX_free(ctx);
    assert_true(ended);
    assert_true(k > 0 || rt_closed_by_peer(fd));
    close(fd);
    /* The refusal is counted once the agent's I/O thread got to it. */
    int64_t end = ax_clock_ms() + 10000;
    do {
      ax_node_stats_get(g_drv, &after);
      if (after.auth_refused > before.auth_refused)
        break;
      rt_sleep_ms(20);
    } while (ax_clock_ms() < end);
    fprintf(stderr, "data stranger %d: refused %llu\n", k,
            (unsigned long long)(after.auth_refused - before.auth_refused));
    assert_true(after.auth_refused > before.auth_refused);
  }
  AX_ASSERT_OK(rt_alive(g_drv, "w1"));
  AX_ASSERT_OK(rt_alive(g_drv, "w2"));
}

/* ax_node_create's checks: all three files or none, the certificate for
 * this node's name, no open non-loopback port without credentials. */
static void test_create_checks(void **state) {
  ax_node_opts o;
  ax_node_opts_init(&o);
  ax_node *n = NULL;
  o.name = "w3";
  o.tls_ca = pem(g_dir, "ca", "pem");
  assert_int_equal(ax_node_create(&o, &n), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "all three"));
  o.name = "w9"; /* w3's certificate */
  o.tls_cert = pem(g_dir, "w3", "pem");
  o.tls_key = pem(g_dir, "w3", "key");
  assert_int_equal(ax_node_create(&o, &n), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "not for this node"));
  o.tls_key = pem(g_dir, "w2", "key"); /* not the certificate's key */
  o.name = "w3";
  assert_int_equal(ax_node_create(&o, &n), AX_EINVAL);
  o.tls_cert = pem(g_other, "intruder", "pem"); /* not signed by our CA */
  o.tls_key = pem(g_other, "intruder", "key");
  o.name = "intruder";
  assert_int_equal(ax_node_create(&o, &n), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "does not verify"));
  /* No token, no TLS, listening on every address. */
  char *tok = getenv("AXON_TOKEN_FILE");
  char saved[512];
  snprintf(saved, sizeof saved, "%s", tok ? tok : "");
  setenv("AXON_TOKEN_FILE", "", 1);
  ax_node_opts_init(&o);
  o.name = "open";
  o.listen = "0.0.0.0:0";
  assert_int_equal(ax_node_create(&o, &n), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "--insecure"));
  o.insecure = 1;
  AX_ASSERT_OK(ax_node_create(&o, &n));
  ax_node_destroy(n);
  n = NULL;
  o.insecure = 0;
  o.listen = "127.0.0.1:0";
  o.data_transport = "tls"; /* TLS data transport without credentials */
  assert_int_equal(ax_node_create(&o, &n), AX_EINVAL);
  o.listen = "0.0.0.0:0"; /* TLS is a credential too */
  o.name = "w3";
  o.tls_ca = pem(g_dir, "ca", "pem");
  o.tls_cert = pem(g_dir, "w3", "pem");
  o.tls_key = pem(g_dir, "w3", "key");
  o.data_transport = "tcp"; /* plaintext data under TLS */
  assert_int_equal(ax_node_create(&o, &n), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "unencrypted"));
  o.data_transport = NULL; /* tls by default */
  AX_ASSERT_OK(ax_node_create(&o, &n));
  assert_true(ax_rpc_debug_bulk_addr(n)[0] != 0);
  ax_node_destroy(n);
  setenv("AXON_TOKEN_FILE", saved, 1);
}

static void test_zero_live(void **state) {
  for (int i = 0; i < NAG; i++)
    AX_ASSERT_OK(rt_remote_zero(g_drv, g_names[i]));
  AX_ASSERT_OK(rt_local_zero());
}

/* Runs scripts/make_certs.sh DIR names... */
static int make_certs(const char *dir, const char *names) {
  const char *src = getenv("AXON_SOURCE_DIR");
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "sh %s/scripts/make_certs.sh %s %s >/dev/null",
           src ? src : ".", dir, names);
  return system(cmd);
}

/* Spawns world w's agents on port (before gRPC starts in this process). */
static void spawn_world(int w, int port) {
  for (int i = 0; i < NAG; i++) {
    const char *n = g_names[i];
    g_pids[w][i] = rt_spawn_agent(n, port, "--tls-ca", pem(g_dir, "ca", "pem"),
                                  "--tls-cert", pem(g_dir, n, "pem"),
                                  "--tls-key", pem(g_dir, n, "key"), NULL);
  }
}

/* Runs the tests against world w (its agents already started). */
static int run_world(int w, int port) {
  g_port = port;
  setenv("AXON_TLS_CA", pem(g_dir, "ca", "pem"), 1); /* the driver's */
  setenv("AXON_TLS_CERT", pem(g_dir, "driver", "pem"), 1);
  setenv("AXON_TLS_KEY", pem(g_dir, "driver", "key"), 1);
  int rc = rt_driver("driver", g_port, NAG + 1, &g_drv);
  unsetenv("AXON_TLS_CA");
  unsetenv("AXON_TLS_CERT");
  unsetenv("AXON_TLS_KEY");
  if (rc != AX_OK) {
    fprintf(stderr, "driver: %s: %s\n", ax_strerror(rc), ax_errmsg());
    for (int i = 0; i < NAG; i++)
      rt_stop_agent(g_pids[w][i], SIGKILL, 5000);
    ax_node_destroy(g_drv);
    return 1;
  }
  fprintf(stderr, "---- TLS world %s a token\n", g_token ? "with" : "without");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_members_work),
      cmocka_unit_test(test_strangers_cannot_join),
      cmocka_unit_test(test_hello_under_another_name),
      cmocka_unit_test(test_data_channel_strangers),
      cmocka_unit_test(test_create_checks),
      cmocka_unit_test(test_members_work),
      cmocka_unit_test(test_zero_live),
  };
  int failed = AX_TEST_MAIN(tests);
  for (int i = 0; i < NAG; i++)
    failed += mt_stop_checked(g_names[i], g_pids[w][i]);
  ax_node_destroy(g_drv);
  g_drv = NULL;
  return failed;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN); /* writes to connections the agent closed */
  if (!mkdtemp(g_dir))
    return 1;
  snprintf(g_other, sizeof g_other, "%s/other", g_dir);
  char rm[256];
  snprintf(rm, sizeof rm, "rm -rf %s", g_dir);
  /* The driver is dialled by address before its name is known: its
   * certificate names 127.0.0.1. */
  if (make_certs(g_dir, "driver=127.0.0.1 w1 w2 w3") ||
      make_certs(g_other, "intruder w1")) {
    fprintf(stderr, "make_certs.sh failed\n");
    system(rm);
    return 1;
  }
  /* Both worlds' agents start now, before gRPC runs here (fork); the
   * second world's wait for their master meanwhile. */
  int port[2] = {rt_free_port(), rt_free_port()};
  spawn_world(0, port[0]); /* generates the token (AXON_TOKEN_FILE) */
  char tok[512];
  snprintf(tok, sizeof tok, "%s", getenv("AXON_TOKEN_FILE"));
  setenv("AXON_TOKEN_FILE", "", 1); /* none */
  spawn_world(1, port[1]);
  setenv("AXON_TOKEN_FILE", tok, 1);
  g_token = 1;
  int failed = run_world(0, port[0]);
  setenv("AXON_TOKEN_FILE", "", 1);
  g_token = 0;
  failed += run_world(1, port[1]);
  system(rm);
  return failed || ax_rpc_live_calls() || ax_future_live_count();
}
