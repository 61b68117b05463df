/* What a pipeline stage host records about itself (stage_host.c): every
 * forward, backward, recompute and optimizer step on lane 0, every receive
 * (waiting for a neighbour's activations or gradients) on lane 1 and every
 * send (pushing to a neighbour) on lane 2, as Chrome-trace events
 * (trace.h) with pid = stage index. The coordinator collects them with the
 * host's "trace" method (ax_pipe_trace in coordinator.h). Internal to
 * runtime/pipeline/.
 *
 * Threads: every function may be called from any thread (the trace has its
 * own lock). Recording never fails the operation: events beyond the cap or
 * without memory are dropped and counted by the trace. */
#ifndef AX_PIPELINE_STAGE_EVENTS_H
#define AX_PIPELINE_STAGE_EVENTS_H

#include <stdint.h>

#include "axon/models/module.h"
#include "axon/rpc/value.h"
#include "axon/runtime/pipeline/trace/trace.h"

#define AXP_LANE_COMPUTE 0
#define AXP_LANE_RECV 1
#define AXP_LANE_SEND 2

/* What a transfer event moves (axi_pipe_event_xfer's kind). */
#define AXP_ACTIVATIONS 0
#define AXP_GRADIENTS 1

/* Events a host keeps between two collections (older ones are dropped). */
#define AXP_STAGE_EVENTS_MAX 200000

/* A compute event: cat "forward", "backward" (in split modes: the input
 * half I), "weight" (the weight half W), "recompute" or "optim", named
 * like "F3.1" (kind letter, batch, micro). stash = live states after it,
 * or -1. On compute events `peer` is the node rank of the agent that ran
 * it (agent; -1 unknown) and `bytes` the weight versions the stage holds
 * after it (versions, counted as the host reports them; -1 unknown): the
 * schedule oracle (tests/pipe_eventcheck.h) checks placement and version
 * bounds from them. */
void axi_pipe_event_compute(ax_trace *tr, int stage, int agent, const char *cat,
                            long batch, int micro, int64_t t0_us, int64_t t1_us,
                            int stash, int versions);

/* A transfer event on the receive or send lane: kind AXP_ACTIVATIONS or
 * AXP_GRADIENTS (input gradients); bytes = tensor bytes moved; peer = the other
 * stage. */
void axi_pipe_event_xfer(ax_trace *tr, int stage, int send, int kind,
                         long batch, int micro, int peer, const ax_tlist *t,
                         int64_t t0_us, int64_t t1_us);

/* The events of the "trace" method: ax_trace_encode(tr, clear = 1) into
 * *buf (malloc'd, the caller frees; NULL and 0 when tr is NULL). */
int axi_pipe_events_take(ax_trace *tr, void **buf, size_t *len);

#endif
