/* The stage host's data path: activations travel like gradients, under
 * the unit's distributed autograd context (runtime/autograd/autograd.h).
 * A forward takes its input (ax_dist_take: what prev pushed to this host's
 * key, the id of its own RRef) and pushes its output to next
 * (ax_dist_push); a backward takes its output gradient (ax_dist_take_grads)
 * and passes its input gradient back (ax_dist_pass_grads). Each records
 * its receive or send event (stage_events.h). A send is not waited for:
 * its failure is kept and returned by the host's next operation. Contract
 * in stage_host-impl.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/pipeline/stage/stage_host-impl.h"
#include "axon/runtime/pipeline/trace/stage_events.h"

/* The host's first failed send. Every send in flight holds a reference,
 * so one that completes after the host is gone writes into memory that is
 * still there. */
struct axi_pipe_sent {
  pthread_mutex_t mu;
  int refs;
  int err; /* AX_OK: none failed */
  char msg[256];
};

static void sent_drop(axi_pipe_sent *b) {
  pthread_mutex_lock(&b->mu);
  int last = --b->refs == 0;
  pthread_mutex_unlock(&b->mu);
  if (!last)
    return;
  pthread_mutex_destroy(&b->mu);
  free(b);
}

static void on_sent(ax_future *f, void *user) {
  axi_pipe_sent *b = user;
  int err = ax_future_err(f);
  pthread_mutex_lock(&b->mu);
  if (err != AX_OK && b->err == AX_OK) {
    b->err = err;
    snprintf(b->msg, sizeof b->msg, "sending to a neighbour: %s",
             ax_future_errmsg(f) ? ax_future_errmsg(f) : ax_strerror(err));
  }
  pthread_mutex_unlock(&b->mu);
  sent_drop(b);
}

/* Keeps the failure of send f (its reference is taken) for the host. */
static int watch(phost *h, ax_future *f) {
  pthread_mutex_lock(&h->sent->mu);
  h->sent->refs++;
  pthread_mutex_unlock(&h->sent->mu);
  int err = ax_future_on_done(f, on_sent, h->sent);
  ax_future_release(f);
  if (err != AX_OK) /* the callback never runs */
    sent_drop(h->sent);
  return err;
}

int axi_pipe_xfer_init(phost *h) {
  if (!(h->sent = calloc(1, sizeof *h->sent)))
    return AX_ENOMEM;
  pthread_mutex_init(&h->sent->mu, NULL);
  h->sent->refs = 1;
  return AX_OK;
}

int axi_pipe_xfer_open(phost *h, uint64_t self) {
  ax_node *n = h->s->node;
  if (h->self && h->self != self)
    ax_dist_take_close(n, h->self, 0); /* forgotten */
  h->self = self;
  pthread_mutex_lock(&h->sent->mu);
  h->sent->err = AX_OK;
  h->sent->msg[0] = 0;
  pthread_mutex_unlock(&h->sent->mu);
  return ax_dist_take_close(n, self, 0);
}

void axi_pipe_xfer_close(phost *h) {
  if (h->self)
    ax_dist_take_close(h->s->node, h->self, 1);
}

void axi_pipe_xfer_free(phost *h) {
  if (h->self)
    ax_dist_take_close(h->s->node, h->self, 0);
  h->self = 0;
  if (h->sent)
    sent_drop(h->sent);
  h->sent = NULL;
}

int axi_pipe_xfer_error(phost *h) {
  pthread_mutex_lock(&h->sent->mu);
  int err = h->sent->err;
  char msg[256];
  snprintf(msg, sizeof msg, "%s", h->sent->msg);
  pthread_mutex_unlock(&h->sent->mu);
  return err == AX_OK
             ? AX_OK
             : ax_seterr(err, "axon.pipe.stage %d: %s", h->s->index, msg);
}

/* ---- forward: activations ------------------------------------------------ */
int axi_pipe_take_input(phost *h, uint64_t ctx, long batch, int micro,
                        int64_t timeout_ms, ax_tlist *in, int64_t *wait_us) {
  axi_ag_stage *s = h->s;
  int64_t t0 = ax_clock_us();
  int err = ax_dist_take(s->node, ctx, h->self,
                         h->prev ? ax_rref_owner(h->prev) : NULL, s->dev,
                         timeout_ms, in);
  int64_t t1 = ax_clock_us();
  if (err != AX_OK) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s", ax_errmsg());
    return ax_seterr(err,
                     "axon.pipe.stage %d: the activations of batch %ld/%d: %s",
                     s->index, batch, micro, msg);
  }
  *wait_us = t1 - t0;
  axi_pipe_event_xfer(h->tr, s->index, 0, AXP_ACTIVATIONS, batch, micro,
                      s->index - 1, in, t0, t1);
  return AX_OK;
}

int axi_pipe_push_output(phost *h, uint64_t ctx, long batch, int micro,
                         const ax_tlist *y) {
  axi_ag_stage *s = h->s;
  if (!h->next)
    return ax_seterr(AX_ESTATE,
                     "axon.pipe.stage %d: no neighbour to send to "
                     "(setup missing?)",
                     s->index);
  int64_t t0 = ax_clock_us();
  ax_future *f = NULL;
  int err = ax_dist_push(s->node, ctx, ax_rref_owner(h->next),
                         ax_rref_id(h->next), y, &f);
  if (err == AX_OK)
    err = watch(h, f);
  if (err == AX_OK)
    axi_pipe_event_xfer(h->tr, s->index, 1, AXP_ACTIVATIONS, batch, micro,
                        s->index + 1, y, t0, ax_clock_us());
  return err;
}

/* ---- backward: gradients ------------------------------------------------- */
int axi_pipe_take_grad(phost *h, uint64_t ctx, uint64_t fn, long batch,
                       int micro, int64_t timeout_ms, ax_tlist *dy,
                       int64_t *wait_us) {
  axi_ag_stage *s = h->s;
  int64_t t0 = ax_clock_us();
  AX_TRY(ax_dist_take_grads(s->node, ctx, fn, timeout_ms, dy));
  *wait_us = ax_clock_us() - t0;
  for (int i = 0; i < dy->n; i++) { /* onto the stage's device */
    ax_tensor *x = dy->t[i] ? ax_tensor_to(dy->t[i], s->dev) : NULL;
    if (dy->t[i] && !x)
      return AX_ENOMEM;
    ax_tensor_release(dy->t[i]);
    dy->t[i] = x;
  }
  axi_pipe_event_xfer(h->tr, s->index, 0, AXP_GRADIENTS, batch, micro,
                      s->index + 1, dy, t0, ax_clock_us());
  return AX_OK;
}

int axi_pipe_pass_grad(phost *h, uint64_t ctx, uint64_t fn, long batch,
                       int micro, const ax_tlist *din) {
  axi_ag_stage *s = h->s;
  int64_t t0 = ax_clock_us();
  ax_future *f = NULL;
  int err = ax_dist_pass_grads(s->node, ctx, fn, din, &f);
  if (err == AX_OK)
    err = watch(h, f);
  if (err == AX_OK)
    axi_pipe_event_xfer(h->tr, s->index, 1, AXP_GRADIENTS, batch, micro,
                        s->index - 1, din, t0, ax_clock_us());
  return err;
}
