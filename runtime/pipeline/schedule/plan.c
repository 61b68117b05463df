/* Plans: every rank's action list for a run, and the dependencies derived
 * from them (mode.h). */
#include <stdlib.h>

#include "axon/kernels/error.h"
#include "axon/runtime/pipeline/schedule/mode.h"

struct ax_pipe_plan {
  int mode, K, v, S, U; /* ranks, stages per rank, stages, units */
  long n, per_rank;
  ax_pipe_op *ops;       /* (K, per_rank) */
  ax_pipe_op **fwd_prev; /* (S, n * U): the action before F(s, u) on its
                            rank's list, or NULL */
};

int ax_pipe_plan_new(int mode, int K, int v, int M, long n,
                     ax_pipe_plan **out) {
  *out = NULL;
  if (!ax_pipe_mode_get(mode))
    return AX_EINVAL;
  if (K < 1 || M < 1 || n < 0)
    return ax_seterr(AX_EINVAL, "plan: bad arguments (K %d, M %d, n %ld)", K, M,
                     n);
  ax_pipe_plan *p = calloc(1, sizeof *p);
  if (!p)
    return AX_ENOMEM;
  p->mode = mode;
  p->K = K;
  p->v = ax_pipe_chunks(mode, v);
  p->S = K * p->v;
  p->U = ax_pipe_units(mode, M);
  p->n = n;
  p->per_rank = ax_pipe_nops_chunks(mode, p->v, M, n);
  size_t units = (size_t)n * (size_t)p->U;
  p->ops = malloc(sizeof *p->ops * ((size_t)K * (size_t)p->per_rank + 1));
  p->fwd_prev = calloc((size_t)p->S * units + 1, sizeof *p->fwd_prev);
  if (!p->ops || !p->fwd_prev) {
    ax_pipe_plan_free(p);
    return AX_ENOMEM;
  }
  for (int r = 0; r < K; r++) {
    ax_pipe_op *l = p->ops + (size_t)r * p->per_rank;
    int err = ax_pipe_schedule_chunks(mode, K, p->v, r, M, n, l, p->per_rank);
    if (err != AX_OK) {
      ax_pipe_plan_free(p);
      return err;
    }
    for (long i = 1; i < p->per_rank; i++)
      if (l[i].kind == AX_OP_FWD)
        p->fwd_prev[(size_t)l[i].stage * units + (size_t)l[i].batch * p->U +
                    (size_t)l[i].micro] = &l[i - 1];
  }
  *out = p;
  return AX_OK;
}

void ax_pipe_plan_free(ax_pipe_plan *p) {
  if (!p)
    return;
  free(p->ops);
  free(p->fwd_prev);
  free(p);
}

const ax_pipe_op *ax_pipe_plan_actions(const ax_pipe_plan *p, int r, long *n) {
  *n = p->per_rank;
  return p->ops + (size_t)r * p->per_rank;
}

int ax_pipe_plan_stages(const ax_pipe_plan *p) { return p->S; }

int ax_pipe_plan_lock_deps(const ax_pipe_plan *p, const ax_pipe_op *o,
                           ax_pipe_op *deps) {
  int nd = 0;
  if (o->kind == AX_OP_FWD && o->stage == 0 && o->batch > 0 &&
      ax_pipe_mode_get(p->mode)->forward_lock) {
    /* The round before is over: every stage finished what its rank's
     * list puts right before its own forward of this unit. */
    size_t units = (size_t)p->n * (size_t)p->U,
           u = (size_t)o->batch * p->U + (size_t)o->micro;
    for (int j = 0; j < p->S; j++) {
      const ax_pipe_op *prev = p->fwd_prev[(size_t)j * units + u];
      if (prev)
        deps[nd++] = *prev;
    }
  }
  return nd;
}

int ax_pipe_plan_deps(const ax_pipe_plan *p, const ax_pipe_op *o,
                      ax_pipe_op *deps) {
  int nd = 0, s = o->stage, S = p->S;
  switch (o->kind) {
  case AX_OP_FWD: /* the activations */
    if (s > 0)
      deps[nd++] = (ax_pipe_op){AX_OP_FWD, s - 1, o->batch, o->micro};
    break;
  case AX_OP_BWD: /* the output gradient */
  case AX_OP_INPUT_GRAD:
    if (s < S - 1)
      deps[nd++] = (ax_pipe_op){o->kind, s + 1, o->batch, o->micro};
    break;
  default: /* W and STEP follow their own rank's earlier actions only */
    break;
  }
  return nd + ax_pipe_plan_lock_deps(p, o, deps + nd);
}

int ax_pipe_deps(int mode, int K, int M, const ax_pipe_op *op,
                 ax_pipe_op *deps) {
  ax_pipe_plan *p = NULL;
  if (!op || op->batch < 0 || op->stage < 0 || op->stage >= K ||
      ax_pipe_plan_new(mode, K, 1, M, (long)op->batch + 1, &p) != AX_OK)
    return -1;
  int nd = ax_pipe_plan_deps(p, op, deps);
  ax_pipe_plan_free(p);
  return nd;
}

int ax_pipe_delay(int mode, int K, int s, int M) {
  const ax_pipe_mode_def *def = ax_pipe_mode_get(mode);
  if (!def)
    return -1;
  if (K < 1 || s < 0 || s >= K || M < 1) {
    ax_seterr(AX_EINVAL, "delay: bad arguments (K %d, stage %d, M %d)", K, s,
              M);
    return -1;
  }
  if (def->chunked) /* chunked modes flush: a forward sees every update */
    return 0;
  /* A steady-state mini-batch t: the version its first forward uses is the
   * number of STEPs before that forward in the stage's list (or t - 1 at
   * most when the forward weights are double-buffered). */
  long t = K + 1, n = t + 1, cap = ax_pipe_nops(mode, M, n), version = 0;
  ax_pipe_op *ops = malloc(sizeof *ops * (size_t)cap);
  if (!ops) {
    ax_seterr(AX_ENOMEM, "delay: out of memory");
    return -1;
  }
  if (ax_pipe_schedule(mode, K, s, M, n, ops, cap) != AX_OK) {
    free(ops);
    return -1;
  }
  for (long i = 0; i < cap; i++) {
    if (ops[i].kind == AX_OP_FWD && ops[i].batch == t)
      break;
    version += ops[i].kind == AX_OP_STEP;
  }
  free(ops);
  if (def->fwd_weights == AX_FWD_DOUBLE_BUFFERED && version > t - 1)
    version = t - 1;
  return (int)(t - version);
}
