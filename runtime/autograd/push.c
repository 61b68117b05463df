/* Pushes and takes: tensors sent under a context to a consumer key on
 * another node (or this one), kept there as received until the consumer
 * takes them ("axon.autograd.push"), and the consumer keys closed by a
 * teardown. Contract in autograd.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/builtin-impl.h"
#include "axon/runtime/autograd/autograd-impl.h"

#define AXD_TAKE_MS 60000 /* a take's deadline when none is given */
#define AXD_DESC_MAX 4096 /* descriptor bytes a push may carry */

/* ---- closed keys --------------------------------------------------------- */
/* The index of key among the closed keys, or -1 (d->mu held). */
static int closed_at(const axi_ag_state *d, uint64_t key) {
  for (int i = 0; i < d->nclosed; i++)
    if (d->closed[i] == key)
      return i;
  return -1;
}

int ax_dist_take_close(ax_node *n, uint64_t key, int closed) {
  axi_ag_state *d = axi_ag_get();
  if (!d || d->node != n)
    return ax_seterr(AX_ESTATE, "dist: node not initialised");
  int err = AX_OK;
  pthread_mutex_lock(&d->mu);
  int at = closed_at(d, key);
  if (closed && at < 0) {
    if (d->nclosed == d->capclosed) {
      int cap = d->capclosed ? 2 * d->capclosed : 8;
      uint64_t *k = realloc(d->closed, (size_t)cap * sizeof *k);
      if (k) {
        d->closed = k;
        d->capclosed = cap;
      }
    }
    if (d->nclosed < d->capclosed)
      d->closed[d->nclosed++] = key;
    else
      err = AX_ENOMEM;
  } else if (!closed && at >= 0) {
    d->closed[at] = d->closed[--d->nclosed];
  }
  pthread_cond_broadcast(&d->cv); /* takes waiting on key end */
  pthread_mutex_unlock(&d->mu);
  return err == AX_OK ? AX_OK
                      : ax_seterr(err, "dist: no memory to close a key");
}

/* ---- the producer's side ------------------------------------------------- */
int ax_dist_push(ax_node *n, uint64_t ctx, const char *to, uint64_t key,
                 const ax_tlist *t, ax_future **done) {
  axi_ag_state *d = axi_ag_get();
  if (done)
    *done = NULL;
  if (!d || d->node != n || !ctx || !to || !t || t->n < 0 ||
      t->n > AX_TLIST_MAX)
    return ax_seterr(AX_EINVAL, "dist: bad arguments to push");
  void *desc = NULL;
  size_t len = 0;
  AX_TRY(axi_ag_send_edges(n, ctx, to, t, &desc, &len));
  /* The sends are counted: the context stops holding t before it leaves.
   * A consumer on this node gets these very tensors and may record them
   * in the context before this thread returns; a forget after the send
   * would erase its record. */
  int err = ax_dist_forget(n, ctx, t);
  ax_values *a = err == AX_OK ? ax_values_new() : NULL;
  if (err == AX_OK && !a)
    err = AX_ENOMEM;
  if (err == AX_OK)
    err = ax_values_add_i64(a, (int64_t)key);
  if (err == AX_OK)
    err = ax_values_add_bytes(a, desc, len);
  free(desc);
  for (int i = 0; err == AX_OK && i < t->n; i++)
    err = t->t[i] ? ax_values_add_tensor(a, t->t[i]) : ax_values_add_i64(a, 0);
  ax_future *f = NULL;
  ax_call_opts o = {.autograd_ctx = ctx};
  if (err == AX_OK)
    err = ax_rpc_async(n, to, "axon.autograd.push", a, &o, &f);
  ax_values_free(a);
  if (err != AX_OK)
    return err;
  if (done)
    *done = f;
  else
    ax_future_release(f);
  return AX_OK;
}

/* "axon.autograd.push" [key, desc, tensors or i64 0 ...] under the
 * pushed context. Inline: it only stores the received tensors as they
 * are (new references, no copies) with the sender and the descriptor in
 * the context, which it creates unless it was released (then the list is
 * dropped: an abandoned unit's late push is no error), and wakes the
 * takes. */
static int h_push(ax_call_ctx *cc, const ax_values *args, ax_values *out,
                  void *user) {
  axi_ag_state *d = axi_ag_get();
  uint64_t ctx = ax_call_autograd_ctx(cc);
  int64_t key;
  const void *desc;
  size_t len;
  AX_TRY(ax_values_get_i64(args, 0, &key));
  AX_TRY(ax_values_get_bytes(args, 1, &desc, &len));
  size_t nt = ax_values_count(args) - 2;
  if (!d || !ctx || nt > AX_TLIST_MAX || len > AXD_DESC_MAX)
    return ax_seterr(AX_EBADARG,
                     "axon.autograd.push: %zu tensors, %zu descriptor "
                     "bytes, context %llx",
                     nt, len, (unsigned long long)ctx);
  axi_ag_box *b = calloc(1, sizeof *b);
  if (!b || (len && !(b->desc = malloc(len)))) {
    free(b);
    return AX_ENOMEM;
  }
  b->key = (uint64_t)key;
  snprintf(b->from, sizeof b->from, "%s", ax_call_caller(cc));
  if (len)
    memcpy(b->desc, desc, len);
  b->len = len;
  int err = AX_OK;
  for (size_t i = 0; err == AX_OK && i < nt; i++) {
    ax_tensor *x = NULL;
    if (ax_values_type(args, 2 + i) == AX_VAL_TENSOR &&
        (err = ax_values_get_tensor(args, 2 + i, &x)) == AX_OK)
      ax_tensor_retain(x);
    b->t.t[b->t.n++] = x; /* NULL: an entry without a tensor */
  }
  if (err == AX_OK) {
    pthread_mutex_lock(&d->mu);
    axi_ag_ctx *c = axi_ag_ctx_find(d, ctx, 1);
    if (c) {
      axi_ag_peer_add(c, b->from);
      axi_ag_box **pp = &c->boxes;
      while (*pp)
        pp = &(*pp)->next;
      *pp = b;
      b = NULL;
      pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&d->mu);
  }
  axi_ag_box_free(b); /* a released context's, or a failure's */
  return err;
}

int axi_ag_push_register(ax_node *n) {
  return axi_register_ex(n, "axon.autograd.push", h_push, NULL, 1);
}

/* ---- the consumer's side ------------------------------------------------- */
/* The first list pushed to key under ctx, unlinked, or NULL (d->mu held). */
static axi_ag_box *box_unlink(axi_ag_state *d, uint64_t ctx, uint64_t key) {
  axi_ag_ctx *c = axi_ag_ctx_find(d, ctx, 0);
  for (axi_ag_box **pp = c ? &c->boxes : NULL; pp && *pp; pp = &(*pp)->next)
    if ((*pp)->key == key) {
      axi_ag_box *b = *pp;
      *pp = b->next;
      return b;
    }
  return NULL;
}

/* take_wait's look at the context (d->mu held; axi_ag_wait). */
typedef struct push_look {
  uint64_t ctx, key;
  axi_ag_box *b;
} push_look;

static int push_ready(axi_ag_state *d, void *arg) {
  push_look *l = arg;
  if (closed_at(d, l->key) >= 0)
    return -ax_seterr(AX_ECLOSED, "dist: consumer %llx closed (torn down)",
                      (unsigned long long)l->key);
  if ((l->b = box_unlink(d, l->ctx, l->key)))
    return 1;
  if (!axi_ag_ctx_find(d, l->ctx, 0) && axi_ag_was_released(d, l->ctx))
    return -ax_seterr(AX_ESTALE, "dist: context %llx released",
                      (unsigned long long)l->ctx);
  return 0;
}

/* Waits for the list pushed to key under ctx (d->mu not held). */
static int take_wait(axi_ag_state *d, uint64_t ctx, uint64_t key,
                     const char *from, int64_t timeout_ms, axi_ag_box **out) {
  int64_t tmo = timeout_ms > 0 ? timeout_ms : AXD_TAKE_MS;
  push_look l = {ctx, key, NULL};
  pthread_mutex_lock(&d->mu);
  int err = axi_ag_wait(d, ax_clock_ms() + tmo, from, push_ready, &l);
  pthread_mutex_unlock(&d->mu);
  if (err == AX_ETIMEOUT)
    ax_seterr(err, "dist: nothing pushed from %s in %lld ms",
              from && from[0] ? from : "the producer", (long long)tmo);
  else if (err == AX_EPEERDOWN)
    ax_seterr(err, "dist: %s is down; nothing pushed", from);
  *out = l.b;
  return err;
}

int ax_dist_take(ax_node *n, uint64_t ctx, uint64_t key, const char *from,
                 ax_device dev, int64_t timeout_ms, ax_tlist *out) {
  axi_ag_state *d = axi_ag_get();
  if (out)
    memset(out, 0, sizeof *out);
  if (!d || d->node != n || !ctx || !out)
    return ax_seterr(AX_EINVAL, "dist: bad arguments to take");
  axi_ag_box *b = NULL;
  AX_TRY(take_wait(d, ctx, key, from, timeout_ms, &b));
  /* Onto the device here, on the taker's thread and without the lock. */
  int err = AX_OK;
  for (int i = 0; i < b->t.n; i++) {
    ax_tensor *x = b->t.t[i];
    if (x && !(out->t[i] = ax_tensor_to(x, dev)))
      err = ax_seterr(AX_ENOMEM, "dist: no memory for a pushed tensor");
  }
  out->n = b->t.n;
  if (err == AX_OK)
    err = axi_ag_recv_edges(n, ctx, b->from, out, b->desc, b->len);
  axi_ag_box_free(b);
  if (err != AX_OK)
    ax_tlist_clear(out);
  return err;
}
