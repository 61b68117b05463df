/* ax_pipe_init: distributed autograd plus the pipeline stage host. */
#include "runtime/pipeline/pipeline.h"

#include "runtime/pipeline/stage_host.h"

int ax_pipe_init(ax_node *n) {
  AX_TRY(ax_dist_init(n));
  int err = axi_pipe_host_register(n);
  if (err != AX_OK)
    ax_dist_fini(n);
  return err;
}
