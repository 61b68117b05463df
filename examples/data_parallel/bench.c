/* --bench-allreduce MB: times ring all-reduces of an MB-MiB tensor over
 * the replicas and prints the bus bandwidth, 2 (N - 1) / N * bytes / time,
 * the figure comparable with a link's raw bandwidth. */
#include <stdio.h>
#include <time.h>

#include <axon/kernels/clock.h>

#include "dp_state.h"

int dp_bench_allreduce(const dp_opts *o) {
  char name[32];
  snprintf(name, sizeof name, "dp%d", o->rank);
  ax_node_opts no;
  ax_node_opts_init(&no);
  no.name = name;
  no.listen = o->rank == 0 ? o->master : "127.0.0.1:0";
  no.master = o->rank == 0 ? NULL : o->master;
  no.world_size = o->rank == 0 ? o->world : 0;
  no.rank = o->rank;
  no.threads = 2;
  no.timeout_ms = o->timeout_ms;
  ax_node *n = NULL;
  ax_coll_group *g = NULL;
  const char *members[64];
  char names[64][16];
  int N = o->world < 64 ? o->world : 64;
  for (int r = 0; r < N; r++) {
    snprintf(names[r], sizeof names[r], "dp%d", r);
    members[r] = names[r];
  }
  int64_t count = (int64_t)(o->bench_mb * (1 << 20) / 4);
  ax_tensor *t = ax_tensor_zeros(AX_F32, 1, &count, AX_CPU);
  int rc = t ? AX_OK : AX_ENOMEM;
  if (rc == AX_OK && (rc = ax_node_create(&no, &n)) == AX_OK &&
      (rc = ax_coll_init(n)) == AX_OK && (rc = ax_node_join(n, 60000)) == AX_OK)
    rc = ax_coll_group_new(n, "bench", N, members, o->timeout_ms, &g);
  const int warm = 2, iters = 10;
  double t0 = 0;
  for (int i = 0; rc == AX_OK && i < warm + iters; i++) {
    if (i == warm)
      t0 = ax_clock_s();
    rc = ax_coll_allreduce(g, t, AX_COLL_SUM);
  }
  double per = (ax_clock_s() - t0) / iters, bytes = (double)count * 4;
  if (rc == AX_OK && o->rank == 0)
    printf("dp: bench allreduce N=%d size=%.1f MiB time=%.2f ms "
           "algbw=%.1f MB/s busbw=%.1f MB/s\n",
           N, bytes / (1 << 20), per * 1e3, bytes / per / 1e6,
           2.0 * (N - 1) / N * bytes / per / 1e6);
  if (rc != AX_OK)
    fprintf(stderr, "dp: bench: %s: %s\n", ax_errname(rc), ax_errmsg());
  if (g && (rc != AX_OK || dp_leave(n, o->rank) != AX_OK)) {
    struct timespec ts = {1, 0}; /* see dp_state_close */
    nanosleep(&ts, NULL);
  }
  ax_coll_group_free(g);
  if (n) {
    ax_node_shutdown(n, 2000);
    ax_coll_fini(n);
    ax_node_destroy(n);
  }
  ax_tensor_release(t);
  return rc == AX_OK ? 0 : 1;
}
