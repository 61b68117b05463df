/* axon-bench join: what a world of many idle agents costs on one host.
 *
 *   axon-bench join [--agents N (16)] [--agent-threads T (4)]
 *
 * Forks N axon-agent children (next to this binary) that join this
 * process, the master (world N + 1), and reports:
 * - join: from the first fork to the world being complete here;
 * - memory and threads: each agent's PSS (/proc/PID/smaps_rollup), summed
 *   and per agent, and its threads (/proc/PID/task), once the world formed;
 * - membership: the bytes of the names and addresses in the membership
 *   every member receives (framing not counted), and their sum (N copies:
 *   linear in N per join, N^2 in all);
 * - round: one barrier, a call to every agent at once and all replies;
 * - shutdown: the world ended (drain, leave) and every child reaped.
 * Each line is one measurement of one run. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agents/axon_bench_local.h"
#include "axon/kernels/clock.h"
#include "axon/rpc/launch.h"
#include "axon/rpc/rpc-debug.h"
#include "axon/rpc/rpc.h"

/* PSS in KiB and the thread count of process pid (0 when gone). */
static void proc_cost(pid_t pid, long *pss_kb, int *threads) {
  char path[64], line[256];
  *pss_kb = 0;
  *threads = 0;
  snprintf(path, sizeof path, "/proc/%d/smaps_rollup", (int)pid);
  FILE *f = fopen(path, "r");
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "Pss:", 4))
      *pss_kb = atol(line + 4);
  if (f)
    fclose(f);
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  f = fopen(path, "r");
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "Threads:", 8))
      *threads = atoi(line + 8);
  if (f)
    fclose(f);
}

/* The membership's strings, as master m hands them out: every member's
 * name, control and data addresses (m's own data address is not public:
 * counted as long as its control address, both "127.0.0.1:PORT"). */
static size_t membership_bytes(ax_node *m) {
  size_t bytes = 0;
  for (int r = 0; r < ax_node_world_size(m); r++) {
    const char *name;
    char ctl[256] = "", bulk[256] = "";
    if (ax_node_member(m, r, &name) != AX_OK)
      continue;
    if (!strcmp(name, ax_node_name(m)))
      snprintf(ctl, sizeof ctl, "%s", ax_node_address(m)),
          snprintf(bulk, sizeof bulk, "%s", ax_node_address(m));
    else
      ax_rpc_debug_peer_addrs(m, name, ctl, sizeof ctl, bulk, sizeof bulk);
    bytes += strlen(name) + strlen(ctl) + strlen(bulk);
  }
  return bytes;
}

/* One barrier: a call to every agent a0..a(n-1) at once, then every
 * reply. The calls that failed. */
static int barrier_round(ax_node *m, int n) {
  ax_future **f = calloc((size_t)n, sizeof *f);
  int bad = 0;
  for (int i = 0; f && i < n; i++) {
    char name[32];
    snprintf(name, sizeof name, "a%d", i);
    bad += ax_rpc_async(m, name, "axon.test.echo", NULL, NULL, &f[i]) != AX_OK;
  }
  for (int i = 0; f && i < n; i++)
    if (f[i]) {
      bad += ax_future_wait(f[i], 60000) != AX_OK;
      ax_future_release(f[i]);
    }
  free(f);
  return bad;
}

int ax_bench_join_main(int argc, char **argv) {
  int nag = 16, athreads = 4, c;
  static const struct option lo[] = {{"agents", 1, 0, 'n'},
                                     {"agent-threads", 1, 0, 't'},
                                     {"help", 0, 0, 'h'},
                                     {0, 0, 0, 0}};
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    switch (c) {
    case 'n':
      nag = atoi(optarg);
      break;
    case 't':
      athreads = atoi(optarg);
      break;
    case 'h':
      printf("usage: axon-bench join [--agents N (16)] [--agent-threads T "
             "(4)]\n");
      return 0;
    default:
      return 2;
    }
  }
  if (nag < 1 || nag > 4096 || athreads < 1 || athreads > 1024) {
    fprintf(stderr, "axon-bench join: --agents 1..4096, --agent-threads "
                    "1..1024\n");
    return 2;
  }
  if (ax_local_token())
    return 1;
  pid_t *pids = calloc((size_t)nag, sizeof *pids);
  if (!pids)
    return 1;
  int port = ax_local_free_port();
  char at[16];
  snprintf(at, sizeof at, "%d", athreads);
  const char *args[] = {"--threads", at, NULL};
  double t0 = ax_clock_s();
  for (int i = 0; i < nag; i++) { /* before gRPC starts in this process */
    char name[32];
    snprintf(name, sizeof name, "a%d", i);
    pids[i] = axi_bench_spawn_agent(name, port, NULL, NULL, 0, args);
  }
  ax_node *m = NULL;
  int err = axi_bench_master("driver", port, nag + 1, &m);
  double t_join = ax_clock_s() - t0;
  if (err) {
    fprintf(stderr, "axon-bench join: %s\n", ax_errmsg());
    for (int i = 0; i < nag; i++)
      if (pids[i] > 0)
        kill(pids[i], SIGKILL);
    while (wait(NULL) > 0)
      ;
    free(pids);
    return 1;
  }
  long pss_sum = 0, pss_max = 0;
  int thr_sum = 0, thr_max = 0;
  for (int i = 0; i < nag; i++) {
    long p;
    int t;
    proc_cost(pids[i], &p, &t);
    pss_sum += p;
    pss_max = p > pss_max ? p : pss_max;
    thr_sum += t;
    thr_max = t > thr_max ? t : thr_max;
  }
  size_t member_bytes = membership_bytes(m);
  double t1 = ax_clock_s();
  int bad = barrier_round(m, nag);
  double t_round = ax_clock_s() - t1;
  double t2 = ax_clock_s();
  int st = ax_local_end_world(m, nag, pids, 30000, NULL, "axon-bench join");
  ax_node_shutdown(m, 5000);
  double t_end = ax_clock_s() - t2;
  printf("axon-bench join: %d agents (--threads %d), one host\n", nag,
         athreads);
  printf("%-34s %10.2f s\n", "join (fork to world complete)", t_join);
  printf("%-34s %10.1f MiB (%.1f MiB per agent, max %.1f)\n", "agents' PSS",
         pss_sum / 1024.0, pss_sum / 1024.0 / nag, pss_max / 1024.0);
  printf("%-34s %10.1f (max %d)\n", "threads per agent", (double)thr_sum / nag,
         thr_max);
  printf("%-34s %10zu B per member, %.1f KiB in all\n", "membership strings",
         member_bytes, member_bytes * (double)(nag + 1) / 1024.0);
  printf("%-34s %10.1f ms (%d failed)\n", "barrier round (call all, wait all)",
         t_round * 1e3, bad);
  printf("%-34s %10.2f s (%s)\n", "shutdown (drain, leave, reap)", t_end,
         st == AX_OK ? "clean" : "not clean");
  free(pids);
  return bad || st != AX_OK;
}
