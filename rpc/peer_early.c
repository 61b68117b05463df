/* Messages to a peer whose address this node does not know yet.
 *
 * A node dials only the addresses of the membership its master hands out
 * (docs/SECURITY.md, "Addresses"); a hello's addresses are never used. A
 * node that has not applied the membership yet may still have to send to a
 * member it heard from (a reply over the data channel, an RRef protocol
 * message): such messages wait here, in order, and leave when the
 * membership gives the peer's address (axi_peer_early_flush). While a
 * peer's queue is not empty, or being flushed, every later message to it
 * joins the queue, so nothing overtakes what waits. The queue is bounded
 * (AXI_EARLY_MAX messages, ax_node_opts.max_inflight_bytes of tensors) and
 * a message waits at most ax_node_opts.timeout_ms (a tick hook of the
 * node's timer takes what waited longer: axi_peer_early_expire); a
 * request's deadline counts the wait. Every message to a peer passes
 * here (axi_peer_send): it waits, or goes on to axi_peer_route. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/node-impl.h"

#define AXI_EARLY_MAX 256

struct axi_early {
  axi_msg m; /* owned copy: strings below, cloned values */
  int64_t queued_ms;
  size_t bytes;
  struct axi_early *next;
};

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static void early_free(axi_early *e) {
  if (!e)
    return;
  free((char *)e->m.fn);
  free((char *)e->m.errmsg);
  free((char *)e->m.node);
  free((char *)e->m.addr);
  free((char *)e->m.bulk_addr);
  free((uint8_t *)e->m.auth);
  for (int i = 0; i < e->m.nmeta; i++)
    free((char *)e->m.meta_key[i]);
  ax_values_free(e->m.values);
  free(e);
}

/* A copy of m that owns everything it points to; NULL on no memory. */
static axi_early *early_new(const axi_msg *m) {
  axi_early *e = calloc(1, sizeof *e);
  if (!e)
    return NULL;
  e->m = *m;
  e->m.pb_ = NULL;
  e->m.fn = dup_or_null(m->fn);
  e->m.errmsg = dup_or_null(m->errmsg);
  e->m.node = dup_or_null(m->node);
  e->m.addr = dup_or_null(m->addr);
  e->m.bulk_addr = dup_or_null(m->bulk_addr);
  e->m.auth = NULL;
  if (m->auth_len && (e->m.auth = malloc(m->auth_len)))
    memcpy((uint8_t *)e->m.auth, m->auth, m->auth_len);
  for (int i = 0; i < m->nmeta; i++)
    e->m.meta_key[i] = dup_or_null(m->meta_key[i]);
  e->m.values = m->values ? ax_values_clone(m->values) : NULL;
  int ok = (!m->fn || e->m.fn) && (!m->errmsg || e->m.errmsg) &&
           (!m->node || e->m.node) && (!m->addr || e->m.addr) &&
           (!m->bulk_addr || e->m.bulk_addr) && (!m->auth_len || e->m.auth) &&
           (!m->values || e->m.values);
  for (int i = 0; i < m->nmeta; i++)
    ok &= !m->meta_key[i] || e->m.meta_key[i] != NULL;
  if (!ok) {
    early_free(e);
    return NULL;
  }
  e->bytes = ax_values_tensor_bytes(m->values);
  e->queued_ms = ax_clock_ms();
  return e;
}

int axi_peer_early_wanted_locked(const axi_peer *p, const axi_msg *m,
                                 axi_stream *via) {
  ax_node *n = p->node;
  if (p->early || p->early_flushing)
    return 1; /* nothing overtakes what waits */
  if (p->addr || __atomic_load_n(&n->joined, __ATOMIC_ACQUIRE))
    return 0;
  /* answered on the connection the request came on */
  return !axi_peer_way_back_locked(p, m, via);
}

int axi_peer_early_queue_locked(axi_peer *p, const axi_msg *m) {
  ax_node *n = p->node;
  size_t bytes = ax_values_tensor_bytes(m->values);
  if (p->early_count >= AXI_EARLY_MAX ||
      p->early_bytes + bytes > n->o.max_inflight_bytes)
    return ax_seterr(AX_ETOOBIG,
                     "%s: %d messages (%zu tensor bytes) already wait for "
                     "its address from the membership",
                     AXI_PNAME(p), p->early_count, p->early_bytes);
  axi_early *e = early_new(m);
  if (!e)
    return ax_seterr(AX_ENOMEM, "%s: no memory to queue a message",
                     AXI_PNAME(p));
  axi_early **t = &p->early;
  while (*t)
    t = &(*t)->next;
  *t = e;
  p->early_count++;
  p->early_bytes += e->bytes;
  return AX_OK;
}

int axi_peer_send(axi_peer *p, const axi_msg *m, axi_stream *via) {
  pthread_mutex_lock(&p->mu);
  if (p->state != AXI_PEER_DOWN && axi_peer_early_wanted_locked(p, m, via)) {
    int rc = axi_peer_early_queue_locked(p, m);
    pthread_mutex_unlock(&p->mu);
    return rc;
  }
  pthread_mutex_unlock(&p->mu);
  return axi_peer_route(p, m, via);
}

/* Takes the head of p's queue (p->mu held). */
static axi_early *pop_locked(axi_peer *p) {
  axi_early *e = p->early;
  if (e) {
    p->early = e->next;
    p->early_count--;
    p->early_bytes -= e->bytes;
  }
  return e;
}

void axi_peer_early_flush(axi_peer *p) {
  pthread_mutex_lock(&p->mu);
  if (p->early_flushing || !p->early || !p->addr) {
    pthread_mutex_unlock(&p->mu);
    return;
  }
  /* The flag stays set until the queue is seen empty under p->mu, so a
   * message queued meanwhile is sent by this loop, in order. */
  p->early_flushing = 1;
  for (;;) {
    axi_early *e = pop_locked(p);
    if (!e) {
      p->early_flushing = 0;
      break;
    }
    pthread_mutex_unlock(&p->mu);
    if (e->m.kind == AXI_REQUEST && e->m.timeout_ms > 0) {
      int64_t left = e->m.timeout_ms - (ax_clock_ms() - e->queued_ms);
      e->m.timeout_ms = left > 1 ? left : 1;
    }
    if (axi_peer_route(p, &e->m, NULL) != AX_OK)
      fprintf(stderr,
              "axon: %s: a message that waited for %s's address "
              "was not sent: %s\n",
              p->node->name, AXI_PNAME(p), ax_errmsg());
    early_free(e);
    pthread_mutex_lock(&p->mu);
  }
  pthread_mutex_unlock(&p->mu);
}

/* Takes what waited longer than ax_node_opts.timeout_ms off p's queue
 * (p->mu held). */
static axi_early *take_expired_locked(axi_peer *p, int64_t now) {
  axi_early *gone = NULL;
  while (!p->early_flushing && p->early &&
         now - p->early->queued_ms > p->node->o.timeout_ms) {
    axi_early *e = pop_locked(p);
    e->next = gone;
    gone = e;
  }
  return gone;
}

/* Drops what take_expired_locked took, logged (without p->mu). */
static void drop(axi_peer *p, axi_early *gone) {
  int k = 0;
  for (axi_early *nx; gone; gone = nx, k++) {
    nx = gone->next;
    early_free(gone);
  }
  if (k)
    fprintf(stderr,
            "axon: %s: dropped %d message(s) to %s: its address "
            "did not come with a membership within %lld ms\n",
            p->node->name, k, AXI_PNAME(p), (long long)p->node->o.timeout_ms);
}

void axi_peer_early_expire(ax_node *n, int64_t now, void *arg) {
  pthread_mutex_lock(&n->mu);
  axi_peer *peers = n->peers; /* peers are only ever prepended */
  pthread_mutex_unlock(&n->mu);
  for (axi_peer *p = peers; p; p = p->next) {
    pthread_mutex_lock(&p->mu);
    axi_early *expired = take_expired_locked(p, now);
    pthread_mutex_unlock(&p->mu);
    drop(p, expired);
  }
}

void axi_peer_early_free(axi_peer *p) {
  for (axi_early *e = p->early, *nx; e; e = nx) {
    nx = e->next;
    early_free(e);
  }
  p->early = NULL;
  p->early_count = 0;
  p->early_bytes = 0;
}
