/* Rendezvous, a member's side: joining the master (ax_node_join), and
 * applying the membership it publishes (ranks, names, peer addresses and
 * incarnations). The master's side is rendezvous.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/node-impl.h"

/* Keeps a replaced string until the node is destroyed (readers may hold
 * it); leaks it rather than free it under a reader when out of memory
 * (n->mu held). */
static void retire_locked(ax_node *n, char *old) {
  char **g = realloc(n->retired_names, (n->nretired + 1) * sizeof *g);
  if (g) {
    n->retired_names = g;
    g[n->nretired++] = old;
  }
}

/* Records the incarnation the membership names for p. A member that came
 * back (it rejoined: another incarnation, from the same addresses or new
 * ones): what was pending with the old process fails, its connections go,
 * and the next message dials the addresses given. */
static void readdress(ax_node *n, axi_peer *p, const char *addr,
                      const char *bulk, uint64_t inc) {
  pthread_mutex_lock(&p->mu);
  int moved =
      p->addr && *addr &&
      (strcmp(p->addr, addr) || strcmp(p->bulk_addr ? p->bulk_addr : "", bulk));
  int reborn = p->incarnation && p->incarnation != inc;
  int down = p->state == AXI_PEER_DOWN;
  p->incarnation = inc;
  pthread_mutex_unlock(&p->mu);
  if (!moved && !reborn)
    return;
  /* Down already: its old connections are gone, and one it has now is
   * the new process's (the rejoin's own reply may be on it). */
  if (!down)
    axi_peer_down(p, NULL, "it rejoined as a new process");
  char *a = moved ? strdup(addr) : NULL,
       *b = moved && *bulk ? strdup(bulk) : NULL;
  if (moved && !a) {
    free(b);
    return;
  }
  pthread_mutex_lock(&p->mu);
  char *oa = NULL, *ob = NULL;
  if (moved) { /* else the same addresses: the next message dials them */
    oa = p->addr;
    ob = p->bulk_addr;
    p->addr = a;
    p->bulk_addr = b;
  }
  p->state = AXI_PEER_IDLE;
  pthread_mutex_unlock(&p->mu);
  pthread_mutex_lock(&n->mu);
  if (oa)
    retire_locked(n, oa);
  if (ob)
    retire_locked(n, ob);
  pthread_mutex_unlock(&n->mu);
}

/* Records the membership on this node: ranks, names and peer addresses. */
void axi_rendezvous_apply(ax_node *n, const ax_values *v) {
  int64_t world = 0;
  const char *master_name = NULL;
  size_t count = ax_values_count(v);
  /* The list comes from the network: its shape is checked before use
   * (world in range before 2 + 4 * world, every entry a string but the
   * incarnations). */
  const size_t F = AXI_MEMBER_FIELDS;
  if (ax_values_get_i64(v, 0, &world) != AX_OK ||
      ax_values_get_str(v, 1, &master_name) != AX_OK || world < 0 ||
      (uint64_t)world > (count - 2) / F || count != (size_t)(2 + F * world))
    return;
  for (size_t i = 2; i < count; i++)
    if (ax_values_type(v, i) !=
        ((i - 2) % F == F - 1 ? AX_VAL_I64 : AX_VAL_STR))
      return;
  if (n->master_peer && strcmp(master_name, n->name)) {
    pthread_mutex_lock(&n->mu);
    int exists = 0;
    for (axi_peer *p = n->peers; p; p = p->next)
      exists |= !strcmp(p->name, master_name);
    if (!exists && !n->master_peer->alias)
      n->master_peer->alias = strdup(master_name);
    pthread_mutex_unlock(&n->mu);
  }
  char **names = calloc(world, sizeof(char *));
  if (!names)
    return;
  pthread_mutex_lock(&n->mu);
  if (!n->master_name)
    n->master_name = strdup(master_name);
  pthread_mutex_unlock(&n->mu);
  int mine = -1;
  for (int r = 0; r < world; r++) {
    const char *name, *addr, *bulk;
    int64_t inc = 0;
    ax_values_get_str(v, 2 + F * r, &name);
    ax_values_get_str(v, 3 + F * r, &addr);
    ax_values_get_str(v, 4 + F * r, &bulk);
    ax_values_get_i64(v, 5 + F * r, &inc);
    names[r] = strdup(name);
    if (!strcmp(name, n->name)) {
      mine = r;
    } else if (*name) {
      axi_peer *p = axi_peer_get(n, name, addr, bulk);
      if (p) {
        p->rank = r;
        readdress(n, p, addr, bulk, (uint64_t)inc);
      }
    }
  }
  pthread_mutex_lock(&n->mu);
  char **old = n->member_name;
  int nold = n->nmembers;
  /* Names handed out by ax_node_member stay valid: an unchanged rank keeps
   * its string, a replaced one is retired until the node is destroyed. */
  for (int r = 0; r < nold; r++) {
    if (r < (int)world && old[r] && names[r] && !strcmp(old[r], names[r])) {
      free(names[r]);
      names[r] = old[r];
    } else if (old[r]) {
      retire_locked(n, old[r]);
    }
  }
  n->member_name = names;
  n->nmembers = (int)world;
  n->world_size = (int)world;
  /* The rank last, with the names: a payload checked in the meantime
   * (rref_codec.c's check_names) takes a node with a rank for one that
   * knows its members, and must not find the rank before the names. */
  if (mine >= 0)
    __atomic_store_n(&n->rank, mine, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&n->mu);
  free(old);
  axi_calls_joined(n);
  /* What waited for an address leaves now, in order. */
  pthread_mutex_lock(&n->mu);
  axi_peer *peers = n->peers; /* peers are only ever prepended */
  pthread_mutex_unlock(&n->mu);
  for (axi_peer *p = peers; p; p = p->next)
    axi_peer_early_flush(p);
}

int axi_is_master(ax_node *n) {
  if (!n->master || !strcmp(n->master, n->addr) ||
      !strcmp(n->master, n->listen))
    return 1;
  /* "0.0.0.0:P" listens on every interface, the master's too. */
  const char *mp = strrchr(n->master, ':'), *ap = strrchr(n->addr, ':');
  return mp && ap && !strcmp(mp, ap) &&
         (!strncmp(n->listen, "0.0.0.0:", 8) ||
          !strncmp(n->listen, "[::]:", 5));
}

int ax_node_join(ax_node *n, int64_t timeout_ms) {
  int64_t deadline = axi_add_sat(ax_clock_ms(), timeout_ms);
  ax_values *a = ax_values_new();
  if (!a)
    return AX_ENOMEM;
  ax_values_add_str(a, n->name);
  ax_values_add_i64(a, n->o.rank);
  ax_values_add_str(a, n->addr);
  ax_values_add_str(a, n->bulk_addr);
  ax_values_add_i64(a, n->o.world_size);
  ax_values_add_i64(a, (int64_t)n->incarnation);
  const char *to = n->name;
  if (!axi_is_master(n)) {
    char pname[160];
    snprintf(pname, sizeof pname, "@%s", n->master);
    n->master_peer = axi_peer_get(n, pname, n->master, NULL);
    if (!n->master_peer) {
      ax_values_free(a);
      return AX_ENOMEM;
    }
    to = n->master_peer->name;
  }
  int rc, attempts = 0;
  int64_t t0 = ax_clock_ms(), next_log = t0 + 1000; /* quiet at start-up */
  char last[512] = "";
  for (;;) {
    int64_t left = deadline - ax_clock_ms();
    if (left <= 0) {
      rc = ax_seterr(AX_ETIMEOUT,
                     "join: master %s not complete in %lld ms%s%s%s",
                     n->master ? n->master : n->addr, (long long)timeout_ms,
                     *last ? " (unreachable: " : "", last, *last ? ")" : "");
      break;
    }
    ax_call_opts o = {.timeout_ms = left};
    ax_values *res = NULL;
    rc = ax_rpc_sync(n, to, "axon.rendezvous.join", a, &o, &res);
    if (rc == AX_OK) {
      axi_rendezvous_apply(n, res);
      ax_values_free(res);
      break;
    }
    if (rc != AX_EPEERDOWN || !n->master_peer)
      break;
    /* The master is not listening yet: retry shortly, and say so about
     * once a second. */
    attempts++;
    /* An attempt that found no stream yet quotes why the last one ended
     * (rpc/grpc_transport.c), so the timeout keeps the TLS or token hint
     * (seen in CI: "unreachable: ...: no stream" at the deadline). */
    snprintf(last, sizeof last, "%s", ax_errmsg());
    int64_t now = ax_clock_ms();
    if (now >= next_log) {
      fprintf(stderr,
              "axon: %s: master %s not reachable (attempt %d, %.1f s of "
              "%.1f s): %s; retrying\n",
              n->name, n->master, attempts, (now - t0) / 1000.0,
              timeout_ms / 1000.0, last);
      next_log = now + 1000;
    }
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
    axi_peer_reset(n->master_peer);
  }
  ax_values_free(a);
  return rc;
}
