/* The front door of the coordinator: ax_pipe_new and ax_pipe_train pick
 * one pipeline (coordinator.c, coord_run.c) or replicated ones
 * (replicas.c), and a train call of a pipeline with a frozen prefix feeds
 * its stages through the prefix (freeze.h). */
#include "axon/runtime/pipeline/coord/coordinator-impl.h"

int ax_pipe_new(ax_node *n, const ax_pipe_opts *o, ax_pipe **out) {
  *out = NULL;
  if (o && (o->replicas > 1 || o->tensor_parallel > 1))
    return axi_pipe_replicas_new(n, o, out);
  if (o && o->zero)
    return ax_seterr(AX_EINVAL,
                     "pipeline: zero %d shards over replicas, "
                     "and there is one",
                     o->zero);
  return axi_pipe_create(n, o, NULL, out);
}

/* One pipeline, or the replicated ones of a front. */
static int train_call(ax_pipe *p, long n, ax_pipe_batch_fn batch,
                      ax_pipe_step_fn step, void *user) {
  if (p->nrep)
    return axi_pipe_replicas_train(p, n, batch, step, user);
  return axi_pipe_train_one(p, n, batch, step, user);
}

int ax_pipe_train(ax_pipe *p, long n, ax_pipe_batch_fn batch,
                  ax_pipe_step_fn step, void *user) {
  if (!p || n < 0 || !batch)
    return ax_seterr(AX_EINVAL, "pipeline: bad arguments to train");
  if (!p->frozen)
    return train_call(p, n, batch, step, user);
  axi_pipe_frozen_feed w = {p->frozen, batch, step, user}; /* freeze.h */
  return train_call(p, n, axi_pipe_frozen_batch, axi_pipe_frozen_step, &w);
}
