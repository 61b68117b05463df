/* Peers: the table of nodes this one talks to, the route a message takes
 * to a peer, and liveness (heartbeats, connect timeouts, call deadlines). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rpc/node-impl.h"

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
  axi_stream *out = p->out, *in = p->in;
  p->out = p->in = NULL;
  pthread_mutex_unlock(&p->mu);
  axi_stream_cancel(out);
  axi_stream_cancel(in);
  axi_stream_release(out);
  axi_stream_release(in);
  pthread_rwlock_rdlock(&n->bulk_lk);
  if (n->bulk)
    n->bulk_ops->drop_peer(n->bulk, p);
  pthread_rwlock_unlock(&n->bulk_lk);
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

int axi_peer_send(axi_peer *p, const axi_msg *m, axi_stream *via) {
  ax_node *n = p->node;
  pthread_mutex_lock(&p->mu);
  if (p->state == AXI_PEER_DOWN) {
    pthread_mutex_unlock(&p->mu);
    return ax_seterr(AX_EPEERDOWN, "%s: peer is down", AXI_PNAME(p));
  }
  if (!p->out) {
    int rc = axi_stream_open(n, p, &p->out);
    if (rc != AX_OK) {
      pthread_mutex_unlock(&p->mu);
      return rc;
    }
    p->state = AXI_PEER_CONNECTING;
    p->connect_ms = p->last_ping_ms = axi_now_ms();
  }
  /* Calls and replies take the TCP channel when it is known: always by
   * default, or from bulk_threshold tensor bytes with small_over_grpc. */
  /* Held until the frame is queued, so that the channel cannot stop
   * under us (ax_node_shutdown takes it exclusively). */
  pthread_rwlock_rdlock(&n->bulk_lk);
  /* A small reply to a call that came over a stream goes back on it: it
   * then stays ahead of that stream's end (a join refused at shutdown). */
  int small = ax_values_tensor_bytes(m->values) < n->o.bulk_threshold;
  int bulk = n->bulk && p->bulk_addr && (!n->o.small_over_grpc || !small) &&
             !(small && m->kind == AXI_RESPONSE && axi_stream_alive(via));
  axi_stream *s = NULL;
  if (!bulk) {
    pthread_rwlock_unlock(&n->bulk_lk);
    s = axi_stream_alive(via) ? via : axi_stream_alive(p->in) && m->kind == AXI_RESPONSE ? p->in : p->out;
    axi_stream_retain(s);
  }
  pthread_mutex_unlock(&p->mu);
  uint8_t *buf;
  size_t len, blob;
  int rc;
  if (bulk) {
    rc = axi_frame_encode(m, 4, 0, &buf, &len, &blob);
    ax_values *vals = NULL;
    if (rc == AX_OK && !(vals = ax_values_clone(m->values))) {
      free(buf);
      rc = ax_seterr(AX_ENOMEM, "send: no memory");
    }
    if (rc == AX_OK) {
      uint32_t magic = AXI_BULK_MAGIC;
      memcpy(buf, &magic, 4);
      __atomic_add_fetch(&n->bytes_out, len + blob, __ATOMIC_RELAXED);
      rc = n->bulk_ops->send(n->bulk, p, buf, len, vals);
    }
    pthread_rwlock_unlock(&n->bulk_lk);
    return rc;
  }
  rc = axi_frame_encode(m, 4, 1, &buf, &len, &blob);
  if (rc == AX_OK)
    rc = axi_stream_send(s, buf, len);
  axi_stream_release(s);
  if (rc == AX_ECLOSED)
    rc = ax_seterr(AX_EPEERDOWN, "%s: stream closed", AXI_PNAME(p));
  return rc;
}

/* Heartbeats, connect timeouts and call deadlines, every 20 ms. */
void *axi_timer_main(void *arg) {
  ax_node *n = arg;
  pthread_mutex_lock(&n->mu);
  while (!n->timer_stop) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 20 * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&n->cv, &n->mu, &ts);
    if (n->timer_stop)
      break;
    axi_peer *peers = n->peers;
    pthread_mutex_unlock(&n->mu);
    int64_t now = axi_now_ms();
    axi_calls_expire(n, now);
    axi_leave_tick(n, now);
    for (axi_peer *p = peers; p; p = p->next) {
      const char *why = NULL;
      axi_stream *ping = NULL;
      pthread_mutex_lock(&p->mu);
      int64_t last = __atomic_load_n(&p->last_recv_ms, __ATOMIC_RELAXED);
      int64_t conn_to = n->o.peer_timeout_ms > 5000 ? n->o.peer_timeout_ms : 5000;
      if (p->state == AXI_PEER_UP && now - last > n->o.peer_timeout_ms)
        why = "heartbeats missed";
      else if (p->state == AXI_PEER_CONNECTING && now - p->connect_ms > conn_to)
        why = "connect timed out";
      else if (p->state == AXI_PEER_UP && now - p->last_ping_ms >= n->o.heartbeat_ms) {
        p->last_ping_ms = now;
        ping = p->out;
        axi_stream_retain(ping);
      }
      axi_stream *cur = p->out;
      pthread_mutex_unlock(&p->mu);
      if (why)
        axi_peer_down(p, cur, why);
      if (ping) {
        axi_msg m = {.kind = AXI_PING};
        uint8_t *buf;
        size_t len, bl;
        if (axi_frame_encode(&m, 4, 1, &buf, &len, &bl) == AX_OK)
          axi_stream_send(ping, buf, len);
        axi_stream_release(ping);
      }
    }
    pthread_mutex_lock(&n->mu);
  }
  pthread_mutex_unlock(&n->mu);
  return NULL;
}
