/* The RRef layer's start-up and shutdown, on top of its parts:
 * ax_rref_init registers the RRef value codec, the built-ins of each part
 * (the protocol, calls through RRefs, debugging), starts the protocol
 * thread and registers the box kind; ax_rref_fini stops the thread and
 * frees the tables. The parts never call back into this file. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "axon/rref/rref-impl.h"

int ax_rref_init(ax_node *n) {
  static int ext_done;
  if (!n)
    return ax_seterr(AX_EINVAL, "rref: NULL node");
  if (!__atomic_exchange_n(&ext_done, 1, __ATOMIC_ACQ_REL)) {
    int rc = ax_value_ext_register(AX_VALUE_EXT_RREF, &axi_rref_ext_ops);
    if (rc != AX_OK)
      return rc;
  }
  if (axi_rctx_get())
    return ax_seterr(AX_ESTATE, "rref: a node of this process is initialised");
  axi_rctx *rc = calloc(1, sizeof *rc);
  if (!rc)
    return AX_ENOMEM;
  rc->node = n;
  snprintf(rc->name, sizeof rc->name, "%s", ax_node_name(n));
  pthread_mutex_init(&rc->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&rc->cv, &ca);
  pthread_condattr_destroy(&ca);
  int err = axi_rref_register_proto(n);
  if (err == AX_OK)
    err = axi_rref_register_calls(n);
  if (err == AX_OK)
    err = axi_rref_register_debug(n);
  if (err == AX_OK && pthread_create(&rc->thread, NULL, axi_proto_thread, rc))
    err = ax_seterr(AX_ENOMEM, "rref: cannot start the protocol thread");
  if (err != AX_OK) {
    free(rc);
    return err;
  }
  axi_rctx_set(rc);
  return ax_robj_register(n, &axi_box_kind);
}

void ax_rref_fini(ax_node *n) {
  axi_rctx *rc = axi_rctx_get();
  if (!rc || rc->node != n)
    return;
  pthread_mutex_lock(&rc->mu);
  rc->stop = 1; /* from now on axi_pmsg_push drops messages */
  pthread_cond_broadcast(&rc->cv);
  pthread_mutex_unlock(&rc->mu);
  pthread_join(rc->thread, NULL);
  axi_rctx_set(NULL);
  pthread_mutex_lock(&rc->mu);
  axi_pmsg *q = rc->q;
  axi_owned *owned = rc->owned;
  rc->q = NULL;
  rc->owned = NULL;
  rc->nowned = 0;
  pthread_mutex_unlock(&rc->mu);
  for (axi_pmsg *m = q, *nx; m; m = nx) {
    nx = m->next;
    free(m);
  }
  /* Destroying an object may release the RRefs it holds (under rc->mu). */
  int survivors = 0;
  for (axi_owned *e = owned, *nx; e; e = nx) {
    nx = e->next;
    survivors += e->local_refs > 0;
    axi_waiters_run(rc, e->waiters, AX_ECLOSED, "rref: node shut down");
    e->waiters = NULL;
    axi_owned_free(e);
  }
  /* User records still referenced by handles stay allocated (their owners
   * may release later; they are no longer in the table); unreferenced ones
   * are freed. */
  pthread_mutex_lock(&rc->mu);
  ax_rref *users = rc->users;
  rc->users = NULL;
  rc->nusers = 0;
  survivors += rc->inflight > 0;
  pthread_mutex_unlock(&rc->mu);
  for (ax_rref *u = users, *nx; u; u = nx) {
    nx = u->next;
    u->next = NULL;
    u->dead = 1;
    u->in_table = 0;
    if (u->dropped)
      axi_user_free(u);
    else
      survivors++;
  }
  for (struct axi_kindreg *k = rc->kinds, *nx; k; k = nx) {
    nx = k->next;
    free(k);
  }
  rc->kinds = NULL;
  rc->resolver = NULL;
  if (survivors) /* handles or callbacks still point at rc: kept on purpose */
    return;
  pthread_cond_destroy(&rc->cv);
  pthread_mutex_destroy(&rc->mu);
  free(rc);
}
