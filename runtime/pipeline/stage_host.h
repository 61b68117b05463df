/* The pipeline stage host: remote object kind "pipe.stage" (registered by
 * ax_pipe_init on every agent) that runs one model stage under a schedule
 * the coordinator drives (runtime/pipeline/coordinator.h).
 *
 * Configuration: "model=NAME[,stage.h keys]", e.g.
 * "model=mlp,stage=1,splits=0/2/4,seed=3,widths=784/64/10": the model name
 * first, then the keys of the model stage kinds (runtime/dist/stage.h).
 *
 * Methods (every call on one host runs one at a time under the stage lock;
 * the coordinator issues at most one fwd/bwd per host at a time). A push
 * that failed makes the next fwd/bwd fail with its error.
 *  - "setup" [mode, recompute, optim config (str), prev, next, self id]:
 *    prev/next are the neighbours' object RRefs, or i64 0 at the ends;
 *    self id is ax_rref_id of this host's own RRef, under which its inbox
 *    receives the neighbours' pushes (stage_inbox.h). Creates the local
 *    optimizer (models/optim.h keys).
 *  - "fwd" [batch, micro, seed, flags, n_in, inputs..., n_lab, labels...,
 *    norms (n_lab i64)]: flags bit 0 = training, bit 1 = keep only the
 *    inputs and recompute at backward (gpipe recompute). With n_in = 0 the
 *    inputs are the activations prev pushed (waited for in the inbox up to
 *    the call's deadline). A stage with a next pushes its outputs there
 *    right away (stage to stage, not through the caller). Training keeps a
 *    per-unit state until its backward: the saved activations (or only the
 *    inputs for fr and recompute) and, for ddg and pipedream, the weight
 *    version the forward used (copy-on-update: before an update, states that
 *    still use the live weights get one separate copy of the flat buffer).
 *    Returns [busy_us, live_states, weight_versions, state_bytes] and, on
 *    the last stage, [loss, correct, count] after them.
 *  - "bwd" [batch, micro, step]: the output gradient is the one next pushed,
 *    or from the loss on the last stage; the input gradients are pushed to
 *    prev. A replayed state first
 *    recomputes its forward (update_stats = 0, same dropout seed) with the
 *    gpipe weights (unchanged since the forward) or, for fr, the latest
 *    ones. Parameter gradients go to the call's distributed autograd
 *    context (its gradient buffer for this stage); modes that update per
 *    mini-batch also sum them into the stage's accumulator. step = 1
 *    updates the weights: with this context's gradients for ddg, fr and
 *    pipedream, with the sum since the last update otherwise. Returns
 *    [busy_us, live_states, weight_versions, state_bytes].
 *  - "state_save" []: [params (P), buffers (Q) or an empty tensor].
 *  - "trace" []: [bytes] the events recorded since the last "trace"
 *    (stage_events.h), encoded by ax_trace_encode.
 *  - "teardown" []: drops the neighbours' RRefs and every state (breaks the
 *    reference cycle between neighbours; call before releasing the host). */
#ifndef AX_PIPELINE_STAGE_HOST_H
#define AX_PIPELINE_STAGE_HOST_H

#include "rref/rref.h"

#define AX_PIPE_FLAG_TRAIN 1
#define AX_PIPE_FLAG_RECOMPUTE 2

/* Registers "pipe.stage" on n (called by ax_pipe_init, pipeline.h). */
int axi_pipe_host_register(ax_node *n);

#endif
