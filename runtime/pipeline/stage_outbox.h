/* The outbox of a pipeline stage host (stage_host.c): tensor lists a stage
 * produced (activations after a forward, input gradients after a backward)
 * wait here until the neighbour that needs them pulls them with the "take"
 * method, stage to stage. Internal to runtime/pipeline/.
 *
 * Threads: every function may be called from any thread; the outbox has its
 * own lock, never held while calling into rpc/ or rref/. */
#ifndef AX_PIPELINE_STAGE_OUTBOX_H
#define AX_PIPELINE_STAGE_OUTBOX_H

#include <pthread.h>

#include "rref/rref.h"
#include "runtime/module.h"
#include "runtime/pipeline/trace.h"

typedef struct axp_pentry axp_pentry;

typedef struct axp_outbox {
  pthread_mutex_t mu;
  axp_pentry *head;
} axp_outbox;

void axp_outbox_init(axp_outbox *ob);
/* Drops every waiting entry (their tensors are released). */
void axp_outbox_clear(axp_outbox *ob);
/* Clears, then destroys the lock. */
void axp_outbox_destroy(axp_outbox *ob);

/* Adds (kind, batch, micro) -> *t. On success the outbox takes t's
 * references and *t is zeroed; on error (AX_ENOMEM) *t is untouched. */
int axp_outbox_put(axp_outbox *ob, int kind, long batch, int micro,
                   ax_tlist *t);

/* The "take" method of stage `index`: args [kind, batch, micro]; hands the
 * entry over once (its tensors, or i64 0 for a missing one, appended to
 * out) and removes it, recording a send event in tr (may be NULL).
 * AX_ENOTFOUND (with a message) when absent. */
int axp_outbox_take(axp_outbox *ob, int index, const ax_values *args,
                    ax_values *out, ax_trace *tr);

/* The client side: calls "take" [kind, batch, micro] on `from` (under the
 * calling thread's current autograd context) and fills *t with copies on
 * dev (NULL entries for missing tensors). On error *t is empty. */
int axp_outbox_fetch(ax_node *n, int index, ax_rref *from, int kind,
                     long batch, int micro, ax_device dev, ax_tlist *t);

#endif
