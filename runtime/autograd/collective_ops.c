/* The public collective operations: all-reduce (whole or its two halves),
 * broadcast and neighbour exchange as operations queued on a group's
 * communication thread, and the bucketed all-reduce fed by
 * ax_exec.grad_ready. */
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/autograd/collective-impl.h"

static int new_op(ax_coll_group *g, axi_coll_kind kind, ax_tensor *t,
                  size_t off, size_t n, ax_coll_op **out) {
  *out = NULL;
  if (!g || !t || t->dtype != AX_F32)
    return ax_seterr(AX_EINVAL, "collective: need a group and an f32 tensor");
  size_t numel = ax_tensor_numel(t);
  if (n == 0 && off <= numel)
    n = numel - off;
  if (off + n > numel || n == 0)
    return ax_seterr(AX_EINVAL, "collective: range [%zu, +%zu) outside %zu",
                     off, n, numel);
  ax_coll_op *op = calloc(1, sizeof *op);
  if (!op)
    return AX_ENOMEM;
  op->g = g;
  op->kind = kind;
  op->t = ax_tensor_retain(t);
  op->off = off;
  op->n = n;
  *out = op;
  return AX_OK;
}

int ax_coll_allreduce_async(ax_coll_group *g, ax_tensor *t, size_t off,
                            size_t n, ax_coll_reduce red, ax_coll_op **out) {
  AX_TRY(new_op(g, AXI_OP_ALLREDUCE, t, off, n, out));
  (*out)->reduce = red;
  return axi_coll_submit(*out);
}

int ax_coll_allreduce(ax_coll_group *g, ax_tensor *t, ax_coll_reduce red) {
  ax_coll_op *op;
  AX_TRY(ax_coll_allreduce_async(g, t, 0, 0, red, &op));
  return ax_coll_wait(op, 0);
}

int ax_coll_reduce_scatter(ax_coll_group *g, ax_tensor *t, ax_coll_reduce red) {
  ax_coll_op *op;
  AX_TRY(new_op(g, AXI_OP_REDUCE_SCATTER, t, 0, 0, &op));
  op->reduce = red;
  AX_TRY(axi_coll_submit(op));
  return ax_coll_wait(op, 0);
}

int ax_coll_allgather(ax_coll_group *g, ax_tensor *t) {
  ax_coll_op *op;
  AX_TRY(new_op(g, AXI_OP_ALLGATHER, t, 0, 0, &op));
  AX_TRY(axi_coll_submit(op));
  return ax_coll_wait(op, 0);
}

int ax_coll_broadcast(ax_coll_group *g, ax_tensor *t, int root) {
  if (!g || root < 0 || root >= g->size)
    return ax_seterr(AX_EINVAL, "ax_coll_broadcast: bad root %d", root);
  ax_coll_op *op;
  AX_TRY(new_op(g, AXI_OP_BCAST, t, 0, 0, &op));
  op->root = root;
  AX_TRY(axi_coll_submit(op));
  return ax_coll_wait(op, 0);
}

int ax_coll_neighbors_async(ax_coll_group *g, ax_tensor *x,
                            ax_tensor *from_prev, ax_tensor *from_next,
                            ax_coll_op **out) {
  *out = NULL;
  if (!from_prev || !from_next || !x ||
      ax_tensor_numel(from_prev) != ax_tensor_numel(x) ||
      ax_tensor_numel(from_next) != ax_tensor_numel(x))
    return ax_seterr(AX_EINVAL, "ax_coll_neighbors: outputs must be CPU "
                                "tensors of x's size");
  const ax_tensor *dev_out = from_prev->device.type != AX_DEV_CPU   ? from_prev
                             : from_next->device.type != AX_DEV_CPU ? from_next
                                                                    : NULL;
  if (dev_out) { /* received straight into host memory */
    char b[16];
    return ax_seterr(AX_EUNSUPPORTED,
                     "ax_coll_neighbors: outputs must be CPU "
                     "tensors, got one on %s",
                     ax_device_str(dev_out->device, b, sizeof b));
  }
  AX_TRY(new_op(g, AXI_OP_NEIGH, x, 0, 0, out));
  (*out)->a = ax_tensor_retain(from_prev);
  (*out)->b = ax_tensor_retain(from_next);
  return axi_coll_submit(*out);
}

/* ---- buckets ------------------------------------------------------------- */

struct ax_coll_buckets {
  ax_coll_group *g;
  ax_tensor *grads;
  size_t total, min_floats;
  ax_coll_reduce reduce;
  size_t lo, hi; /* reported but not yet submitted, when `have` */
  int have, any;
  size_t sent_lo, sent_hi; /* hull of the submitted ranges */
  ax_coll_op **ops;
  int nops, cap, err;
};

int ax_coll_buckets_begin(ax_coll_group *g, ax_tensor *grads,
                          size_t bucket_bytes, ax_coll_reduce red,
                          ax_coll_buckets **out) {
  *out = NULL;
  if (!g || !grads || grads->dtype != AX_F32)
    return ax_seterr(AX_EINVAL, "ax_coll_buckets_begin: bad arguments");
  ax_coll_buckets *b = calloc(1, sizeof *b);
  if (!b)
    return AX_ENOMEM;
  b->g = g;
  b->grads = ax_tensor_retain(grads);
  b->total = ax_tensor_numel(grads);
  b->min_floats = bucket_bytes / sizeof(float);
  b->reduce = red;
  *out = b;
  return AX_OK;
}

static void submit_range(ax_coll_buckets *b, size_t lo, size_t hi) {
  if (hi <= lo || b->err)
    return;
  if (b->nops == b->cap) {
    int cap = b->cap ? 2 * b->cap : 16;
    ax_coll_op **o = realloc(b->ops, cap * sizeof *o);
    if (!o) {
      b->err = AX_ENOMEM;
      return;
    }
    b->ops = o;
    b->cap = cap;
  }
  ax_coll_op *op;
  int rc = ax_coll_allreduce_async(b->g, b->grads, lo, hi - lo, b->reduce, &op);
  if (rc != AX_OK) {
    b->err = rc;
    return;
  }
  b->ops[b->nops++] = op;
  if (!b->any || lo < b->sent_lo)
    b->sent_lo = lo;
  if (!b->any || hi > b->sent_hi)
    b->sent_hi = hi;
  b->any = 1;
}

void ax_coll_buckets_ready(void *arg, size_t off, size_t n) {
  ax_coll_buckets *b = arg;
  if (off + n > b->total)
    return;
  if (b->have && off + n == b->lo) {
    b->lo = off;
  } else {
    if (b->have)
      submit_range(b, b->lo, b->hi);
    b->lo = off;
    b->hi = off + n;
    b->have = 1;
  }
  if (b->hi - b->lo >= b->min_floats) {
    submit_range(b, b->lo, b->hi);
    b->have = 0;
  }
}

int ax_coll_buckets_end(ax_coll_buckets *b, int64_t timeout_ms) {
  if (b->have)
    submit_range(b, b->lo, b->hi);
  if (!b->any) {
    submit_range(b, 0, b->total);
  } else {
    submit_range(b, b->sent_hi, b->total);
    submit_range(b, 0, b->sent_lo);
  }
  int rc = b->err;
  for (int i = 0; i < b->nops; i++) {
    int r = ax_coll_wait(b->ops[i], timeout_ms);
    if (rc == AX_OK && r != AX_OK)
      rc = r;
  }
  ax_tensor_release(b->grads);
  free(b->ops);
  free(b);
  return rc;
}
