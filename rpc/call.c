/* Calls: the function registry, incoming calls and the worker pool that
 * runs handlers (outgoing calls wait in rpc/pcall.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/node-impl.h"

const double ax_lat_bounds_s[AX_LAT_BUCKETS] = {
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3,
    10e-3, 25e-3,  50e-3,  0.1,    0.25, 1.0,    1e300};

/* ---- registry ---------------------------------------------------------- */
int axi_register(ax_node *n, const char *fn, ax_rpc_handler h, void *user) {
  return axi_register_ex(n, fn, h, user, 0);
}

int axi_register_ex(ax_node *n, const char *fn, ax_rpc_handler h, void *user,
                    int inline_) {
  if (!n || !fn || !*fn || !h)
    return ax_seterr(AX_EINVAL, "register: bad arguments");
  axi_fn *f = calloc(1, sizeof *f);
  if (!f || !(f->name = strdup(fn))) {
    free(f);
    return ax_seterr(AX_ENOMEM, "register: no memory");
  }
  f->h = h;
  f->user = user;
  f->inline_ = inline_;
  pthread_mutex_lock(&n->mu);
  for (axi_fn *g = n->fns; g; g = g->next)
    if (!strcmp(g->name, fn)) {
      pthread_mutex_unlock(&n->mu);
      free(f->name);
      free(f);
      return ax_seterr(AX_ESTATE, "register: %s already registered", fn);
    }
  /* Appended, so that ax_node_fn_stats indices stay stable. */
  axi_fn **pp = &n->fns;
  while (*pp)
    pp = &(*pp)->next;
  *pp = f;
  pthread_mutex_unlock(&n->mu);
  return AX_OK;
}

int ax_rpc_register(ax_node *n, const char *fn, ax_rpc_handler h, void *user) {
  if (fn && !strncmp(fn, AXI_BUILTIN_PREFIX, strlen(AXI_BUILTIN_PREFIX)))
    return ax_seterr(AX_EINVAL,
                     "register: names starting with " AXI_BUILTIN_PREFIX
                     " are reserved");
  return axi_register(n, fn, h, user);
}

int ax_rpc_register_inline(ax_node *n, const char *fn, ax_rpc_handler h,
                           void *user) {
  if (fn && !strncmp(fn, AXI_BUILTIN_PREFIX, strlen(AXI_BUILTIN_PREFIX)))
    return ax_seterr(AX_EINVAL,
                     "register: names starting with " AXI_BUILTIN_PREFIX
                     " are reserved");
  return axi_register_ex(n, fn, h, user, 1);
}

static axi_fn *fn_find(ax_node *n, const char *fn) {
  pthread_mutex_lock(&n->mu);
  axi_fn *f = n->fns;
  while (f && strcmp(f->name, fn))
    f = f->next;
  pthread_mutex_unlock(&n->mu);
  return f;
}

void axi_limit_log(ax_node *n, const char *peer, const char *what,
                   int closing) {
  uint64_t k = __atomic_add_fetch(&n->limit_drops, 1, __ATOMIC_RELAXED);
  if (k <= 20 || k % 1000 == 0)
    fprintf(stderr, "axon: %s: %s from %s: %s\n", n->name,
            closing ? "closing the connection" : "refused a frame", peer, what);
}

/* ---- incoming calls ---------------------------------------------------- */
static __thread ax_call_ctx *t_cur;

ax_call_ctx *axi_call_current(void) { return t_cur; }

static void ctx_free(ax_call_ctx *c) {
  ax_node *n = c->node;
  if (c->stream)
    n->ctl->ops->ref(c->stream, -1);
  axi_msg_clear(&c->msg);
  ax_future_release(c->deferred);
  for (int i = 0; i < AXI_MAX_META; i++)
    free(c->lmeta[i]);
  free(c->behalf);
  free(c);
  __atomic_sub_fetch(&n->incalls, 1, __ATOMIC_RELAXED);
  axi_live_calls_add(-1);
}

static void record(axi_fn *f, int err, int64_t t0_us) {
  if (!f)
    return;
  int64_t us = ax_clock_us() - t0_us;
  double s = us * 1e-6;
  int b = 0;
  while (b < AX_LAT_BUCKETS - 1 && s > ax_lat_bounds_s[b])
    b++;
  __atomic_add_fetch(&f->calls, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&f->lat_count[b], 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&f->lat_sum_us, (uint64_t)us, __ATOMIC_RELAXED);
  if (err)
    __atomic_add_fetch(&f->errors, 1, __ATOMIC_RELAXED);
}

/* Answers c (vals taken) and frees it. */
static void reply(ax_call_ctx *c, int err, ax_values *vals, const char *msg) {
  ax_node *n = c->node;
  const char *fname = c->fn ? c->fn->name : (c->msg.fn ? c->msg.fn : "?");
  char *full = NULL;
  if (err != AX_OK) {
    __atomic_add_fetch(&n->errors_in, 1, __ATOMIC_RELAXED);
    size_t len = strlen(n->name) + strlen(fname) + (msg ? strlen(msg) : 0) + 64;
    if ((full = malloc(len)))
      snprintf(full, len, "%s: %s: %s", n->name, fname,
               msg && *msg ? msg : ax_strerror(err));
    ax_values_free(vals);
    vals = NULL;
  }
  record(c->fn, err, c->t0_us);
  if (c->local_id) {
    axi_pcall_complete(n, NULL, c->local_id, err, vals, full);
    vals = NULL;
  } else if (c->peer) {
    axi_msg m = {.kind = AXI_RESPONSE,
                 .call_id = c->msg.call_id,
                 .values = vals,
                 .err = err,
                 .errmsg = full,
                 .node = n->name};
    int rc = axi_peer_send(c->peer, &m, c->stream);
    if (rc == AX_ETOOBIG || rc == AX_ENOMEM) { /* tell the caller why */
      axi_msg e = {.kind = AXI_RESPONSE,
                   .call_id = c->msg.call_id,
                   .err = rc,
                   .errmsg = "reply could not be sent",
                   .node = n->name};
      axi_peer_send(c->peer, &e, c->stream);
    }
    ax_values_free(vals);
  } else {
    ax_values_free(vals);
  }
  free(full);
  ctx_free(c);
}

static void deferred_done(ax_future *f, void *user) {
  ax_call_ctx *c = user;
  int err = ax_future_err(f);
  reply(c, err, err == AX_OK ? ax_values_clone(ax_future_values(f)) : NULL,
        ax_future_errmsg(f));
}

void axi_call_run(ax_call_ctx *c) {
  ax_node *n = c->node;
  if (n->closing) {
    reply(c, AX_ECLOSED, NULL, "node is shutting down");
    return;
  }
  if (c->deadline_ms && ax_clock_ms() > c->deadline_ms) {
    reply(c, AX_ETIMEOUT, NULL, "deadline passed before the handler ran");
    return;
  }
  ax_values *out = ax_values_new();
  ax_clearerr();
  ax_call_ctx *outer = t_cur; /* an inline handler may run inside another */
  t_cur = c;
  int rc = out ? c->fn->h(c, c->msg.values, out, c->fn->user) : AX_ENOMEM;
  t_cur = outer;
  if (rc != AX_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ax_errmsg());
    ax_values_free(out);
    reply(c, rc, NULL, msg);
  } else if (c->deferred) {
    ax_values_free(out);
    if (ax_future_on_done(c->deferred, deferred_done, c) != AX_OK)
      reply(c, AX_ENOMEM, NULL, "cannot wait for the deferred result");
  } else {
    reply(c, AX_OK, out, NULL);
  }
}

static void *worker_main(void *arg) {
  ax_node *n = arg;
  for (;;) {
    pthread_mutex_lock(&n->mu);
    while (!n->q_head && !n->q_stop) {
      n->idle_workers++;
      pthread_cond_wait(&n->q_cv, &n->mu);
      n->idle_workers--;
    }
    ax_call_ctx *c = n->q_head;
    if (c) {
      n->q_head = c->next;
      n->q_len--;
      if (!n->q_head)
        n->q_tail = &n->q_head;
    }
    pthread_mutex_unlock(&n->mu);
    if (!c)
      return NULL;
    axi_call_run(c);
  }
}

/* Wakes a worker for the queued calls, starting another while more calls
 * wait than workers are idle (n->mu held). An idle agent runs no worker;
 * a busy one up to ax_node_opts.threads. */
static void wake_locked(ax_node *n) {
  if (n->q_len > n->idle_workers && n->nworkers < n->o.threads && !n->q_stop &&
      pthread_create(&n->workers[n->nworkers], NULL, worker_main, n) == 0)
    n->nworkers++;
  pthread_cond_signal(&n->q_cv);
}

void axi_calls_enqueue(ax_node *n, ax_call_ctx *c) {
  c->next = NULL;
  pthread_mutex_lock(&n->mu);
  *n->q_tail = c;
  n->q_tail = &c->next;
  n->q_len++;
  wake_locked(n);
  pthread_mutex_unlock(&n->mu);
}

static ax_call_ctx *ctx_new(ax_node *n) {
  ax_call_ctx *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->node = n;
  c->t0_us = ax_clock_us();
  __atomic_add_fetch(&n->incalls, 1, __ATOMIC_RELAXED);
  axi_live_calls_add(1);
  return c;
}

static void reply_error(ax_node *n, axi_peer *p, axi_stream *s, uint64_t id,
                        const char *fn, int err, const char *msg) {
  char full[512];
  snprintf(full, sizeof full, "%s: %s: %s", n->name, fn ? fn : "?", msg);
  axi_msg m = {.kind = AXI_RESPONSE,
               .call_id = id,
               .err = err,
               .errmsg = full,
               .node = n->name};
  axi_peer_send(p, &m, s);
  __atomic_add_fetch(&n->errors_in, 1, __ATOMIC_RELAXED);
}

static int hold_until_joined(ax_node *n, ax_call_ctx *c);

void axi_on_frame(ax_node *n, axi_peer *p, axi_stream *s, axi_msg *m, int rc) {
  if (rc != AX_OK) {
    __atomic_add_fetch(&n->malformed, 1, __ATOMIC_RELAXED);
    if (m->kind == AXI_REQUEST && m->call_id)
      reply_error(n, p, s, m->call_id, "?", rc, ax_errmsg());
    else if (m->kind == AXI_RESPONSE)
      axi_pcall_complete(n, p, m->call_id, rc, NULL, ax_errmsg());
    axi_msg_clear(m);
    return;
  }
  if (m->kind == AXI_RESPONSE) {
    ax_values *v = m->values;
    m->values = NULL;
    axi_pcall_complete(n, p, m->call_id, m->err, v, m->errmsg);
    axi_msg_clear(m);
    return;
  }
  if (m->kind != AXI_REQUEST) {
    axi_msg_clear(m);
    return;
  }
  __atomic_add_fetch(&n->calls_in, 1, __ATOMIC_RELAXED);
  if ((int64_t)m->depth > n->o.max_call_depth) {
    char why[160];
    snprintf(why, sizeof why,
             "call depth %u over the limit of %d (a call chain to itself?)",
             m->depth, n->o.max_call_depth);
    reply_error(n, p, s, m->call_id, m->fn, AX_EINVAL, why);
    axi_msg_clear(m);
    return;
  }
  axi_fn *f = fn_find(n, m->fn);
  if (!f || n->closing) {
    reply_error(n, p, s, m->call_id, m->fn, f ? AX_ECLOSED : AX_ENOFUNC,
                f ? "node is shutting down" : "unknown function");
    axi_msg_clear(m);
    return;
  }
  ax_call_ctx *c = ctx_new(n);
  if (!c) {
    reply_error(n, p, s, m->call_id, m->fn, AX_ENOMEM, "no memory");
    axi_msg_clear(m);
    return;
  }
  c->peer = p;
  c->stream = s;
  if (s)
    n->ctl->ops->ref(s, 1);
  c->msg = *m;
  memset(m, 0, sizeof *m);
  c->fn = f;
  if (c->msg.timeout_ms > 0)
    c->deadline_ms = axi_add_sat(ax_clock_ms(), c->msg.timeout_ms);
  if (hold_until_joined(n, c))
    return;
  if (f->inline_)
    axi_call_run(c); /* on this transport thread: no hand-off */
  else
    axi_calls_enqueue(n, c);
}

/* Holds c if this node has not joined yet (see node-impl.h): every call
 * but the rendezvous built-ins (AXI_RENDEZVOUS_PREFIX). A built-in's reply that
 * has no way back yet (a call over the data channel from a member whose address
 * only the membership gives) waits for that address (rpc/peer_early.c). */
static int hold_until_joined(ax_node *n, ax_call_ctx *c) {
  if (!strncmp(c->fn->name, AXI_RENDEZVOUS_PREFIX,
               strlen(AXI_RENDEZVOUS_PREFIX)))
    return 0;
  pthread_mutex_lock(&n->mu);
  int hold = !n->joined;
  if (hold) {
    c->next = NULL;
    if (!n->held_tail)
      n->held_tail = &n->held_head;
    *n->held_tail = c;
    n->held_tail = &c->next;
  }
  pthread_mutex_unlock(&n->mu);
  return hold;
}

void axi_calls_joined(ax_node *n) {
  pthread_mutex_lock(&n->mu);
  n->joined = 1;
  if (n->held_head) { /* in arrival order, ahead of nothing newer */
    *n->q_tail = n->held_head;
    n->q_tail = n->held_tail;
    for (ax_call_ctx *c = n->held_head; c; c = c->next)
      n->q_len++;
    n->held_head = NULL;
    n->held_tail = &n->held_head;
    for (int i = 0; i < n->o.threads && n->q_len > n->idle_workers; i++)
      wake_locked(n);
    pthread_cond_broadcast(&n->q_cv);
  }
  pthread_mutex_unlock(&n->mu);
}

int axi_calls_start(ax_node *n) {
  n->q_tail = &n->q_head;
  pthread_cond_init(&n->q_cv, NULL);
  n->workers = calloc(n->o.threads, sizeof(pthread_t));
  if (!n->workers)
    return ax_seterr(AX_ENOMEM, "node: no memory");
  /* Workers start on demand (wake_locked); the first one now, so that a
   * node that cannot start a thread fails here, visibly. */
  if (pthread_create(&n->workers[0], NULL, worker_main, n))
    return ax_seterr(AX_ENOMEM, "node: cannot start worker threads");
  n->nworkers = 1;
  return AX_OK;
}

void axi_calls_stop(ax_node *n) {
  pthread_mutex_lock(&n->mu);
  n->q_stop = 1;
  pthread_cond_broadcast(&n->q_cv);
  pthread_mutex_unlock(&n->mu);
  for (int i = 0; i < n->nworkers; i++) {
    struct timespec ts = ax_clock_after_ms(CLOCK_REALTIME, 5000);
    if (pthread_timedjoin_np(n->workers[i], NULL, &ts) != 0) {
      fprintf(stderr, "axon: %s: a handler did not return; leaking the node\n",
              n->name);
      n->leaked = 1;
    }
  }
  n->nworkers = 0;
  /* Calls still queued are answered: local ones complete their future. */
  pthread_mutex_lock(&n->mu);
  ax_call_ctx *c = n->q_head;
  n->q_head = NULL;
  n->q_tail = &n->q_head;
  n->q_len = 0;
  if (n->held_head) { /* never joined: the held calls too */
    *n->held_tail = c;
    c = n->held_head;
    n->held_head = NULL;
    n->held_tail = &n->held_head;
  }
  pthread_mutex_unlock(&n->mu);
  for (ax_call_ctx *nx; c; c = nx) {
    nx = c->next;
    reply(c, AX_ECLOSED, NULL, "node is shutting down");
  }
  if (!n->leaked) {
    free(n->workers);
    n->workers = NULL;
    pthread_cond_destroy(&n->q_cv);
  }
}
