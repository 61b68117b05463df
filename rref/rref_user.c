/* The user side of RRefs: creation (remote and local), waiting for it,
 * local values, to_here and calls through an RRef. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "axon/rref/rref-impl.h"

/* ---- creation (user side) ------------------------------------------------ */
static void on_create_reply(ax_future *f, void *user) {
  ax_rref *u = user;
  axi_rctx *rc = u->rc;
  int err = ax_future_err(f);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", ax_future_errmsg(f));
  int64_t cerr = AX_OK;
  const char *cmsg = "";
  if (err == AX_OK &&
      (ax_values_get_i64(ax_future_values(f), 0, &cerr) != AX_OK ||
       ax_values_get_str(ax_future_values(f), 1, &cmsg) != AX_OK))
    err = AX_EMALFORMED;
  if (err == AX_OK && cerr != AX_OK)
    snprintf(msg, sizeof msg, "%s", cmsg);
  pthread_mutex_lock(&rc->mu);
  if (err == AX_OK || err == AX_ETIMEOUT)
    u->confirmed = 1; /* the owner has (or will tombstone) our fork */
  else
    u->dead = 1;
  u->known = err == AX_OK; /* the owner answered: it holds the value */
  u->err = err == AX_OK ? (int)cerr : err;
  if (u->err)
    u->errmsg = strdup(msg);
  ax_future *created = ax_future_retain(u->created);
  pthread_mutex_unlock(&rc->mu);
  ax_future_complete(created, u->err, NULL, msg);
  ax_future_release(created);
  pthread_mutex_lock(&rc->mu);
  u->busy--;
  axi_user_maybe_done(rc, u);
  pthread_mutex_unlock(&rc->mu);
  ax_future_release(f);
}

/* Local creation on this node: runs fn or the kind's constructor here. */
static int create_local(axi_rctx *rc, int mode, const char *fn,
                        const ax_values *args, const char *cfg, ax_device dev,
                        const ax_call_opts *opts, ax_rref **out) {
  uint64_t id = axi_rref_new_id(rc);
  pthread_mutex_lock(&rc->mu);
  axi_owned *e = axi_owned_find(rc, id, 1);
  ax_rref *r = e ? axi_owner_handle(rc, e) : NULL;
  if (e)
    e->type = mode ? AX_RREF_OBJECT : AX_RREF_VALUE;
  pthread_mutex_unlock(&rc->mu);
  if (!r)
    return ax_seterr(AX_ENOMEM, "rref: no memory");
  int err;
  char msg[512] = "";
  if (mode) {
    const ax_robj_kind *k = axi_kind_find(rc, fn);
    void *obj = NULL;
    err = k ? axi_kind_create(k, rc->node, cfg, dev, &obj)
            : ax_seterr(AX_ENOTFOUND, "rref: no object kind %s", fn);
    if (err)
      snprintf(msg, sizeof msg, "%s: %s", rc->name, ax_errmsg());
    axi_owned_settle(rc, e, err, err ? msg : NULL, NULL, err ? NULL : k, obj);
  } else {
    ax_values *v = NULL;
    ax_call_opts o = opts ? *opts : (ax_call_opts){0};
    o.autograd_ctx = axi_ctx_of(opts);
    err = ax_rpc_sync(rc->node, rc->name, fn, args, &o, &v);
    if (err)
      snprintf(msg, sizeof msg, "%s", ax_errmsg());
    axi_owned_settle(rc, e, err, err ? msg : NULL, v, NULL, NULL);
  }
  *out = r;
  return AX_OK;
}

static int create_remote(ax_node *n, const char *to, int mode, const char *fn,
                         const ax_values *args, const char *cfg, ax_device dev,
                         const ax_call_opts *opts, ax_rref **out) {
  axi_rctx *rc = axi_rctx_get();
  if (!rc || rc->node != n)
    return ax_seterr(AX_ESTATE, "rref: node not initialised");
  if (!to || !fn)
    return ax_seterr(AX_EINVAL, "rref: bad arguments");
  if (strlen(to) >= AXI_NAME_MAX)
    return ax_seterr(AX_EINVAL, "rref: node name %s too long", to);
  if (!strcmp(to, rc->name))
    return create_local(rc, mode, fn, args, cfg, dev, opts, out);
  ax_values *a = ax_values_new();
  uint64_t id = axi_rref_new_id(rc), fork = axi_rref_new_id(rc);
  int err = a ? AX_OK : AX_ENOMEM;
  if (err == AX_OK) {
    ax_values_add_i64(a, (int64_t)id);
    ax_values_add_i64(a, (int64_t)fork);
    ax_values_add_i64(a, mode);
    ax_values_add_str(a, fn);
    if (mode) {
      char ds[32];
      ax_values_add_str(a, cfg ? cfg : "");
      ax_values_add_str(a, ax_device_str(dev, ds, sizeof ds));
    } else {
      err = ax_values_append(a, args);
    }
  }
  ax_future *created = ax_future_new(), *f = NULL;
  if (err == AX_OK && !created)
    err = AX_ENOMEM;
  if (err == AX_OK) {
    ax_call_opts o = opts ? *opts : (ax_call_opts){0};
    o.autograd_ctx = axi_ctx_of(opts);
    err = ax_rpc_async(n, to, "axon.rref.create", a, &o, &f);
  }
  ax_values_free(a);
  if (err != AX_OK) {
    ax_future_release(created);
    return err;
  }
  pthread_mutex_lock(&rc->mu);
  ax_rref *u =
      axi_user_new(rc, id, fork, mode ? AX_RREF_OBJECT : AX_RREF_VALUE, to);
  if (u) {
    u->created = created;
    u->busy++;
    snprintf(u->parent, sizeof u->parent, "%s", to);
  }
  pthread_mutex_unlock(&rc->mu);
  if (!u) { /* the owner then keeps the value until its node shuts down */
    ax_future_release(created);
    ax_future_release(f);
    return ax_seterr(AX_ENOMEM, "rref: no memory");
  }
  if (ax_future_on_done(f, on_create_reply, u) != AX_OK)
    on_create_reply(f, u); /* never: on_done fails only without memory */
  *out = u;
  return AX_OK;
}

int ax_remote(ax_node *n, const char *to, const char *fn, const ax_values *args,
              const ax_call_opts *opts, ax_rref **out) {
  return create_remote(n, to, 0, fn, args, NULL, AX_CPU, opts, out);
}

int ax_remote_object(ax_node *n, const char *to, const char *kind,
                     const char *config, ax_device dev,
                     const ax_call_opts *opts, ax_rref **out) {
  return create_remote(n, to, 1, kind, NULL, config, dev, opts, out);
}

int ax_rref_own_object(ax_node *n, const ax_robj_kind *kind, void *obj,
                       ax_rref **out) {
  axi_rctx *rc = axi_rctx_get();
  if (!rc || rc->node != n || !kind || !obj)
    return ax_seterr(AX_EINVAL, "rref: bad arguments");
  uint64_t id = axi_rref_new_id(rc);
  pthread_mutex_lock(&rc->mu);
  axi_owned *e = axi_owned_find(rc, id, 1);
  ax_rref *r = NULL;
  if (e) {
    e->type = AX_RREF_OBJECT;
    e->state = AXI_OWN_READY;
    e->kind = kind;
    e->obj = obj;
    r = axi_owner_handle(rc, e);
  }
  pthread_mutex_unlock(&rc->mu);
  if (!r)
    return ax_seterr(AX_ENOMEM, "rref: no memory");
  *out = r;
  return AX_OK;
}

/* ---- using an RRef ------------------------------------------------------- */
static int stored_error(ax_rref *r) {
  if (r->is_owner || !r->created || !ax_future_is_done(r->created) ||
      r->err == AX_OK)
    return AX_OK;
  return ax_seterr(r->err, "%s", r->errmsg ? r->errmsg : ax_strerror(r->err));
}

int ax_rref_wait_created(ax_rref *r, int64_t timeout_ms) {
  if (!r)
    return ax_seterr(AX_EINVAL, "rref: NULL");
  if (r->is_owner) {
    pthread_mutex_lock(&r->rc->mu);
    int st = r->entry->state, err = r->entry->err;
    pthread_mutex_unlock(&r->rc->mu);
    return st == AXI_OWN_ERROR ? err : AX_OK;
  }
  if (r->created) {
    int err = ax_future_wait(r->created, timeout_ms);
    if (err == AX_ETIMEOUT && !ax_future_is_done(r->created))
      return ax_seterr(AX_ETIMEOUT, "rref: creation not finished");
  }
  return stored_error(r);
}

/* The owner's entry of r if it is ready and of `type` (*e set, rc->mu
 * held on success and released on failure). */
static int local_entry(ax_rref *r, ax_rref_type type, axi_owned **e) {
  if (!r || !r->is_owner)
    return ax_seterr(AX_ESTATE, "rref: not the owner");
  pthread_mutex_lock(&r->rc->mu);
  *e = r->entry;
  int err = (*e)->state == AXI_OWN_READY   ? AX_OK
            : (*e)->state == AXI_OWN_ERROR ? (*e)->err
                                           : AX_ESTATE;
  if (err == AX_OK && (ax_rref_type)(*e)->type != type)
    err = AX_EUNSUPPORTED;
  if (err != AX_OK) {
    pthread_mutex_unlock(&r->rc->mu);
    return ax_seterr(err, "rref: no local %s",
                     type == AX_RREF_VALUE ? "value" : "object");
  }
  return AX_OK;
}

int ax_rref_local_value(ax_rref *r, const ax_values **out) {
  axi_owned *e;
  AX_TRY(local_entry(r, AX_RREF_VALUE, &e));
  *out = e->vals;
  pthread_mutex_unlock(&r->rc->mu);
  return AX_OK;
}

int ax_rref_local_object(ax_rref *r, void **obj) {
  axi_owned *e;
  AX_TRY(local_entry(r, AX_RREF_OBJECT, &e));
  *obj = e->obj;
  pthread_mutex_unlock(&r->rc->mu);
  return AX_OK;
}

int ax_rref_to_here(ax_node *n, ax_rref *r, int64_t timeout_ms,
                    uint64_t autograd_ctx, ax_values **out) {
  axi_rctx *rc = axi_rctx_get();
  if (!rc || rc->node != n || !r || !out)
    return ax_seterr(AX_EINVAL, "rref: bad arguments");
  if (timeout_ms < 0)
    return ax_seterr(AX_ETIMEOUT, "rref: to_here with no time left");
  if (timeout_ms == 0)
    timeout_ms = 60000;
  int64_t end = ax_clock_ms();
  end = end > INT64_MAX - timeout_ms ? INT64_MAX : end + timeout_ms;
  if (!r->is_owner && r->created) {
    AX_TRY(ax_rref_wait_created(r, timeout_ms));
  }
  if (r->type != AX_RREF_VALUE)
    return ax_seterr(AX_EUNSUPPORTED, "rref: to_here of an object");
  int64_t left = end - ax_clock_ms();
  if (left <= 0)
    return ax_seterr(AX_ETIMEOUT, "rref: to_here deadline passed");
  uint64_t ctx = autograd_ctx ? autograd_ctx : ax_autograd_ctx_current();
  ax_values *a = ax_values_new(), *raw = NULL;
  if (!a)
    return AX_ENOMEM;
  ax_values_add_i64(a, (int64_t)r->id);
  const char *keys[9];
  int64_t vals[9];
  ax_call_opts o = axi_opts_conf(NULL, r, keys, vals);
  o.timeout_ms = left;
  o.autograd_ctx = ctx;
  int err = ax_rpc_sync(n, r->owner, "axon.rref.fetch", a, &o, &raw);
  ax_values_free(a);
  if (err == AX_OK)
    err = axi_take_reply(rc, raw, ctx, r->owner, out); /* takes raw */
  else
    ax_values_free(raw);
  return err;
}

typedef struct wrap {
  axi_rctx *rc;
  ax_future *out;
  uint64_t ctx;
  char from[AXI_NAME_MAX];
} wrap;

static void on_call_reply(ax_future *f, void *user) {
  wrap *w = user;
  int err = ax_future_err(f);
  ax_values *v = NULL, *raw = err ? NULL : ax_future_take_values(f);
  if (err == AX_OK)
    err = axi_take_reply(w->rc, raw, w->ctx, w->from, &v); /* takes raw */
  ax_future_complete(w->out, err, v,
                     ax_future_err(f) ? ax_future_errmsg(f) : ax_errmsg());
  ax_future_release(w->out);
  ax_future_release(f);
  free(w);
}

/* [id, method, args..., bytes desc] for a call through r. */
static int call_args(axi_rctx *rc, ax_rref *r, const char *method,
                     const ax_values *args, uint64_t ctx, ax_values **out) {
  ax_values *a = ax_values_new();
  if (!a)
    return AX_ENOMEM;
  ax_values_add_i64(a, (int64_t)r->id);
  ax_values_add_str(a, method);
  int err = ax_values_append(a, args);
  void *desc = NULL;
  size_t len = 0;
  const ax_rref_grad_hooks *h = axi_grad_hooks();
  if (err == AX_OK && h && ctx && strcmp(r->owner, rc->name))
    err = h->send(rc->node, ctx, r->owner, a, 2, &desc, &len);
  if (err == AX_OK)
    err = ax_values_add_bytes(a, desc, len);
  free(desc);
  if (err != AX_OK) {
    ax_values_free(a);
    return err;
  }
  *out = a;
  return AX_OK;
}

/* The common start of a call through an RRef: checks the arguments and the
 * RRef's stored creation error, picks the autograd context and builds the
 * argument list (*a, caller frees). */
static int prepare_call(ax_node *n, ax_rref *r, const char *method,
                        const ax_values *args, const ax_call_opts *opts,
                        int has_out, axi_rctx **rc, uint64_t *ctx,
                        ax_values **a) {
  *rc = axi_rctx_get();
  if (!*rc || (*rc)->node != n || !r || !method || !has_out)
    return ax_seterr(AX_EINVAL, "rref: bad arguments");
  AX_TRY(stored_error(r));
  *ctx = axi_ctx_of(opts);
  return call_args(*rc, r, method, args, *ctx, a);
}

int ax_rref_rpc_async(ax_node *n, ax_rref *r, const char *method,
                      const ax_values *args, const ax_call_opts *opts,
                      ax_future **out) {
  axi_rctx *rc;
  uint64_t ctx;
  ax_values *a;
  AX_TRY(prepare_call(n, r, method, args, opts, out != NULL, &rc, &ctx, &a));
  wrap *w = calloc(1, sizeof *w);
  ax_future *res = ax_future_new(), *f = NULL;
  int err = (w && res) ? AX_OK : AX_ENOMEM;
  if (err == AX_OK) {
    const char *keys[9];
    int64_t vals[9];
    ax_call_opts o = axi_opts_conf(opts, r, keys, vals);
    o.autograd_ctx = ctx;
    err = ax_rpc_async(n, r->owner, "axon.rref.call", a, &o, &f);
  }
  ax_values_free(a);
  if (err != AX_OK) {
    free(w);
    ax_future_release(res);
    return err;
  }
  w->rc = rc;
  w->out = ax_future_retain(res);
  w->ctx = ctx;
  snprintf(w->from, sizeof w->from, "%s", r->owner);
  ax_future_on_done(f, on_call_reply, w);
  *out = res;
  return AX_OK;
}

int ax_rref_rpc_sync(ax_node *n, ax_rref *r, const char *method,
                     const ax_values *args, const ax_call_opts *opts,
                     ax_values **out) {
  ax_future *f;
  AX_TRY(ax_rref_rpc_async(n, r, method, args, opts, &f));
  int64_t t = (opts && opts->timeout_ms > 0) ? opts->timeout_ms : 60000;
  int err = ax_future_wait(f, t + 2000);
  if (err == AX_OK && out) {
    *out = ax_future_take_values(f);
    if (!*out)
      *out = ax_values_new();
  }
  ax_future_release(f);
  return err;
}

int ax_rref_remote(ax_node *n, ax_rref *r, const char *method,
                   const ax_values *args, const ax_call_opts *opts,
                   ax_rref **out) {
  axi_rctx *rc;
  uint64_t ctx;
  ax_values *a;
  AX_TRY(prepare_call(n, r, method, args, opts, out != NULL, &rc, &ctx, &a));
  ax_call_opts o = opts ? *opts : (ax_call_opts){0};
  o.autograd_ctx = ctx;
  int err;
  if (!strcmp(r->owner, rc->name)) {
    /* Local: run the call with rr.keep so its results stay unattached. */
    const char *keys[1] = {"rr.keep"};
    int64_t vals[1] = {1};
    o.nmeta = 1;
    o.meta_key = keys;
    o.meta_val = vals;
    err = create_local(rc, 0, "axon.rref.call", a, NULL, AX_CPU, &o, out);
  } else {
    err = ax_remote(n, r->owner, "axon.rref.call", a, &o, out);
  }
  ax_values_free(a);
  return err;
}
