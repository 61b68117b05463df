/* BasicBlock: the two-convolution residual block of CIFAR ResNets.
 *
 *   a1 = relu(bn1(conv1(x)))
 *   y  = relu(bn2(conv2(a1)) + shortcut(x))
 *
 * The block drives its children (conv1, bn1, conv2, bn2 and, for a
 * projection shortcut, conv and bn) through child slots. bn1 is a batch norm
 * with its ReLU fused (ax_batchnorm2d_relu_new); the block does the second
 * ReLU and the residual sum itself, in place on a tensor it owns (the batch
 * norms save their inputs, not their outputs). */
#include "axon/kernels/backend-impl.h"
#include "axon/models/layers/vision.h"

typedef struct basic_block {
  int in, out, stride, proj;
} basic_block;

enum { CONV1 = 0, BN1, CONV2, BN2, SC_CONV, SC_BN };
enum { SAVE_Y = 1 };

/* Runs child i forward on one tensor; *y receives a new reference. */
static int child_fwd(ax_module *m, int i, const ax_exec *ex, ax_slot *slot,
                     ax_tensor *x, ax_tensor **y) {
  ax_slot *cs = slot ? ax_slot_child(slot, i) : NULL;
  if (slot && !cs)
    return ax_seterr(AX_ENOMEM, "basic_block: out of memory");
  ax_tlist in = ax_tlist1(x), out = {0};
  AX_TRY(ax_forward(m->children[i], ex, cs, &in, &out));
  *y = out.t[0];
  return AX_OK;
}

/* Runs child i backward (whole, or its input half: `part`) on one
 * gradient; *dx receives a new reference (NULL when need_dx is 0). */
static int child_bwd(ax_bwd_part part, ax_module *m, int i, const ax_exec *ex,
                     int need_dx, ax_slot *slot, ax_tensor *dy,
                     ax_tensor **dx) {
  ax_exec cex = *ex;
  cex.need_dx = need_dx;
  ax_tlist dout = ax_tlist1(dy), din = {0};
  AX_TRY(ax_backward_part(part, m->children[i], &cex, ax_slot_child(slot, i),
                          &dout, &din));
  *dx = din.n > 0 ? din.t[0] : NULL;
  return AX_OK;
}

static int relu_inplace(ax_tensor *t) {
  return AX_K(ax_backend_of(t->device), relu_fwd, ax_tensor_numel(t), ax_f32(t),
              ax_f32(t));
}

static int bb_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                      const ax_tlist *in, ax_tlist *out) {
  basic_block *B = m->priv;
  ax_tensor *x = in->n > 0 ? in->t[0] : NULL; // (N, in, H, W)
  char b[64];
  if (!x || x->dtype != AX_F32 || x->ndim != 4 || x->shape[1] != B->in)
    return ax_seterr(AX_ESHAPE,
                     "basic_block(%d->%d, s=%d): expected input (N, %d, H, W), "
                     "got %s",
                     B->in, B->out, B->stride, B->in,
                     x ? ax_tensor_shape_str(x, b, sizeof b) : "none");
  ax_tensor *h = NULL, *a1 = NULL, *y = NULL, *s = NULL, *t = NULL;
  int rc = child_fwd(m, CONV1, ex, slot, x, &h);
  if (rc == AX_OK)
    rc = child_fwd(m, BN1, ex, slot, h, &a1); // (N, out, OH, OW), relu'd
  ax_tensor_release(h);
  h = NULL;
  if (rc == AX_OK)
    rc = child_fwd(m, CONV2, ex, slot, a1, &h);
  if (rc == AX_OK)
    rc = child_fwd(m, BN2, ex, slot, h, &y);
  ax_tensor_release(h);
  if (rc == AX_OK && B->proj) {
    rc = child_fwd(m, SC_CONV, ex, slot, x, &t);
    if (rc == AX_OK)
      rc = child_fwd(m, SC_BN, ex, slot, t, &s);
    ax_tensor_release(t);
  }
  if (rc == AX_OK && !B->proj && !ax_tensor_same_shape(x, y))
    rc = ax_seterr(AX_EINTERNAL, "basic_block: identity shortcut mismatch");
  if (rc == AX_OK) {
    /* y = relu(y + shortcut), in one pass when the backend can. */
    ax_backend *be = ax_backend_of(y->device);
    const float *sc = ax_f32(B->proj ? s : x);
    if (be->iface.add_relu_fwd) {
      rc = AX_K(be, add_relu_fwd, ax_tensor_numel(y), sc, ax_f32(y));
    } else {
      rc = AX_K(be, axpby, ax_tensor_numel(y), 1.0f, sc, 1.0f, ax_f32(y));
      if (rc == AX_OK)
        rc = relu_inplace(y);
    }
  }
  ax_tensor_release(s);
  if (rc == AX_OK && slot)
    ax_slot_put(slot, SAVE_Y, y);
  ax_tensor_release(a1);
  if (rc != AX_OK) {
    ax_tensor_release(y);
    return rc;
  }
  *out = ax_tlist1(y);
  return AX_OK;
}

/* The backward (module.h's walk): the whole backward or the input half
 * thread the gradient through the children, each child whole or only its
 * input half (`part`). The input half keeps nothing of its own: the
 * convolutions keep their inputs and output gradients, the batch norms
 * their (2, C) sums, so the weight half is the children's. */
static int bb_walk(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                   ax_slot *slot, const ax_tlist *dout, ax_tlist *din) {
  if (part == AX_BWD_WEIGHT)
    return ax_walk_children(part, m, ex, slot, dout, din);
  basic_block *B = m->priv;
  ax_tensor *y = ax_slot_get(slot, SAVE_Y);        // (N, out, OH, OW)
  ax_tensor *dy = dout->n > 0 ? dout->t[0] : NULL; // like y
  if (!y)
    return ax_seterr(AX_ESTATE, "basic_block: backward without forward");
  char b[64], b2[64];
  if (!dy || dy->dtype != AX_F32 || !ax_tensor_same_shape(dy, y))
    return ax_seterr(
        AX_ESHAPE, "basic_block(%d->%d, s=%d): expected gradient %s, got %s",
        B->in, B->out, B->stride, ax_tensor_shape_str(y, b, sizeof b),
        dy ? ax_tensor_shape_str(dy, b2, sizeof b2) : "none");
  ax_backend *be = ax_backend_of(y->device);
  ax_tensor *g = ax_tensor_like(y), *d1 = NULL, *d2 = NULL, *dx = NULL,
            *ds = NULL;
  if (!g)
    return AX_ENOMEM;
  /* g: the gradient of the residual sum, shared by both branches. */
  int rc =
      AX_K(be, relu_bwd, ax_tensor_numel(y), ax_f32(y), ax_f32(dy), ax_f32(g));
  if (rc == AX_OK)
    rc = child_bwd(part, m, BN2, ex, 1, slot, g, &d1);
  if (rc == AX_OK)
    rc = child_bwd(part, m, CONV2, ex, 1, slot, d1, &d2);
  ax_tensor_release(d1);
  d1 = NULL;
  if (rc == AX_OK) /* bn1 applies its ReLU's gradient itself */
    rc = child_bwd(part, m, BN1, ex, 1, slot, d2, &d1);
  ax_tensor_release(d2);
  if (rc == AX_OK)
    rc = child_bwd(part, m, CONV1, ex, ex->need_dx, slot, d1, &dx);
  ax_tensor_release(d1);
  d1 = NULL;
  if (rc == AX_OK && B->proj) {
    rc = child_bwd(part, m, SC_BN, ex, 1, slot, g, &d1);
    if (rc == AX_OK)
      rc = child_bwd(part, m, SC_CONV, ex, ex->need_dx, slot, d1, &ds);
    ax_tensor_release(d1);
  }
  if (rc == AX_OK && dx)
    rc = AX_K(be, axpby, ax_tensor_numel(dx), 1.0f, ax_f32(B->proj ? ds : g),
              1.0f, ax_f32(dx));
  ax_tensor_release(g);
  ax_tensor_release(ds);
  if (rc != AX_OK) {
    ax_tensor_release(dx);
    return rc;
  }
  din->n = 1;
  din->t[0] = ex->need_dx ? dx : NULL;
  if (!ex->need_dx)
    ax_tensor_release(dx);
  ax_slot_put(slot, SAVE_Y, NULL);
  return AX_OK;
}

static const ax_module_ops bb_ops = {
    /* .kind = */ "basic_block",
    /* .forward = */ bb_forward,
    /* .backward = */ NULL,
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ NULL,
    /* .backward_weight = */ NULL,
    /* .walk = */ bb_walk,
};

ax_module *ax_basic_block_new(int in, int out, int stride) {
  if (in <= 0 || out <= 0 || stride <= 0) {
    ax_seterr(AX_EINVAL,
              "basic_block: bad configuration in=%d out=%d "
              "stride=%d",
              in, out, stride);
    return NULL;
  }
  ax_module *m = ax_module_new(&bb_ops, sizeof(basic_block));
  if (!m) {
    ax_seterr(AX_ENOMEM, "basic_block: out of memory");
    return NULL;
  }
  basic_block *B = m->priv;
  *B = (basic_block){in, out, stride, in != out || stride != 1};
  int rc = ax_module_add(m, ax_conv2d_new(in, out, 3, stride, 1, 0));
  if (rc == AX_OK)
    rc = ax_module_add(m, ax_batchnorm2d_relu_new(out, 0.1f, 1e-5f));
  if (rc == AX_OK)
    rc = ax_module_add(m, ax_conv2d_new(out, out, 3, 1, 1, 0));
  if (rc == AX_OK)
    rc = ax_module_add(m, ax_batchnorm2d_new(out, 0.1f, 1e-5f));
  if (rc == AX_OK && B->proj)
    rc = ax_module_add(m, ax_conv2d_new(in, out, 1, stride, 0, 0));
  if (rc == AX_OK && B->proj)
    rc = ax_module_add(m, ax_batchnorm2d_new(out, 0.1f, 1e-5f));
  if (rc != AX_OK) {
    ax_seterr(rc, "basic_block: out of memory");
    ax_module_free(m);
    return NULL;
  }
  return m;
}
