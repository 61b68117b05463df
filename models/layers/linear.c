/* Linear layer: y = x W^T + b over the last dimension, whole or one
 * member's part of a tensor-parallel one (models/layers/parallel.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "axon/models/layers/basic.h"
#include "axon/models/layers/parallel.h"
#include "axon/models/precision-impl.h"

enum { PART_WHOLE = 0, PART_COLUMN = 1, PART_ROW = 2 };

typedef struct linear {
  int in, out, bias; /* this member's sizes; bias: it holds one */
  float init_std;
  int part; /* PART_*: which part of the whole layer it is */
  int full_in, full_out, full_bias, segments;
  ax_tp tp;
} linear;

static void linear_copy(const linear *L, float *w, float *b, float *params,
                        int to_whole);

/* The group's sum of t (tensor parallelism), in place. */
static int tp_sum(const linear *L, const ax_exec *ex, ax_tensor *t) {
  if (!ex->tp_allreduce)
    return ax_seterr(AX_ESTATE,
                     "linear(%d->%d): member %d of a "
                     "tensor-parallel group of %d run without the group "
                     "(ax_exec.tp_allreduce)",
                     L->in, L->out, L->tp.rank, L->tp.size);
  return ex->tp_allreduce(ex->tp_user, t);
}

/* Slot: the input x from forward until the weight half, and the output
 * gradient dy from the input half until the weight half (dW = dy^T x and
 * db = sum dy need both), each kept in the exec's precision
 * (ax_slot_put_act: bf16 in bf16, the GEMMs' operands as they are). */
enum { SAVE_X = 0, SAVE_DY = 1 };

static int linear_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                          const ax_tlist *in, ax_tlist *out) {
  linear *L = m->priv;
  ax_tensor *x = in->t[0]; // (..., in)
  char b[64];
  if (!x || x->dtype != AX_F32 || x->ndim < 1 || x->shape[x->ndim - 1] != L->in)
    return ax_seterr(AX_ESHAPE, "linear(%d->%d): input %s does not end in %d",
                     L->in, L->out,
                     x ? ax_tensor_shape_str(x, b, sizeof b) : "?", L->in);
  int rows = (int)(ax_tensor_numel(x) / (size_t)L->in);
  int64_t shape[AX_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++)
    shape[i] = x->shape[i];
  shape[x->ndim - 1] = L->out;
  ax_tensor *y = ax_tensor_new(AX_F32, x->ndim, shape, x->device);
  if (!y)
    return AX_ENOMEM;
  ax_backend *be = ax_backend_of(x->device);
  const float *W = ax_param(m, ex, 0);
  int rc = AX_OK;
  if (slot) { /* x as kept, also the GEMM's operand */
    ax_slot_put(slot, SAVE_DY, NULL);
    rc = ax_slot_put_act(slot, SAVE_X, ex, x);
  }
  ax_tensor *xk = slot ? ax_slot_get(slot, SAVE_X) : x;
  if (rc == AX_OK)
    rc = axi_prec_gemm(ex, be, 0, 1, rows, L->out, L->in, 1.0f,
                       axi_mm_at(xk, 0), L->in, 0, axi_mm_f32(W), L->in, 0,
                       0.0f, ax_f32(y), L->out, 0, 1);
  if (rc == AX_OK && L->bias)
    rc = AX_K(be, bias_add, ax_f32(y), ax_param(m, ex, (size_t)L->in * L->out),
              rows, L->out, 1);
  if (rc == AX_OK && L->part == PART_ROW) /* Megatron's g: the partial sums */
    rc = tp_sum(L, ex, y);
  if (rc != AX_OK) {
    ax_tensor_release(y);
    return rc;
  }
  out->n = 1;
  out->t[0] = y;
  return AX_OK;
}

/* The saved input and its row count; AX_ESTATE unless the slot is between
 * forward and the input half (want_dy = 0) or between the halves (1). */
static int linear_state(const linear *L, ax_slot *slot, int want_dy,
                        ax_tensor **x, int *rows) {
  *x = ax_slot_get(slot, SAVE_X); // (..., in)
  int has_dy = ax_slot_get(slot, SAVE_DY) != NULL;
  if (!*x || has_dy != want_dy)
    return ax_seterr(AX_ESTATE, "linear(%d->%d): %s", L->in, L->out,
                     !*x       ? "backward without forward"
                     : want_dy ? "weight half without input half"
                               : "input half ran twice");
  *rows = (int)(ax_tensor_numel(*x) / (size_t)L->in);
  return AX_OK;
}

static int linear_backward_input(ax_module *m, const ax_exec *ex, ax_slot *slot,
                                 const ax_tlist *dout, ax_tlist *din) {
  linear *L = m->priv;
  ax_tensor *x, *dy = dout->n > 0 ? dout->t[0] : NULL; // (..., out)
  int rows;
  AX_TRY(linear_state(L, slot, 0, &x, &rows));
  if (!dy || dy->dtype != AX_F32 ||
      ax_tensor_numel(dy) != (size_t)rows * L->out)
    return ax_seterr(AX_ESHAPE,
                     "linear(%d->%d): gradient has %zu elements, "
                     "expected %d",
                     L->in, L->out, dy ? ax_tensor_numel(dy) : 0,
                     rows * L->out);
  din->n = 1;
  din->t[0] = NULL;
  AX_TRY(ax_slot_put_act(slot, SAVE_DY, ex, dy)); /* kept for W */
  if (ex->need_dx) {
    ax_tensor *dx = ax_tensor_new(AX_F32, x->ndim, x->shape, x->device);
    if (!dx)
      return AX_ENOMEM;
    /* dx (rows, in) = dy (rows, out) W (out, in) */
    int rc =
        axi_prec_gemm(ex, ax_backend_of(x->device), 0, 0, rows, L->in, L->out,
                      1.0f, axi_mm_at(ax_slot_get(slot, SAVE_DY), 0), L->out, 0,
                      axi_mm_f32(ax_param(m, ex, 0)), L->in, 0, 0.0f,
                      ax_f32(dx), L->in, 0, 1);
    if (rc == AX_OK && L->part == PART_COLUMN) /* Megatron's f backward */
      rc = tp_sum(L, ex, dx);
    if (rc != AX_OK) {
      ax_tensor_release(dx);
      return rc;
    }
    din->t[0] = dx;
  }
  return AX_OK;
}

static int linear_backward_weight(ax_module *m, const ax_exec *ex,
                                  ax_slot *slot) {
  linear *L = m->priv;
  ax_tensor *x, *dy = ax_slot_get(slot, SAVE_DY); // (..., out)
  int rows;
  AX_TRY(linear_state(L, slot, 1, &x, &rows));
  ax_backend *be = ax_backend_of(x->device);
  /* dW (out, in) += dy^T (out, rows) x (rows, in) */
  AX_TRY(axi_prec_gemm(ex, be, 1, 0, L->out, L->in, rows, 1.0f,
                       axi_mm_at(dy, 0), L->out, 0, axi_mm_at(x, 0), L->in, 0,
                       1.0f, ax_grad(m, ex, 0), L->in, 0, 1));
  if (L->bias) {
    ax_tensor *dyf = NULL; /* db from the kept dy, widened */
    AX_TRY(ax_slot_get_f32(slot, SAVE_DY, &dyf));
    int rc = AX_K(be, bias_grad, ax_f32(dyf),
                  ax_grad(m, ex, (size_t)L->in * L->out), rows, L->out, 1);
    ax_tensor_release(dyf);
    AX_TRY(rc);
  }
  ax_slot_put(slot, SAVE_X, NULL);
  ax_slot_put(slot, SAVE_DY, NULL);
  return AX_OK;
}

/* The whole layer's initial W (out, in) then b (out) into p, drawn in
 * that order from rng. */
static void init_whole(int in, int out, int bias, float std, float *p,
                       ax_rng *rng) {
  size_t nw = (size_t)in * out;
  if (std > 0.0f) {
    for (size_t i = 0; i < nw; i++)
      p[i] = std * (float)ax_rng_normal(rng);
    for (int i = 0; bias && i < out; i++)
      p[nw + (size_t)i] = 0.0f;
    return;
  }
  float bound = 1.0f / sqrtf((float)in);
  for (size_t i = 0; i < nw + (bias ? (size_t)out : 0); i++)
    p[i] = bound * (float)(2.0 * ax_rng_uniform(rng) - 1.0);
}

/* A part draws the whole layer's values (so the rng stream, and every
 * later layer's values, are the whole model's) and keeps its own: a
 * column part the rows of W and entries of b of its output features (in
 * each of the `segments` equal blocks of the outputs), a row part the
 * columns of W of its input features and, on member 0, all of b. */
static void linear_init(ax_module *m, float *params, float *buffers,
                        ax_rng *rng) {
  linear *L = m->priv;
  (void)buffers;
  if (L->part == PART_WHOLE) {
    init_whole(L->in, L->out, L->bias, L->init_std, params, rng);
    return;
  }
  int fin = L->full_in, fout = L->full_out;
  size_t nw = (size_t)fin * fout;
  float *w = malloc((nw + (size_t)fout) * sizeof *w);
  if (!w) { /* init has no error path: a NaN fails the first step loudly */
    for (size_t i = 0; i < m->n_params; i++)
      params[i] = NAN;
    return;
  }
  init_whole(fin, fout, L->full_bias, L->init_std, w, rng);
  linear_copy(L, w, w + nw, params, 0);
  free(w);
}

static const ax_module_ops linear_ops;

/* Between the whole module wm's own parameters `whole` and the member's
 * part pm's `part`, then the children: the part's slice into part
 * (to_whole = 0) or back into whole (1). */
static int part_walk(const ax_module *pm, const ax_module *wm, float *whole,
                     float *part, int to_whole) {
  if (pm->ops != wm->ops || pm->n_children != wm->n_children)
    return ax_seterr(AX_EINVAL,
                     "tensor-parallel slice: a %s where the whole "
                     "has a %s",
                     pm->ops->kind, wm->ops->kind);
  const linear *L = pm->ops == &linear_ops ? pm->priv : NULL;
  if (L && L->part != PART_WHOLE) {
    const linear *W = wm->priv;
    if (W->part != PART_WHOLE || W->in != L->full_in || W->out != L->full_out ||
        W->bias != L->full_bias)
      return ax_seterr(AX_EINVAL,
                       "tensor-parallel slice: linear(%d->%d) "
                       "part of a whole linear(%d->%d)",
                       L->full_in, L->full_out, W->in, W->out);
    linear_copy(L, whole, whole + (size_t)W->in * W->out, part, to_whole);
  } else if (pm->n_params != wm->n_params) {
    return ax_seterr(AX_EINVAL,
                     "tensor-parallel slice: %s with %zu "
                     "parameters, the whole's %zu",
                     pm->ops->kind, pm->n_params, wm->n_params);
  } else if (to_whole) {
    memcpy(whole, part, pm->n_params * sizeof *part);
  } else {
    memcpy(part, whole, pm->n_params * sizeof *part);
  }
  for (int i = 0; i < pm->n_children; i++)
    AX_TRY(part_walk(pm->children[i], wm->children[i],
                     whole + wm->children[i]->param_off - wm->param_off,
                     part + pm->children[i]->param_off - pm->param_off,
                     to_whole));
  return AX_OK;
}

int ax_tp_slice_params(const ax_module *part, const ax_module *whole,
                       const float *whole_params, float *part_params) {
  return part_walk(part, whole, (float *)whole_params + whole->param_off,
                   part_params + part->param_off, 0);
}

int ax_tp_join_params(const ax_module *part, const ax_module *whole,
                      const float *part_params, float *whole_params) {
  return part_walk(part, whole, whole_params + whole->param_off,
                   (float *)part_params + part->param_off, 1);
}

static void linear_copy(const linear *L, float *w, float *b, float *params,
                        int to_whole) {
  int fin = L->full_in, fout = L->full_out;
  float *lb = params + (size_t)L->in * L->out;
#define AXI_MOVE(part, whole, n)                                               \
  (to_whole ? memcpy((whole), (part), (n) * sizeof(float))                     \
            : memcpy((part), (whole), (n) * sizeof(float)))
  if (L->part == PART_COLUMN) {
    int seg = fout / L->segments, mine = seg / L->tp.size;
    for (int s = 0, r = 0; s < L->segments; s++)
      for (int j = 0; j < mine; j++, r++) {
        int src = s * seg + L->tp.rank * mine + j;
        AXI_MOVE(params + (size_t)r * fin, w + (size_t)src * fin, (size_t)fin);
        if (L->bias)
          AXI_MOVE(lb + r, b + src, 1);
      }
  } else {
    for (int r = 0; r < fout; r++)
      AXI_MOVE(params + (size_t)r * L->in,
               w + (size_t)r * fin + (size_t)L->tp.rank * L->in, (size_t)L->in);
    if (L->bias)
      AXI_MOVE(lb, b, (size_t)fout);
  }
#undef AXI_MOVE
}

static const ax_module_ops linear_ops = {
    /* .kind = */ "linear",
    /* .forward = */ linear_forward,
    /* .backward = */ NULL, /* the halves back to back */
    /* .init = */ linear_init,
    /* .destroy = */ NULL,
    /* .backward_input = */ linear_backward_input,
    /* .backward_weight = */ linear_backward_weight,
};

ax_module *ax_linear_new_std(int in, int out, int bias, float init_std) {
  if (in <= 0 || out <= 0) {
    ax_seterr(AX_EINVAL, "linear: sizes %d -> %d must be positive", in, out);
    return NULL;
  }
  ax_module *m = ax_module_new(&linear_ops, sizeof(linear));
  if (!m)
    return NULL;
  linear *L = m->priv;
  L->in = in;
  L->out = out;
  L->bias = bias != 0;
  L->init_std = init_std;
  m->n_params = (size_t)in * out + (bias ? (size_t)out : 0);
  return m;
}

ax_module *ax_linear_new(int in, int out, int bias) {
  return ax_linear_new_std(in, out, bias, 0.0f);
}

/* A part of the whole layer (in, out): this member's sizes and bias. */
static ax_module *linear_part(int part, int in, int out, int bias,
                              float init_std, int segments, ax_tp tp) {
  const char *what = part == PART_COLUMN ? "column" : "row";
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size) {
    ax_seterr(AX_EINVAL, "linear %s part: member %d of %d", what, tp.rank,
              tp.size);
    return NULL;
  }
  int split = part == PART_COLUMN ? out : in;
  int blocks = part == PART_COLUMN ? segments * tp.size : tp.size;
  if (in <= 0 || out <= 0 || segments < 1 || split % blocks != 0) {
    ax_seterr(AX_EINVAL,
              "linear(%d->%d) %s part: %s %d not divisible into "
              "%d x %d",
              in, out, what, part == PART_COLUMN ? "out" : "in", split,
              segments, tp.size);
    return NULL;
  }
  int lin = part == PART_COLUMN ? in : in / tp.size;
  int lout = part == PART_COLUMN ? out / tp.size : out;
  int lbias = bias && (part == PART_COLUMN || tp.rank == 0);
  ax_module *m = ax_linear_new_std(lin, lout, lbias, init_std);
  if (!m)
    return NULL;
  linear *L = m->priv;
  L->part = tp.size > 1 ? part : PART_WHOLE;
  L->full_in = in;
  L->full_out = out;
  L->full_bias = bias != 0;
  L->segments = segments;
  L->tp = tp;
  return m;
}

ax_module *ax_linear_column_new(int in, int out, int bias, float init_std,
                                int segments, ax_tp tp) {
  return linear_part(PART_COLUMN, in, out, bias, init_std, segments, tp);
}

ax_module *ax_linear_row_new(int in, int out, int bias, float init_std,
                             ax_tp tp) {
  return linear_part(PART_ROW, in, out, bias, init_std, 1, tp);
}
