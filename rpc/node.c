/* Nodes: options, creation, shutdown and destruction. Creating a node
 * starts the rpc subsystem on top of its parts (the pending-call table,
 * credentials, workers, built-ins, transports, the timer and its tick
 * hooks); the parts never call back into this file. The membership
 * accessors are in membership.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/auth-impl.h"
#include "axon/rpc/node-impl.h"
#include "axon/rpc/pool-impl.h"
#include "axon/rpc/tls-impl.h"

static long g_nodes; /* nodes created and not yet destroyed */

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

/* Parses a whole decimal integer in [lo, hi] from the variable `var`. */
static int env_int(const char *var, const char *v, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi)
    return ax_seterr(AX_EINVAL, "%s='%s': expected an integer in [%ld, %ld]",
                     var, v, lo, hi);
  *out = (int)x;
  return AX_OK;
}

int ax_node_opts_from_env(ax_node_opts *o) {
  static char master[256];
  if (!o)
    return ax_seterr(AX_EINVAL,
                     "node options from the environment: NULL options");
  const char *a = getenv("AXON_MASTER_ADDR"), *p = getenv("AXON_MASTER_PORT");
  const char *rv = "SLURM_PROCID", *r = getenv(rv);
  if (!r || !*r)
    r = getenv(rv = "OMPI_COMM_WORLD_RANK");
  int port = 29500, rank = o->rank;
  if (p && *p)
    AX_TRY(env_int("AXON_MASTER_PORT", p, 1, 65535, &port));
  if (a && *a && strlen(a) + 7 > sizeof master)
    return ax_seterr(AX_EINVAL, "AXON_MASTER_ADDR is longer than %zu bytes",
                     sizeof master - 7);
  if (o->rank < 0 && r && *r)
    AX_TRY(env_int(rv, r, 0, (1 << 16) - 1, &rank));
  /* Everything checked: only now is anything changed. */
  if (a && *a) {
    snprintf(master, sizeof master, "%s:%d", a, port);
    o->master = master;
  }
  o->rank = rank;
  return AX_OK;
}

/* The control transport, then the data transport on the same host (any
 * port). Without a data transport (it could not start) every message
 * travels over the control transport. */
static int start_transports(ax_node *n) {
  static const axi_rx rx = {axi_on_frame};
  const axi_transport_ops *ctl =
      axi_transport_find("grpc", AXI_TRANSPORT_CONTROL);
  /* With TLS credentials the data transport is "tls", and only then;
   * without, "shm" (TCP, and shared memory within a host). */
  const char *env = getenv("AXON_DATA_TRANSPORT");
  const char *dname = n->o.data_transport ? n->o.data_transport
                      : env && *env       ? env
                      : n->tls            ? "tls"
                                          : "shm";
  const axi_transport_ops *data = axi_transport_find(dname, AXI_TRANSPORT_DATA);
  if (!data)
    return ax_seterr(AX_EINVAL,
                     "node %s: no data transport named '%s' (known: %s)",
                     n->name, dname, axi_transport_names(AXI_TRANSPORT_DATA));
  if (n->tls != !strcmp(dname, "tls"))
    return ax_seterr(AX_EINVAL, "node %s: data transport '%s' %s", n->name,
                     dname,
                     n->tls ? "would carry data unencrypted under TLS "
                              "(use tls)"
                            : "needs TLS credentials (tls_ca, "
                              "tls_cert, tls_key)");
  AX_TRY(ctl->start(n, n->listen, &rx, &n->ctl, n->addr, sizeof n->addr));
  char listen[160];
  snprintf(listen, sizeof listen, "%s", n->addr);
  char *c = strrchr(listen, ':');
  if (c)
    snprintf(c, sizeof listen - (size_t)(c - listen), ":0");
  if (data->start(n, listen, &rx, &n->data, n->bulk_addr,
                  sizeof n->bulk_addr) != AX_OK) {
    n->data = NULL;
    n->bulk_addr[0] = 0;
  }
  return AX_OK;
}

/* What the timer thread runs every tick, in this order: call deadlines,
 * a pending drain request, messages that waited too long for an address,
 * then heartbeats and connect timeouts. */
static int register_ticks(ax_node *n) {
  AX_TRY(axi_node_on_tick(n, axi_calls_expire, NULL));
  AX_TRY(axi_node_on_tick(n, axi_leave_tick, NULL));
  AX_TRY(axi_node_on_tick(n, axi_peer_early_expire, NULL));
  return axi_node_on_tick(n, axi_peer_heartbeat, NULL);
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
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  n->incarnation = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
  pthread_mutex_init(&n->mu, NULL);
  pthread_cond_init(&n->cv, NULL);
  pthread_rwlock_init(&n->data_lk, NULL);
  /* The pending-call table first: shutting down a node that failed below
   * fails its (no) pending calls. */
  int rc = axi_pcalls_init(n);
  if (rc == AX_OK)
    rc = axi_auth_load(n);
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
    rc = start_transports(n);
  n->o.data_transport = NULL; /* borrowed: read once */
  if (rc == AX_OK)
    rc = register_ticks(n);
  if (rc == AX_OK && pthread_create(&n->timer_thread, NULL, axi_timer_main, n))
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
  int64_t deadline = ax_clock_ms() + (timeout_ms > 0 ? timeout_ms : 0);
  while (__atomic_load_n(&n->incalls, __ATOMIC_RELAXED) > 0 &&
         ax_clock_ms() < deadline) {
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
  int64_t left = deadline - ax_clock_ms();
  axi_calls_stop(n); /* joins the workers (bounded; leaks n on a stuck one) */
  pthread_rwlock_wrlock(&n->data_lk); /* no sender or dropper inside */
  axi_transport *data = n->data;
  n->data = NULL;
  pthread_rwlock_unlock(&n->data_lk);
  if (data) {
    data->ops->stop(data, left > 1000 ? left : 1000);
    data->ops->free(data);
  }
  if (n->ctl) /* its connections are released too */
    n->ctl->ops->stop(n->ctl, left > 1000 ? left : 1000);
  axi_calls_fail(n, NULL, AX_ECLOSED, "node is shutting down");
  n->closed = 1;
  return AX_OK;
}

typedef struct axi_on_destroy {
  void (*fn)(ax_node *n, void *user);
  void *user;
  struct axi_on_destroy *next;
} axi_on_destroy;

int ax_node_on_destroy(ax_node *n, void (*fn)(ax_node *n, void *user),
                       void *user) {
  axi_on_destroy *d = malloc(sizeof *d);
  if (!d)
    return ax_seterr(AX_ENOMEM, "node: no memory");
  d->fn = fn;
  d->user = user;
  pthread_mutex_lock(&n->mu);
  d->next = n->on_destroy;
  n->on_destroy = d;
  pthread_mutex_unlock(&n->mu);
  return AX_OK;
}

/* Frees what a node owns once nothing runs on it any more (see
 * node-impl.h). */
void axi_node_free(ax_node *n) {
  axi_node_ticks_free(n);
  axi_rendezvous_fini(n);
  for (axi_peer *p = n->peers, *nx; p; p = nx) {
    nx = p->next;
    free(p->name);
    free(p->alias);
    free(p->addr);
    free(p->bulk_addr);
    axi_peer_early_free(p);
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
  axi_pcalls_free(n);
  pthread_rwlock_destroy(&n->data_lk);
  free(n);
}

void ax_node_destroy(ax_node *n) {
  if (!n)
    return;
  ax_node_shutdown(n, 1000);
  if (n->leaked)
    return; /* a handler never returned; freeing would crash it */
  for (axi_on_destroy *d = n->on_destroy, *nx; d; d = nx) {
    nx = d->next;
    d->fn(n, d->user);
    free(d);
  }
  n->on_destroy = NULL;
  if (n->ctl)
    n->ctl->ops->free(n->ctl);
  n->ctl = NULL;
  axi_node_free(n);
  /* The last node gone: cached receive buffers are no longer needed. */
  if (__atomic_sub_fetch(&g_nodes, 1, __ATOMIC_RELAXED) == 0)
    axi_pool_trim();
}

void ax_node_on_peer_down(ax_node *n, ax_peer_down_cb cb, void *user) {
  pthread_mutex_lock(&n->mu);
  n->down_user = user;
  n->down_cb = cb;
  pthread_mutex_unlock(&n->mu);
}
