/* Distributed autograd's per-context gradient buffers (autograd.h): found
 * or made by key, read, taken out of a context and recycled through the
 * node's pool. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "axon/runtime/autograd/autograd-impl.h"

/* ---- gradient buffers ---------------------------------------------------- */
/* The buffer of stage `key` in context c (NULL-safe; d->mu held). */
static axi_ag_grad *grad_find(axi_ag_ctx *c, uint64_t key) {
  axi_ag_grad *g = c ? c->grads : NULL;
  while (g && g->key != key)
    g = g->next;
  return g;
}

/* A recycled buffer of nfloats on dev, not zeroed yet, or NULL (d->mu
 * held). */
static ax_tensor *pool_take(axi_ag_state *d, size_t nfloats, ax_device dev) {
  for (int i = 0; i < d->npool; i++) {
    ax_tensor *t = d->pool[i];
    if (ax_tensor_numel(t) != nfloats || !ax_device_eq(t->device, dev))
      continue;
    d->pool[i] = d->pool[--d->npool];
    return t;
  }
  return NULL;
}

/* Finds key's buffer in ctx or, when fresh (a zero-filled buffer) is given,
 * links it there (*fresh = NULL: the context holds it now). d->mu held. */
static int grads_find(axi_ag_state *d, uint64_t ctx, uint64_t key,
                      size_t nfloats, ax_tensor **fresh, ax_tensor **out) {
  axi_ag_ctx *c = axi_ag_ctx_find(d, ctx, 1);
  axi_ag_grad *g = grad_find(c, key);
  if (!c)
    return ax_seterr(AX_ESTALE, "dist: context released");
  if (!g && !*fresh)
    return AX_ENOTFOUND; /* not yet: the caller makes one */
  if (!g) {
    if (!(g = calloc(1, sizeof *g)))
      return ax_seterr(AX_ENOMEM, "dist: no memory for gradients");
    g->key = key;
    g->g = *fresh;
    *fresh = NULL;
    g->next = c->grads;
    c->grads = g;
  }
  if (ax_tensor_numel(g->g) != nfloats)
    return ax_seterr(AX_ESHAPE, "dist: gradient buffer size mismatch");
  *out = ax_tensor_retain(g->g);
  return AX_OK;
}

int ax_dist_grads(ax_node *n, uint64_t ctx, uint64_t key, size_t nfloats,
                  ax_device dev, ax_tensor **out) {
  axi_ag_state *d = axi_ag_get();
  if (!d || d->node != n)
    return ax_seterr(AX_ESTATE, "dist: node not initialised");
  ax_tensor *fresh = NULL;
  pthread_mutex_lock(&d->mu);
  int err = grads_find(d, ctx, key, nfloats, &fresh, out);
  if (err == AX_ENOTFOUND)
    fresh = pool_take(d, nfloats, dev);
  pthread_mutex_unlock(&d->mu);
  if (err != AX_ENOTFOUND)
    return err;
  /* A new buffer is zeroed without the lock, which pushes and gradients
   * arriving meanwhile take. */
  if (fresh && ax_tensor_fill(fresh, 0.0f) != AX_OK) {
    ax_tensor_release(fresh);
    fresh = NULL;
  }
  int64_t shape[1] = {(int64_t)nfloats};
  if (!fresh && !(fresh = ax_tensor_zeros(AX_F32, 1, shape, dev)))
    return ax_seterr(AX_ENOMEM, "dist: no memory for gradients");
  pthread_mutex_lock(&d->mu);
  err = grads_find(d, ctx, key, nfloats, &fresh, out);
  pthread_mutex_unlock(&d->mu);
  ax_dist_grads_recycle(n, fresh); /* made by another thread meanwhile */
  return err;
}

int ax_dist_get_gradients(ax_node *n, uint64_t ctx, uint64_t key,
                          ax_tensor **out) {
  axi_ag_state *d = axi_ag_get();
  if (!d || d->node != n)
    return ax_seterr(AX_ESTATE, "dist: node not initialised");
  int err = AX_OK;
  pthread_mutex_lock(&d->mu);
  axi_ag_grad *g = grad_find(axi_ag_ctx_find(d, ctx, 0), key);
  if (!g)
    err = ax_seterr(AX_ENOTFOUND, "dist: no gradients for %llx in %llx",
                    (unsigned long long)key, (unsigned long long)ctx);
  else
    *out = ax_tensor_retain(g->g);
  pthread_mutex_unlock(&d->mu);
  return err;
}

/* ---- taking and recycling gradient buffers ------------------------------- */
int ax_dist_take_gradients(ax_node *n, uint64_t ctx, uint64_t key,
                           ax_tensor **out) {
  axi_ag_state *d = axi_ag_get();
  if (!d || d->node != n)
    return ax_seterr(AX_ESTATE, "dist: node not initialised");
  int err = AX_OK;
  pthread_mutex_lock(&d->mu);
  axi_ag_ctx *c = axi_ag_ctx_find(d, ctx, 0);
  axi_ag_grad **pp = c ? &c->grads : NULL;
  while (pp && *pp && (*pp)->key != key)
    pp = &(*pp)->next;
  if (!pp || !*pp) {
    err = ax_seterr(AX_ENOTFOUND, "dist: no gradients for %llx in %llx",
                    (unsigned long long)key, (unsigned long long)ctx);
  } else {
    axi_ag_grad *g = *pp;
    *pp = g->next;
    *out = g->g;
    free(g);
  }
  pthread_mutex_unlock(&d->mu);
  return err;
}

void ax_dist_grads_recycle(ax_node *n, ax_tensor *g) {
  axi_ag_state *d = axi_ag_get();
  if (!g)
    return;
  if (d && d->node == n) {
    pthread_mutex_lock(&d->mu);
    if (d->npool < AXD_POOL_MAX) {
      d->pool[d->npool++] = g;
      g = NULL;
    }
    pthread_mutex_unlock(&d->mu);
  }
  ax_tensor_release(g);
}
