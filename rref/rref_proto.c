/* Owner-side protocol handlers: fork, accept, delete, create and fetch. The
 * waiters that hold calls on values still being created are in
 * rref_wait.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/rpc/builtin-impl.h"
#include "axon/rref/rref-impl.h"

static int caller_rank(ax_call_ctx *ctx) {
  int r = -1;
  ax_node_rank_of(ax_call_node(ctx), ax_call_caller(ctx), &r);
  return r;
}

static int h_fork(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                  void *user) {
  axi_rctx *rc = axi_rctx_get();
  int64_t id, fork;
  AX_TRY(ax_values_get_i64(args, 0, &id));
  AX_TRY(ax_values_get_i64(args, 1, &fork));
  int64_t grace;
  int err = AX_OK;
  pthread_mutex_lock(&rc->mu);
  axi_owned *e = axi_owned_find(rc, (uint64_t)id, 0);
  if (!e && (err = axi_absent_verdict(rc, (uint64_t)id, 0, &grace)) == AX_OK)
    e = axi_owned_find(rc, (uint64_t)id, 1); /* the create is on its way */
  if (e)
    axi_owned_add_fork(e, (uint64_t)fork, caller_rank(ctx));
  pthread_mutex_unlock(&rc->mu);
  if (err != AX_OK)
    return err;
  return e ? AX_OK : ax_seterr(AX_ENOMEM, "rref: no memory");
}

static int h_accept(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                    void *user) {
  axi_rctx *rc = axi_rctx_get();
  int64_t fork, child = 0;
  AX_TRY(ax_values_get_i64(args, 0, &fork));
  if (ax_values_count(args) > 1)
    AX_TRY(ax_values_get_i64(args, 1, &child));
  pthread_mutex_lock(&rc->mu);
  if (fork == 0) /* [0, child]: the holder of a fork this owner made */
    axi_fork_holder(rc, (uint64_t)child, caller_rank(ctx));
  for (ax_rref *u = rc->users; fork && u; u = u->next)
    if (u->fork_id == (uint64_t)fork) {
      axi_child_accepted(rc, u, (uint64_t)child);
      break;
    }
  pthread_mutex_unlock(&rc->mu);
  return AX_OK;
}

static int h_delete(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                    void *user) {
  axi_rctx *rc = axi_rctx_get();
  int64_t id, fork;
  AX_TRY(ax_values_get_i64(args, 0, &id));
  AX_TRY(ax_values_get_i64(args, 1, &fork));
  axi_owned *dead = NULL;
  pthread_mutex_lock(&rc->mu);
  axi_owned *e = axi_owned_find(rc, (uint64_t)id, 0);
  if (!e || !axi_owned_del_fork(e, (uint64_t)fork))
    axi_tomb_add(rc, (uint64_t)id, (uint64_t)fork);
  else
    dead = axi_owned_maybe_unlink(rc, e);
  pthread_mutex_unlock(&rc->mu);
  axi_owned_free(dead);
  return AX_OK;
}

/* ---- creation ------------------------------------------------------------ */
typedef struct creating {
  axi_rctx *rc;
  axi_owned *e;
  ax_future *reply;
} creating;

static void reply_outcome(ax_future *reply, int err, const char *msg) {
  ax_values *v = ax_values_new();
  if (v) {
    ax_values_add_i64(v, err);
    ax_values_add_str(v, msg ? msg : "");
  }
  ax_future_complete(reply, v ? AX_OK : AX_ENOMEM, v, "rref: no memory");
}

static void release_hold(axi_rctx *rc, axi_owned *e) {
  pthread_mutex_lock(&rc->mu);
  e->local_refs--;
  axi_owned *dead = axi_owned_maybe_unlink(rc, e);
  pthread_mutex_unlock(&rc->mu);
  axi_owned_free(dead);
}

static void on_created(ax_future *f, void *user) {
  creating *c = user;
  int err = ax_future_err(f);
  const char *msg = err ? ax_future_errmsg(f) : NULL;
  ax_values *v = err ? NULL : ax_future_take_values(f);
  if (!err && !v)
    v = ax_values_new();
  axi_owned_settle(c->rc, c->e, err, msg, v, NULL, NULL);
  reply_outcome(c->reply, err, msg);
  ax_future_release(c->reply);
  ax_future_release(f);
  release_hold(c->rc, c->e);
  free(c);
}

/* Takes the entry for a creation: registers the creator's fork (unless its
 * delete came first) and holds the entry until the value is settled. */
static axi_owned *create_begin(axi_rctx *rc, uint64_t id, uint64_t fork,
                               int type, int holder) {
  pthread_mutex_lock(&rc->mu);
  axi_hw_note(rc, id);
  axi_owned *e = axi_owned_find(rc, id, 1);
  if (e) {
    e->type = type;
    e->local_refs++;
    if (fork && !axi_tomb_take(rc, id, fork))
      axi_owned_add_fork(e, fork, holder);
  }
  pthread_mutex_unlock(&rc->mu);
  return e;
}

/* args: [id, fork, mode, fn|kind, ...]; mode 0: fn's arguments follow;
 * mode 1: [config, device]. Replies [err, msg] once the value is settled. */
static int h_create(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                    void *user) {
  axi_rctx *rc = axi_rctx_get();
  int64_t id, fork, mode;
  const char *fn;
  AX_TRY(ax_values_get_i64(args, 0, &id));
  AX_TRY(ax_values_get_i64(args, 1, &fork));
  AX_TRY(ax_values_get_i64(args, 2, &mode));
  AX_TRY(ax_values_get_str(args, 3, &fn));
  int64_t delay = __atomic_load_n(&rc->create_delay_ms, __ATOMIC_RELAXED);
  if (delay > 0) { /* test hook: the create "arrives" late */
    struct timespec ts = {delay / 1000, (delay % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  axi_owned *e =
      create_begin(rc, (uint64_t)id, (uint64_t)fork,
                   mode ? AX_RREF_OBJECT : AX_RREF_VALUE, caller_rank(ctx));
  if (!e)
    return ax_seterr(AX_ENOMEM, "rref: no memory");
  if (mode == 1) {
    const char *cfg, *dev_s;
    ax_device dev;
    void *obj = NULL;
    const ax_robj_kind *k = axi_kind_find(rc, fn);
    int err = ax_values_get_str(args, 4, &cfg);
    if (err == AX_OK)
      err = ax_values_get_str(args, 5, &dev_s);
    if (err == AX_OK)
      err = ax_device_parse(dev_s, &dev);
    if (err == AX_OK && !k)
      err = ax_seterr(AX_ENOTFOUND, "rref: no object kind %s on %s", fn,
                      rc->name);
    if (err == AX_OK)
      err = axi_kind_create(k, rc->node, cfg, dev, &obj);
    char msg[512];
    snprintf(msg, sizeof msg, "%s: %s", rc->name, err ? ax_errmsg() : "");
    axi_owned_settle(rc, e, err, err ? msg : NULL, NULL, err ? NULL : k, obj);
    release_hold(rc, e);
    ax_values_add_i64(out, err);
    ax_values_add_str(out, err ? msg : "");
    return AX_OK;
  }
  ax_values_view view; /* the function's arguments, borrowed from args */
  const ax_values *rest =
      ax_values_view_range(args, 4, ax_values_count(args), &view);
  creating *c = calloc(1, sizeof *c);
  ax_future *reply = ax_future_new(), *f = NULL;
  int err = (rest && c && reply) ? AX_OK : AX_ENOMEM;
  if (err == AX_OK) {
    const char *keys[1] = {"rr.keep"};
    int64_t vals[1] = {1};
    ax_call_opts o = {.timeout_ms = ax_call_remaining_ms(ctx),
                      .autograd_ctx = ax_call_autograd_ctx(ctx),
                      .nmeta = 1,
                      .meta_key = keys,
                      .meta_val = vals,
                      .on_behalf_of = ax_call_caller(ctx)};
    if (o.timeout_ms <= 0)
      o.timeout_ms = 1;
    err = ax_rpc_async(rc->node, rc->name, fn, rest, &o, &f);
  }
  if (err != AX_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s: %s", rc->name, ax_errmsg());
    axi_owned_settle(rc, e, err, msg, NULL, NULL, NULL);
    release_hold(rc, e);
    free(c);
    ax_future_release(reply);
    ax_values_add_i64(out, err);
    ax_values_add_str(out, msg);
    return AX_OK;
  }
  c->rc = rc;
  c->e = e;
  c->reply = reply;
  ax_call_defer(ctx, reply);
  ax_future_on_done(f, on_created, c);
  return AX_OK;
}

/* ---- fetch --------------------------------------------------------------- */
/* args: [id]. Replies [values..., bytes autograd descriptor]. */
static int h_fetch(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                   void *user) {
  axi_rctx *rc = axi_rctx_get();
  int64_t id;
  AX_TRY(ax_values_get_i64(args, 0, &id));
  int64_t grace;
  int err = AX_OK;
  pthread_mutex_lock(&rc->mu);
  axi_owned *e = axi_owned_lookup(rc, (uint64_t)id, ctx, &grace, &err);
  if (!e) {
    pthread_mutex_unlock(&rc->mu);
    return err;
  }
  if (e->state == AXI_OWN_PENDING) {
    err = axi_rref_wait_entry(rc, e, ctx, "axon.rref.fetch", args,
                              caller_rank(ctx), grace);
    pthread_mutex_unlock(&rc->mu);
    return err;
  }
  err = e->state == AXI_OWN_ERROR ? e->err : AX_OK;
  if (err != AX_OK) {
    err = ax_seterr(err, "%s", e->msg ? e->msg : ax_strerror(err));
  } else if (e->type != AX_RREF_VALUE) {
    err = ax_seterr(AX_EUNSUPPORTED, "rref: to_here of an object");
  } else {
    err = ax_values_append(out, e->vals);
  }
  pthread_mutex_unlock(&rc->mu);
  if (err != AX_OK)
    return err;
  void *desc = NULL;
  size_t len = 0;
  const ax_rref_grad_hooks *h = axi_grad_hooks();
  const char *to = ax_call_caller(ctx);
  uint64_t agc = ax_call_autograd_ctx(ctx);
  if (h && agc && strcmp(to, rc->name))
    err = h->send(rc->node, agc, to, out, 0, &desc, &len);
  if (err == AX_OK)
    err = ax_values_add_bytes(out, desc, len);
  free(desc);
  return err;
}

int axi_rref_register_proto(ax_node *n) {
  AX_TRY(axi_register(n, "axon.rref.fork", h_fork, NULL));
  AX_TRY(axi_register(n, "axon.rref.accept", h_accept, NULL));
  AX_TRY(axi_register(n, "axon.rref.delete", h_delete, NULL));
  AX_TRY(axi_register(n, "axon.rref.create", h_create, NULL));
  return axi_register(n, "axon.rref.fetch", h_fetch, NULL);
}
