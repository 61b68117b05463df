/* Internal structure of model stages (runtime/autograd/stage.c) shared with
 * their parameter-set objects and local optimizers (optim_dist.c). */
#ifndef AX_DIST_STAGE_IMPL_H
#define AX_DIST_STAGE_IMPL_H

#include <pthread.h>

#include "axon/models/model.h"
#include "axon/models/optim.h"
#include "axon/runtime/autograd/stage.h"

typedef struct axi_ag_stage {
  int refs; /* atomic: the stage object, parameter sets, recorded calls */
  ax_node *node;
  const ax_model_def *def;
  ax_device dev;
  uint64_t key; /* gradient buffer key in contexts */
  int index, first, last, is_first, ignore_index;
  ax_model_info info; /* the model's (its ties: models/model.h) */
  ax_net *net;
  ax_optim *opt;      /* the owner's local optimizer (mu) */
  pthread_mutex_t mu; /* serialises forward, backward, step and state */
} axi_ag_stage;

void axi_ag_stage_release(axi_ag_stage *s);
/* Builds a stage of `model` from a stage configuration (stage.h keys) into
 * *obj (an axi_ag_stage with one reference). */
/* Host copies of the flat parameters (P) and of the buffers (Q, or an
 * empty tensor), taken under the stage's lock (new references). */
int axi_ag_stage_state_copy(axi_ag_stage *s, ax_tensor **params,
                            ax_tensor **buffers);
/* Appends those copies [params, buffers] to out: the "state_save" method
 * of the stage kinds of stage.h (the pipeline stage host's reply is its
 * own message, runtime/pipeline/stage/stage_msg-impl.h). */
int axi_ag_stage_state_save(axi_ag_stage *s, ax_values *out);

int axi_ag_stage_create(ax_node *n, const char *model, const char *config,
                        ax_device dev, void **obj);
extern const ax_robj_kind axi_ag_params_kind; /* "stage.params" */

#endif
