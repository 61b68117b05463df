/* The distributed backward: gradient delivery to recorded functions, the
 * "axon.autograd.grad" / "axon.autograd.root" / "axon.autograd.release"
 * handlers, and the root-side ax_dist_backward and ax_dist_context_release.
 * Held functions are in engine_held.c, the aggregate futures in
 * engine_agg.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/backend-impl.h"
#include "axon/kernels/clock.h"
#include "axon/rpc/builtin-impl.h"
#include "axon/runtime/autograd/autograd-impl.h"

/* ---- delivery ------------------------------------------------------------ */

/* Sends g (NULL: "no gradient", which still counts as the contribution)
 * along a RECV edge: "axon.autograd.grad" [fn, k, (g)]. */
int axi_ag_send_grad(axi_ag_state *d, uint64_t ctx, const axi_ag_src *s,
                     ax_tensor *g, axi_ag_agg *a) {
  ax_values *v = ax_values_new();
  if (!v)
    return AX_ENOMEM;
  ax_values_add_i64(v, (int64_t)s->rfn);
  ax_values_add_i64(v, s->k);
  if (g)
    ax_values_add_tensor(v, g);
  ax_call_opts o = {.timeout_ms = AXD_CALL_MS, .autograd_ctx = ctx};
  ax_future *f = NULL;
  int err = ax_rpc_async(d->node, s->from, "axon.autograd.grad", v, &o, &f);
  ax_values_free(v);
  if (err == AX_OK)
    axi_ag_agg_add(a, f);
  return err;
}

/* Runs fn's backward (it is marked ran and its context busy) and passes
 * the input gradients on. Every input with a source gets its contribution,
 * NULL where the backward gave none (integer ids, a mask passed through):
 * the producer counts it and runs once all its consumers reported. */
static int run_fn(axi_ag_state *d, uint64_t ctx, axi_ag_fn *fn, axi_ag_agg *a) {
  ax_tlist dout = {0}, din = {0};
  int any = 0;
  dout.n = fn->n_out;
  for (int k = 0; k < fn->n_out; k++)
    any |= (dout.t[k] = fn->dout[k]) != NULL;
  /* No gradient reached any output: nothing to differentiate, and every
   * input reports "no gradient" in turn. */
  int err = any ? fn->ops->backward(fn->state, ctx, &dout, &din) : AX_OK;
  for (int i = 0; err == AX_OK && i < fn->n_in; i++) {
    ax_tensor *g = i < din.n ? din.t[i] : NULL;
    if (fn->in[i].kind == AXD_SRC_LOCAL)
      err = axi_ag_deliver(d, ctx, fn->in[i].fn, fn->in[i].k, g, a);
    else if (fn->in[i].kind == AXD_SRC_REMOTE)
      err = axi_ag_send_grad(d, ctx, &fn->in[i], g, a);
  }
  ax_tlist_clear(&din);
  if (fn->ops->release)
    fn->ops->release(fn->state);
  fn->state = NULL;
  pthread_mutex_lock(&d->mu);
  for (int k = 0; k < AX_TLIST_MAX; k++) { /* drop gradients early */
    ax_tensor_release(fn->dout[k]);
    fn->dout[k] = NULL;
  }
  pthread_mutex_unlock(&d->mu);
  return err;
}

/* Adds g to fn's output k (g NULL: a contribution without gradient); runs
 * fn when every expected contribution came. */
int axi_ag_deliver(axi_ag_state *d, uint64_t ctx, axi_ag_fn *fn, int k,
                   ax_tensor *g, axi_ag_agg *a) {
  if (k < 0 || k >= fn->n_out)
    return ax_seterr(AX_EINVAL, "dist: output %d of a %d-output function", k,
                     fn->n_out);
  int err = AX_OK, ready = 0;
  axi_ag_ctx *c = NULL;
  pthread_mutex_lock(&d->mu);
  c = axi_ag_ctx_find(d, ctx, 0);
  if (!c || fn->ran) {
    err = ax_seterr(AX_ESTATE, "dist: function already ran or context gone");
  } else if (!g) {
    /* counted below, nothing to add */
  } else if (!fn->dout[k]) {
    fn->dout[k] = ax_tensor_retain(g);
  } else {
    if (!fn->dout_own[k]) { /* copy before summing into a shared tensor */
      ax_tensor *s = ax_tensor_like(fn->dout[k]);
      if (!s || ax_tensor_copy(s, fn->dout[k]) != AX_OK) {
        ax_tensor_release(s);
        err = AX_ENOMEM;
      } else {
        ax_tensor_release(fn->dout[k]);
        fn->dout[k] = s;
        fn->dout_own[k] = 1;
      }
    }
    if (err == AX_OK && ax_tensor_numel(g) != ax_tensor_numel(fn->dout[k]))
      err = ax_seterr(AX_ESHAPE, "dist: gradient shape mismatch");
    ax_tensor *gd = err == AX_OK ? ax_tensor_to(g, fn->dout[k]->device) : NULL;
    if (err == AX_OK && !gd)
      err = AX_ENOMEM;
    if (err == AX_OK)
      err = AX_K(ax_backend_of(gd->device), axpby, ax_tensor_numel(gd), 1.0f,
                 ax_f32(gd), 1.0f, ax_f32(fn->dout[k]));
    ax_tensor_release(gd);
  }
  if (err == AX_OK && ++fn->received >= fn->expected) {
    if (fn->held) { /* its owner takes the sums (ax_dist_take_grads) */
      pthread_cond_broadcast(&d->cv);
    } else {
      fn->ran = 1;
      c->busy++;
      ready = 1;
    }
  }
  pthread_mutex_unlock(&d->mu);
  if (!ready)
    return err;
  err = run_fn(d, ctx, fn, a);
  pthread_mutex_lock(&d->mu);
  int free_it = --c->busy == 0 && c->released;
  pthread_mutex_unlock(&d->mu);
  if (free_it)
    axi_ag_ctx_free(c);
  return err;
}

/* Seeds root tensors with ones and delivers them. */
static int seed_roots(axi_ag_state *d, uint64_t ctx, const ax_tlist *roots,
                      axi_ag_agg *a) {
  for (int i = 0; i < roots->n; i++) {
    ax_tensor *t = roots->t[i];
    if (!t)
      continue;
    axi_ag_src s = {0};
    pthread_mutex_lock(&d->mu);
    axi_ag_ctx *c = axi_ag_ctx_find(d, ctx, 0);
    axi_ag_map *m = c ? axi_ag_map_find(c, t) : NULL;
    if (m) {
      s = m->s;
      if (s.kind == AXD_SRC_LOCAL)
        s.fn->expected++;
    }
    pthread_mutex_unlock(&d->mu);
    if (!c)
      return ax_seterr(AX_ESTALE, "dist: no context %llx here",
                       (unsigned long long)ctx);
    if (!m)
      return ax_seterr(AX_EINVAL,
                       "dist: root %d is not recorded in the "
                       "context",
                       i);
    ax_tensor *one = ax_tensor_like(t);
    if (!one || ax_tensor_fill(one, 1.0f) != AX_OK) {
      ax_tensor_release(one);
      return AX_ENOMEM;
    }
    int err = s.kind == AXD_SRC_LOCAL
                  ? axi_ag_deliver(d, ctx, s.fn, s.k, one, a)
                  : axi_ag_send_grad(d, ctx, &s, one, a);
    ax_tensor_release(one);
    AX_TRY(err);
  }
  return AX_OK;
}

/* ---- handlers ------------------------------------------------------------ */
static int h_grad(ax_call_ctx *cc, const ax_values *args, ax_values *out,
                  void *user) {
  axi_ag_state *d = axi_ag_get();
  int64_t fid, k;
  ax_tensor *g = NULL;
  AX_TRY(ax_values_get_i64(args, 0, &fid));
  AX_TRY(ax_values_get_i64(args, 1, &k));
  if (ax_values_count(args) > 2)
    AX_TRY(ax_values_get_tensor(args, 2, &g));
  int64_t delay = __atomic_load_n(&d->grad_delay_ms, __ATOMIC_RELAXED);
  if (delay > 0) {
    struct timespec ts = {delay / 1000, (delay % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  uint64_t ctx = ax_call_autograd_ctx(cc);
  pthread_mutex_lock(&d->mu);
  axi_ag_ctx *c = axi_ag_ctx_find(d, ctx, 0);
  axi_ag_fn *fn = c ? axi_ag_fn_find(c, (uint64_t)fid) : NULL;
  pthread_mutex_unlock(&d->mu);
  if (!fn)
    return ax_seterr(AX_ESTALE, "%s: no function %lld in context %llx", d->name,
                     (long long)fid, (unsigned long long)ctx);
  axi_ag_agg *a = axi_ag_agg_new(0);
  if (!a)
    return AX_ENOMEM;
  int err = axi_ag_deliver(d, ctx, fn, (int)k, g, a);
  char msg[256];
  snprintf(msg, sizeof msg, "%s: %s", d->name, err ? ax_errmsg() : "");
  ax_future *f = axi_ag_agg_finish(a, err, msg);
  ax_call_defer(cc, f);
  ax_future_release(f);
  return AX_OK;
}

static int h_root(ax_call_ctx *cc, const ax_values *args, ax_values *out,
                  void *user) {
  axi_ag_state *d = axi_ag_get();
  ax_rref *r;
  const ax_values *v;
  AX_TRY(ax_values_get_rref(args, 0, &r));
  AX_TRY(ax_rref_local_value(r, &v));
  ax_tlist roots = {0};
  for (size_t i = 0; i < ax_values_count(v) && roots.n < AX_TLIST_MAX; i++)
    if (ax_values_type(v, i) == AX_VAL_TENSOR)
      ax_values_get_tensor(v, i, &roots.t[roots.n++]);
  axi_ag_agg *a = axi_ag_agg_new(0);
  if (!a)
    return AX_ENOMEM;
  int err = seed_roots(d, ax_call_autograd_ctx(cc), &roots, a);
  char msg[256];
  snprintf(msg, sizeof msg, "%s: %s", d->name, err ? ax_errmsg() : "");
  ax_future *f = axi_ag_agg_finish(a, err, msg);
  ax_call_defer(cc, f);
  ax_future_release(f);
  return AX_OK;
}

/* Unlinks ctx and returns its peers (caller frees), or AX_ESTALE. */
static int release_local(axi_ag_state *d, uint64_t ctx, axi_ag_peer **peers) {
  pthread_mutex_lock(&d->mu);
  axi_ag_ctx *c = NULL;
  for (axi_ag_ctx **pp = &d->ctxs; *pp; pp = &(*pp)->next)
    if ((*pp)->id == ctx) {
      c = *pp;
      *pp = c->next;
      d->nctx--;
      d->released[d->nrel++ % AXD_RELEASED_RING] = ctx;
      break;
    }
  int free_now = 0;
  if (c) {
    *peers = c->peers;
    c->peers = NULL;
    c->released = 1;
    free_now = c->busy == 0;
    pthread_cond_broadcast(&d->cv); /* takes under ctx end (AX_ESTALE) */
  } else if (ctx && !axi_ag_was_released(d, ctx)) {
    /* Released before this node saw it (a call under ctx still on its
     * way, e.g. queued behind a failure): the call must not create it
     * afterwards, where nothing would ever release it again. */
    d->released[d->nrel++ % AXD_RELEASED_RING] = ctx;
  }
  pthread_mutex_unlock(&d->mu);
  if (!c)
    return AX_ESTALE;
  if (free_now)
    axi_ag_ctx_free(c);
  return AX_OK;
}

/* Whether `name` is among the names of v (the nodes a release covers). */
static int covered(const ax_values *v, const char *name) {
  for (size_t i = 0; v && i < ax_values_count(v); i++) {
    const char *s;
    if (ax_values_get_str(v, i, &s) == AX_OK && !strcmp(s, name))
      return 1;
  }
  return 0;
}

/* Sends "axon.autograd.release" [the nodes this release covers...] to every
 * peer not covered yet (by the release that reached us: `cover`, its caller
 * `skip`). Each receiver then forwards only to peers nobody covers: when
 * the context's creator saw every node (a pipeline's coordinator), one
 * round reaches them all, without node-to-node repeats. Frees peers. */
static void release_peers(axi_ag_state *d, uint64_t ctx, axi_ag_peer *peers,
                          const char *skip, const ax_values *cover,
                          axi_ag_agg *a) {
  ax_values *list = ax_values_new();
  for (size_t i = 0; list && cover && i < ax_values_count(cover); i++) {
    const char *s;
    if (ax_values_get_str(cover, i, &s) == AX_OK)
      ax_values_add_str(list, s);
  }
  axi_ag_peer *todo = NULL;
  for (axi_ag_peer *p = peers, *nx; p; p = nx) {
    nx = p->next;
    if ((skip && !strcmp(p->name, skip)) || covered(cover, p->name)) {
      free(p);
      continue;
    }
    if (list)
      ax_values_add_str(list, p->name);
    p->next = todo;
    todo = p;
  }
  if (list)
    ax_values_add_str(list, d->name);
  for (axi_ag_peer *p = todo, *nx; p; p = nx) {
    nx = p->next;
    ax_call_opts o = {.timeout_ms = 10000, .autograd_ctx = ctx};
    ax_future *f = NULL;
    if (ax_rpc_async(d->node, p->name, "axon.autograd.release", list, &o, &f) ==
        AX_OK)
      axi_ag_agg_add(a, f);
    free(p);
  }
  ax_values_free(list);
}

static int h_release(ax_call_ctx *cc, const ax_values *args, ax_values *out,
                     void *user) {
  axi_ag_state *d = axi_ag_get();
  axi_ag_peer *peers = NULL;
  uint64_t ctx = ax_call_autograd_ctx(cc);
  if (release_local(d, ctx, &peers) != AX_OK)
    return AX_OK; /* already released here */
  axi_ag_agg *a = axi_ag_agg_new(1);
  if (!a)
    return AX_ENOMEM;
  release_peers(d, ctx, peers, ax_call_caller(cc), args, a);
  ax_future *f = axi_ag_agg_finish(a, AX_OK, NULL);
  ax_call_defer(cc, f);
  ax_future_release(f);
  return AX_OK;
}

static int h_live(ax_call_ctx *cc, const ax_values *args, ax_values *out,
                  void *user) {
  return ax_values_add_i64(out, ax_dist_live_contexts(ax_call_node(cc)));
}

static int h_debug(ax_call_ctx *cc, const ax_values *args, ax_values *out,
                   void *user) {
  int64_t ms;
  AX_TRY(ax_values_get_i64(args, 0, &ms));
  ax_dist_debug_grad_delay(ax_call_node(cc), ms);
  return AX_OK;
}

int axi_ag_engine_register(ax_node *n) {
  AX_TRY(axi_register(n, "axon.autograd.grad", h_grad, NULL));
  AX_TRY(axi_register(n, "axon.autograd.root", h_root, NULL));
  AX_TRY(axi_register(n, "axon.autograd.release", h_release, NULL));
  AX_TRY(axi_register(n, "axon.autograd.live", h_live, NULL));
  return axi_register(n, "axon.autograd.debug", h_debug, NULL);
}

void ax_dist_debug_grad_delay(ax_node *n, int64_t ms) {
  axi_ag_state *d = axi_ag_get();
  if (d && d->node == n)
    __atomic_store_n(&d->grad_delay_ms, ms, __ATOMIC_RELAXED);
}

/* ---- root side ----------------------------------------------------------- */
int ax_dist_backward(ax_node *n, uint64_t ctx, const ax_tlist *roots,
                     int64_t timeout_ms) {
  axi_ag_state *d = axi_ag_get();
  if (!d || d->node != n || !roots)
    return ax_seterr(AX_EINVAL, "dist: bad arguments");
  axi_ag_agg *a = axi_ag_agg_new(0);
  if (!a)
    return AX_ENOMEM;
  int err = seed_roots(d, ctx, roots, a);
  return axi_ag_agg_wait(axi_ag_agg_finish(a, err, err ? ax_errmsg() : NULL),
                         timeout_ms);
}

int ax_dist_backward_rrefs(ax_node *n, uint64_t ctx, ax_rref *const *roots,
                           int nroots, int64_t timeout_ms) {
  axi_ag_state *d = axi_ag_get();
  if (!d || d->node != n || (!roots && nroots))
    return ax_seterr(AX_EINVAL, "dist: bad arguments");
  axi_ag_agg *a = axi_ag_agg_new(0);
  if (!a)
    return AX_ENOMEM;
  int err = AX_OK;
  /* The roots' values must exist before their owners can seed them. */
  for (int i = 0; err == AX_OK && i < nroots; i++)
    err = ax_rref_wait_created(roots[i],
                               timeout_ms > 0 ? timeout_ms : AXD_CALL_MS);
  for (int i = 0; err == AX_OK && i < nroots; i++) {
    ax_values *v = ax_values_new();
    ax_future *f = NULL;
    err = v ? ax_values_add_rref(v, roots[i]) : AX_ENOMEM;
    ax_call_opts o = {.timeout_ms = timeout_ms > 0 ? timeout_ms : AXD_CALL_MS,
                      .autograd_ctx = ctx};
    if (err == AX_OK)
      err = ax_rpc_async(n, ax_rref_owner(roots[i]), "axon.autograd.root", v,
                         &o, &f);
    ax_values_free(v);
    if (err == AX_OK)
      axi_ag_agg_add(a, f);
  }
  return axi_ag_agg_wait(axi_ag_agg_finish(a, err, err ? ax_errmsg() : NULL),
                         timeout_ms);
}

int ax_dist_context_release(ax_node *n, uint64_t ctx, int64_t timeout_ms) {
  axi_ag_state *d = axi_ag_get();
  if (!d || d->node != n)
    return ax_seterr(AX_EINVAL, "dist: node not initialised");
  if (ax_autograd_ctx_current() == ctx)
    ax_autograd_ctx_set_current(0);
  axi_ag_peer *peers = NULL;
  if (release_local(d, ctx, &peers) != AX_OK)
    return ax_seterr(AX_ESTALE, "dist: no context %llx here",
                     (unsigned long long)ctx);
  axi_ag_agg *a = axi_ag_agg_new(1);
  if (!a)
    return AX_ENOMEM;
  release_peers(d, ctx, peers, NULL, NULL, a);
  return axi_ag_agg_wait(axi_ag_agg_finish(a, AX_OK, NULL),
                         timeout_ms > 0 ? timeout_ms : 10000);
}
