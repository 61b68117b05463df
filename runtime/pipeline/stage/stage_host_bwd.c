/* The pipeline stage host's backward: replay, per-context gradients, weight
 * stashing and the update rule of each mode. Contract in stage_host.h. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/backend-impl.h"
#include "axon/models/loss.h"
#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/pipeline/schedule/mode.h"
#include "axon/runtime/pipeline/stage/stage_host-impl.h"
#include "axon/runtime/pipeline/trace/stage_events.h"

/* ---- backward and update ------------------------------------------------- */

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

/* Double-buffered modes: before STEP(t) changes the live weights, they
 * become the shadow that every forward of batch t+1 uses (and the stash of
 * the states that used them). s->mu held. */
static int shadow_live(phost *h, long t) {
  ax_tensor *live = h->s->net->params, *copy = ax_tensor_like(live);
  if (!copy)
    return AX_ENOMEM;
  int err = ax_tensor_copy(copy, live);
  if (err != AX_OK) {
    ax_tensor_release(copy);
    return err;
  }
  for (pstate *st = h->states; st; st = st->next)
    if (st->ver == live) {
      ax_tensor_release(st->ver);
      st->ver = ax_tensor_retain(copy);
    }
  ax_tensor_release(h->shadow);
  h->shadow = copy;
  h->shadow_for = t + 1;
  return AX_OK;
}

/* ---- taken gradients and their sum in micro-batch order ------------------ */
/* The sum's buffers (sum_tree.h) are the units' gradient buffers: acc +=
 * x on the stage's device, and x goes back to the pool once added. */
static int grads_add(void *user, void *acc, void *x) {
  axi_ag_stage *s = user;
  return AX_K(ax_backend_of(s->dev), axpby, s->net->n_params, 1.0f,
              ax_f32((ax_tensor *)x), 1.0f, ax_f32((ax_tensor *)acc));
}

static void grads_drop(void *user, void *x) {
  ax_dist_grads_recycle(((axi_ag_stage *)user)->node, x);
}

/* Adds the taken gradients of batch t to the sum while the next
 * micro-batch in order is there, so the sum takes them as leaves 0, 1,
 * ..., U-1 of the setup's order (a fixed tree, or left to right) and keeps
 * only the partial sums that order needs. s->mu held. */
static int fold(phost *h, long t) {
  axi_ag_stage *s = h->s;
  if (h->sum.leaves && h->sum_batch != t)
    return ax_seterr(AX_ESTATE,
                     "axon.pipe.stage %d: gradients of batch %ld not "
                     "stepped before batch %ld",
                     s->index, h->sum_batch, t);
  for (;;) {
    pgrad **pp = &h->grads;
    while (*pp && !((*pp)->batch == t && (*pp)->micro == h->sum.leaves))
      pp = &(*pp)->next;
    if (!*pp)
      return AX_OK;
    pgrad *g = *pp;
    *pp = g->next;
    if (!h->sum.leaves) { /* micro-batch 0 starts the sum */
      ax_sum_tree_init(&h->sum, h->sum_order, grads_add, grads_drop, s);
      h->sum_batch = t;
    }
    ax_tensor *x = g->g;
    free(g);
    int err = ax_sum_tree_push(&h->sum, x);
    if (err != AX_OK) { /* the batch's step fails: it lacks this sum */
      ax_sum_tree_clear(&h->sum);
      return err;
    }
  }
}

/* STEP of batch t over `units` units: the sum of their gradients, in the
 * setup's order over micro-batches 0 .. units-1, then the update
 * (stage_update.c: combined with the other replicas' in the same order,
 * its tied copies' summed; maybe pending until the ties' exchanges are
 * in); states still using the live weights get their stashed copy first.
 * s->mu held. */
static int step_locked(phost *h, long t, int units) {
  axi_ag_stage *s = h->s;
  axi_pipe_fault_action(s->node, s->index, AXI_PIPE_FAULT_STEP, t, -1);
  if (!s->opt && !h->offload)
    return ax_seterr(AX_ESTATE, "axon.pipe.stage: no optimizer (setup)");
  AX_TRY(axi_pipe_host_settle(h)); /* the previous update first */
  AX_TRY(fold(h, t));
  if (h->sum.leaves != units)
    return ax_seterr(AX_ESTATE,
                     "axon.pipe.stage %d: step of batch %ld with the "
                     "gradients of %ld of its %d units",
                     s->index, t, h->sum.leaves, units);
  void *sum = NULL;
  int err = ax_sum_tree_finish(&h->sum, &sum);
  h->acc = sum;
  if (err != AX_OK) {
    ax_sum_tree_clear(&h->sum);
    return err;
  }
  int dbuf = h->def->fwd_weights == AX_FWD_DOUBLE_BUFFERED;
  /* Under predict the forwards of t + 1 use their prediction, made from
   * the live weights before this update (axi_stale_before_step): no
   * shadow. */
  err = dbuf && h->stale.kind != AX_STALE_PREDICT ? shadow_live(h, t)
                                                  : stash_live(h);
  if (err == AX_OK) /* the correction's view of the update (staleness.h) */
    err = axi_stale_before_step(&h->stale, axi_pipe_host_steps(h),
                                s->net->params, dbuf ? t + 1 : -1);
  if (err == AX_OK && s->opt) /* an offloaded step carries the scale */
    err = ax_optim_set_lr_scale(s->opt, h->stale.lr_scale);
  return axi_pipe_update_begin(h, t, err);
}

/* Which part of a unit's backward an action runs. */
enum { PART_FULL = 0, PART_INPUT = 1, PART_WEIGHT = 2 };

/* The replay of a state's forward into a new slot (no new statistics). A
 * last stage, which kept its labels, computes the loss's gradient here
 * (ax_forward_xent: a fusing head's gradients in the slot; otherwise the
 * logits' gradient in st->dlogits, empty until now, which *dy then points
 * to). s->mu held. */
static int replay(phost *h, pstate *st, ax_exec *ex, const ax_tlist **dy) {
  ax_tlist y = {0};
  if (!(st->slot = ax_slot_new()))
    return AX_ENOMEM;
  ex->update_stats = 0;
  if (st->labels.n == 0) {
    int err = ax_forward(h->s->net->root, ex, st->slot, &st->input, &y);
    ax_tlist_clear(&y);
    return err;
  }
  ax_loss_result r;
  int err = ax_forward_xent(h->s->net->root, ex, st->slot, &st->input,
                            &st->labels, h->s->ignore_index, st->norm,
                            st->scale, &r, &st->dlogits);
  if (st->dlogits.n > 0)
    *dy = &st->dlogits;
  return err;
}

/* Part `part` of the unit's backward: the input gradients (FULL, INPUT)
 * into din and the parameter gradients (FULL, WEIGHT) into g, a buffer of
 * the unit's context. A replayed state recomputes its forward first (FULL,
 * INPUT). mark: [start, replay done, backward done] (us). s->mu held. */
static int backward_locked(phost *h, pstate *st, int part, const ax_tlist *dy,
                           ax_tensor *g, ax_tlist *din, int64_t mark[3]) {
  axi_ag_stage *s = h->s;
  ax_net *net = s->net;
  ax_exec ex = axi_pipe_host_exec(h, 1);
  ex.params = st->ver ? st->ver : net->params;
  ex.seed = st->seed;
  ax_tensor *wb = NULL; /* pipemare's corrected weights (staleness.h) */
  int err = st->ver ? AX_OK
                    : axi_stale_backward(&h->stale, net->params,
                                         axi_pipe_host_steps(h), &wb);
  if (err != AX_OK)
    return err;
  if (wb)
    ex.params = wb;
  mark[0] = ax_clock_us();
  if (!st->slot && part != PART_WEIGHT)
    err = replay(h, st, &ex, &dy);
  mark[1] = ax_clock_us();
  ex.grads = g;
  ex.need_dx = !s->is_first;
  if (err == AX_OK && part == PART_FULL)
    err = ax_backward(net->root, &ex, st->slot, dy, din);
  else if (err == AX_OK && part == PART_INPUT)
    err = ax_backward_input(net->root, &ex, st->slot, dy, din);
  else if (err == AX_OK)
    err = ax_backward_weight(net->root, &ex, st->slot);
  mark[2] = ax_clock_us();
  ax_tensor_release(wb);
  return err;
}

/* The output gradients of the unit: the loss's on the last stage, else
 * the ones the next stage sent back along the unit's context. */
static int output_grads(ax_call_ctx *cc, phost *h, pstate *st, uint64_t ctx,
                        ax_tlist *dy, int64_t *wait_us) {
  if (!h->is_last)
    return axi_pipe_take_grad(h, ctx, st->fn, st->batch, st->micro,
                              axi_pipe_wait_ms(cc), dy, wait_us);
  dy->n = st->dlogits.n;
  for (int i = 0; i < dy->n; i++)
    dy->t[i] = ax_tensor_retain(st->dlogits.t[i]);
  return AX_OK;
}

/* The unit's parameter gradients leave its context for the sum in
 * micro-batch order (s->mu held). */
static int collect_grads(phost *h, uint64_t ctx, long batch, int micro) {
  axi_ag_stage *s = h->s;
  ax_tensor *taken = NULL;
  pgrad *pg = calloc(1, sizeof *pg);
  int err =
      pg ? ax_dist_take_gradients(s->node, ctx, s->key, &taken) : AX_ENOMEM;
  if (err != AX_OK) {
    free(pg);
    return err;
  }
  pg->batch = batch;
  pg->micro = micro;
  pg->g = taken;
  pg->next = h->grads;
  h->grads = pg;
  return fold(h, batch);
}

/* The state of (batch, micro): taken out of the list for FULL and WEIGHT
 * (the unit's last action), left in it for INPUT (W follows). s->mu held. */
static pstate *state_for(phost *h, long batch, int micro, int part,
                         const char **why) {
  for (pstate **pp = &h->states; *pp; pp = &(*pp)->next) {
    pstate *st = *pp;
    if (st->batch != batch || st->micro != micro)
      continue;
    if ((part == PART_WEIGHT) != (st->input_done != 0)) {
      *why = part == PART_WEIGHT ? "a weight half before its input half"
                                 : "a backward after its input half";
      return NULL;
    }
    if (part != PART_INPUT)
      *pp = st->next;
    return st;
  }
  *why = "a backward without its forward";
  return NULL;
}

/* The "bwd", "bwdi" and "bwdw" methods (stage_msg-impl.h). */
static int host_backward(ax_call_ctx *cc, phost *h, const ax_values *args,
                         int part, ax_values *out) {
  axi_ag_stage *s = h->s;
  int64_t t0 = ax_clock_us(), c0 = axi_pipe_host_cpu_us();
  axi_pipe_bwd_msg m = {0, 0, 0, 1}; /* bwdi: no step */
  if (part == PART_INPUT) {
    axi_pipe_bwdi_msg mi;
    AX_TRY(axi_pipe_bwdi_decode(args, &mi));
    m.batch = mi.batch;
    m.micro = mi.micro;
  } else {
    AX_TRY(part == PART_FULL ? axi_pipe_bwd_decode(args, &m)
                             : axi_pipe_bwdw_decode(args, &m));
  }
  int64_t batch = m.batch, micro = m.micro, step = m.step, units = m.units;
  axi_pipe_fault_action(s->node, s->index,
                        part == PART_INPUT    ? AXI_PIPE_FAULT_I
                        : part == PART_WEIGHT ? AXI_PIPE_FAULT_W
                                              : AXI_PIPE_FAULT_B,
                        batch, micro);
  uint64_t ctx = ax_call_autograd_ctx(cc);
  if (!ctx)
    return ax_seterr(AX_ESTATE,
                     "axon.pipe.stage %d: a backward runs under its "
                     "unit's distributed autograd context",
                     s->index);
  AX_TRY(axi_pipe_xfer_error(h));
  const char *why = NULL;
  pthread_mutex_lock(&s->mu);
  pstate *st = state_for(h, batch, (int)micro, part, &why);
  pthread_mutex_unlock(&s->mu);
  if (!st)
    return ax_seterr(AX_ENOTFOUND, "axon.pipe.stage %d: batch %lld/%lld: %s",
                     s->index, (long long)batch, (long long)micro, why);
  ax_tlist dy = {0}, din = {0};
  int64_t waited = 0;
  int err =
      part == PART_WEIGHT ? AX_OK : output_grads(cc, h, st, ctx, &dy, &waited);
  t0 += waited; /* busy time: not the wait for the gradient */
  int replay = st->slot == NULL && part != PART_WEIGHT;
  int64_t mark[4] = {0, 0, 0, 0};
  int live = 0;
  uint64_t fn = st->fn;
  ax_tensor *g = NULL;
  if (err == AX_OK)
    err = ax_dist_grads(s->node, ctx, s->key, s->net->n_params, s->dev, &g);
  pthread_mutex_lock(&s->mu);
  if (err == AX_OK) /* the last update's parameters */
    err = axi_pipe_host_settle(h);
  if (err == AX_OK)
    err = backward_locked(h, st, part, &dy, g, &din, mark);
  if (err == AX_OK && part != PART_INPUT)
    err = collect_grads(h, ctx, (long)batch, (int)micro);
  mark[3] = mark[2];
  if (err == AX_OK && step) {
    err = step_locked(h, batch, (int)units);
    mark[3] = ax_clock_us();
  }
  if (part == PART_INPUT) {
    st->input_done = err == AX_OK;
    if (err != AX_OK) { /* the unit cannot finish: drop its state */
      for (pstate **pp = &h->states; *pp; pp = &(*pp)->next)
        if (*pp == st) {
          *pp = st->next;
          break;
        }
      axi_pipe_state_free(st);
    }
  } else {
    axi_pipe_state_free(st);
  }
  axi_pipe_report_msg rep = {0};
  if (err == AX_OK)
    axi_pipe_host_report(h, t0, c0, &rep);
  for (pstate *o = h->states; o; o = o->next)
    live++;
  int vers = h->versions, agent = ax_node_rank(s->node);
  pthread_mutex_unlock(&s->mu);
  if (err == AX_OK) {
    if (replay)
      axi_pipe_event_compute(h->tr, s->index, agent, "recompute", (long)batch,
                             (int)micro, mark[0], mark[1], -1, -1);
    axi_pipe_event_compute(
        h->tr, s->index, agent, part == PART_WEIGHT ? "weight" : "backward",
        (long)batch, (int)micro, mark[1], mark[2], live, vers);
    if (step)
      axi_pipe_event_compute(h->tr, s->index, agent, "optim", (long)batch,
                             (int)micro, mark[2], mark[3], -1, vers);
  }
  if (err == AX_OK && part != PART_WEIGHT && !s->is_first)
    err = axi_pipe_pass_grad(h, ctx, fn, (long)batch, (int)micro, &din);
  if (err == AX_OK)
    err = axi_pipe_report_encode(&rep, out);
  ax_tensor_release(g);
  ax_tlist_clear(&dy);
  ax_tlist_clear(&din);
  return err;
}

int axi_pipe_host_bwd(ax_call_ctx *cc, void *obj, const ax_values *args,
                      ax_values *out) {
  return host_backward(cc, obj, args, PART_FULL, out);
}

int axi_pipe_host_bwd_input(ax_call_ctx *cc, void *obj, const ax_values *args,
                            ax_values *out) {
  return host_backward(cc, obj, args, PART_INPUT, out);
}

int axi_pipe_host_bwd_weight(ax_call_ctx *cc, void *obj, const ax_values *args,
                             ax_values *out) {
  return host_backward(cc, obj, args, PART_WEIGHT, out);
}

int axi_pipe_host_step(ax_call_ctx *cc, void *obj, const ax_values *args,
                       ax_values *out) {
  phost *h = obj;
  int64_t t0 = ax_clock_us(), c0 = axi_pipe_host_cpu_us();
  axi_pipe_step_msg m;
  AX_TRY(axi_pipe_step_decode(args, &m));
  long batch = (long)m.batch;
  axi_pipe_report_msg rep = {0};
  pthread_mutex_lock(&h->s->mu);
  int err = step_locked(h, batch, (int)m.units);
  if (err == AX_OK)
    axi_pipe_host_report(h, t0, c0, &rep);
  int vers = h->versions;
  pthread_mutex_unlock(&h->s->mu);
  if (err == AX_OK)
    err = axi_pipe_report_encode(&rep, out);
  if (err == AX_OK)
    axi_pipe_event_compute(h->tr, h->s->index, ax_node_rank(h->s->node),
                           "optim", (long)batch, 0, t0, ax_clock_us(), -1,
                           vers);
  return err;
}
