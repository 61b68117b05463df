/* Distributed autograd's start-up and shutdown, on top of its parts:
 * ax_dist_init starts the RRef layer, registers the built-ins of each part
 * (the engine, the distributed optimizer, remote stages), installs the
 * RRef gradient hooks and the peer-down handler; ax_dist_fini undoes it.
 * The parts never call back into this file. */
#include <stdio.h>
#include <stdlib.h>

#include "axon/runtime/autograd/autograd-impl.h"
#include "axon/runtime/autograd/collective.h"

static void on_peer_down(ax_node *n, const char *peer, void *user) {
  ax_rref_peer_down(n, peer);
  axi_ag_state *d = axi_ag_get();
  int rank = -1;
  if (!d || ax_node_rank_of(n, peer, &rank) != AX_OK)
    return;
  axi_ag_ctx *gone = NULL;
  pthread_mutex_lock(&d->mu);
  for (axi_ag_ctx **pp = &d->ctxs; *pp;) {
    axi_ag_ctx *c = *pp;
    if ((c->id >> 48) == (uint64_t)(rank + 1)) {
      *pp = c->next;
      d->nctx--;
      d->released[d->nrel++ % AXD_RELEASED_RING] = c->id;
      c->released = 1;
      if (!c->busy) {
        c->next = gone;
        gone = c;
      }
    } else {
      pp = &c->next;
    }
  }
  pthread_cond_broadcast(&d->cv); /* takes under those contexts end */
  pthread_mutex_unlock(&d->mu);
  for (axi_ag_ctx *c = gone, *nx; c; c = nx) {
    nx = c->next;
    axi_ag_ctx_free(c);
  }
}

int ax_dist_init(ax_node *n) {
  if (axi_ag_get())
    return ax_seterr(AX_ESTATE, "dist: a node of this process is initialised");
  AX_TRY(ax_rref_init(n));
  axi_ag_state *d = calloc(1, sizeof *d);
  if (!d)
    return AX_ENOMEM;
  d->node = n;
  snprintf(d->name, sizeof d->name, "%s", ax_node_name(n));
  pthread_mutex_init(&d->mu, NULL);
  pthread_cond_init(&d->cv, NULL);
  int err = axi_ag_engine_register(n);
  if (err == AX_OK)
    err = axi_ag_optim_register(n);
  if (err == AX_OK)
    err = axi_ag_stages_register(n);
  if (err == AX_OK)
    err = axi_ag_push_register(n);
  if (err != AX_OK) {
    free(d);
    return err;
  }
  axi_ag_set(d);
  ax_rref_set_grad_hooks(&axi_ag_grad_hooks);
  ax_node_on_peer_down(n, on_peer_down, NULL);
  return AX_OK;
}

void ax_dist_fini(ax_node *n) {
  axi_ag_state *d = axi_ag_get();
  if (!d || d->node != n)
    return;
  ax_node_on_peer_down(n, NULL, NULL);
  ax_rref_set_grad_hooks(NULL);
  axi_ag_set(NULL);
  for (axi_ag_ctx *c = d->ctxs, *nx; c; c = nx) {
    nx = c->next;
    axi_ag_ctx_free(c);
  }
  ax_rref_fini(n);
  ax_coll_fini(n); /* after the objects: stage hosts free their groups */
  for (int i = 0; i < d->npool; i++)
    ax_tensor_release(d->pool[i]);
  free(d->closed);
  pthread_cond_destroy(&d->cv);
  pthread_mutex_destroy(&d->mu);
  free(d);
}
