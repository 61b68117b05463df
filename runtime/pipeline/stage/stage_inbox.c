/* Stage to stage pushes of the pipeline stage host and the inbox that
 * receives them. Contract in stage_inbox.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/builtin-impl.h"
#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/pipeline/stage/stage_inbox.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"
#include "axon/runtime/pipeline/trace/stage_events.h"

struct axi_pipe_ientry { /* pushed activations waiting for their forward */
  long batch;
  int micro;
  ax_tlist t;
  axi_pipe_received meta; /* context, sender and autograd descriptor */
  struct axi_pipe_ientry *next;
};

static void entry_free(axi_pipe_ientry *e) {
  ax_tlist_clear(&e->t);
  free(e->meta.desc);
  free(e);
}

void axi_pipe_received_clear(axi_pipe_received *r) {
  free(r->desc);
  memset(r, 0, sizeof *r);
}

/* Every registered inbox of this process, by id. Lock order: g_mu, then an
 * inbox's mu. */
typedef struct reg {
  axi_pipe_inbox *ib;
  struct reg *next;
} reg;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static reg *g_reg;

static axi_pipe_inbox *find_locked(uint64_t id) {
  for (reg *r = g_reg; r; r = r->next)
    if (r->ib->id == id)
      return r->ib;
  return NULL;
}

static void unregister(axi_pipe_inbox *ib) {
  pthread_mutex_lock(&g_mu);
  for (reg **pp = &g_reg; *pp; pp = &(*pp)->next)
    if ((*pp)->ib == ib) {
      reg *r = *pp;
      *pp = r->next;
      free(r);
      break;
    }
  ib->id = 0;
  pthread_mutex_unlock(&g_mu);
}

void axi_pipe_inbox_init(axi_pipe_inbox *ib, int stage, ax_device dev,
                         ax_trace *tr) {
  memset(ib, 0, sizeof *ib);
  pthread_mutex_init(&ib->mu, NULL);
  pthread_cond_init(&ib->cv, NULL);
  ib->stage = stage;
  ib->dev = dev;
  ib->tr = tr;
}

void axi_pipe_inbox_close(axi_pipe_inbox *ib) {
  unregister(ib);
  pthread_mutex_lock(&ib->mu);
  axi_pipe_ientry *e = ib->head;
  ib->head = NULL;
  ib->closed = 1;
  pthread_cond_broadcast(&ib->cv);
  pthread_mutex_unlock(&ib->mu);
  for (axi_pipe_ientry *nx; e; e = nx) {
    nx = e->next;
    entry_free(e);
  }
}

void axi_pipe_inbox_destroy(axi_pipe_inbox *ib) {
  axi_pipe_inbox_close(ib);
  pthread_cond_destroy(&ib->cv);
  pthread_mutex_destroy(&ib->mu);
}

int axi_pipe_inbox_open(axi_pipe_inbox *ib, uint64_t id) {
  unregister(ib);
  reg *r = calloc(1, sizeof *r);
  if (!r)
    return AX_ENOMEM;
  pthread_mutex_lock(&g_mu);
  if (id == 0 || find_locked(id)) {
    pthread_mutex_unlock(&g_mu);
    free(r);
    return ax_seterr(AX_ESTATE, "axon.pipe.stage %d: inbox id %llx is taken",
                     ib->stage, (unsigned long long)id);
  }
  pthread_mutex_lock(&ib->mu);
  ib->id = id;
  ib->closed = 0;
  ib->err = AX_OK;
  ib->msg[0] = 0;
  pthread_mutex_unlock(&ib->mu);
  r->ib = ib;
  r->next = g_reg;
  g_reg = r;
  pthread_mutex_unlock(&g_mu);
  return AX_OK;
}

/* "axon.pipe.give" (axi_pipe_give_msg, stage_msg-impl.h), inline on the
 * transport thread: stores the list (moved to the inbox's device),
 * its context, sender and autograd descriptor in the inbox and wakes its
 * operation. */
static int h_give(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                  void *user) {
  axi_pipe_give_msg m;
  AX_TRY(axi_pipe_give_decode(args, &m));
  size_t dlen = m.desc.n;
  axi_pipe_ientry *e = calloc(1, sizeof *e);
  if (!e || (dlen && !(e->meta.desc = malloc(dlen)))) {
    free(e);
    return AX_ENOMEM;
  }
  e->batch = (long)m.batch;
  e->micro = (int)m.micro;
  e->meta.ctx = ax_call_autograd_ctx(ctx);
  snprintf(e->meta.from, sizeof e->meta.from, "%s", ax_call_caller(ctx));
  if (dlen)
    memcpy(e->meta.desc, m.desc.p, dlen);
  e->meta.len = dlen;
  int err = AX_OK;
  pthread_mutex_lock(&g_mu);
  axi_pipe_inbox *ib = find_locked((uint64_t)m.id);
  if (!ib)
    err = ax_seterr(AX_ENOTFOUND,
                    "axon.pipe.give: no stage with id %llx on this "
                    "node (torn down?)",
                    (unsigned long long)m.id);
  for (int i = 0; err == AX_OK && i < m.t.n; i++) {
    ax_tensor *x = m.t.t[i]; /* NULL: an input without gradient */
    if (x && !(x = ax_tensor_to(x, ib->dev)))
      err = AX_ENOMEM;
    e->t.t[e->t.n++] = x;
  }
  if (err == AX_OK) {
    pthread_mutex_lock(&ib->mu);
    e->next = ib->head;
    ib->head = e;
    pthread_cond_broadcast(&ib->cv);
    pthread_mutex_unlock(&ib->mu);
    e = NULL;
  }
  pthread_mutex_unlock(&g_mu);
  if (e)
    entry_free(e);
  return err;
}

int axi_pipe_inbox_register_rpc(ax_node *n) {
  return axi_register_ex(n, "axon.pipe.give", h_give, NULL, 1);
}

/* A push finished: a failure is kept by the producer (found by its id). */
void axi_pipe_on_pushed(ax_future *f, void *user) {
  uint64_t self = (uint64_t)(uintptr_t)user;
  int err = ax_future_err(f);
  if (err == AX_OK)
    return;
  pthread_mutex_lock(&g_mu);
  axi_pipe_inbox *ib = find_locked(self);
  if (ib) {
    pthread_mutex_lock(&ib->mu);
    if (ib->err == AX_OK) {
      ib->err = err;
      snprintf(ib->msg, sizeof ib->msg, "sending to a neighbour: %s",
               ax_future_errmsg(f) ? ax_future_errmsg(f) : ax_strerror(err));
    }
    pthread_mutex_unlock(&ib->mu);
  }
  pthread_mutex_unlock(&g_mu);
}

int axi_pipe_push(ax_node *n, axi_pipe_inbox *self, ax_rref *to, uint64_t ctx,
                  long batch, int micro, const ax_tlist *t) {
  if (!to)
    return ax_seterr(AX_ESTATE,
                     "axon.pipe.stage %d: no neighbour to send to "
                     "(setup missing?)",
                     self->stage);
  int64_t t0 = ax_trace_now_us();
  void *desc = NULL;
  size_t dlen = 0;
  int err = ctx ? ax_dist_send_edges(n, ctx, ax_rref_owner(to), t, &desc, &dlen)
                : AX_OK;
  /* The send is counted: the context stops holding t before it leaves. A
   * neighbour on this node gets these very tensors and may record them in
   * the context before this thread returns (stage-driven execution); a
   * forget after the push would erase its record. */
  if (err == AX_OK && ctx)
    err = ax_dist_forget(n, ctx, t);
  ax_values *a = err == AX_OK ? ax_values_new() : NULL;
  if (err == AX_OK && !a)
    err = AX_ENOMEM;
  axi_pipe_give_msg m = {
      (int64_t)ax_rref_id(to), batch, micro, {desc, dlen}, *t};
  if (err == AX_OK)
    err = axi_pipe_give_encode(&m, a);
  free(desc);
  ax_future *f = NULL;
  ax_call_opts co = {.autograd_ctx = ctx};
  if (err == AX_OK)
    err = ax_rpc_async(n, ax_rref_owner(to), "axon.pipe.give", a, &co, &f);
  ax_values_free(a);
  if (err == AX_OK) {
    err = ax_future_on_done(f, axi_pipe_on_pushed, (void *)(uintptr_t)self->id);
    ax_future_release(f);
  }
  if (err == AX_OK)
    axi_pipe_event_xfer(self->tr, self->stage, 1, AXP_ACTIVATIONS, batch, micro,
                        self->stage + 1, t, t0, ax_trace_now_us());
  return err;
}

static axi_pipe_ientry *unlink_locked(axi_pipe_inbox *ib, long batch,
                                      int micro) {
  for (axi_pipe_ientry **pp = &ib->head; *pp; pp = &(*pp)->next)
    if ((*pp)->batch == batch && (*pp)->micro == micro) {
      axi_pipe_ientry *e = *pp;
      *pp = e->next;
      return e;
    }
  return NULL;
}

int axi_pipe_inbox_take(axi_pipe_inbox *ib, ax_node *n, const char *from,
                        long batch, int micro, int64_t timeout_ms, ax_tlist *t,
                        axi_pipe_received *meta) {
  memset(t, 0, sizeof *t);
  memset(meta, 0, sizeof *meta);
  int64_t t0 = ax_trace_now_us(), end = t0 + timeout_ms * 1000;
  const char *what = "activation";
  int err = AX_OK;
  axi_pipe_ientry *e = NULL;
  pthread_mutex_lock(&ib->mu);
  while (!(e = unlink_locked(ib, batch, micro))) {
    if (ib->closed) {
      err = ax_seterr(AX_ECLOSED,
                      "axon.pipe.stage %d: torn down while waiting for "
                      "the %s of batch %ld/%d",
                      ib->stage, what, batch, micro);
      break;
    }
    int64_t now = ax_trace_now_us();
    if (now >= end) {
      err = ax_seterr(AX_ETIMEOUT,
                      "axon.pipe.stage %d: no %s of batch %ld/%d "
                      "from %s in %lld ms",
                      ib->stage, what, batch, micro,
                      from ? from : "the neighbour", (long long)timeout_ms);
      break;
    }
    pthread_mutex_unlock(&ib->mu);
    if (from && ax_node_peer_is_down(n, from)) {
      pthread_mutex_lock(&ib->mu);
      if ((e = unlink_locked(ib, batch, micro)))
        break; /* it arrived after all */
      err = ax_seterr(AX_EPEERDOWN,
                      "axon.pipe.stage %d: %s is down; no %s of "
                      "batch %ld/%d",
                      ib->stage, from, what, batch, micro);
      break;
    }
    pthread_mutex_lock(&ib->mu);
    if ((e = unlink_locked(ib, batch, micro)))
      break; /* arrived while the lock was free */
    int64_t wait_us = end - now < 100000 ? end - now : 100000;
    struct timespec ts = ax_clock_after_us(CLOCK_REALTIME, wait_us);
    pthread_cond_timedwait(&ib->cv, &ib->mu, &ts);
  }
  pthread_mutex_unlock(&ib->mu);
  if (!e)
    return err;
  *t = e->t; /* takes the references */
  *meta = e->meta;
  meta->wait_us = ax_trace_now_us() - t0;
  free(e);
  axi_pipe_event_xfer(ib->tr, ib->stage, 0, AXP_ACTIVATIONS, batch, micro,
                      ib->stage - 1, t, t0, ax_trace_now_us());
  return AX_OK;
}

int axi_pipe_inbox_error(axi_pipe_inbox *ib) {
  pthread_mutex_lock(&ib->mu);
  int err = ib->err;
  char msg[256];
  snprintf(msg, sizeof msg, "%s", ib->msg);
  pthread_mutex_unlock(&ib->mu);
  return err == AX_OK
             ? AX_OK
             : ax_seterr(err, "axon.pipe.stage %d: %s", ib->stage, msg);
}
