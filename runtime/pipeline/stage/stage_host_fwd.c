/* The pipeline stage host's forward ("fwd"): inputs taken from the data
 * path, the forward under the unit's context, the loss on the last stage
 * (in training through ax_forward_xent: fused into the model's head where
 * it can, models/loss.h). Contract in stage_host.h. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/backend-impl.h"
#include "axon/models/loss.h"
#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/pipeline/coord/coordinator.h"
#include "axon/runtime/pipeline/schedule/mode.h"
#include "axon/runtime/pipeline/stage/stage_host-impl.h"
#include "axon/runtime/pipeline/stage/stage_host.h"
#include "axon/runtime/pipeline/trace/stage_events.h"

/* ---- forward ------------------------------------------------------------- */
/* The loss's labels and the gradient's scale of a last stage's forward. */
static int loss_args(const axi_pipe_fwd_msg *m, float *scale) {
  if (!m->has_labels)
    return ax_seterr(AX_EBADARG, "axon.pipe.stage: last stage needs labels");
  if (m->has_scale && !(m->scale > 0 && m->scale < 1e30))
    return ax_seterr(AX_EBADARG, "axon.pipe.stage: loss scale %g", m->scale);
  *scale = m->has_scale ? (float)m->scale : 1.0f;
  return AX_OK;
}

/* A replayed last stage (its forward computed the loss alone) keeps the
 * unit's labels, their norms and the scale, from which the replay computes
 * the loss's gradient. */
static int keep_labels(const axi_pipe_fwd_msg *m, float scale, pstate *st,
                       ax_device dev) {
  for (int i = 0; i < m->lab.t.n; i++) {
    st->norm[i] = m->lab.norm[i];
    if (!(st->labels.t[st->labels.n++] = ax_tensor_to(m->lab.t.t[i], dev)))
      return AX_ENOMEM;
  }
  st->scale = scale;
  return AX_OK;
}

int axi_pipe_host_inputs(ax_call_ctx *cc, phost *h, const ax_tlist *given,
                         long batch, int micro, int train, const char *why,
                         uint64_t *ctx, ax_tlist *in, int64_t *t0_us) {
  axi_ag_stage *s = h->s;
  *ctx = ax_call_autograd_ctx(cc); /* activations travel under it */
  if (!*ctx && (train || given->n == 0 || !h->is_last))
    return ax_seterr(AX_ESTATE, "axon.pipe.stage %d: %s", s->index, why);
  AX_TRY(axi_pipe_xfer_error(h));
  if (given->n > 0) {
    for (int i = 0; i < given->n; i++)
      if (!(in->t[in->n++] = ax_tensor_to(given->t[i], s->dev)))
        return AX_ENOMEM;
    return AX_OK;
  }
  int64_t waited = 0;
  int err = axi_pipe_take_input(h, *ctx, batch, micro, axi_pipe_wait_ms(cc), in,
                                &waited);
  *t0_us += waited; /* busy time: not the wait for the activations */
  return err;
}

int axi_pipe_host_fwd(ax_call_ctx *cc, void *obj, const ax_values *args,
                      ax_values *out) {
  phost *h = obj;
  axi_ag_stage *s = h->s;
  int64_t t0 = ax_clock_us(), c0 = axi_pipe_host_cpu_us();
  axi_pipe_fwd_msg m;
  AX_TRY(axi_pipe_fwd_decode(args, &m));
  int64_t batch = m.batch, micro = m.micro, seed = m.seed, flags = m.flags;
  int train = (flags & AX_PIPE_FLAG_TRAIN) != 0;
  axi_pipe_fault_action(s->node, s->index, AXI_PIPE_FAULT_F, train ? batch : -1,
                        micro);
  uint64_t ctx = 0;
  ax_tlist in = {0}, y = {0};
  int err = axi_pipe_host_inputs(
      cc, h, &m.in, (long)batch, (int)micro, train,
      "a forward runs under its unit's distributed autograd context", &ctx, &in,
      &t0);
  pstate *st = NULL;
  if (err == AX_OK && train) {
    if (!(st = calloc(1, sizeof *st)) || !(st->slot = ax_slot_new()))
      err = AX_ENOMEM;
    else {
      st->batch = batch;
      st->micro = (int)micro;
      st->seed = (uint64_t)seed;
    }
  }
  ax_loss_result r;
  memset(&r, 0, sizeof r);
  pthread_mutex_lock(&s->mu);
  if (err == AX_OK) /* the last update's parameters */
    err = axi_pipe_host_settle(h);
  int64_t tc = ax_clock_us();
  ax_tensor *w = s->net->params; /* the weights this forward uses */
  if (err == AX_OK && train && h->def->fwd_weights == AX_FWD_DOUBLE_BUFFERED) {
    if (h->shadow && h->shadow_for == batch)
      w = h->shadow; /* the live weights moved on: batch uses the shadow */
    else if (batch - 2 > h->last_step)
      err = ax_seterr(AX_ESTATE,
                      "axon.pipe.stage %d: %s forward of batch %lld "
                      "before the update of batch %lld (too few "
                      "micro-batches?)",
                      s->index, h->def->name, (long long)batch,
                      (long long)batch - 2);
  }
  ax_tensor *wf = NULL; /* w, or its prediction (staleness.h) */
  if (err == AX_OK)
    err = train ? axi_stale_forward(&h->stale, w, (long)batch, &wf) : AX_OK;
  if (err == AX_OK && wf)
    w = wf;
  if (err == AX_OK && train && micro == 0) /* boundary batch's buffers */
    err = axi_pipe_boundary_fwd(h, (long)batch);
  float scale = 1.0f;
  if (err == AX_OK && h->is_last)
    err = loss_args(&m, &scale);
  if (err == AX_OK) {
    ax_exec ex = axi_pipe_host_exec(h, train);
    ex.params = w;
    ex.seed = (uint64_t)seed;
    ex.update_stats = train;
    /* The loss fused into the model's head if it can; the loss alone when
     * the backward replays this forward. */
    if (h->is_last && st)
      err =
          ax_forward_xent(s->net->root, &ex, st->slot, &in, &m.lab.t,
                          s->ignore_index, m.lab.norm, scale, &r,
                          flags & AX_PIPE_FLAG_RECOMPUTE ? NULL : &st->dlogits);
    else
      err = ax_forward(s->net->root, &ex, st ? st->slot : NULL, &in, &y);
  }
  if (err == AX_OK && st) {
    if (h->def->bwd_weights == AX_WEIGHTS_STASHED &&
        axi_stale_stashes(&h->stale))
      st->ver = ax_tensor_retain(w); /* live weights are copied on update */
    if (flags & AX_PIPE_FLAG_RECOMPUTE) { /* keep only the inputs */
      ax_slot_free(st->slot);
      st->slot = NULL;
      st->input.n = in.n;
      for (int i = 0; i < in.n; i++)
        st->input.t[i] = ax_tensor_retain(in.t[i]);
      if (h->is_last)
        err = keep_labels(&m, scale, st, s->dev);
    }
  }
  if (err == AX_OK && h->is_last && !st) /* evaluation: from the logits */
    err = ax_loss_xent(&y, &m.lab.t, s->ignore_index, m.lab.norm, scale, &r,
                       NULL);
  if (err == AX_OK && st) { /* the unit's function in its context */
    ax_tlist none = {0};
    err = ax_dist_record_held(s->node, ctx, &in, h->is_last ? &none : &y,
                              &st->fn);
    if (err == AX_OK) /* the function keeps the inputs' sources */
      err = ax_dist_forget(s->node, ctx, &in);
  }
  if (err == AX_OK && st) {
    st->next = h->states;
    h->states = st;
    st = NULL;
  }
  ax_tensor_release(wf);
  axi_pipe_report_msg rep = {0};
  if (err == AX_OK)
    axi_pipe_host_report(h, t0, c0, &rep);
  int live = 0, vers = h->versions;
  for (pstate *o = h->states; o; o = o->next)
    live++;
  pthread_mutex_unlock(&s->mu);
  if (err == AX_OK && train)
    axi_pipe_event_compute(h->tr, s->index, ax_node_rank(s->node), "forward",
                           (long)batch, (int)micro, tc, ax_clock_us(), live,
                           vers);
  if (err == AX_OK && h->is_last) {
    rep.has_loss = 1;
    rep.loss = r.loss;
    rep.correct = r.correct[0];
    rep.count = r.count[0];
  } else if (err == AX_OK) {
    err = axi_pipe_push_output(h, ctx, (long)batch, (int)micro, &y);
  }
  if (err == AX_OK)
    err = axi_pipe_report_encode(&rep, out);
  axi_pipe_state_free(st);
  ax_tlist_clear(&in);
  ax_tlist_clear(&y);
  return err;
}
