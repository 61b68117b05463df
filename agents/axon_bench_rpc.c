/* axon-bench rpc: axon RPC against a raw TCP ping-pong between the same two
 * processes (TCP_NODELAY, blocking sockets, 1 MiB steps, pooled receive
 * buffer). Prints p50/p99 round trip of a small call, calls/s with 64 in
 * flight, and GB/s for 1, 16 and 64 MiB tensors.
 *
 *   axon-bench rpc [--iters N] [--reps N] [--worker] [--grpc-small]
 *                  [--bulk-threshold B] [--tls | --shm [--rounds N]]
 *
 * The handlers are trivial, so they are registered inline (run on the
 * receiving transport thread); --worker registers them as ordinary
 * handlers run by the worker pool. --grpc-small sends messages under
 * --bulk-threshold tensor bytes over the gRPC stream instead of the TCP
 * channel (ax_node_opts.small_over_grpc).
 *
 * axon's side runs the "tcp" data transport unless AXON_DATA_TRANSPORT
 * names another. --tls compares TCP with mutual TLS instead, --shm TCP with
 * the shared-memory transport (axon_bench_rpc_pair.c).
 *
 * The server is a forked child (forked before gRPC starts in either
 * process); it answers raw TCP on one socket and axon calls on its node. */
#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agents/axon_bench_rpc.h"
#include "axon/kernels/clock.h"
#include "axon/rpc/launch.h"
#include "axon/rpc/rpc.h"

#define STEP (1u << 20)

static int g_worker;              /* --worker: handlers on the worker pool */
static long long g_bulk_thr = -1; /* --bulk-threshold; -1: node default */
static int g_grpc_small;          /* --grpc-small: small calls over gRPC */

static int xfer(int fd, void *p, size_t n, int wr) {
  char *c = p;
  while (n) {
    size_t k = n < STEP ? n : STEP;
    ssize_t r = wr ? write(fd, c, k) : read(fd, c, k);
    if (r <= 0)
      return -1;
    c += r;
    n -= (size_t)r;
  }
  return 0;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* ---- server (child) ------------------------------------------------------ */
static void *raw_server(void *arg) {
  int fd = (int)(intptr_t)arg;
  char *pool = malloc(64u << 20), small[4096];
  for (;;) {
    uint64_t n;
    if (xfer(fd, &n, 8, 0) || n == 0)
      break;
    if (n <= sizeof small) {
      if (xfer(fd, small, n, 0) || xfer(fd, small, n, 1))
        break;
    } else {
      for (uint64_t left = n; left;) { /* into the pooled buffer */
        size_t k = left < (64u << 20) ? left : (64u << 20);
        if (xfer(fd, pool, k, 0))
          goto out;
        left -= k;
      }
      if (xfer(fd, &n, 8, 1))
        break;
    }
  }
out:
  free(pool);
  return NULL;
}

static int h_ping(ax_call_ctx *c, const ax_values *a, ax_values *out, void *u) {
  int64_t x = 0;
  ax_values_get_i64(a, 0, &x);
  return ax_values_add_i64(out, x);
}

static int h_sink(ax_call_ctx *c, const ax_values *a, ax_values *out, void *u) {
  ax_tensor *t;
  AX_TRY(ax_values_get_tensor(a, 0, &t));
  return ax_values_add_i64(out, (int64_t)ax_tensor_nbytes(t));
}

int axi_bench_rpc_child(int raw_port, const char *master) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(raw_port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa))
    return 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ax_node_opts o;
  ax_node_opts_init(&o);
  o.name = "bench-server";
  o.master = master;
  o.threads = 2;
  if (g_bulk_thr >= 0)
    o.bulk_threshold = (size_t)g_bulk_thr;
  o.small_over_grpc = g_grpc_small;
  int (*reg)(ax_node *, const char *, ax_rpc_handler, void *) =
      g_worker ? ax_rpc_register : ax_rpc_register_inline;
  ax_node *n;
  if (ax_node_create(&o, &n) || reg(n, "ping", h_ping, NULL) ||
      reg(n, "sink", h_sink, NULL) || ax_node_join(n, 30000))
    return 1;
  raw_server((void *)(intptr_t)fd); /* returns when the parent is done */
  close(fd);
  ax_node_shutdown(n, 2000);
  ax_node_destroy(n);
  return 0;
}

/* ---- client (parent) ----------------------------------------------------- */
const size_t axi_bench_rpc_sizes[3] = {1u << 20, 16u << 20, 64u << 20};

static void raw_bench(int fd, int iters, int reps, axi_rpc_row *r) {
  char msg[64] = {0};
  uint64_t n = sizeof msg;
  double *lat = malloc(iters * sizeof *lat);
  for (int i = 0; i < iters + 100; i++) {
    double t0 = ax_clock_s();
    xfer(fd, &n, 8, 1);
    xfer(fd, msg, n, 1);
    xfer(fd, msg, n, 0);
    if (i >= 100)
      lat[i - 100] = ax_clock_s() - t0;
  }
  qsort(lat, iters, sizeof *lat, cmp_d);
  r->p50_us = lat[iters / 2] * 1e6;
  r->p99_us = lat[iters * 99 / 100] * 1e6;
  free(lat);
  /* 64 in flight: each request is header + 64 B, each reply 64 B. */
  int total = iters * 4;
  char req[72];
  memcpy(req, &n, 8);
  double t0 = ax_clock_s();
  for (int i = 0; i < 64; i++)
    xfer(fd, req, sizeof req, 1);
  for (int i = 0; i < total; i++) {
    xfer(fd, msg, 64, 0);
    if (i + 64 < total)
      xfer(fd, req, sizeof req, 1);
  }
  r->calls_s = total / (ax_clock_s() - t0);
  char *buf = malloc(64u << 20);
  memset(buf, 1, 64u << 20);
  for (int s = 0; s < 3; s++) {
    double best = 1e9;
    for (int k = 0; k < reps; k++) {
      uint64_t len = axi_bench_rpc_sizes[s], ack;
      double t = ax_clock_s();
      xfer(fd, &len, 8, 1);
      xfer(fd, buf, len, 1);
      xfer(fd, &ack, 8, 0);
      t = ax_clock_s() - t;
      best = t < best ? t : best;
    }
    r->gbs[s] = axi_bench_rpc_sizes[s] / best / 1e9;
  }
  free(buf);
}

void axi_bench_rpc_run(ax_node *n, int iters, int reps, axi_rpc_row *r) {
  ax_values *a = ax_values_new();
  ax_values_add_i64(a, 7);
  double *lat = malloc(iters * sizeof *lat);
  for (int i = 0; i < iters + 100; i++) {
    double t0 = ax_clock_s();
    ax_values *res = NULL;
    if (ax_rpc_sync(n, "bench-server", "ping", a, NULL, &res) != AX_OK)
      fprintf(stderr, "ping: %s\n", ax_errmsg());
    ax_values_free(res);
    if (i >= 100)
      lat[i - 100] = ax_clock_s() - t0;
  }
  qsort(lat, iters, sizeof *lat, cmp_d);
  r->p50_us = lat[iters / 2] * 1e6;
  r->p99_us = lat[iters * 99 / 100] * 1e6;
  free(lat);
  int total = iters * 4;
  ax_future *ring[64];
  double t0 = ax_clock_s();
  for (int i = 0; i < total + 64; i++) {
    ax_future **slot = &ring[i % 64];
    if (i >= 64) {
      ax_future_wait(*slot, 60000);
      ax_future_release(*slot);
    }
    if (i < total && ax_rpc_async(n, "bench-server", "ping", a, NULL, slot))
      fprintf(stderr, "async: %s\n", ax_errmsg());
  }
  r->calls_s = total / (ax_clock_s() - t0);
  ax_values_free(a);
  for (int s = 0; s < 3; s++) {
    int64_t numel = (int64_t)(axi_bench_rpc_sizes[s] / 4);
    ax_tensor *t = ax_tensor_new(AX_F32, 1, &numel, AX_CPU);
    memset(t->data, 1, axi_bench_rpc_sizes[s]);
    ax_values *ta = ax_values_new();
    ax_values_add_tensor(ta, t);
    double best = 1e9;
    for (int k = 0; k < reps; k++) {
      ax_values *res = NULL;
      double t1 = ax_clock_s();
      if (ax_rpc_sync(n, "bench-server", "sink", ta, NULL, &res) != AX_OK)
        fprintf(stderr, "sink: %s\n", ax_errmsg());
      t1 = ax_clock_s() - t1;
      ax_values_free(res);
      best = t1 < best ? t1 : best;
    }
    r->gbs[s] = axi_bench_rpc_sizes[s] / best / 1e9;
    ax_values_free(ta);
    ax_tensor_release(t);
  }
}

int axi_bench_listen(int backlog, int *port) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof sa;
  bind(ls, (struct sockaddr *)&sa, sizeof sa);
  listen(ls, backlog);
  getsockname(ls, (struct sockaddr *)&sa, &sl);
  *port = ntohs(sa.sin_port);
  return ls;
}

/* The table of raw TCP against axon RPC. */
static void print_rows(const axi_rpc_row *raw, const axi_rpc_row *rpc) {
  printf("%-28s %12s %12s %8s\n", "axon-bench rpc (loopback)", "raw TCP",
         "axon RPC", "ratio");
  printf("%-28s %12.1f %12.1f %8.2f\n", "small call p50 (us)", raw->p50_us,
         rpc->p50_us, rpc->p50_us / raw->p50_us);
  printf("%-28s %12.1f %12.1f %8.2f\n", "small call p99 (us)", raw->p99_us,
         rpc->p99_us, rpc->p99_us / raw->p99_us);
  printf("%-28s %12.0f %12.0f %8.2f\n", "calls/s, 64 in flight", raw->calls_s,
         rpc->calls_s, rpc->calls_s / raw->calls_s);
  const char *names[3] = {"1 MiB tensor (GB/s)", "16 MiB tensor (GB/s)",
                          "64 MiB tensor (GB/s)"};
  for (int s = 0; s < 3; s++)
    printf("%-28s %12.2f %12.2f %8.2f\n", names[s], raw->gbs[s], rpc->gbs[s],
           rpc->gbs[s] / raw->gbs[s]);
}

int ax_bench_rpc_main(int argc, char **argv) {
  int iters = 5000, reps = 10, rounds = 3, tls = 0, shm = 0, c;
  static const struct option lo[] = {
      {"iters", 1, 0, 'i'},      {"reps", 1, 0, 'r'},
      {"worker", 0, 0, 'w'},     {"bulk-threshold", 1, 0, 'b'},
      {"grpc-small", 0, 0, 'g'}, {"tls", 0, 0, 't'},
      {"shm", 0, 0, 's'},        {"rounds", 1, 0, 'R'},
      {"help", 0, 0, 'h'},       {0, 0, 0, 0}};
  optind = 1;
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    if (c == 'i')
      iters = atoi(optarg);
    else if (c == 'r')
      reps = atoi(optarg);
    else if (c == 'w')
      g_worker = 1;
    else if (c == 'b')
      g_bulk_thr = atoll(optarg);
    else if (c == 'g')
      g_grpc_small = 1;
    else if (c == 't')
      tls = 1;
    else if (c == 's')
      shm = 1;
    else if (c == 'R')
      rounds = atoi(optarg);
    else {
      printf("usage: axon-bench rpc [--iters N (5000)] [--reps N (10)] "
             "[--worker] [--grpc-small] [--bulk-threshold BYTES (1 MiB)]\n"
             "       axon-bench rpc --tls | --shm [--rounds N (3)] [--iters N] "
             "[--reps N]\n"
             "  --worker          run the handlers on the worker pool instead "
             "of inline\n"
             "  --grpc-small      send messages under the bulk threshold over "
             "the gRPC stream\n"
             "  --bulk-threshold  with --grpc-small: tensor bytes from which "
             "the TCP channel is used\n"
             "  --tls             plaintext against mutual TLS on both "
             "channels, interleaved\n"
             "                    in one run (certificates from "
             "scripts/make_certs.sh)\n"
             "  --shm             TCP against the shared-memory transport, "
             "interleaved in one run\n");
      return c == 'h' ? 0 : 2;
    }
  }
  if (iters < 100)
    iters = 100;
  signal(SIGPIPE, SIG_IGN);
  if (tls || shm)
    return axi_bench_rpc_pair(shm, iters, reps, rounds < 1 ? 1 : rounds);
  setenv("AXON_DATA_TRANSPORT", "tcp", 0); /* axon's TCP against raw TCP */
  int raw_port, one = 1, ls = axi_bench_listen(1, &raw_port);
  char master[64]; /* a free port for the master */
  snprintf(master, sizeof master, "127.0.0.1:%d", ax_local_free_port());
  pid_t pid = fork(); /* before any gRPC initialisation */
  if (pid == 0)
    _exit(axi_bench_rpc_child(raw_port, master));
  int fd = accept(ls, NULL, NULL);
  close(ls);
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ax_node_opts o;
  ax_node_opts_init(&o);
  o.name = "bench-client";
  o.listen = master;
  o.master = master;
  o.world_size = 2;
  o.threads = 2;
  if (g_bulk_thr >= 0)
    o.bulk_threshold = (size_t)g_bulk_thr;
  o.small_over_grpc = g_grpc_small;
  ax_node *n = NULL;
  if (ax_node_create(&o, &n) || ax_node_join(n, 30000)) {
    fprintf(stderr, "axon-bench rpc: %s\n", ax_errmsg());
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return 1;
  }
  axi_rpc_row raw, rpc;
  raw_bench(fd, iters, reps, &raw);
  axi_bench_rpc_run(n, iters, reps, &rpc);
  uint64_t zero = 0;
  xfer(fd, &zero, 8, 1);
  close(fd);
  int st = 0;
  waitpid(pid, &st, 0);
  ax_node_destroy(n);
  print_rows(&raw, &rpc);
  return 0;
}
