/* The pipeline stage host's backward: replay, per-context gradients, weight
 * stashing and the update rule of each mode. Contract in stage_host.h. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend-impl.h"
#include "runtime/dist/autograd.h"
#include "runtime/pipeline/schedule.h"
#include "runtime/pipeline/stage_events.h"
#include "runtime/pipeline/stage_host-impl.h"

/* ---- backward and update ------------------------------------------------------- */
static pstate *state_take(phost *h, long batch, int micro) {
  for (pstate **pp = &h->states; *pp; pp = &(*pp)->next)
    if ((*pp)->batch == batch && (*pp)->micro == micro) {
      pstate *st = *pp;
      *pp = st->next;
      return st;
    }
  return NULL;
}

/* Before the live weights change, states whose forward used them move to
 * one separate copy (the stashed version). s->mu held. */
static int stash_live(phost *h) {
  ax_tensor *live = h->s->net->params, *copy = NULL;
  for (pstate *st = h->states; st; st = st->next) {
    if (st->ver != live)
      continue;
    if (!copy) {
      if (!(copy = ax_tensor_like(live)))
        return AX_ENOMEM;
      AX_TRY(ax_tensor_copy(copy, live));
    }
    ax_tensor_release(st->ver);
    st->ver = ax_tensor_retain(copy);
  }
  ax_tensor_release(copy);
  return AX_OK;
}

/* mark: [start, replay done, backward done, update done] (us). */
static int backward_locked(phost *h, pstate *st, const ax_tlist *dy,
                           ax_tensor *g, int step, ax_tlist *din,
                           int64_t mark[4]) {
  axd_stage *s = h->s;
  ax_net *net = s->net;
  ax_exec ex = ax_net_exec(net, 1);
  ex.params = st->ver ? st->ver : net->params;
  ex.seed = st->seed;
  int err = AX_OK;
  mark[0] = ax_trace_now_us();
  if (!st->slot) { /* replay: recompute the forward without new statistics */
    ax_tlist y = {0};
    if (!(st->slot = ax_slot_new()))
      return AX_ENOMEM;
    ex.update_stats = 0;
    err = ax_forward(net->root, &ex, st->slot, &st->input, &y);
    ax_tlist_clear(&y);
  }
  mark[1] = ax_trace_now_us();
  ex.grads = g;
  ex.need_dx = !s->is_first;
  if (err == AX_OK)
    err = ax_backward(net->root, &ex, st->slot, dy, din);
  ax_backend *be = ax_backend_of(s->dev);
  int async = ax_pipe_async_update(h->mode);
  if (err == AX_OK && !async && g != net->grads)
    err = AX_K(be, axpby, net->n_params, 1.0f, ax_f32(g), 1.0f,
               ax_f32(net->grads));
  mark[2] = mark[3] = ax_trace_now_us();
  if (err == AX_OK && step) {
    if (!s->opt)
      return ax_seterr(AX_ESTATE, "pipe.stage: no optimizer (setup)");
    err = stash_live(h);
    if (err == AX_OK)
      err = ax_optim_step(s->opt, net->params, async ? g : net->grads);
    if (err == AX_OK && (!async || g == net->grads))
      err = ax_net_zero_grad(net);
    mark[3] = ax_trace_now_us();
  }
  return err;
}

int axp_host_bwd(ax_call_ctx *cc, void *obj, const ax_values *args,
                 ax_values *out) {
  phost *h = obj;
  axd_stage *s = h->s;
  int64_t t0 = ax_trace_now_us(), batch, micro, step;
  AX_TRY(ax_values_get_i64(args, 0, &batch));
  AX_TRY(ax_values_get_i64(args, 1, &micro));
  AX_TRY(ax_values_get_i64(args, 2, &step));
  AX_TRY(axp_inbox_error(&h->in));
  pthread_mutex_lock(&s->mu);
  pstate *st = state_take(h, batch, (int)micro);
  pthread_mutex_unlock(&s->mu);
  if (!st)
    return ax_seterr(AX_ENOTFOUND, "pipe.stage %d: backward of batch %lld/%lld "
                     "without its forward", s->index, (long long)batch,
                     (long long)micro);
  ax_tlist dy = {0}, din = {0};
  int err = AX_OK;
  if (h->is_last) {
    dy.n = st->dlogits.n;
    for (int i = 0; i < dy.n; i++)
      dy.t[i] = ax_tensor_retain(st->dlogits.t[i]);
  } else {
    err = axp_inbox_take(&h->in, s->node,
                         h->next ? ax_rref_owner(h->next) : NULL,
                         AXP_GRADIENTS, (long)batch, (int)micro,
                         axp_wait_ms(cc), &dy);
  }
  int replay = st->slot == NULL;
  int64_t mark[4] = {0, 0, 0, 0};
  int live = 0;
  uint64_t ctx = ax_autograd_ctx_current();
  ax_tensor *g = NULL;
  if (err == AX_OK && ctx)
    err = ax_dist_grads(s->node, ctx, s->key, s->net->n_params, s->dev, &g);
  else if (err == AX_OK)
    g = ax_tensor_retain(s->net->grads);
  pthread_mutex_lock(&s->mu);
  if (err == AX_OK)
    err = backward_locked(h, st, &dy, g, step != 0, &din, mark);
  axp_state_free(st);
  if (err == AX_OK)
    err = axp_host_report(h, t0, out);
  for (pstate *o = h->states; o; o = o->next)
    live++;
  pthread_mutex_unlock(&s->mu);
  if (err == AX_OK) {
    if (replay)
      axp_event_compute(h->tr, s->index, "recompute", (long)batch, (int)micro,
                        mark[0], mark[1], -1);
    axp_event_compute(h->tr, s->index, "backward", (long)batch, (int)micro,
                      mark[1], mark[2], live);
    if (step)
      axp_event_compute(h->tr, s->index, "optim", (long)batch, (int)micro,
                        mark[2], mark[3], -1);
  }
  if (err == AX_OK && !s->is_first)
    err = axp_push(s->node, &h->in, h->prev, AXP_GRADIENTS, (long)batch,
                   (int)micro, &din);
  ax_tensor_release(g);
  ax_tlist_clear(&dy);
  ax_tlist_clear(&din);
  return err;
}

