/* Object kinds, calls through RRefs, creation and fetching (the user side),
 * and the autograd hooks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/builtin-impl.h"
#include "axon/rref/rref-impl.h"

static const ax_rref_grad_hooks *g_hooks;
static __thread uint64_t t_ctx;
static __thread int t_deferred;

void ax_rref_set_grad_hooks(const ax_rref_grad_hooks *h) {
  __atomic_store_n(&g_hooks, h, __ATOMIC_RELEASE);
}
const ax_rref_grad_hooks *axi_grad_hooks(void) {
  return __atomic_load_n(&g_hooks, __ATOMIC_ACQUIRE);
}
uint64_t ax_autograd_ctx_current(void) { return t_ctx; }
void ax_autograd_ctx_set_current(uint64_t ctx) { t_ctx = ctx; }

uint64_t axi_ctx_of(const ax_call_opts *o) {
  return (o && o->autograd_ctx) ? o->autograd_ctx : t_ctx;
}

/* Splits a reply [values..., bytes desc]: feeds the descriptor to the recv
 * hook, drops it and hands the list itself over as the values. */
int axi_take_reply(axi_rctx *rc, ax_values *raw, uint64_t ctx, const char *from,
                   ax_values **out) {
  size_t n = ax_values_count(raw);
  const void *desc = NULL;
  size_t len = 0;
  if (n == 0 || ax_values_get_bytes(raw, n - 1, &desc, &len) != AX_OK) {
    ax_values_free(raw);
    return ax_seterr(AX_EMALFORMED, "rref: reply without descriptor");
  }
  const ax_rref_grad_hooks *h = axi_grad_hooks();
  int err = AX_OK;
  if (h && ctx && len && strcmp(from, rc->name)) {
    ax_values_view view;
    err = h->recv(rc->node, ctx, from,
                  ax_values_view_range(raw, 0, n - 1, &view), 0, desc, len);
  }
  if (err != AX_OK) {
    ax_values_free(raw);
    return err;
  }
  ax_values_truncate(raw, n - 1);
  *out = raw;
  return AX_OK;
}

/* ---- object kinds -------------------------------------------------------- */
static const ax_robj_kind *kind_lookup(axi_rctx *rc, const char *name) {
  const ax_robj_kind *k = NULL;
  for (struct axi_kindreg *r = rc->kinds; r && !k; r = r->next)
    if (!strcmp(r->k->name, name))
      k = r->k;
  return k;
}

/* Registers kind unless the name is taken (mu not held); returns the kind
 * registered under the name, or NULL without memory. */
static const ax_robj_kind *kind_add(axi_rctx *rc, const ax_robj_kind *kind,
                                    int *taken) {
  struct axi_kindreg *r = calloc(1, sizeof *r);
  pthread_mutex_lock(&rc->mu);
  const ax_robj_kind *k = kind_lookup(rc, kind->name);
  *taken = k != NULL;
  if (!k && r) {
    r->k = k = kind;
    r->next = rc->kinds;
    rc->kinds = r;
    r = NULL;
  }
  pthread_mutex_unlock(&rc->mu);
  free(r);
  return k;
}

const ax_robj_kind *axi_kind_find(axi_rctx *rc, const char *name) {
  pthread_mutex_lock(&rc->mu);
  const ax_robj_kind *k = kind_lookup(rc, name);
  ax_robj_resolver res = rc->resolver;
  void *user = rc->resolver_user;
  pthread_mutex_unlock(&rc->mu);
  if (k || !res)
    return k;
  const ax_robj_kind *made = res(rc->node, name, user);
  int taken;
  if (!made || !made->name || strcmp(made->name, name) ||
      (!made->create && !made->create_kind))
    return NULL;
  return kind_add(rc, made, &taken);
}

int axi_kind_create(const ax_robj_kind *k, ax_node *n, const char *config,
                    ax_device dev, void **obj) {
  return k->create_kind ? k->create_kind(k, n, config, dev, obj)
                        : k->create(n, config, dev, obj);
}

int ax_robj_register(ax_node *n, const ax_robj_kind *kind) {
  axi_rctx *rc = axi_rctx_get();
  if (!rc || rc->node != n || !kind || !kind->name ||
      (!kind->create && !kind->create_kind))
    return ax_seterr(AX_EINVAL, "robj: node not initialised or bad kind");
  int taken = 0;
  if (!kind_add(rc, kind, &taken))
    return AX_ENOMEM;
  return taken ? ax_seterr(AX_ESTATE, "robj: kind %s already registered",
                           kind->name)
               : AX_OK;
}

void ax_robj_set_resolver(ax_node *n, ax_robj_resolver fn, void *user) {
  axi_rctx *rc = axi_rctx_get();
  if (!rc || rc->node != n)
    return;
  pthread_mutex_lock(&rc->mu);
  rc->resolver = fn;
  rc->resolver_user = user;
  pthread_mutex_unlock(&rc->mu);
}

/* A deferred method's reply travels like an immediate one: [results...,
 * bytes desc]. The method's future `f` holds only the results, so the call
 * is answered with a second future `g` that gets f's outcome plus the
 * descriptor of the results (empty unless they carry autograd edges). */
typedef struct defer_fwd {
  ax_future *g;
  ax_node *node;
  uint64_t agc;
  char caller[128];
} defer_fwd;

static void defer_done(ax_future *f, void *user) {
  defer_fwd *d = user;
  int err = ax_future_err(f);
  if (err != AX_OK) {
    ax_future_complete(d->g, err, NULL, ax_future_errmsg(f));
  } else {
    const ax_values *r = ax_future_values(f);
    ax_values *v = r ? ax_values_clone(r) : ax_values_new();
    const ax_rref_grad_hooks *h = axi_grad_hooks();
    axi_rctx *rc = axi_rctx_get();
    void *desc = NULL;
    size_t dl = 0;
    if (!v)
      err = AX_ENOMEM;
    if (err == AX_OK && h && d->agc && rc && strcmp(d->caller, rc->name))
      err = h->send(d->node, d->agc, d->caller, v, 0, &desc, &dl);
    if (err == AX_OK)
      err = ax_values_add_bytes(v, desc, dl);
    free(desc);
    if (err == AX_OK) {
      ax_future_complete(d->g, AX_OK, v, NULL);
    } else {
      ax_values_free(v);
      ax_future_complete(d->g, err, NULL, ax_errmsg());
    }
  }
  ax_future_release(d->g);
  free(d);
}

int ax_robj_defer(ax_call_ctx *ctx, ax_future *f) {
  defer_fwd *d = calloc(1, sizeof *d);
  ax_future *g = ax_future_new();
  if (!d || !g) {
    free(d);
    ax_future_release(g);
    return AX_ENOMEM;
  }
  d->node = ax_call_node(ctx);
  d->agc = ax_call_autograd_ctx(ctx);
  snprintf(d->caller, sizeof d->caller, "%s", ax_call_caller(ctx));
  int err = ax_call_defer(ctx, g);
  if (err != AX_OK) {
    ax_future_release(g);
    free(d);
    return err;
  }
  d->g = g; /* the reference ax_future_new gave us, released in defer_done */
  if (ax_future_on_done(f, defer_done, d) != AX_OK) {
    ax_future_complete(g, AX_ENOMEM, NULL, "rref: deferred reply");
    ax_future_release(g);
    free(d);
  }
  t_deferred = 1;
  return AX_OK;
}

/* args: [id, method, args..., bytes desc]. Replies [results..., bytes desc]
 * unless metadata rr.keep is set (the results become an owned value). */
static int h_call(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                  void *user) {
  axi_rctx *rc = axi_rctx_get();
  int64_t id, keep = 0;
  const char *method;
  const void *desc;
  size_t len, n = ax_values_count(args);
  AX_TRY(ax_values_get_i64(args, 0, &id));
  AX_TRY(ax_values_get_str(args, 1, &method));
  AX_TRY(ax_values_get_bytes(args, n - 1, &desc, &len));
  if (ax_call_meta(ctx, "rr.keep", &keep) != AX_OK)
    ax_clearerr();
  const char *caller = ax_call_caller(ctx);
  int64_t grace;
  int err = AX_OK;
  pthread_mutex_lock(&rc->mu);
  axi_owned *e = axi_owned_lookup(rc, (uint64_t)id, ctx, &grace, &err);
  if (e && e->state == AXI_OWN_PENDING) {
    int64_t rank = -1;
    int r;
    if (ax_node_rank_of(rc->node, caller, &r) == AX_OK)
      rank = r;
    err = axi_rref_wait_entry(rc, e, ctx, "axon.rref.call", args, rank, grace);
    pthread_mutex_unlock(&rc->mu);
    return err;
  }
  if (e && e->state == AXI_OWN_ERROR)
    err = ax_seterr(e->err, "%s", e->msg ? e->msg : ax_strerror(e->err));
  else if (e && e->type != AX_RREF_OBJECT)
    err = ax_seterr(AX_EUNSUPPORTED, "rref: %s on a value", method);
  const ax_robj_method_def *m = NULL;
  if (err == AX_OK) {
    for (m = e->kind->methods; m && m->name && strcmp(m->name, method); m++)
      ;
    if (!m || !m->name)
      err = ax_seterr(AX_ENOFUNC, "rref: %s has no method %s", e->kind->name,
                      method);
    else
      e->local_refs++; /* the object lives through the call */
  }
  void *obj = e ? e->obj : NULL;
  pthread_mutex_unlock(&rc->mu);
  if (err != AX_OK)
    return err;
  uint64_t agc = ax_call_autograd_ctx(ctx);
  ax_values_view view; /* the method's arguments, borrowed from args */
  const ax_values *margs = ax_values_view_range(args, 2, n - 1, &view);
  const ax_rref_grad_hooks *h = axi_grad_hooks();
  if (err == AX_OK && h && agc && len && strcmp(caller, rc->name))
    err = h->recv(rc->node, agc, caller, margs, 0, desc, len);
  uint64_t saved = t_ctx;
  t_ctx = agc;
  t_deferred = 0;
  if (err == AX_OK)
    err = m->fn(ctx, obj, margs, out);
  int deferred = t_deferred;
  t_deferred = 0;
  t_ctx = saved;
  pthread_mutex_lock(&rc->mu);
  e->local_refs--;
  axi_owned *dead = axi_owned_maybe_unlink(rc, e);
  pthread_mutex_unlock(&rc->mu);
  axi_owned_free(dead);
  if (err != AX_OK || deferred || keep)
    return err;
  void *d = NULL;
  size_t dl = 0;
  if (h && agc && strcmp(caller, rc->name))
    err = h->send(rc->node, agc, caller, out, 0, &d, &dl);
  if (err == AX_OK)
    err = ax_values_add_bytes(out, d, dl);
  free(d);
  return err;
}

int axi_rref_register_calls(ax_node *n) {
  return axi_register(n, "axon.rref.call", h_call, NULL);
}
