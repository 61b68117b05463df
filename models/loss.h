/* Softmax cross-entropy over a model's outputs.
 *
 * loss = sum_i mean_{rows r of outputs[i] with labels[i][r] != ignore}
 *          xent(outputs[i][r], labels[i][r])
 * Logits are (rows, classes) or (B, classes); labels are i32 or i64 of
 * `rows` elements on any device (moved to the logits' device). */
#ifndef AX_LOSS_H
#define AX_LOSS_H

#include "axon/models/module.h"

typedef struct ax_loss_result {
  double loss;                   /* the summed mean losses */
  int64_t count[AX_TLIST_MAX];   /* kept rows per output */
  int64_t correct[AX_TLIST_MAX]; /* rows whose argmax equals the label */
} ax_loss_result;

/* Computes the loss; when dlogits is not NULL also its gradient
 * (new references, one per output) scaled by `scale` / count_i (scale = 1
 * for a plain mean; the pipeline passes micro/mini-batch ratios). When
 * norm[i] > 0 it replaces count_i as the divisor (so micro-batch losses sum
 * to the mini-batch mean). norm may be NULL. */
int ax_loss_xent(const ax_tlist *outputs, const ax_tlist *labels,
                 int ignore_index, const int64_t *norm, float scale,
                 ax_loss_result *res, ax_tlist *dlogits);

/* A training step's forward and loss in one: ax_forward of root on `in`
 * (ex->training set, slot not NULL), then the loss of its outputs as
 * ax_loss_xent computes it, with dlogits for ax_backward. When the model's
 * last block fuses the loss (ax_xent_fuse, models/module.h: GPT's head),
 * the outputs are never formed and dlogits comes back EMPTY: pass it to
 * the backward as it is (the block kept its gradients in the slot). With
 * several outputs nothing is fused. dlogits NULL asks for the loss alone
 * (a forward whose backward will replay it): a fusing block computes no
 * gradient and the plain path no dlogits. res as ax_loss_xent's; the
 * forward's outputs are dropped. On error dlogits is empty. */
int ax_forward_xent(ax_module *root, const ax_exec *ex, ax_slot *slot,
                    const ax_tlist *in, const ax_tlist *labels,
                    int ignore_index, const int64_t *norm, float scale,
                    ax_loss_result *res, ax_tlist *dlogits);

#endif
