/* Using a checkpoint without the pipeline (checkpoint.h): the state the
 * mover gathers from any layout (state.h) as the whole model, and the
 * exported model file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/models/model.h"
#include "axon/runtime/pipeline/state/checkpoint.h"
#include "axon/runtime/pipeline/state/ckpt_file-impl.h"
#include "axon/runtime/pipeline/state/state.h"

/* The whole model on dev with the state's parameters and buffers (their
 * sizes were checked against the model when the state was read). */
static int build(const ax_train_state *w, ax_device dev, ax_net **out) {
  const ax_model_def *def = ax_model_find(w->model);
  if (!def)
    return AX_ENOTFOUND;
  ax_config cfg;
  AX_TRY(ax_model_config(def, w->model_config, &cfg));
  ax_net *net;
  AX_TRY(ax_model_stage(def, &cfg, 0, w->n_blocks, dev, 0, &net));
  int err = AX_OK;
  if (w->n_params != net->n_params || w->n_buffers != net->n_buffers)
    err = ax_seterr(AX_EFORMAT,
                    "checkpoint: %zu parameters and %zu buffer values, %s "
                    "(%s) has %zu and %zu",
                    w->n_params, w->n_buffers, w->model, w->model_config,
                    net->n_params, net->n_buffers);
  if (err == AX_OK)
    err = ax_tensor_write(net->params, w->params, w->n_params * sizeof(float));
  if (err == AX_OK && w->n_buffers)
    err =
        ax_tensor_write(net->buffers, w->buffers, w->n_buffers * sizeof(float));
  if (err != AX_OK) {
    ax_net_free(net);
    return err;
  }
  *out = net;
  return AX_OK;
}

int ax_ckpt_load_net(const char *path, ax_device dev, ax_net **net,
                     ax_ckpt_info *info) {
  ax_train_state w;
  *net = NULL;
  AX_TRY(ax_state_read(path, &w, info));
  int err = build(&w, dev, net);
  ax_state_free(&w);
  return err;
}

int ax_ckpt_export(const char *path, const char *out) {
  ax_ckpt_info info;
  ax_train_state w;
  AX_TRY(ax_state_read(path, &w, &info));
  axi_ckw f;
  axi_ckw_init(&f, AXI_CK_MODEL);
  axi_ckw_str(&f, "model", info.model);
  axi_ckw_str(&f, "model_config", info.model_config);
  axi_ckw_str(&f, "dataset", info.dataset);
  axi_ckw_str(&f, "data_config", info.data_config);
  axi_ckw_i64(&f, "step", info.step);
  axi_ckw_i64(&f, "blocks", w.n_blocks);
  axi_ckw_f32(&f, "params", w.params, w.n_params);
  axi_ckw_f32(&f, "buffers", w.buffers, w.n_buffers);
  int err = axi_ckw_commit(&f, out, NULL, NULL);
  ax_state_free(&w);
  return err;
}
