/* Nodes: creation, peers, sending, liveness and shutdown. */
#include <grpc/grpc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rpc/auth-impl.h"
#include "rpc/node-impl.h"
#include "rpc/pool-impl.h"
#include "rpc/tls-impl.h"

static long g_live_calls;
static long g_nodes; /* nodes created and not yet destroyed */

long ax_rpc_live_calls(void) {
  return __atomic_load_n(&g_live_calls, __ATOMIC_RELAXED);
}
void axi_live_calls_add(long d) {
  __atomic_add_fetch(&g_live_calls, d, __ATOMIC_RELAXED);
}

int64_t axi_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}
int64_t axi_now_ms(void) { return axi_now_us() / 1000; }

void ax_node_opts_init(ax_node_opts *o) {
  memset(o, 0, sizeof *o);
  o->listen = "127.0.0.1:0";
  o->world_size = 1;
  o->rank = -1;
  o->threads = 4;
  o->device = AX_CPU;
  o->timeout_ms = 60000;
  o->heartbeat_ms = 500;
  o->peer_timeout_ms = 4000;
  o->bulk_threshold = 1u << 20;
  o->max_msg_bytes = (size_t)4 << 30;
  o->max_hdr_bytes = AXI_MAX_HDR;
  o->max_values = 65536;
  o->max_inflight_bytes = (size_t)4 << 30;
  o->max_grpc_msg_bytes = (size_t)64 << 20;
  o->max_call_depth = 32;
}

void ax_node_opts_from_env(ax_node_opts *o) {
  static char master[256];
  const char *a = getenv("AXON_MASTER_ADDR"), *p = getenv("AXON_MASTER_PORT");
  if (a && *a) {
    snprintf(master, sizeof master, "%s:%s", a, (p && *p) ? p : "29500");
    o->master = master;
  }
  const char *r = getenv("SLURM_PROCID");
  if (!r || !*r)
    r = getenv("OMPI_COMM_WORLD_RANK");
  if (o->rank < 0 && r && *r)
    o->rank = atoi(r);
}

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
static void *timer_main(void *arg) {
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

int ax_node_create(const ax_node_opts *o, ax_node **out) {
  if (!o || !o->name || !*o->name || strchr(o->name, '@') || !out)
    return ax_seterr(AX_EINVAL, "node: a name (without '@') is required");
  if (ax_device_check(o->device) != AX_OK ||
      ax_device_map_check(&o->device_map) != AX_OK) {
    char msg[400];
    snprintf(msg, sizeof msg, "%s", ax_errmsg());
    return ax_seterr(AX_ENODEV, "node %s: %s", o->name, msg);
  }
  ax_node *n = calloc(1, sizeof *n);
  if (!n)
    return ax_seterr(AX_ENOMEM, "node: no memory");
  grpc_init();
  __atomic_add_fetch(&g_nodes, 1, __ATOMIC_RELAXED);
  n->o = *o;
  if (n->o.threads < 1)
    n->o.threads = 1;
  /* Limits left at zero (options not from ax_node_opts_init) get defaults. */
  ax_node_opts d;
  ax_node_opts_init(&d);
  if (!n->o.max_msg_bytes)
    n->o.max_msg_bytes = d.max_msg_bytes;
  if (!n->o.max_hdr_bytes)
    n->o.max_hdr_bytes = d.max_hdr_bytes;
  if (!n->o.max_values)
    n->o.max_values = d.max_values;
  if (!n->o.max_inflight_bytes)
    n->o.max_inflight_bytes = d.max_inflight_bytes;
  if (!n->o.max_grpc_msg_bytes)
    n->o.max_grpc_msg_bytes = d.max_grpc_msg_bytes;
  if (n->o.max_call_depth <= 0)
    n->o.max_call_depth = d.max_call_depth;
  if (n->o.timeout_ms <= 0)
    n->o.timeout_ms = d.timeout_ms;
  n->name = strdup(o->name);
  n->listen = strdup(o->listen ? o->listen : "127.0.0.1:0");
  n->master = o->master ? strdup(o->master) : NULL;
  n->o.name = n->name;
  n->o.listen = n->listen;
  n->o.master = n->master;
  n->rank = -1;
  pthread_mutex_init(&n->mu, NULL);
  pthread_cond_init(&n->cv, NULL);
  pthread_mutex_init(&n->calls_mu, NULL);
  pthread_rwlock_init(&n->bulk_lk, NULL);
  int rc = axi_auth_load(n);
  if (rc == AX_OK)
    rc = axi_tls_load(n);
  if (rc == AX_OK)
    rc = axi_tls_listen_check(n);
  /* borrowed: read once */
  n->o.token_file = n->o.tls_ca = n->o.tls_cert = n->o.tls_key = NULL;
  if (rc == AX_OK)
    rc = axi_calls_start(n);
  if (rc == AX_OK) /* the built-ins exist before anyone can reach us */
    rc = axi_rendezvous_init(n);
  if (rc == AX_OK)
    rc = axi_leave_init(n);
  if (rc == AX_OK)
    rc = axi_grpc_start(n, n->listen, n->addr, sizeof n->addr);
  if (rc == AX_OK) {
    char host[128];
    snprintf(host, sizeof host, "%s", n->addr);
    char *c = strrchr(host, ':');
    if (c)
      *c = 0;
    n->bulk_ops = n->tls ? &axi_bulk_tls_ops : &axi_bulk_tcp_ops;
    if (n->bulk_ops->start(n, host, &n->bulk, n->bulk_addr,
                           sizeof n->bulk_addr) != AX_OK) {
      n->bulk = NULL; /* large tensors then travel inline */
      n->bulk_addr[0] = 0;
    }
  }
  if (rc == AX_OK && pthread_create(&n->timer_thread, NULL, timer_main, n))
    rc = ax_seterr(AX_ENOMEM, "node: cannot start the timer thread");
  if (rc != AX_OK) {
    n->timer_stop = 1;
    ax_node_destroy(n);
    return rc;
  }
  *out = n;
  return AX_OK;
}

int ax_node_shutdown(ax_node *n, int64_t timeout_ms) {
  if (!n)
    return AX_OK;
  pthread_mutex_lock(&n->mu);
  int already = n->closing;
  n->closing = 1;
  pthread_mutex_unlock(&n->mu);
  if (already)
    return AX_OK;
  axi_rendezvous_close(n); /* joins still waiting for the world fail now */
  int64_t deadline = axi_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
  while (__atomic_load_n(&n->incalls, __ATOMIC_RELAXED) > 0 &&
         axi_now_ms() < deadline) {
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  if (n->timer_thread) {
    pthread_mutex_lock(&n->mu);
    n->timer_stop = 1;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    pthread_join(n->timer_thread, NULL);
    n->timer_thread = 0;
  }
  axi_leave_close(n);
  axi_calls_fail(n, NULL, AX_ECLOSED, "node is shutting down");
  int64_t left = deadline - axi_now_ms();
  axi_calls_stop(n); /* joins the workers (bounded; leaks n on a stuck one) */
  pthread_rwlock_wrlock(&n->bulk_lk); /* no sender or dropper inside */
  axi_bulk *b = n->bulk;
  n->bulk = NULL;
  pthread_rwlock_unlock(&n->bulk_lk);
  if (b)
    n->bulk_ops->stop(b);
  axi_grpc_stop(n, left > 1000 ? left : 1000);
  for (axi_peer *p = n->peers; p; p = p->next) {
    pthread_mutex_lock(&p->mu);
    axi_stream *a = p->out, *b = p->in;
    p->out = p->in = NULL;
    pthread_mutex_unlock(&p->mu);
    axi_stream_release(a);
    axi_stream_release(b);
  }
  axi_calls_fail(n, NULL, AX_ECLOSED, "node is shutting down");
  n->closed = 1;
  return AX_OK;
}

void ax_node_destroy(ax_node *n) {
  if (!n)
    return;
  ax_node_shutdown(n, 1000);
  if (n->leaked)
    return; /* a handler never returned; freeing would crash it */
  axi_grpc_free(n);
  axi_rendezvous_fini(n);
  for (axi_peer *p = n->peers, *nx; p; p = nx) {
    nx = p->next;
    free(p->name);
    free(p->alias);
    free(p->addr);
    free(p->bulk_addr);
    pthread_mutex_destroy(&p->mu);
    free(p);
  }
  for (axi_fn *f = n->fns, *nx; f; f = nx) {
    nx = f->next;
    free(f->name);
    free(f);
  }
  for (int i = 0; i < n->nmembers; i++)
    free(n->member_name[i]);
  free(n->member_name);
  for (int i = 0; i < n->nretired; i++)
    free(n->retired_names[i]);
  free(n->retired_names);
  free(n->master_name);
  free(n->name);
  free(n->listen);
  free(n->master);
  memset(n->token, 0, sizeof n->token);
  axi_tls_free(n);
  pthread_mutex_destroy(&n->mu);
  pthread_cond_destroy(&n->cv);
  pthread_mutex_destroy(&n->calls_mu);
  pthread_rwlock_destroy(&n->bulk_lk);
  free(n);
  grpc_shutdown();
  /* The last node gone: cached receive buffers are no longer needed. */
  if (__atomic_sub_fetch(&g_nodes, 1, __ATOMIC_RELAXED) == 0)
    axi_pool_trim();
}

const char *ax_node_name(const ax_node *n) { return n->name; }
int ax_node_rank(const ax_node *n) { return n->rank; }
int ax_node_world_size(const ax_node *n) { return n->world_size; }
const char *ax_node_address(const ax_node *n) { return n->addr; }

int ax_node_member(const ax_node *n, int rank, const char **name) {
  ax_node *m = (ax_node *)n; /* the lock only */
  pthread_mutex_lock(&m->mu);
  const char *s = rank >= 0 && rank < n->nmembers ? n->member_name[rank] : NULL;
  pthread_mutex_unlock(&m->mu);
  if (!s)
    return ax_seterr(AX_ENOTFOUND, "node: no member with rank %d", rank);
  *name = s;
  return AX_OK;
}

int ax_node_rank_of(const ax_node *n, const char *name, int *rank) {
  ax_node *m = (ax_node *)n; /* the lock only */
  int found = -1;
  pthread_mutex_lock(&m->mu);
  for (int i = 0; i < n->nmembers && found < 0; i++)
    if (n->member_name[i] && !strcmp(n->member_name[i], name))
      found = i;
  pthread_mutex_unlock(&m->mu);
  if (found < 0)
    return ax_seterr(AX_ENOTFOUND, "node: no member named %s", name);
  *rank = found;
  return AX_OK;
}

const char *ax_node_master_name(const ax_node *n) { return n->master_name; }

int ax_node_peer_is_down(ax_node *n, const char *name) {
  axi_peer *p = axi_peer_find(n, name);
  return p && __atomic_load_n(&p->state, __ATOMIC_RELAXED) == AXI_PEER_DOWN;
}

void ax_node_on_peer_down(ax_node *n, ax_peer_down_cb cb, void *user) {
  pthread_mutex_lock(&n->mu);
  n->down_user = user;
  n->down_cb = cb;
  pthread_mutex_unlock(&n->mu);
}
