/* The outbox of a pipeline stage host and the "take" method that empties
 * it, stage to stage. Contract in stage_outbox.h. */
#include <stdlib.h>
#include <string.h>

#include "runtime/pipeline/stage_events.h"
#include "runtime/pipeline/stage_outbox.h"

struct axp_pentry { /* a produced tensor list waiting for "take" */
  int kind;
  long batch;
  int micro;
  ax_tlist t;
  struct axp_pentry *next;
};

void axp_outbox_init(axp_outbox *ob) {
  pthread_mutex_init(&ob->mu, NULL);
  ob->head = NULL;
}

void axp_outbox_clear(axp_outbox *ob) {
  pthread_mutex_lock(&ob->mu);
  axp_pentry *e = ob->head;
  ob->head = NULL;
  pthread_mutex_unlock(&ob->mu);
  for (axp_pentry *nx; e; e = nx) {
    nx = e->next;
    ax_tlist_clear(&e->t);
    free(e);
  }
}

void axp_outbox_destroy(axp_outbox *ob) {
  axp_outbox_clear(ob);
  pthread_mutex_destroy(&ob->mu);
}

int axp_outbox_put(axp_outbox *ob, int kind, long batch, int micro,
                   ax_tlist *t) {
  axp_pentry *e = calloc(1, sizeof *e);
  if (!e)
    return AX_ENOMEM;
  e->kind = kind;
  e->batch = batch;
  e->micro = micro;
  e->t = *t; /* takes the references */
  memset(t, 0, sizeof *t);
  pthread_mutex_lock(&ob->mu);
  e->next = ob->head;
  ob->head = e;
  pthread_mutex_unlock(&ob->mu);
  return AX_OK;
}

int axp_outbox_take(axp_outbox *ob, int index, const ax_values *args,
                    ax_values *out, ax_trace *tr) {
  int64_t t0 = ax_trace_now_us(), kind, batch, micro;
  AX_TRY(ax_values_get_i64(args, 0, &kind));
  AX_TRY(ax_values_get_i64(args, 1, &batch));
  AX_TRY(ax_values_get_i64(args, 2, &micro));
  pthread_mutex_lock(&ob->mu);
  axp_pentry *e = NULL;
  for (axp_pentry **pp = &ob->head; *pp; pp = &(*pp)->next)
    if ((*pp)->kind == kind && (*pp)->batch == batch &&
        (*pp)->micro == micro) {
      e = *pp;
      *pp = e->next;
      break;
    }
  pthread_mutex_unlock(&ob->mu);
  if (!e)
    return ax_seterr(AX_ENOTFOUND, "pipe.stage %d: no %s of batch %lld/%lld",
                     index, kind ? "input gradient" : "activation",
                     (long long)batch, (long long)micro);
  int err = AX_OK;
  for (int i = 0; err == AX_OK && i < e->t.n; i++) /* i64 0: no tensor */
    err = e->t.t[i] ? ax_values_add_tensor(out, e->t.t[i])
                    : ax_values_add_i64(out, 0);
  if (err == AX_OK)
    axp_event_xfer(tr, index, 1, (int)kind, (long)batch, (int)micro,
                   kind ? index - 1 : index + 1, &e->t, t0,
                   ax_trace_now_us());
  ax_tlist_clear(&e->t);
  free(e);
  return err;
}

int axp_outbox_fetch(ax_node *n, int index, ax_rref *from, int kind,
                     long batch, int micro, ax_device dev, ax_tlist *t) {
  memset(t, 0, sizeof *t);
  if (!from)
    return ax_seterr(AX_ESTATE, "pipe.stage %d: no neighbour to fetch from "
                     "(setup missing?)", index);
  int64_t a[3] = {kind, batch, micro};
  ax_values *args = ax_values_new(), *res = NULL;
  if (!args)
    return AX_ENOMEM;
  for (int i = 0; i < 3; i++)
    ax_values_add_i64(args, a[i]);
  ax_call_opts o = {.autograd_ctx = ax_autograd_ctx_current()};
  int err = ax_rref_rpc_sync(n, from, "take", args, &o, &res);
  ax_values_free(args);
  for (size_t i = 0; err == AX_OK && i < ax_values_count(res) &&
                     t->n < AX_TLIST_MAX; i++) {
    ax_tensor *x;
    if (ax_values_type(res, i) != AX_VAL_TENSOR) {
      t->t[t->n++] = NULL; /* an input without gradient */
      continue;
    }
    err = ax_values_get_tensor(res, i, &x);
    if (err == AX_OK && !(t->t[t->n++] = ax_tensor_to(x, dev)))
      err = AX_ENOMEM;
  }
  ax_values_free(res);
  if (err != AX_OK)
    ax_tlist_clear(t);
  return err;
}
