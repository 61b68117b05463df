/* axon-bench rpc --tls / --shm: two data transports side by side. Two
 * worlds run in one run, each a client node here and a forked server
 * child:
 * - --tls: plaintext TCP against mutual TLS on both channels (certificates
 *   made by scripts/make_certs.sh in a temporary directory); goals:
 *   p50 <= 1.3x, 64 MiB >= 0.5x;
 * - --shm: TCP against the shared-memory transport (both on this host);
 *   goal: 16 and 64 MiB >= 2x.
 * The same measurements (axi_bench_rpc_run) alternate between them for
 * --rounds rounds, so that both see the same machine load; the table gives
 * the median small-call p50/p99 and calls/s over the rounds, the best
 * GB/s, and the ratios. */
#include <arpa/inet.h>
#include <libgen.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agents/axon_bench_local.h"
#include "agents/axon_bench_rpc.h"
#include "axon/rpc/launch.h"

/* Runs scripts/make_certs.sh (from AXON_SOURCE_DIR, else next to the
 * build directory holding this program) into dir. */
static int make_certs(const char *dir) {
  char exe[4096], script[4300];
  const char *src = getenv("AXON_SOURCE_DIR");
  if (src && *src) {
    snprintf(script, sizeof script, "%s/scripts/make_certs.sh", src);
  } else {
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    snprintf(script, sizeof script, "%s/../scripts/make_certs.sh",
             dirname(exe));
  }
  char cmd[8800];
  snprintf(cmd, sizeof cmd,
           "sh '%s' '%s' bench-client=127.0.0.1 bench-server=127.0.0.1 "
           ">/dev/null",
           script, dir);
  if (system(cmd) != 0) {
    fprintf(stderr, "axon-bench rpc --tls: %s failed (set AXON_SOURCE_DIR)\n",
            script);
    return -1;
  }
  return 0;
}

static void pem(char *buf, size_t len, const char *dir, const char *name,
                const char *ext) {
  snprintf(buf, len, "%s/%s.%s", dir, name, ext);
}

/* The client nodes of both worlds: n[w] joins master[w] with data
 * transport dt[w] (world 1 with the client's certificates under dir when
 * not shm). AX_OK, or the first error. */
static int join_clients(int shm, const char *const *dt, char master[2][64],
                        const char *dir, ax_node **n) {
  char ca[128], ccert[128], ckey[128];
  pem(ca, sizeof ca, dir, "ca", "pem");
  pem(ccert, sizeof ccert, dir, "bench-client", "pem");
  pem(ckey, sizeof ckey, dir, "bench-client", "key");
  int rc = AX_OK;
  for (int w = 0; w < 2 && rc == AX_OK; w++) {
    ax_node_opts o;
    ax_node_opts_init(&o);
    o.name = "bench-client";
    o.listen = o.master = master[w];
    o.world_size = 2;
    o.threads = 2;
    o.data_transport = dt[w];
    if (w && !shm) {
      o.tls_ca = ca;
      o.tls_cert = ccert;
      o.tls_key = ckey;
    }
    rc = ax_node_create(&o, &n[w]);
    if (rc == AX_OK)
      rc = ax_node_join(n[w], 30000);
  }
  return rc;
}

/* The table: medians m[w] (p50, p99, calls/s) and the best GB/s of both
 * worlds, with the goals. */
static void print_pair(int shm, const char *what, const char *dt1, int rounds,
                       double m[2][3], double gbs[2][3]) {
  printf("axon-bench rpc %s (loopback, %d interleaved rounds)\n", what, rounds);
  printf("%-28s %12s %12s %8s %s\n", "", "tcp", dt1, "ratio", "goal");
  printf("%-28s %12.1f %12.1f %8.2f %s\n", "small call p50 (us)", m[0][0],
         m[1][0], m[1][0] / m[0][0], shm ? "" : "<= 1.3");
  printf("%-28s %12.1f %12.1f %8.2f\n", "small call p99 (us)", m[0][1], m[1][1],
         m[1][1] / m[0][1]);
  printf("%-28s %12.0f %12.0f %8.2f\n", "calls/s, 64 in flight", m[0][2],
         m[1][2], m[1][2] / m[0][2]);
  const char *names[3] = {"1 MiB tensor (GB/s)", "16 MiB tensor (GB/s)",
                          "64 MiB tensor (GB/s)"};
  for (int s = 0; s < 3; s++)
    printf("%-28s %12.2f %12.2f %8.2f %s\n", names[s], gbs[0][s], gbs[1][s],
           gbs[1][s] / gbs[0][s],
           shm      ? (s ? ">= 2" : "")
           : s == 2 ? ">= 0.5"
                    : "");
}

int axi_bench_rpc_pair(int shm, int iters, int reps, int rounds) {
  char dir[64] = "/tmp/axon-bench-tls-XXXXXX", rm[128];
  if (!mkdtemp(dir))
    return 1;
  snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
  const char *what = shm ? "--shm" : "--tls";
  /* world 0, world 1: their data transports */
  const char *dt[2] = {"tcp", shm ? "shm" : "tls"};
  if (!shm && make_certs(dir)) {
    system(rm);
    return 1;
  }
  char ca[128], scert[128], skey[128];
  pem(ca, sizeof ca, dir, "ca", "pem");
  pem(scert, sizeof scert, dir, "bench-server", "pem");
  pem(skey, sizeof skey, dir, "bench-server", "key");
  /* The children's raw sockets only tell them when the parent is done. */
  int raw_port, ls = axi_bench_listen(2, &raw_port);
  char master[2][64];
  pid_t pid[2];
  int fd[2];
  for (int w = 0; w < 2; w++) { /* 0: plaintext, 1: TLS */
    snprintf(master[w], sizeof master[w], "127.0.0.1:%d", ax_local_free_port());
    if ((pid[w] = fork()) == 0) { /* before any gRPC initialisation */
      setenv("AXON_DATA_TRANSPORT", dt[w], 1);
      if (w && !shm) {
        setenv("AXON_TLS_CA", ca, 1);
        setenv("AXON_TLS_CERT", scert, 1);
        setenv("AXON_TLS_KEY", skey, 1);
      }
      _exit(axi_bench_rpc_child(raw_port, master[w]));
    }
    fd[w] = accept(ls, NULL, NULL);
  }
  close(ls);
  ax_node *n[2] = {NULL, NULL};
  int rc = join_clients(shm, dt, master, dir, n);
  if (rc != AX_OK) {
    fprintf(stderr, "axon-bench rpc %s: %s\n", what, ax_errmsg());
    for (int w = 0; w < 2; w++)
      kill(pid[w], SIGKILL);
  }
  double p50[2][64], p99[2][64], cps[2][64], gbs[2][3] = {{0}};
  if (rounds > 64)
    rounds = 64;
  for (int r = 0; rc == AX_OK && r < rounds; r++) {
    for (int k = 0; k < 2; k++) {
      int w = (r + k) % 2; /* alternate which goes first */
      axi_rpc_row row;
      axi_bench_rpc_run(n[w], iters, reps, &row);
      p50[w][r] = row.p50_us;
      p99[w][r] = row.p99_us;
      cps[w][r] = row.calls_s;
      for (int s = 0; s < 3; s++)
        gbs[w][s] = row.gbs[s] > gbs[w][s] ? row.gbs[s] : gbs[w][s];
    }
  }
  uint64_t zero = 0;
  for (int w = 0; w < 2; w++) {
    if (write(fd[w], &zero, 8) != 8)
      kill(pid[w], SIGKILL);
    close(fd[w]);
    waitpid(pid[w], NULL, 0);
    ax_node_destroy(n[w]);
  }
  system(rm);
  if (rc != AX_OK)
    return 1;
  double m[2][3];
  for (int w = 0; w < 2; w++) {
    m[w][0] = axi_bench_median(p50[w], rounds);
    m[w][1] = axi_bench_median(p99[w], rounds);
    m[w][2] = axi_bench_median(cps[w], rounds);
  }
  print_pair(shm, what, dt[1], rounds, m, gbs);
  return 0;
}
