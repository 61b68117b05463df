/* The public call API: ax_rpc_async/sync, handler context accessors and
 * node statistics. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/future-impl.h"
#include "axon/rpc/node-impl.h"

static int local_call(ax_node *n, const char *fn, const ax_values *args,
                      const ax_call_opts *o, int64_t timeout, uint32_t depth,
                      ax_future **out);

/* The call's time and depth: an explicit timeout, or the node default
 * capped by what is left of the call this thread's handler serves (a
 * nested call inherits its caller's deadline); its depth is one more than
 * that call's. An exhausted remaining time is AX_ETIMEOUT. */
static int call_budget(ax_node *n, const char *to, const char *fn,
                       const ax_call_opts *o, int64_t *timeout,
                       uint32_t *depth) {
  int64_t t = o ? o->timeout_ms : 0;
  ax_call_ctx *cur = axi_call_current();
  *depth = cur ? cur->msg.depth + 1 : 0;
  if (cur && (int64_t)*depth > n->o.max_call_depth)
    return ax_seterr(AX_EINVAL,
                     "rpc: %s on %s: call depth %u over the limit of %d (a "
                     "call chain to itself?)",
                     fn, to, *depth, n->o.max_call_depth);
  if (t < 0)
    return ax_seterr(AX_ETIMEOUT, "rpc: %s on %s: no time left (%lld ms)", fn,
                     to, (long long)t);
  if (t == 0) {
    t = n->o.timeout_ms > 0 ? n->o.timeout_ms : 60000;
    if (cur && cur->deadline_ms) {
      int64_t left = cur->deadline_ms - ax_clock_ms();
      if (left <= 0)
        return ax_seterr(AX_ETIMEOUT,
                         "rpc: %s on %s: the calling handler's deadline passed",
                         fn, to);
      if (left < t)
        t = left;
    }
  }
  *timeout = t;
  return AX_OK;
}

int ax_rpc_async(ax_node *n, const char *to, const char *fn,
                 const ax_values *args, const ax_call_opts *o,
                 ax_future **out) {
  if (!n || !to || !fn || !*fn || !out)
    return ax_seterr(AX_EINVAL, "rpc: bad arguments");
  if (o && (o->nmeta < 0 || o->nmeta > AXI_MAX_META))
    return ax_seterr(AX_EINVAL, "rpc: at most %d metadata entries",
                     AXI_MAX_META);
  if (n->closing)
    return ax_seterr(AX_ECLOSED, "rpc: node %s is shut down", n->name);
  int64_t timeout;
  uint32_t depth;
  AX_TRY(call_budget(n, to, fn, o, &timeout, &depth));
  if (ax_values_tensor_bytes(args) > n->o.max_msg_bytes)
    return ax_seterr(AX_ETOOBIG, "rpc: %zu tensor bytes over the %zu limit",
                     ax_values_tensor_bytes(args), n->o.max_msg_bytes);
  if (!strcmp(to, n->name))
    return local_call(n, fn, args, o, timeout, depth, out);
  axi_peer *p = axi_peer_find(n, to);
  if (!p)
    return ax_seterr(AX_ENOTFOUND, "rpc: no node named %s", to);
  ax_future *f = ax_future_new();
  axi_pcall *c =
      f ? axi_pcall_add(n, p, fn, f, axi_add_sat(ax_clock_ms(), timeout))
        : NULL;
  if (!c) {
    ax_future_release(f);
    return ax_seterr(AX_ENOMEM, "rpc: no memory");
  }
  uint64_t id = c->id;
  __atomic_add_fetch(&n->calls_out, 1, __ATOMIC_RELAXED);
  axi_msg m = {.kind = AXI_REQUEST,
               .call_id = id,
               .fn = fn,
               .timeout_ms = timeout,
               .values = (ax_values *)args,
               .autograd_ctx = o ? o->autograd_ctx : 0,
               .depth = depth};
  for (int i = 0; o && i < o->nmeta; i++) {
    m.meta_key[i] = o->meta_key[i];
    m.meta_val[i] = o->meta_val[i];
    m.nmeta++;
  }
  int rc = axi_peer_send(p, &m, NULL);
  if (rc != AX_OK) {
    /* The future is not handed out either way, so no callback can run. */
    axi_pcall_drop(n, c, id);
    ax_future_release(f);
    return rc;
  }
  *out = f;
  return AX_OK;
}

static int local_call(ax_node *n, const char *fn, const ax_values *args,
                      const ax_call_opts *o, int64_t timeout, uint32_t depth,
                      ax_future **out) {
  axi_fn *f = NULL;
  pthread_mutex_lock(&n->mu);
  for (f = n->fns; f && strcmp(f->name, fn); f = f->next)
    ;
  pthread_mutex_unlock(&n->mu);
  ax_future *fut = ax_future_new();
  ax_call_ctx *c = fut ? calloc(1, sizeof *c) : NULL;
  ax_values *a = c ? (args ? ax_values_clone(args) : ax_values_new()) : NULL;
  char *behalf = a && o && o->on_behalf_of ? strdup(o->on_behalf_of) : NULL;
  if (!a || (o && o->on_behalf_of && !behalf)) {
    ax_values_free(a);
    ax_future_release(fut);
    free(c);
    return ax_seterr(AX_ENOMEM, "rpc: no memory");
  }
  if (!f) {
    ax_values_free(a);
    free(behalf);
    free(c);
    char msg[256];
    snprintf(msg, sizeof msg, "%s: %s: unknown function", n->name, fn);
    ax_future_complete(fut, AX_ENOFUNC, NULL, msg);
    *out = fut;
    return AX_OK;
  }
  /* The call is pending like a remote one, so that it expires at its
   * deadline even while every worker is busy. */
  c->deadline_ms = axi_add_sat(ax_clock_ms(), timeout);
  axi_pcall *pc = axi_pcall_add(n, NULL, fn, fut, c->deadline_ms);
  if (!pc) {
    ax_values_free(a);
    free(behalf);
    free(c);
    ax_future_release(fut);
    return ax_seterr(AX_ENOMEM, "rpc: no memory");
  }
  c->node = n;
  c->t0_us = ax_clock_us();
  c->fn = f;
  c->local_id = pc->id;
  c->behalf = behalf;
  c->msg.kind = AXI_REQUEST;
  c->msg.values = a;
  c->msg.timeout_ms = timeout;
  c->msg.depth = depth;
  c->msg.autograd_ctx = o ? o->autograd_ctx : 0;
  for (int i = 0; o && i < o->nmeta; i++) {
    c->lmeta[i] = strdup(o->meta_key[i] ? o->meta_key[i] : "");
    c->msg.meta_key[i] = c->lmeta[i];
    c->msg.meta_val[i] = o->meta_val[i];
    c->msg.nmeta++;
  }
  __atomic_add_fetch(&n->incalls, 1, __ATOMIC_RELAXED);
  axi_live_calls_add(1);
  *out = fut;
  if (f->inline_) {
    /* An inline handler never blocks, so it runs here, as it would on a
     * transport thread: queued behind calls that wait for it (a stage's
     * forward waiting for the push "axon.autograd.push" delivers), it
     * could wait for a worker that never comes free. The future is
     * complete when this returns. */
    axi_call_run(c);
    return AX_OK;
  }
  axi_calls_enqueue(n, c);
  return AX_OK;
}

/* How long ax_rpc_sync polls for the reply of a small call (under 64 KiB
 * of tensor data) before sleeping: about one small-call round trip. Larger
 * calls sleep at once, leaving both cores to the transfer.
 * AXON_SYNC_SPIN_US overrides it (0 disables). */
static int64_t g_spin_us = -1;

static int64_t sync_spin_us(void) {
  int64_t v = __atomic_load_n(&g_spin_us, __ATOMIC_RELAXED);
  if (v < 0) {
    const char *e = getenv("AXON_SYNC_SPIN_US");
    v = (e && *e) ? atoll(e) : 50;
    __atomic_store_n(&g_spin_us, v < 0 ? 0 : v, __ATOMIC_RELAXED);
  }
  return v < 0 ? 0 : v;
}

int ax_rpc_sync(ax_node *n, const char *to, const char *fn,
                const ax_values *args, const ax_call_opts *o, ax_values **out) {
  ax_future *f;
  int64_t timeout;
  uint32_t depth;
  AX_TRY(call_budget(n, to, fn, o, &timeout, &depth));
  AX_TRY(ax_rpc_async(n, to, fn, args, o, &f));
  /* The call completes by its deadline; the grace covers the timer tick. */
  int64_t spin =
      ax_values_tensor_bytes(args) < (64u << 10) ? sync_spin_us() : 0;
  int rc = axi_future_wait_spin(f, spin, axi_add_sat(timeout, 2000));
  if (rc == AX_OK && out) {
    *out = ax_future_take_values(f);
    if (!*out)
      *out = ax_values_new();
  }
  ax_future_release(f);
  return rc;
}

int ax_call_defer(ax_call_ctx *c, ax_future *f) {
  if (!c || !f || c->deferred)
    return ax_seterr(AX_EINVAL, "defer: bad arguments or already deferred");
  c->deferred = ax_future_retain(f);
  return AX_OK;
}

ax_node *ax_call_node(const ax_call_ctx *c) { return c->node; }
const char *ax_call_caller(const ax_call_ctx *c) {
  if (c->peer)
    return AXI_PNAME(c->peer);
  return c->behalf ? c->behalf : c->node->name;
}
const char *ax_call_fn(const ax_call_ctx *c) { return c->fn->name; }
uint64_t ax_call_autograd_ctx(const ax_call_ctx *c) {
  return c->msg.autograd_ctx;
}
int ax_call_meta(const ax_call_ctx *c, const char *key, int64_t *val) {
  for (int i = 0; i < c->msg.nmeta; i++)
    if (c->msg.meta_key[i] && !strcmp(c->msg.meta_key[i], key)) {
      *val = c->msg.meta_val[i];
      return AX_OK;
    }
  return ax_seterr(AX_ENOTFOUND, "call: no metadata %s", key);
}
int ax_call_meta_count(const ax_call_ctx *c) { return c->msg.nmeta; }
int ax_call_meta_at(const ax_call_ctx *c, int i, const char **key,
                    int64_t *val) {
  if (i < 0 || i >= c->msg.nmeta)
    return ax_seterr(AX_EINVAL, "call: no metadata entry %d", i);
  *key = c->msg.meta_key[i] ? c->msg.meta_key[i] : "";
  *val = c->msg.meta_val[i];
  return AX_OK;
}
int64_t ax_call_remaining_ms(const ax_call_ctx *c) {
  if (!c->deadline_ms)
    return INT64_MAX;
  int64_t left = c->deadline_ms - ax_clock_ms();
  return left > 0 ? left : -1; /* never 0, which would mean "the default" */
}

void ax_node_stats_get(ax_node *n, ax_node_stats *s) {
  memset(s, 0, sizeof *s);
  s->bytes_in = __atomic_load_n(&n->bytes_in, __ATOMIC_RELAXED);
  s->bytes_out = __atomic_load_n(&n->bytes_out, __ATOMIC_RELAXED);
  s->calls_in = __atomic_load_n(&n->calls_in, __ATOMIC_RELAXED);
  s->calls_out = __atomic_load_n(&n->calls_out, __ATOMIC_RELAXED);
  s->errors_in = __atomic_load_n(&n->errors_in, __ATOMIC_RELAXED);
  s->malformed = __atomic_load_n(&n->malformed, __ATOMIC_RELAXED);
  s->forged = __atomic_load_n(&n->forged, __ATOMIC_RELAXED);
  s->limit_drops = __atomic_load_n(&n->limit_drops, __ATOMIC_RELAXED);
  s->auth_refused = __atomic_load_n(&n->auth_refused, __ATOMIC_RELAXED);
  s->live_calls = ax_rpc_live_calls();
  s->live_futures = ax_future_live_count();
  pthread_mutex_lock(&n->mu);
  for (axi_peer *p = n->peers; p; p = p->next) {
    int st = __atomic_load_n(&p->state, __ATOMIC_RELAXED);
    s->peers_up += st == AXI_PEER_UP;
    s->peers_down += st == AXI_PEER_DOWN;
  }
  pthread_mutex_unlock(&n->mu);
}

int ax_node_fn_stats(ax_node *n, size_t i, ax_fn_stats *out) {
  pthread_mutex_lock(&n->mu);
  axi_fn *f = n->fns;
  while (f && i--)
    f = f->next;
  pthread_mutex_unlock(&n->mu);
  if (!f)
    return AX_ENOTFOUND;
  memset(out, 0, sizeof *out);
  out->fn = f->name;
  out->calls = __atomic_load_n(&f->calls, __ATOMIC_RELAXED);
  out->errors = __atomic_load_n(&f->errors, __ATOMIC_RELAXED);
  for (int b = 0; b < AX_LAT_BUCKETS; b++)
    out->lat_count[b] = __atomic_load_n(&f->lat_count[b], __ATOMIC_RELAXED);
  out->lat_sum_s = __atomic_load_n(&f->lat_sum_us, __ATOMIC_RELAXED) * 1e-6;
  return AX_OK;
}
