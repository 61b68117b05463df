/* ax_pipe_init: distributed autograd plus the pipeline stage host. */
#include "axon/runtime/pipeline/pipeline.h"

#include "axon/runtime/autograd/collective.h"
#include "axon/runtime/pipeline/stage/stage_host-impl.h"

int ax_pipe_init(ax_node *n) {
  AX_TRY(ax_dist_init(n));
  /* The collectives' mailbox: replicas of a stage all-reduce (--replicas). */
  int err = ax_coll_init(n);
  if (err == AX_OK)
    err = axi_pipe_host_register(n);
  if (err != AX_OK)
    ax_dist_fini(n);
  return err;
}
