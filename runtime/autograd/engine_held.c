/* Held functions of the distributed backward: their owner takes the
 * summed output gradients (ax_dist_take_grads) and passes its input
 * gradients on (ax_dist_pass_grads) through engine.c's delivery. */
#include <stdio.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "axon/runtime/autograd/autograd-impl.h"

/* ---- held functions ------------------------------------------------------ */
/* ax_dist_take_grads' look at its function (d->mu held; axi_ag_wait). */
typedef struct grads_look {
  uint64_t ctx, fid;
  ax_tlist *dout;
  char consumer[AXD_NAME]; /* the node that owes the gradients */
  int received, expected;
} grads_look;

static int grads_ready(axi_ag_state *d, void *arg) {
  grads_look *g = arg;
  axi_ag_ctx *c = axi_ag_ctx_find(d, g->ctx, 0);
  axi_ag_fn *fn = c ? axi_ag_fn_find(c, g->fid) : NULL;
  if (!fn || !fn->held)
    return -ax_seterr(AX_ESTALE, "dist: no held function %llu in context %llx",
                      (unsigned long long)g->fid, (unsigned long long)g->ctx);
  if (fn->ran)
    return -ax_seterr(AX_ESTATE, "dist: gradients of function %llu taken twice",
                      (unsigned long long)g->fid);
  g->received = fn->received;
  g->expected = fn->expected;
  snprintf(g->consumer, sizeof g->consumer, "%s", fn->consumer);
  if (fn->received < fn->expected)
    return 0;
  fn->ran = 1;
  g->dout->n = fn->n_out;
  for (int k = 0; k < fn->n_out; k++) {
    g->dout->t[k] = fn->dout[k]; /* the context's reference moves */
    fn->dout[k] = NULL;
  }
  return 1;
}

int ax_dist_take_grads(ax_node *n, uint64_t ctx, uint64_t fid,
                       int64_t timeout_ms, ax_tlist *dout) {
  axi_ag_state *d = axi_ag_get();
  memset(dout, 0, sizeof *dout);
  if (!d || d->node != n)
    return ax_seterr(AX_ESTATE, "dist: node not initialised");
  int64_t tmo = timeout_ms > 0 ? timeout_ms : AXD_CALL_MS;
  grads_look g = {.ctx = ctx, .fid = fid, .dout = dout};
  pthread_mutex_lock(&d->mu);
  int err = axi_ag_wait(d, ax_clock_ms() + tmo, g.consumer, grads_ready, &g);
  pthread_mutex_unlock(&d->mu);
  if (err == AX_ETIMEOUT)
    ax_seterr(err, "dist: %d of %d gradients for function %llu in %lld ms",
              g.received, g.expected, (unsigned long long)fid, (long long)tmo);
  else if (err == AX_EPEERDOWN)
    ax_seterr(err, "dist: %s is down; no gradient for function %llu",
              g.consumer, (unsigned long long)fid);
  return err;
}

int ax_dist_pass_grads(ax_node *n, uint64_t ctx, uint64_t fid,
                       const ax_tlist *din, ax_future **done) {
  axi_ag_state *d = axi_ag_get();
  if (done)
    *done = NULL;
  if (!d || d->node != n || !din)
    return ax_seterr(AX_EINVAL, "dist: bad arguments to pass_grads");
  axi_ag_src in[AX_TLIST_MAX];
  int n_in = 0;
  pthread_mutex_lock(&d->mu);
  axi_ag_ctx *c = axi_ag_ctx_find(d, ctx, 0);
  axi_ag_fn *fn = c ? axi_ag_fn_find(c, fid) : NULL;
  if (fn) {
    n_in = fn->n_in;
    memcpy(in, fn->in, sizeof in);
    c->busy++; /* local producers stay valid while we deliver */
  }
  pthread_mutex_unlock(&d->mu);
  if (!fn)
    return ax_seterr(AX_ESTALE, "dist: no function %llu in context %llx",
                     (unsigned long long)fid, (unsigned long long)ctx);
  axi_ag_agg *a = axi_ag_agg_new(0);
  int err = a ? AX_OK : AX_ENOMEM;
  /* Every input with a source reports, NULL meaning "no gradient" (the
   * producer counts it all the same; see run_fn). */
  for (int i = 0; err == AX_OK && i < n_in; i++) {
    ax_tensor *g = i < din->n ? din->t[i] : NULL;
    if (in[i].kind == AXD_SRC_LOCAL)
      err = axi_ag_deliver(d, ctx, in[i].fn, in[i].k, g, a);
    else if (in[i].kind == AXD_SRC_REMOTE)
      err = axi_ag_send_grad(d, ctx, &in[i], g, a);
  }
  pthread_mutex_lock(&d->mu);
  int free_it = --c->busy == 0 && c->released;
  pthread_mutex_unlock(&d->mu);
  if (free_it)
    axi_ag_ctx_free(c);
  if (!a)
    return err;
  char msg[256];
  snprintf(msg, sizeof msg, "%s", err ? ax_errmsg() : "");
  ax_future *f = axi_ag_agg_finish(a, err, msg);
  if (err == AX_OK && done)
    *done = f;
  else
    ax_future_release(f);
  return err == AX_OK ? AX_OK : ax_seterr(err, "%s", msg);
}
