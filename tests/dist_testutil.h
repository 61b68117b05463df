/* Helpers for the RRef and distributed-autograd tests: a driver node with
 * ax_dist_init, agents spawned before gRPC starts (tests/rpc_testutil.h),
 * and checks that every node ends with zero live RRefs, contexts, calls and
 * futures. Header-only. */
#ifndef AX_DIST_TESTUTIL_H
#define AX_DIST_TESTUTIL_H

#include "runtime/dist/autograd.h"
#include "runtime/dist/stage.h"
#include "tests/rpc_testutil.h"

/* The master node of a test with RRefs and distributed autograd. */
static inline int dt_driver(const char *name, int port, int world,
                            ax_node **out) {
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  ax_node_opts o;
  ax_node_opts_init(&o);
  o.name = name;
  o.listen = listen;
  o.master = listen;
  o.world_size = world;
  o.rank = 0;
  o.threads = 4;
  o.peer_timeout_ms = 2000;
  int rc = ax_node_create(&o, out);
  if (rc != AX_OK)
    return rc;
  if ((rc = ax_dist_init(*out)) == AX_OK)
    rc = ax_node_join(*out, 90000);
  if (rc != AX_OK) {
    ax_node_shutdown(*out, 1000);
    ax_dist_fini(*out);
    ax_node_destroy(*out);
    *out = NULL;
  }
  return rc;
}

static inline void dt_driver_end(ax_node *n) {
  ax_node_shutdown(n, 5000);
  ax_dist_fini(n);
  ax_node_destroy(n);
}

/* RRef records and contexts of node `to` (this node when to == NULL). */
static inline int dt_counts(ax_node *n, const char *to, int64_t *owned,
                            int64_t *users, int64_t *ctxs) {
  if (!to) {
    long o, u;
    AX_TRY(ax_rref_live(n, &o, &u));
    *owned = o;
    *users = u;
    *ctxs = ax_dist_live_contexts(n);
    return AX_OK;
  }
  ax_values *r = NULL;
  ax_call_opts co = {.timeout_ms = 5000};
  AX_TRY(ax_rpc_sync(n, to, "ax.rref.live", NULL, &co, &r));
  ax_values_get_i64(r, 0, owned);
  ax_values_get_i64(r, 1, users);
  ax_values_free(r);
  AX_TRY(ax_rpc_sync(n, to, "ax.dist.live", NULL, &co, &r));
  ax_values_get_i64(r, 0, ctxs);
  ax_values_free(r);
  return AX_OK;
}

/* Waits (up to 10 s) until node `to` has the given numbers of owned
 * records, user records and contexts (-1: any). */
static inline int dt_wait_counts(ax_node *n, const char *to, int64_t owned,
                                 int64_t users, int64_t ctxs) {
  int64_t end = rt_now_ms() + 10000, o = -1, u = -1, c = -1;
  while (rt_now_ms() < end) {
    AX_TRY(dt_counts(n, to, &o, &u, &c));
    if ((owned < 0 || o == owned) && (users < 0 || u == users) &&
        (ctxs < 0 || c == ctxs))
      return AX_OK;
    rt_sleep_ms(20);
  }
  char buf[2048] = "";
  if (!to) {
    ax_rref_debug_list(n, buf, sizeof buf);
  } else {
    ax_values *r = NULL;
    const char *s = NULL;
    ax_call_opts co = {.timeout_ms = 5000};
    if (ax_rpc_sync(n, to, "ax.rref.list", NULL, &co, &r) == AX_OK &&
        ax_values_get_str(r, 0, &s) == AX_OK)
      snprintf(buf, sizeof buf, "%s", s);
    ax_values_free(r);
  }
  return ax_seterr(AX_ESTATE, "%s: %lld owned, %lld users, %lld contexts "
                   "(want %lld/%lld/%lld)\n%s", to ? to : "local",
                   (long long)o, (long long)u, (long long)c, (long long)owned,
                   (long long)users, (long long)ctxs, buf);
}

/* Zero RRefs, contexts, calls and futures on every listed node and here. */
static inline int dt_all_zero(ax_node *n, const char *const *names, int k) {
  for (int i = 0; i < k; i++) {
    AX_TRY(dt_wait_counts(n, names[i], 0, 0, 0));
    AX_TRY(rt_remote_zero(n, names[i]));
  }
  AX_TRY(dt_wait_counts(n, NULL, 0, 0, 0));
  return rt_local_zero();
}

/* Waits (up to 10 s) until every listed agent knows the whole membership
 * (the master's join returns before the others have received it). */
static inline int dt_wait_world(ax_node *n, const char *const *names, int k) {
  int64_t end = rt_now_ms() + 10000;
  for (int i = 0; i < k; i++) {
    int64_t w = 0;
    while (w != ax_node_world_size(n)) {
      if (rt_now_ms() > end)
        return ax_seterr(AX_ETIMEOUT, "%s does not know the membership",
                         names[i]);
      ax_values *r = NULL;
      ax_call_opts co = {.timeout_ms = 5000};
      AX_TRY(ax_rpc_sync(n, names[i], "ax.rref.live", NULL, &co, &r));
      ax_values_get_i64(r, 2, &w);
      ax_values_free(r);
      if (w != ax_node_world_size(n))
        rt_sleep_ms(20);
    }
  }
  return AX_OK;
}

/* One-line argument lists. */
static inline ax_values *dt_i64s(int k, const int64_t *v) {
  ax_values *a = ax_values_new();
  for (int i = 0; i < k; i++)
    ax_values_add_i64(a, v[i]);
  return a;
}

#endif
