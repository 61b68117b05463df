/* The shared-memory data transport ("shm", rpc/bulk_shm.c) against real
 * agents on this host: tensors of sizes around the ring's (wrapping it,
 * many in flight) arrive intact; the rings really are shared memory (the
 * processes map them); an agent running "tcp" is reached over TCP; an
 * agent killed in the middle of a transfer (the driver's writer blocked on
 * a full ring) fails the call cleanly and leaves no mapping behind in the
 * survivor; and local strangers on an agent's Unix socket offering no
 * ring, an unsealed one, one too small or too large, one whose header
 * does not match its file, or a ring whose
 * indices they scribble on, are closed while the agent keeps serving and
 * unmaps what they cost. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "axon/rpc/rpc-debug.h"
#include "harness.h"
#include "tests/mp_testutil.h"

enum { A1, A2, T1, VICTIM, NAG };
static const char *g_names[NAG] = {"a1", "a2", "t1", "victim"};
static pid_t g_pids[NAG];
static ax_node *g_drv;

/* Shared-memory rings process pid maps (pid 0: this process). */
static int rings_mapped(pid_t pid) {
  char path[64], line[512];
  snprintf(path, sizeof path, pid ? "/proc/%d/maps" : "/proc/self/maps",
           (int)pid);
  FILE *f = fopen(path, "r");
  int k = 0;
  while (f && fgets(line, sizeof line, f))
    k += strstr(line, "memfd:axon-shm") != NULL;
  if (f)
    fclose(f);
  return k;
}

/* Waits up to 10 s for process pid to map `want` rings. */
static int wait_rings(pid_t pid, int want) {
  for (int i = 0; i < 1000 && rings_mapped(pid) != want; i++)
    rt_sleep_ms(10);
  return rings_mapped(pid);
}

/* A float tensor of n bytes (n a multiple of 4) with a pattern from seed. */
static ax_tensor *pattern(size_t n, uint32_t seed) {
  int64_t len = (int64_t)n / 4;
  ax_tensor *t = ax_tensor_new(AX_F32, 1, &len, AX_CPU);
  uint32_t *p = t->data, x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n / 4; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    p[i] = x;
  }
  return t;
}

static ax_future *echo_async(const char *to, ax_tensor *t) {
  ax_values *a = ax_values_new();
  ax_values_add_tensor(a, t);
  ax_call_opts o = {.timeout_ms = 60000};
  ax_future *f = NULL;
  AX_ASSERT_OK(ax_rpc_async(g_drv, to, "axon.test.echo", a, &o, &f));
  ax_values_free(a);
  return f;
}

static void assert_echoed(ax_future *f, const ax_tensor *t) {
  AX_ASSERT_OK(ax_future_wait(f, 60000));
  const ax_values *r = ax_future_values(f);
  ax_tensor *back = NULL;
  AX_ASSERT_OK(ax_values_get_tensor(r, 0, &back));
  assert_int_equal(ax_tensor_nbytes(back), ax_tensor_nbytes(t));
  assert_memory_equal(back->data, t->data, ax_tensor_nbytes(t));
  ax_future_release(f);
}

static void test_sizes_around_the_ring(void **state) {
  assert_non_null(strstr(ax_rpc_debug_bulk_addr(g_drv), "+shm."));
  const size_t ring = 4u << 20;
  const size_t sizes[] = {
      4, 4096, ring - 4, ring, ring + 4, 3 * ring + 1028, 16u << 20, 64u << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    ax_tensor *t = pattern(sizes[i], (uint32_t)i);
    assert_echoed(echo_async("a1", t), t);
    ax_tensor_release(t);
  }
  /* Both directions of driver <-> a1 are rings: ours to it, its to us. */
  assert_int_equal(wait_rings(0, 2), 2);
  assert_int_equal(wait_rings(g_pids[A1], 2), 2);
}

static void test_many_in_flight(void **state) {
  enum { K = 48 };
  ax_tensor *t[K];
  ax_future *f[K];
  for (int i = 0; i < K; i++) {
    size_t n = ((size_t)(i * 7919) % (3u << 20)) / 4 * 4 + 4;
    t[i] = pattern(n, 100 + (uint32_t)i);
    f[i] = echo_async(i % 2 ? "a1" : "a2", t[i]);
  }
  for (int i = 0; i < K; i++) {
    assert_echoed(f[i], t[i]);
    ax_tensor_release(t[i]);
  }
}

/* t1 runs "tcp": reached over TCP, no ring on either side. */
static void test_tcp_agent(void **state) {
  char ctl[128], bulk[256];
  AX_ASSERT_OK(
      ax_rpc_debug_peer_addrs(g_drv, "t1", ctl, sizeof ctl, bulk, sizeof bulk));
  assert_null(strstr(bulk, "+shm."));
  int before = rings_mapped(0);
  ax_tensor *t = pattern(16u << 20, 7);
  assert_echoed(echo_async("t1", t), t);
  ax_tensor_release(t);
  assert_int_equal(rings_mapped(0), before);
  assert_int_equal(rings_mapped(g_pids[T1]), 0);
}

/* The victim is killed while a 512 MiB tensor crosses to it: the ring is
 * full and the driver's writer waits for the victim's bell, which never
 * comes. The call fails as a lost peer, and the driver unmaps the
 * victim's rings. */
static void test_peer_dies_mid_transfer(void **state) {
  ax_tensor *small = pattern(4096, 1);
  assert_echoed(echo_async("victim", small), small); /* rings both ways */
  ax_tensor_release(small);
  int before = rings_mapped(0);
  ax_tensor *big = pattern(512u << 20, 2);
  ax_values *a = ax_values_new();
  ax_values_add_tensor(a, big);
  ax_call_opts o = {.timeout_ms = 60000};
  ax_future *f = NULL;
  AX_ASSERT_OK(ax_rpc_async(g_drv, "victim", "axon.test.checksum", a, &o, &f));
  ax_values_free(a);
  rt_sleep_ms(30);
  assert_int_equal(kill(g_pids[VICTIM], SIGKILL), 0);
  int64_t t0 = ax_clock_ms();
  int rc = ax_future_wait(f, 30000);
  int64_t dt = ax_clock_ms() - t0;
  fprintf(stderr, "call to the killed victim: %s after %lld ms: %s\n",
          ax_strerror(rc), (long long)dt, ax_errmsg());
  assert_true(rc == AX_EPEERDOWN || rc == AX_ECLOSED);
  assert_true(dt < 10000);
  ax_future_release(f);
  ax_tensor_release(big);
  rt_stop_agent(g_pids[VICTIM], SIGKILL, 5000);
  g_pids[VICTIM] = 0;
  assert_int_equal(wait_rings(0, before - 2), before - 2);
  AX_ASSERT_OK(rt_alive(g_drv, "a1"));
}

/* ---- local strangers on a1's Unix socket ---------------------------------*/
static int dial_unix(void) {
  char ctl[128], bulk[256];
  AX_ASSERT_OK(
      ax_rpc_debug_peer_addrs(g_drv, "a1", ctl, sizeof ctl, bulk, sizeof bulk));
  char *plus = strstr(bulk, "+shm.");
  assert_non_null(plus);
  *plus = 0;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int w =
      snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "axon-shm/%s", bulk);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa,
                           (socklen_t)(offsetof(struct sockaddr_un, sun_path) +
                                       1 + (size_t)w)),
                   0);
  return fd;
}

static void send_fd(int sock, char byte, int fd) {
  struct iovec iov = {&byte, 1};
  union {
    struct cmsghdr c;
    char buf[CMSG_SPACE(sizeof(int))];
  } u;
  memset(&u, 0, sizeof u);
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0) {
    mh.msg_control = u.buf;
    mh.msg_controllen = sizeof u.buf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
  }
  assert_int_equal(sendmsg(sock, &mh, 0), 1);
}

/* A ring as the transport makes one (header: magic, version, size; head at
 * byte 64), of `size` bytes, sealed or not, mapped at *map. Named as the
 * transport names its rings, so that the agent's mapping of it counts in
 * rings_mapped. */
static int make_ring(size_t size, int seal, uint8_t **map) {
  int fd = memfd_create("axon-shm", MFD_ALLOW_SEALING);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)(4096 + size)), 0);
  *map = mmap(NULL, 4096 + size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  assert_true(*map != MAP_FAILED);
  uint32_t magic = 0x52535841u, version = 1;
  uint64_t sz = size;
  memcpy(*map, &magic, 4);
  memcpy(*map + 4, &version, 4);
  memcpy(*map + 8, &sz, 8);
  if (seal)
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  return fd;
}

/* One stranger: offers what `kind` says, and must be closed by a1 (which
 * maps `before` rings of its own). */
static void stranger(int kind, int before) {
  int s = dial_unix(), rfd = -1;
  uint8_t *map = NULL;
  size_t size = 1u << 20;
  switch (kind) {
  case 0: /* the offer byte without a ring */
    send_fd(s, 'M', -1);
    break;
  case 1: /* a ring that could shrink under the reader */
    rfd = make_ring(size, 0, &map);
    send_fd(s, 'M', rfd);
    break;
  case 2: /* too small */
    size = 4096;
    rfd = make_ring(size, 1, &map);
    send_fd(s, 'M', rfd);
    break;
  case 6: /* too large: more than a stranger may make the agent map */
    size = 128u << 20;
    rfd = make_ring(size, 1, &map);
    send_fd(s, 'M', rfd);
    break;
  case 3: /* a header that does not match the file */
    rfd = make_ring(size, 1, &map);
    memcpy(map + 8, &(uint64_t){size * 2}, 8);
    send_fd(s, 'M', rfd);
    break;
  case 4: /* a valid ring, then a head far past the tail */
    rfd = make_ring(size, 1, &map);
    send_fd(s, 'M', rfd);
    /* taken: a1 maps it and waits for the hello */
    assert_int_equal(wait_rings(g_pids[A1], before + 1), before + 1);
    memcpy(map + 64, &(uint64_t){size * 5}, 8);
    send_fd(s, 'B', -1);
    break;
  case 5: /* a valid ring carrying garbage instead of a hello */
    rfd = make_ring(size, 1, &map);
    memset(map + 4096, 0xab, 1000);
    memcpy(map + 64, &(uint64_t){1000}, 8);
    send_fd(s, 'M', rfd);
    break;
  }
  assert_true(rt_closed_by_peer(s));
  close(s);
  if (rfd >= 0)
    close(rfd);
  if (map)
    munmap(map, 4096 + size);
}

static void test_local_strangers(void **state) {
  int before = rings_mapped(g_pids[A1]);
  for (int kind = 0; kind <= 6; kind++) {
    stranger(kind, before);
    assert_int_equal(wait_rings(g_pids[A1], before), before);
    AX_ASSERT_OK(rt_alive(g_drv, "a1"));
  }
  ax_tensor *t = pattern(8u << 20, 9); /* a1's own rings still work */
  assert_echoed(echo_async("a1", t), t);
  ax_tensor_release(t);
}

static void test_zero_live(void **state) {
  for (int i = 0; i < NAG; i++)
    if (g_pids[i])
      AX_ASSERT_OK(rt_remote_zero(g_drv, g_names[i]));
  AX_ASSERT_OK(rt_local_zero());
}

int main(void) {
  unsetenv("AXON_DATA_TRANSPORT"); /* the default: shm */
  int port = rt_free_port();
  g_pids[A1] = rt_spawn_agent("a1", port, NULL);
  g_pids[A2] = rt_spawn_agent("a2", port, NULL);
  g_pids[T1] = rt_spawn_agent("t1", port, "--data-transport", "tcp", NULL);
  g_pids[VICTIM] = rt_spawn_agent("victim", port, NULL);
  int rc = rt_driver("driver", port, NAG + 1, &g_drv);
  if (rc != AX_OK) {
    fprintf(stderr, "driver: %s: %s\n", ax_strerror(rc), ax_errmsg());
    for (int i = 0; i < NAG; i++)
      rt_stop_agent(g_pids[i], SIGKILL, 5000);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sizes_around_the_ring),
      cmocka_unit_test(test_many_in_flight),
      cmocka_unit_test(test_tcp_agent),
      cmocka_unit_test(test_peer_dies_mid_transfer),
      cmocka_unit_test(test_local_strangers),
      cmocka_unit_test(test_zero_live),
  };
  int failed = AX_TEST_MAIN(tests);
  for (int i = 0; i < NAG; i++)
    if (g_pids[i])
      failed += mt_stop_checked(g_names[i], g_pids[i]);
  ax_node_destroy(g_drv);
  return failed || ax_rpc_live_calls() || ax_future_live_count();
}
