/* Softmax cross-entropy over a model's output list. */
#include "axon/models/loss.h"

#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"

static int xent_one(ax_tensor *logits, const ax_tensor *labels_any,
                    int ignore_index, int64_t norm, float scale, double *loss,
                    int64_t *count, int64_t *correct, ax_tensor **dlogits) {
  char b1[64], b2[64];
  if (!logits || logits->dtype != AX_F32 || logits->ndim < 1)
    return ax_seterr(AX_EDTYPE, "loss: logits must be f32");
  int classes = (int)logits->shape[logits->ndim - 1];
  int rows = (int)(ax_tensor_numel(logits) / (size_t)(classes ? classes : 1));
  if (!labels_any || (int)ax_tensor_numel(labels_any) != rows)
    return ax_seterr(AX_ESHAPE, "loss: logits %s need %d labels, got %s",
                     ax_tensor_shape_str(logits, b1, sizeof b1), rows,
                     labels_any ? ax_tensor_shape_str(labels_any, b2, sizeof b2)
                                : "none");
  ax_tensor *l32 = ax_tensor_to_i32(labels_any);
  ax_tensor *labels = l32 ? ax_tensor_to(l32, logits->device) : NULL;
  ax_tensor_release(l32);
  ax_tensor *probs = ax_tensor_like(logits);
  if (!labels || !probs) {
    ax_tensor_release(labels);
    ax_tensor_release(probs);
    return AX_ENOMEM;
  }
  ax_backend *be = ax_backend_of(logits->device);
  double sum = 0.0;
  int rc = AX_K(be, xent_fwd, rows, classes, ax_f32(logits), ax_i32(labels),
                ignore_index, ax_f32(probs), &sum, count, correct);
  if (rc == AX_OK) {
    int64_t div = norm > 0 ? norm : (*count ? *count : 1);
    *loss = sum / (double)div;
    if (dlogits) {
      *dlogits = ax_tensor_like(logits);
      rc = *dlogits ? AX_K(be, xent_bwd, rows, classes, ax_f32(probs),
                           ax_i32(labels), ignore_index, scale / (float)div,
                           ax_f32(*dlogits))
                    : AX_ENOMEM;
    }
  }
  ax_tensor_release(labels);
  ax_tensor_release(probs);
  return rc;
}

int ax_loss_xent(const ax_tlist *outputs, const ax_tlist *labels,
                 int ignore_index, const int64_t *norm, float scale,
                 ax_loss_result *res, ax_tlist *dlogits) {
  memset(res, 0, sizeof *res);
  if (dlogits)
    dlogits->n = 0;
  if (outputs->n != labels->n || outputs->n < 1)
    return ax_seterr(AX_EINVAL, "loss: %d outputs but %d label tensors",
                     outputs->n, labels->n);
  for (int i = 0; i < outputs->n; i++) {
    double l = 0.0;
    ax_tensor *d = NULL;
    int rc = xent_one(outputs->t[i], labels->t[i], ignore_index,
                      norm ? norm[i] : 0, scale, &l, &res->count[i],
                      &res->correct[i], dlogits ? &d : NULL);
    if (rc != AX_OK) {
      ax_tensor_release(d);
      if (dlogits)
        ax_tlist_clear(dlogits);
      return rc;
    }
    res->loss += l;
    if (dlogits) {
      dlogits->t[i] = d;
      dlogits->n = i + 1;
    }
  }
  return AX_OK;
}

/* The rows of the i32 labels that are not ignore_index (labels on a device
 * are copied to the host for it). */
static int kept_rows(const ax_tensor *labels, int ignore_index, int64_t *n) {
  ax_tensor *host = ax_tensor_to(labels, AX_CPU);
  if (!host)
    return AX_ENOMEM;
  *n = 0;
  for (size_t r = 0; r < ax_tensor_numel(host); r++)
    *n += ax_i32(host)[r] != ignore_index;
  ax_tensor_release(host);
  return AX_OK;
}

int ax_forward_xent(ax_module *root, const ax_exec *ex, ax_slot *slot,
                    const ax_tlist *in, const ax_tlist *labels,
                    int ignore_index, const int64_t *norm, float scale,
                    ax_loss_result *res, ax_tlist *dlogits) {
  memset(res, 0, sizeof *res);
  if (dlogits)
    dlogits->n = 0;
  ax_xent_fuse fuse = {0};
  ax_exec cex = *ex;
  ax_tensor *lab = NULL;
  int rc = AX_OK;
  int64_t div = 1; /* the mean's divisor */
  if (labels->n == 1 && labels->t[0] && ex->training && slot) {
    int64_t kept = 0;
    ax_tensor *l32 = ax_tensor_to_i32(labels->t[0]);
    /* counted where the labels came from (the host, as a rule) */
    rc = !l32                  ? AX_ENOMEM
         : norm && norm[0] > 0 ? AX_OK
                               : kept_rows(l32, ignore_index, &kept);
    lab = l32 ? ax_tensor_to(l32, ex->params->device) : NULL;
    ax_tensor_release(l32);
    if (rc == AX_OK && !lab)
      rc = AX_ENOMEM;
    div = norm && norm[0] > 0 ? norm[0] : (kept ? kept : 1);
    fuse = (ax_xent_fuse){
        lab, ignore_index, scale / (float)div, !dlogits, 0, 0.0, 0, 0};
    cex.xent = &fuse;
  }
  ax_tlist out = {0};
  if (rc == AX_OK)
    rc = ax_forward(root, &cex, slot, in, &out);
  if (rc == AX_OK && fuse.done) { /* fuse.count is the kept rows */
    res->loss = fuse.loss_sum / (double)div;
    res->count[0] = fuse.count;
    res->correct[0] = fuse.correct;
  } else if (rc == AX_OK) {
    rc = ax_loss_xent(&out, labels, ignore_index, norm, scale, res, dlogits);
  }
  ax_tlist_clear(&out);
  ax_tensor_release(lab);
  return rc;
}
