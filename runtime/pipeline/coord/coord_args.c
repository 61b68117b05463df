/* The arguments of an action the coordinator issues (coord_run.c): the
 * stage message of its kind, with the unit's rows of the mini-batch's
 * inputs (stage 0) and labels (the last stage), loaded once per
 * mini-batch. */
#include <string.h>

#include "axon/runtime/pipeline/coord/coordinator-impl.h"
#include "axon/runtime/pipeline/stage/stage_host.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"

/* Loads mini-batch t (mu held): the inputs, labels and per-output norms
 * (its own labels' counts, or the whole mini-batch's from norm_fn). */
static int batch_load(ax_pipe *p, long t) {
  axi_pipe_batch *b = &p->b[t];
  if (b->loaded)
    return AX_OK;
  AX_TRY(p->batch_fn(p->user, p->base + t, &b->in, &b->lab));
  b->loaded = 1;
  b->units_left = p->U;
  if (b->in.n < 1 || b->lab.n < 1 || b->in.t[0]->shape[0] < p->U)
    return ax_seterr(AX_EINVAL,
                     "pipeline: mini-batch %ld has fewer examples "
                     "than %d micro-batches",
                     t, p->U);
  if (p->norm_fn)
    return p->norm_fn(p->user, p->base + t, b->norm);
  axi_pipe_label_counts(&b->lab, p->ignore_index, b->norm);
  return AX_OK;
}

/* Rows of unit m in tensor x of a mini-batch of B examples. */
static ax_tensor *unit_slice(const ax_pipe *p, const ax_tensor *x, int64_t B,
                             int m) {
  int64_t f = x->shape[0] / B, lo = B * m / p->U, hi = B * (m + 1) / p->U;
  return ax_tensor_slice0(x, lo * f, (hi - lo) * f);
}

int axi_pipe_make_args(ax_pipe *p, const ax_pipe_op *o, int step,
                       ax_values **out) {
  ax_values *a = ax_values_new();
  if (!a)
    return AX_ENOMEM;
  *out = a;
  long gid = p->base + o->batch;
  if (o->kind == AX_OP_STEP)
    return axi_pipe_step_encode(&(axi_pipe_step_msg){gid, p->U}, a);
  if (o->kind == AX_OP_INPUT_GRAD)
    return axi_pipe_bwdi_encode(&(axi_pipe_bwdi_msg){gid, o->micro}, a);
  axi_pipe_bwd_msg bm = {gid, o->micro, step, p->U};
  if (o->kind == AX_OP_BWD)
    return axi_pipe_bwd_encode(&bm, a);
  if (o->kind == AX_OP_WEIGHT_GRAD)
    return axi_pipe_bwdw_encode(&bm, a);
  int first = o->stage == 0, last = o->stage == p->K - 1;
  int err = AX_OK;
  if (first || last)
    err = batch_load(p, o->batch);
  if (err != AX_OK)
    return err;
  axi_pipe_batch *b = &p->b[o->batch];
  int rec = ax_pipe_replays(p->o.mode, p->o.recompute, p->U, o->micro);
  axi_pipe_fwd_msg m;
  memset(&m, 0, sizeof m);
  m.batch = gid;
  m.micro = o->micro;
  m.seed = (int64_t)(p->o.seed * 1000003u + (uint64_t)(gid * p->U + o->micro));
  m.flags = AX_PIPE_FLAG_TRAIN | (rec ? AX_PIPE_FLAG_RECOMPUTE : 0);
  int64_t B = first || last ? b->in.t[0]->shape[0] : 0;
  /* The unit's rows of the inputs (stage 0) and labels (the last stage). */
  for (int i = 0; first && err == AX_OK && i < b->in.n; i++)
    if (!(m.in.t[m.in.n++] = unit_slice(p, b->in.t[i], B, o->micro)))
      err = AX_ENOMEM;
  m.has_labels = last;
  for (int i = 0; last && err == AX_OK && i < b->lab.n; i++) {
    if (!(m.lab.t.t[m.lab.t.n++] = unit_slice(p, b->lab.t[i], B, o->micro)))
      err = AX_ENOMEM;
    m.lab.norm[i] = b->norm[i];
  }
  m.has_scale = last && b->scale > 0; /* a replica's share (replicas.c) */
  m.scale = b->scale;
  if (err == AX_OK)
    err = axi_pipe_fwd_encode(&m, a);
  ax_tlist_clear(&m.in);
  ax_tlist_clear(&m.lab.t);
  return err;
}
