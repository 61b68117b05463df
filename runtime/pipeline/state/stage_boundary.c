/* The stage host's last step boundary, kept for live recovery
 * ("boundary"; contract in stage_host.h; the coordinator's side is
 * recover.c).
 *
 * In a flushed mode a stage's state between its STEP of batch t - 1 and
 * its first forward of batch t is the state at boundary t: the weights,
 * the optimizer state and step count, and the buffers (batch-norm
 * statistics). When a replica's agent is lost, the stages of one batch may
 * stand on either side of its STEP (a stage whose replicas' all-reduce
 * did not involve the lost agent finished it; the others could not), so
 * every stage must be able to go back to the boundary of the batch that
 * was interrupted. A stage that keeps it copies, under s->mu:
 *
 *  - the buffers at its first forward of a batch (micro-batch 0), before
 *    that forward changes them: they are boundary t's (`next`);
 *  - its weights, optimizer state and step count in its STEP of batch t,
 *    once the replicas' average came in and before the update, with the
 *    buffers of boundary t: the whole state at boundary t (`kept`), until
 *    the next STEP that gets its average replaces it. A STEP whose
 *    all-reduce failed (the lost agent was in its group) keeps the
 *    previous boundary, which the coordinator then most likely wants.
 *
 * Going back to boundary c is then: the kept state when it is boundary
 * c's (last step c, or c - 1 when the update failed half way); else, last
 * step c - 1, nothing to do but the buffers (from `next` when batch c's
 * forwards ran). The cost: one copy of the weights and optimizer state
 * per STEP, and two of the buffers. */
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/pipeline/stage/stage_host-impl.h"

struct axi_pipe_boundary {
  long kept;                 /* the boundary held below; -1: none */
  ax_tensor *params, *m, *v; /* at boundary `kept` */
  ax_tensor *bufs;
  long steps, last_step;
  long next;            /* the batch whose first forward saw next_bufs */
  ax_tensor *next_bufs; /* -1: none */
};

static void drop(ax_tensor **t) {
  ax_tensor_release(*t);
  *t = NULL;
}

void axi_pipe_boundary_free(phost *h) {
  axi_pipe_boundary *b = h->bd;
  if (!b)
    return;
  drop(&b->params), drop(&b->m), drop(&b->v), drop(&b->bufs);
  drop(&b->next_bufs);
  free(b);
  h->bd = NULL;
}

/* *dst (allocated like src on first use) becomes a copy of src; a NULL or
 * empty src leaves NULL. */
static int copy_into(ax_tensor **dst, const ax_tensor *src) {
  if (!src || !ax_tensor_numel(src)) {
    drop(dst);
    return AX_OK;
  }
  if (!*dst && !(*dst = ax_tensor_like(src)))
    return AX_ENOMEM;
  return ax_tensor_copy(*dst, src);
}

int axi_pipe_boundary_fwd(phost *h, long batch) {
  axi_pipe_boundary *b = h->bd;
  if (!b)
    return AX_OK;
  b->next = -1; /* until the copy is whole */
  AX_TRY(copy_into(&b->next_bufs, h->s->net->buffers));
  b->next = batch;
  return AX_OK;
}

int axi_pipe_boundary_step(phost *h, long t) {
  axi_pipe_boundary *b = h->bd;
  if (!b)
    return AX_OK;
  ax_optim *o = h->s->opt;
  b->kept = -1;       /* until the copy is whole */
  if (b->next == t) { /* boundary t's buffers move in */
    ax_tensor *x = b->bufs;
    b->bufs = b->next_bufs;
    b->next_bufs = x;
    b->next = -1;
  } else { /* no forward of t seen: the live buffers are still t's */
    AX_TRY(copy_into(&b->bufs, h->s->net->buffers));
  }
  AX_TRY(copy_into(&b->params, h->s->net->params));
  AX_TRY(copy_into(&b->m, o ? ax_optim_state(o, 0) : NULL));
  AX_TRY(copy_into(&b->v, o ? ax_optim_state(o, 1) : NULL));
  b->steps = o ? ax_optim_steps(o) : 0;
  b->last_step = h->last_step;
  b->kept = t;
  return AX_OK;
}

/* src into dst (both present or both absent). */
static int put(ax_tensor *dst, const ax_tensor *src) {
  if (!dst || !ax_tensor_numel(dst))
    return AX_OK;
  if (!src)
    return ax_seterr(AX_ESTATE, "axon.pipe.stage: a boundary without a copy");
  return ax_tensor_copy(dst, src);
}

/* Back to boundary c (s->mu held, nothing in flight). */
static int rewind_to(phost *h, long c) {
  axi_pipe_boundary *b = h->bd;
  axi_ag_stage *s = h->s;
  if ((h->last_step == c || h->last_step == c - 1) && b->kept == c &&
      b->last_step == c - 1) {
    ax_optim *o = s->opt;
    AX_TRY(put(s->net->params, b->params));
    AX_TRY(put(o ? ax_optim_state(o, 0) : NULL, b->m));
    AX_TRY(put(o ? ax_optim_state(o, 1) : NULL, b->v));
    AX_TRY(put(s->net->buffers, b->bufs));
    if (o)
      ax_optim_set_steps(o, b->steps);
    h->last_step = b->last_step;
    return AX_OK;
  }
  if (h->last_step != c - 1)
    return ax_seterr(AX_ESTATE,
                     "axon.pipe.stage %d: its last step is %ld, and it "
                     "keeps boundary %ld only: not boundary %ld",
                     s->index, h->last_step, b->kept, c);
  if (b->next == c) /* batch c's forwards changed the buffers */
    return put(s->net->buffers, b->next_bufs);
  return AX_OK;
}

int axi_pipe_boundary_op(phost *h, const axi_pipe_boundary_msg *m,
                         axi_pipe_boundary_reply_msg *r) {
  int err = AX_OK;
  if (m->op == AXP_BOUNDARY_KEEP && !h->bd) {
    if (!h->def->flush || h->zero || h->offload || !h->s->opt)
      err = ax_seterr(AX_EINVAL,
                      "axon.pipe.stage %d: a step boundary is kept in a "
                      "flushed mode with the whole optimizer state here "
                      "(%s has %s)",
                      h->s->index, h->def->name,
                      !h->def->flush ? "no flush"
                      : h->zero      ? "a sharded one"
                                     : "none or another agent's");
    else if (!(h->bd = calloc(1, sizeof *h->bd)))
      err = AX_ENOMEM;
    else
      h->bd->kept = h->bd->next = -1;
  } else if (m->op == AXP_BOUNDARY_REWIND) {
    err = !h->bd ? ax_seterr(AX_ESTATE,
                             "axon.pipe.stage %d: no step boundary kept",
                             h->s->index)
          : h->states || h->grads || h->acc
              ? ax_seterr(AX_ESTATE,
                          "axon.pipe.stage %d: rewound with units "
                          "in flight (stop it first)",
                          h->s->index)
              : rewind_to(h, (long)m->batch);
  }
  r->last_step = h->last_step;
  r->kept = h->bd ? h->bd->kept : -1;
  return err;
}
