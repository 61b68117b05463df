/* The pending-call table: outgoing calls waiting for their replies (calls
 * to this node included), matched by id and by the peer they went to, and
 * failed or expired together. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/node-impl.h"

#define BUCKETS 4096

struct axi_pcalls {
  pthread_mutex_t mu;
  axi_pcall *calls[BUCKETS]; /* by id */
  long n;
  uint64_t next_id;
};

int axi_pcalls_init(ax_node *n) {
  if (!(n->pcalls = calloc(1, sizeof *n->pcalls)))
    return ax_seterr(AX_ENOMEM, "node: no memory");
  pthread_mutex_init(&n->pcalls->mu, NULL);
  return AX_OK;
}

void axi_pcalls_free(ax_node *n) {
  if (!n->pcalls)
    return;
  pthread_mutex_destroy(&n->pcalls->mu);
  free(n->pcalls);
  n->pcalls = NULL;
}

long axi_pcall_count(ax_node *n) {
  pthread_mutex_lock(&n->pcalls->mu);
  long k = n->pcalls->n;
  pthread_mutex_unlock(&n->pcalls->mu);
  return k;
}

static void pcall_finish(axi_pcall *c, int err, ax_values *vals,
                         const char *msg) {
  ax_future_complete(c->f, err, vals, msg);
  ax_future_release(c->f);
  free(c->fn);
  free(c);
  axi_live_calls_add(-1);
}

axi_pcall *axi_pcall_add(ax_node *n, axi_peer *p, const char *fn, ax_future *f,
                         int64_t deadline_ms) {
  axi_pcall *c = calloc(1, sizeof *c);
  char *fname = strdup(fn);
  if (!c || !fname) {
    free(c);
    free(fname);
    return NULL;
  }
  c->peer = p;
  c->f = ax_future_retain(f); /* the table's reference */
  c->fn = fname;
  c->deadline_ms = deadline_ms;
  axi_live_calls_add(1);
  axi_pcalls *t = n->pcalls;
  pthread_mutex_lock(&t->mu);
  c->id = ++t->next_id;
  c->next = t->calls[c->id % BUCKETS];
  t->calls[c->id % BUCKETS] = c;
  t->n++;
  pthread_mutex_unlock(&t->mu);
  return c;
}

/* The same member: the peer object itself, or the provisional "@HOST:PORT"
 * peer of the master before the membership names it (only joins go there),
 * or a peer under the same (real) name. */
static int same_peer(const axi_peer *want, const axi_peer *from) {
  if (want == from)
    return 1;
  if (!want || !from)
    return 0;
  if (want->name[0] == '@' && !want->alias)
    return 1;
  return !strcmp(AXI_PNAME(want), AXI_PNAME(from));
}

/* Unlinks the call id if it went to p; a reply to a call that went to
 * another peer is counted and logged as forged. */
static axi_pcall *pcall_take(ax_node *n, axi_peer *p, uint64_t id) {
  axi_pcalls *t = n->pcalls;
  pthread_mutex_lock(&t->mu);
  axi_pcall **pp = &t->calls[id % BUCKETS];
  while (*pp && (*pp)->id != id)
    pp = &(*pp)->next;
  axi_pcall *c = *pp;
  const char *want = NULL;
  if (c && !same_peer(c->peer, p)) {
    want = c->peer ? AXI_PNAME(c->peer) : n->name;
    c = NULL;
  } else if (c) {
    *pp = c->next;
    t->n--;
  }
  pthread_mutex_unlock(&t->mu);
  if (want) {
    uint64_t k = __atomic_add_fetch(&n->forged, 1, __ATOMIC_RELAXED);
    if (k <= 10 || k % 1000 == 0)
      fprintf(stderr,
              "axon: %s: dropped a reply to call %llu from %s: the call went "
              "to %s (%llu such replies)\n",
              n->name, (unsigned long long)id, p ? AXI_PNAME(p) : n->name, want,
              (unsigned long long)k);
  }
  return c;
}

int axi_pcall_complete(ax_node *n, axi_peer *p, uint64_t id, int err,
                       ax_values *vals, const char *msg) {
  axi_pcall *c = pcall_take(n, p, id);
  if (!c) {
    ax_values_free(vals); /* late (the call timed out) or forged */
    return 0;
  }
  pcall_finish(c, err, vals, msg);
  return 1;
}

/* Unlinks every call matching (peer p or any; deadline passed or any). */
static axi_pcall *pcall_take_all(ax_node *n, axi_peer *p, int64_t now) {
  axi_pcall *list = NULL;
  axi_pcalls *t = n->pcalls;
  pthread_mutex_lock(&t->mu);
  for (int b = 0; b < BUCKETS && t->n > 0; b++) {
    axi_pcall **pp = &t->calls[b];
    while (*pp) {
      axi_pcall *c = *pp;
      if ((!p || c->peer == p) && (now < 0 || c->deadline_ms <= now)) {
        *pp = c->next;
        t->n--;
        c->next = list;
        list = c;
      } else {
        pp = &c->next;
      }
    }
  }
  pthread_mutex_unlock(&t->mu);
  return list;
}

void axi_calls_fail(ax_node *n, axi_peer *p, int err, const char *why) {
  for (axi_pcall *c = pcall_take_all(n, p, -1), *nx; c; c = nx) {
    nx = c->next;
    pcall_finish(c, err, NULL, why);
  }
}

void axi_calls_expire(ax_node *n, int64_t now_ms, void *arg) {
  for (axi_pcall *c = pcall_take_all(n, NULL, now_ms), *nx; c; c = nx) {
    nx = c->next;
    char msg[256];
    snprintf(msg, sizeof msg, "%s: %s: deadline exceeded",
             c->peer ? AXI_PNAME(c->peer) : n->name, c->fn);
    pcall_finish(c, AX_ETIMEOUT, NULL, msg);
  }
}

void axi_pcall_drop(ax_node *n, axi_pcall *c, uint64_t id) {
  axi_pcalls *t = n->pcalls;
  pthread_mutex_lock(&t->mu); /* c may be gone: compared, not read */
  axi_pcall **pp = &t->calls[id % BUCKETS];
  while (*pp && *pp != c)
    pp = &(*pp)->next;
  int mine = *pp == c;
  if (mine) {
    *pp = c->next;
    t->n--;
  }
  pthread_mutex_unlock(&t->mu);
  if (mine) {
    ax_future_release(c->f);
    free(c->fn);
    free(c);
    axi_live_calls_add(-1);
  }
}
