/* Internals of the pipeline stage host (stage_host.c: creation, setup,
 * forward, state and teardown; stage_host_bwd.c: backward and the update
 * rule of each mode). Contract of the methods in stage_host.h. */
#ifndef AX_PIPELINE_STAGE_HOST_IMPL_H
#define AX_PIPELINE_STAGE_HOST_IMPL_H

#include "runtime/dist/stage-impl.h"
#include "runtime/pipeline/stage_inbox.h"
#include "runtime/pipeline/trace.h"

typedef struct pstate { /* one unit between its forward and its backward */
  long batch;
  int micro;
  uint64_t seed;
  ax_slot *slot;     /* saved activations; NULL when replayed */
  ax_tlist input;    /* kept inputs (replay) */
  ax_tlist dlogits;  /* last stage: d loss / d logits */
  ax_tensor *ver;    /* weights the forward used (ddg, pipedream) */
  struct pstate *next;
} pstate;

typedef struct phost {
  axd_stage *s;
  int mode, recompute, is_last;
  ax_rref *prev, *next;
  axp_inbox in;   /* its own lock; everything else under s->mu */
  pstate *states;
  ax_trace *tr;   /* stage-side events (stage_events.h); its own lock */
} phost;

/* Frees a state and everything it keeps (NULL-safe). */
void axp_state_free(pstate *st);
/* Appends [busy_us, live_states, weight_versions, state_bytes] (s->mu
 * held). */
int axp_host_report(phost *h, int64_t t0_us, ax_values *out);
/* How long an operation waits for its neighbour's tensors: what is left of
 * its call's deadline (at most 10 minutes). */
static inline int64_t axp_wait_ms(ax_call_ctx *cc) {
  int64_t left = ax_call_remaining_ms(cc);
  return left < 1 ? 1 : left > 600000 ? 600000 : left;
}
/* The "bwd" method (stage_host_bwd.c). */
int axp_host_bwd(ax_call_ctx *cc, void *obj, const ax_values *args,
                 ax_values *out);

#endif
