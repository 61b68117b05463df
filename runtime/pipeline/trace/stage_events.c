/* Stage-side trace events of the pipeline stage host. Contract in
 * stage_events.h. */
#include <stdio.h>
#include <stdlib.h>

#include "axon/runtime/pipeline/trace/stage_events.h"

void axi_pipe_event_compute(ax_trace *tr, int stage, int agent, const char *cat,
                            long batch, int micro, int64_t t0_us, int64_t t1_us,
                            int stash, int versions) {
  if (!tr)
    return;
  char name[32];
  char k = cat[0] == 'f'   ? 'F'
           : cat[0] == 'b' ? 'B'
           : cat[0] == 'w' ? 'W'
           : cat[0] == 'r' ? 'R'
                           : 'U';
  snprintf(name, sizeof name, "%c%ld.%d", k, batch, micro);
  ax_trace_event e =
      ax_trace_event_make(name, cat, stage, AXP_LANE_COMPUTE, t0_us, t1_us);
  e.step = batch;
  e.micro = micro;
  e.stash = stash;
  e.peer = agent;
  e.bytes = versions;
  ax_trace_add(tr, &e);
}

void axi_pipe_event_xfer(ax_trace *tr, int stage, int send, int kind,
                         long batch, int micro, int peer, const ax_tlist *t,
                         int64_t t0_us, int64_t t1_us) {
  if (!tr)
    return;
  int64_t bytes = 0;
  for (int i = 0; t && i < t->n; i++)
    bytes += t->t[i] ? (int64_t)ax_tensor_nbytes(t->t[i]) : 0;
  char name[32];
  snprintf(name, sizeof name, "%s %c%ld.%d", send ? "send" : "recv",
           kind ? 'G' : 'A', batch, micro);
  ax_trace_event e =
      ax_trace_event_make(name, send ? "send" : "recv", stage,
                          send ? AXP_LANE_SEND : AXP_LANE_RECV, t0_us, t1_us);
  e.step = batch;
  e.micro = micro;
  e.bytes = bytes;
  e.peer = peer;
  ax_trace_add(tr, &e);
}

int axi_pipe_events_take(ax_trace *tr, void **buf, size_t *len) {
  *buf = NULL;
  *len = 0;
  return tr ? ax_trace_encode(tr, 1, buf, len) : AX_OK;
}
