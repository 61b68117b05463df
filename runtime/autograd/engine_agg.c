/* Distributed autograd's aggregate futures (autograd-impl.h): one future
 * that completes once every part added to it did, with the first error,
 * and the root side's bounded wait on one. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "axon/runtime/autograd/autograd-impl.h"

/* ---- aggregate futures: complete once every part did --------------------- */
struct axi_ag_agg {
  pthread_mutex_t mu;
  ax_future *f;
  int pending, err, ignore_errors;
  char msg[256];
};

axi_ag_agg *axi_ag_agg_new(int ignore_errors) {
  axi_ag_agg *a = calloc(1, sizeof *a);
  if (!a || !(a->f = ax_future_new())) {
    free(a);
    return NULL;
  }
  pthread_mutex_init(&a->mu, NULL);
  a->pending = 1; /* the builder's token, dropped by agg_finish */
  a->ignore_errors = ignore_errors;
  return a;
}

static void agg_drop(axi_ag_agg *a, int err, const char *msg) {
  pthread_mutex_lock(&a->mu);
  if (err != AX_OK && a->err == AX_OK && !a->ignore_errors) {
    a->err = err;
    snprintf(a->msg, sizeof a->msg, "%s", msg ? msg : ax_strerror(err));
  }
  int last = --a->pending == 0;
  pthread_mutex_unlock(&a->mu);
  if (!last)
    return;
  ax_future_complete(a->f, a->err, NULL, a->msg);
  ax_future_release(a->f);
  pthread_mutex_destroy(&a->mu);
  free(a);
}

static void agg_part_done(ax_future *f, void *user) {
  agg_drop(user, ax_future_err(f), ax_future_errmsg(f));
  ax_future_release(f);
}

void axi_ag_agg_add(axi_ag_agg *a, ax_future *f) {
  pthread_mutex_lock(&a->mu);
  a->pending++;
  pthread_mutex_unlock(&a->mu);
  if (ax_future_on_done(f, agg_part_done, a) != AX_OK) {
    ax_future_release(f);
    agg_drop(a, AX_ENOMEM, "dist: no memory");
  }
}

/* Returns the aggregate's future (one reference) and drops the builder's
 * token. */
ax_future *axi_ag_agg_finish(axi_ag_agg *a, int err, const char *msg) {
  ax_future *f = ax_future_retain(a->f);
  agg_drop(a, err, msg);
  return f;
}

int axi_ag_agg_wait(ax_future *f, int64_t timeout_ms) {
  int err = ax_future_wait(f, timeout_ms > 0 ? timeout_ms : AXD_CALL_MS);
  if (err != AX_OK && ax_future_is_done(f))
    err = ax_seterr(err, "%s", ax_future_errmsg(f));
  else if (err == AX_ETIMEOUT)
    err = ax_seterr(AX_ETIMEOUT, "dist: backward not finished in time");
  ax_future_release(f);
  return err;
}
