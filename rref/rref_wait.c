/* Waiters: calls that reached the owner of a value still being created
 * (a fetch or a call that overtook its creation) wait here, deferred, and
 * are re-issued locally once the value settles, or answered at their
 * deadline by the protocol thread (axi_waiters_expire). */
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "axon/rref/rref-impl.h"

static void waiter_free(axi_waiter *w) {
  ax_future_release(w->reply);
  ax_values_free(w->args);
  free(w->fn);
  for (int i = 0; i < w->nmeta; i++)
    free(w->meta_key[i]);
  free(w);
}

int axi_rref_wait_entry(axi_rctx *rc, axi_owned *e, ax_call_ctx *ctx,
                        const char *fn, const ax_values *args, int64_t caller,
                        int64_t grace_ms) {
  axi_waiter *w = calloc(1, sizeof *w);
  if (!w || !(w->reply = ax_future_new()) || !(w->fn = strdup(fn)) ||
      !(w->args = ax_values_clone(args))) {
    if (w) {
      ax_future_release(w->reply);
      free(w->fn);
      free(w);
    }
    return ax_seterr(AX_ENOMEM, "rref: no memory");
  }
  w->ctx = ax_call_autograd_ctx(ctx);
  w->caller_rank = caller;
  for (int i = 0; i < ax_call_meta_count(ctx) && w->nmeta < 8; i++) {
    const char *k;
    int64_t v;
    if (ax_call_meta_at(ctx, i, &k, &v) != AX_OK ||
        !(w->meta_key[w->nmeta] = strdup(k))) {
      waiter_free(w);
      return ax_seterr(AX_ENOMEM, "rref: no memory");
    }
    w->meta_val[w->nmeta++] = v;
  }
  int64_t left = ax_call_remaining_ms(ctx);
  if (left < 0)
    left = 0;
  w->expire_err = AX_ETIMEOUT;
  if (grace_ms >= 0 && grace_ms < left) { /* may never be created */
    left = grace_ms;
    w->expire_err = AX_ESTALE;
  }
  w->deadline_ms = ax_clock_ms() + left;
  ax_call_defer(ctx, w->reply);
  w->next = e->waiters;
  e->waiters = w;
  return AX_OK;
}

static void on_rerun(ax_future *f, void *user) {
  ax_future *reply = user;
  int err = ax_future_err(f);
  ax_future_complete(reply, err, err ? NULL : ax_future_take_values(f),
                     ax_future_errmsg(f));
  ax_future_release(reply);
  ax_future_release(f);
}

void axi_waiters_run(axi_rctx *rc, axi_waiter *w, int err, const char *msg) {
  for (axi_waiter *nx; w; w = nx) {
    nx = w->next;
    int rc2 = err;
    ax_future *f = NULL;
    if (err == AX_OK) {
      int64_t left = w->deadline_ms - ax_clock_ms();
      const char *from = NULL;
      if (ax_node_member(rc->node, (int)w->caller_rank, &from) != AX_OK)
        from = NULL; /* not a member (yet): the call reads as our own */
      ax_clearerr();
      ax_call_opts o = {.timeout_ms = left > 0 ? left : 1,
                        .autograd_ctx = w->ctx,
                        .nmeta = w->nmeta,
                        .meta_key = (const char *const *)w->meta_key,
                        .meta_val = w->meta_val,
                        .on_behalf_of = from};
      rc2 = ax_rpc_async(rc->node, rc->name, w->fn, w->args, &o, &f);
      if (rc2 == AX_OK &&
          ax_future_on_done(f, on_rerun, ax_future_retain(w->reply)) != AX_OK) {
        ax_future_release(w->reply);
        ax_future_release(f);
        rc2 = AX_ENOMEM;
      }
      msg = rc2 ? ax_errmsg() : NULL;
    }
    if (rc2 != AX_OK)
      ax_future_complete(w->reply, rc2, NULL, msg);
    waiter_free(w);
  }
}

void axi_waiters_expire(axi_rctx *rc, int64_t now) {
  axi_waiter *expired = NULL;
  axi_owned *gone = NULL;
  pthread_mutex_lock(&rc->mu);
  for (axi_owned *e = rc->owned, *enx; e; e = enx) {
    enx = e->next;
    for (axi_waiter **pp = &e->waiters; *pp;) {
      axi_waiter *w = *pp;
      if (w->deadline_ms <= now) {
        *pp = w->next;
        w->next = expired;
        expired = w;
      } else {
        pp = &w->next;
      }
    }
    axi_owned *d = axi_owned_maybe_unlink(rc, e);
    if (d) {
      d->next = gone;
      gone = d;
    }
  }
  pthread_mutex_unlock(&rc->mu);
  for (axi_waiter *w = expired, *nx; w; w = nx) {
    nx = w->next;
    ax_future_complete(w->reply, w->expire_err, NULL,
                       w->expire_err == AX_ESTALE
                           ? "rref: unknown id (never created here)"
                           : "rref: value not created before the deadline");
    waiter_free(w);
  }
  for (axi_owned *e = gone, *nx; e; e = nx) {
    nx = e->next;
    axi_owned_free(e);
  }
}

void axi_owned_settle(axi_rctx *rc, axi_owned *e, int err, const char *msg,
                      ax_values *vals, const ax_robj_kind *kind, void *obj) {
  pthread_mutex_lock(&rc->mu);
  axi_waiter *w = e->waiters;
  e->waiters = NULL;
  e->err = err;
  e->msg = msg ? strdup(msg) : NULL;
  e->vals = vals;
  e->kind = kind;
  e->obj = obj;
  e->state = err == AX_OK ? AXI_OWN_READY : AXI_OWN_ERROR;
  pthread_mutex_unlock(&rc->mu);
  axi_waiters_run(rc, w, err, msg);
}
