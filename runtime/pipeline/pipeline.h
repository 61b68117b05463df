/* Setting up a node for pipelines. The pipeline layer builds on distributed
 * autograd (runtime/autograd/), never the other way round, so the stage host
 * kind "axon.pipe.stage" is registered here rather than by ax_dist_init. */
#ifndef AX_PIPELINE_PIPELINE_H
#define AX_PIPELINE_PIPELINE_H

#include "axon/runtime/autograd/autograd.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ax_dist_init(n), the collectives' mailbox (ax_coll_init: the replicas
 * of a stage all-reduce their gradients), then registers the pipeline stage
 * host kind "axon.pipe.stage" (stage_host.h), the offloaded optimizer kind
 * "axon.pipe.optim" and the in-memory checkpoint store. The single call an
 * agent that hosts pipeline stages, or a coordinator, makes after
 * ax_node_create; undo it with ax_dist_fini (which also frees the
 * mailbox). On error nothing stays initialised. */
int ax_pipe_init(ax_node *n);

#ifdef __cplusplus
}
#endif
#endif
