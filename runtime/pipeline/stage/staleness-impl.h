/* The staleness corrections' per-stage state and math (staleness.c), used
 * by the stage host; the contract of the corrections is in staleness.h.
 * Not thread-safe: the host calls these under its stage lock. */
#ifndef AX_PIPELINE_STALENESS_IMPL_H
#define AX_PIPELINE_STALENESS_IMPL_H

#include "axon/kernels/tensor.h"
#include "axon/models/optim.h"
#include "axon/runtime/pipeline/stage/staleness.h"

typedef struct axi_stale {
  int kind;    /* AX_STALE_* */
  int delay;   /* ax_pipe_delay of the stage */
  int warmup;  /* PipeMare's learning-rate warm-up (updates; 0: none) */
  float gamma; /* decay of delta (0 for predict: delta is the last update) */
  ax_tensor *delta;  /* the average of the updates; NULL: zero */
  ax_tensor *before; /* the weights before the update in progress */
  ax_tensor *pred;   /* predicted weights of mini-batch pred_for */
  long pred_for;
  float lr_scale; /* the learning-rate scale of the update in progress
                     (axi_stale_before_step): PipeMare's, else 1 */
} axi_stale;

/* Sets the correction up (after axi_stale_clear): kind, the stage's delay,
 * PipeMare's gamma (< 0: AX_PIPEMARE_GAMMA) and warm-up. AX_EINVAL on a
 * bad value (the state then stays AX_STALE_NONE). */
int axi_stale_init(axi_stale *z, int kind, int delay, double gamma, int warmup);
/* Drops the tensors and returns to AX_STALE_NONE (NULL-safe fields;
 * lr_scale 1). */
void axi_stale_clear(axi_stale *z);
/* Whether the backward uses a stashed version when the mode stashes one
 * (pipemare corrects the live weights instead). */
int axi_stale_stashes(const axi_stale *z);
/* The weights a training forward of mini-batch `batch` uses, given the
 * weights w the mode gives it: w itself (a new reference) but for predict,
 * w + delay * delta, computed once per mini-batch (later calls for the
 * same batch return the same tensor whatever w). */
int axi_stale_forward(axi_stale *z, ax_tensor *w, long batch, ax_tensor **out);
/* The weights a backward uses under pipemare: live - min(delay, steps) *
 * delta (a new tensor, or a new reference to live when that is live);
 * *out = NULL for the other corrections (the mode's choice stands). */
int axi_stale_backward(axi_stale *z, ax_tensor *live, long steps,
                       ax_tensor **out);
/* Around one optimizer step of the live weights w (mini-batch t), the
 * optimizer's update number `steps` (0-based: the updates it made before):
 * before sets z->lr_scale, the factor of this update's learning rate
 * (pipemare: axi_stale_lr_scale at steps; 1 otherwise), which the caller
 * gives the optimizer that runs the update (the stage's own, its ZeRO
 * shard's, or the optimizer host's with the offloaded step); it keeps w's
 * values, and for predict never lets a prediction be w itself across its
 * update; next >= 0 (double-buffered modes, whose forwards of t + 1 use the
 * weights before this update) makes the prediction of mini-batch next from
 * w now, if not made yet. After (w updated: every value of the whole
 * parameters, also when a shard of them was stepped here or they were
 * updated on another agent) folds the update into delta and drops a
 * prediction of a batch <= t. */
int axi_stale_before_step(axi_stale *z, long steps, ax_tensor *w, long next);
int axi_stale_after_step(axi_stale *z, const ax_tensor *w, long t);
/* PipeMare's learning-rate factor at 0-based update k (staleness.h). */
float axi_stale_lr_scale(int delay, int warmup, long k);

#endif
