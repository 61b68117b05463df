/* Peers: the table of nodes this one talks to, the route a message takes
 * to a peer, and liveness (heartbeats and connect timeouts, a tick hook of
 * the node's timer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/node-impl.h"

axi_peer *axi_peer_find(ax_node *n, const char *name) {
  pthread_mutex_lock(&n->mu);
  axi_peer *p = n->peers;
  for (; p; p = p->next)
    if (!strcmp(p->name, name) || (p->alias && !strcmp(p->alias, name)))
      break;
  pthread_mutex_unlock(&n->mu);
  return p;
}

axi_peer *axi_peer_get(ax_node *n, const char *name, const char *addr,
                       const char *bulk_addr) {
  if (!name || !*name)
    return NULL;
  pthread_mutex_lock(&n->mu);
  axi_peer *p = n->peers;
  for (; p; p = p->next)
    if (!strcmp(p->name, name) || (p->alias && !strcmp(p->alias, name)))
      break;
  if (!p && (p = calloc(1, sizeof *p))) {
    p->node = n;
    p->name = strdup(name);
    p->rank = -1;
    pthread_mutex_init(&p->mu, NULL);
    p->next = n->peers;
    n->peers = p;
  }
  pthread_mutex_unlock(&n->mu);
  if (!p)
    return NULL;
  /* Addresses are set once: readers may hold the old pointers. */
  pthread_mutex_lock(&p->mu);
  if (!p->addr && addr && *addr)
    p->addr = strdup(addr);
  if (!p->bulk_addr && bulk_addr && *bulk_addr)
    p->bulk_addr = strdup(bulk_addr);
  pthread_mutex_unlock(&p->mu);
  return p;
}

void axi_peer_down(axi_peer *p, axi_stream *s, const char *why) {
  ax_node *n = p->node;
  pthread_mutex_lock(&p->mu);
  if ((s && p->out != s) || p->state == AXI_PEER_DOWN) {
    pthread_mutex_unlock(&p->mu);
    return;
  }
  p->state = AXI_PEER_DOWN;
  snprintf(p->down_why, sizeof p->down_why, "%s", why);
  pthread_mutex_unlock(&p->mu);
  n->ctl->ops->drop_peer(n->ctl, p);
  pthread_rwlock_rdlock(&n->data_lk);
  if (n->data)
    n->data->ops->drop_peer(n->data, p);
  pthread_rwlock_unlock(&n->data_lk);
  char msg[256];
  snprintf(msg, sizeof msg, "%s: peer down: %s", AXI_PNAME(p), why);
  axi_calls_fail(n, p, AX_EPEERDOWN, msg);
  ax_peer_down_cb cb = n->down_cb;
  if (cb && !n->closing)
    cb(n, AXI_PNAME(p), n->down_user);
}

void axi_peer_reset(axi_peer *p) {
  pthread_mutex_lock(&p->mu);
  if (p->state == AXI_PEER_DOWN)
    p->state = AXI_PEER_IDLE;
  pthread_mutex_unlock(&p->mu);
}

int axi_peer_way_back_locked(const axi_peer *p, const axi_msg *m,
                             axi_stream *via) {
  const axi_transport_ops *ctl = p->node->ctl->ops;
  return ctl->alive(via) || (m->kind == AXI_RESPONSE && ctl->alive(p->in));
}

int axi_peer_route(axi_peer *p, const axi_msg *m, axi_stream *via) {
  ax_node *n = p->node;
  const axi_transport_ops *ctl = n->ctl->ops;
  pthread_mutex_lock(&p->mu);
  if (p->state == AXI_PEER_DOWN) {
    pthread_mutex_unlock(&p->mu);
    return ax_seterr(AX_EPEERDOWN, "%s: peer is down", AXI_PNAME(p));
  }
  /* The control connection carries hellos and heartbeats: it exists
   * whichever way this message goes, once p's address is known (from the
   * membership, or the master's from --master; a hello's addresses are
   * never used). A peer without one is answered on the connection its
   * request came on. */
  if (!p->out && !p->addr && !axi_peer_way_back_locked(p, m, via)) {
    pthread_mutex_unlock(&p->mu);
    return ax_seterr(AX_EPEERDOWN,
                     "%s: not a member of this world (no address from the "
                     "membership) and no connection from it",
                     AXI_PNAME(p));
  }
  if (!p->out && p->addr) {
    int rc = ctl->connect(n->ctl, p);
    if (rc != AX_OK) {
      pthread_mutex_unlock(&p->mu);
      return rc;
    }
    p->state = AXI_PEER_CONNECTING;
    p->connect_ms = p->last_ping_ms = ax_clock_ms();
  }
  int has_data_addr = p->bulk_addr != NULL;
  pthread_mutex_unlock(&p->mu);
  /* Calls and replies take the data transport when it is known: always by
   * default, or from bulk_threshold tensor bytes with small_over_grpc. A
   * small reply to a request that came over a control connection goes back
   * on it: it then stays ahead of that connection's end (a join refused at
   * shutdown). The lock is held until the frame is queued, so that the
   * transport cannot stop under us (ax_node_shutdown takes it
   * exclusively). */
  int small = ax_values_tensor_bytes(m->values) < n->o.bulk_threshold;
  pthread_rwlock_rdlock(&n->data_lk);
  if (n->data && has_data_addr && (!n->o.small_over_grpc || !small) &&
      !(small && m->kind == AXI_RESPONSE && ctl->alive(via)) &&
      !(n->data->ops->would_block && n->data->ops->would_block(n->data, p))) {
    int rc = n->data->ops->send(n->data, p, m, NULL);
    pthread_rwlock_unlock(&n->data_lk);
    return rc;
  }
  pthread_rwlock_unlock(&n->data_lk);
  return ctl->send(n->ctl, p, m, via);
}

void axi_peer_heartbeat(ax_node *n, int64_t now, void *arg) {
  pthread_mutex_lock(&n->mu);
  axi_peer *peers = n->peers; /* peers are only ever prepended */
  pthread_mutex_unlock(&n->mu);
  for (axi_peer *p = peers; p; p = p->next) {
    const char *why = NULL;
    int ping = 0;
    pthread_mutex_lock(&p->mu);
    int64_t last = __atomic_load_n(&p->last_recv_ms, __ATOMIC_RELAXED);
    int64_t conn_to = n->o.peer_timeout_ms > 5000 ? n->o.peer_timeout_ms : 5000;
    if (p->state == AXI_PEER_UP && now - last > n->o.peer_timeout_ms)
      why = "heartbeats missed";
    else if (p->state == AXI_PEER_CONNECTING && now - p->connect_ms > conn_to)
      why = "connect timed out";
    else if (p->state == AXI_PEER_UP &&
             now - p->last_ping_ms >= n->o.heartbeat_ms) {
      p->last_ping_ms = now;
      ping = 1;
    }
    axi_stream *cur = p->out;
    pthread_mutex_unlock(&p->mu);
    if (why)
      axi_peer_down(p, cur, why);
    if (ping) {
      axi_msg m = {.kind = AXI_PING};
      n->ctl->ops->send(n->ctl, p, &m, NULL);
    }
  }
}
