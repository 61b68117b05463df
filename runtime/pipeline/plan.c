/* Plans: every stage's action list for a run, and the dependencies derived
 * from them (mode.h). */
#include <stdlib.h>

#include "kernels/error.h"
#include "runtime/pipeline/mode.h"

struct ax_pipe_plan {
  int mode, K, U;
  long n, per_stage;
  ax_pipe_op *ops;  /* (K, per_stage) */
  long *fwd_at;     /* (K, n * U): index of F(u) in its stage's list */
};

int ax_pipe_plan_new(int mode, int K, int M, long n, ax_pipe_plan **out) {
  *out = NULL;
  if (!ax_pipe_mode_get(mode))
    return AX_EINVAL;
  if (K < 1 || M < 1 || n < 0)
    return ax_seterr(AX_EINVAL, "plan: bad arguments (K %d, M %d, n %ld)", K,
                     M, n);
  ax_pipe_plan *p = calloc(1, sizeof *p);
  if (!p)
    return AX_ENOMEM;
  p->mode = mode;
  p->K = K;
  p->U = ax_pipe_units(mode, M);
  p->n = n;
  p->per_stage = ax_pipe_nops(mode, M, n);
  size_t units = (size_t)n * (size_t)p->U;
  p->ops = malloc(sizeof *p->ops * ((size_t)K * (size_t)p->per_stage + 1));
  p->fwd_at = malloc(sizeof *p->fwd_at * ((size_t)K * units + 1));
  if (!p->ops || !p->fwd_at) {
    ax_pipe_plan_free(p);
    return AX_ENOMEM;
  }
  for (int s = 0; s < K; s++) {
    ax_pipe_op *l = p->ops + (size_t)s * p->per_stage;
    int err = ax_pipe_schedule(mode, K, s, M, n, l, p->per_stage);
    if (err != AX_OK) {
      ax_pipe_plan_free(p);
      return err;
    }
    for (long i = 0; i < p->per_stage; i++)
      if (l[i].kind == AX_OP_FWD)
        p->fwd_at[(size_t)s * units + (size_t)l[i].batch * p->U +
                  (size_t)l[i].micro] = i;
  }
  *out = p;
  return AX_OK;
}

void ax_pipe_plan_free(ax_pipe_plan *p) {
  if (!p)
    return;
  free(p->ops);
  free(p->fwd_at);
  free(p);
}

const ax_pipe_op *ax_pipe_plan_actions(const ax_pipe_plan *p, int s,
                                       long *n) {
  *n = p->per_stage;
  return p->ops + (size_t)s * p->per_stage;
}

int ax_pipe_plan_deps(const ax_pipe_plan *p, const ax_pipe_op *o,
                      ax_pipe_op *deps) {
  int nd = 0, s = o->stage, K = p->K;
  switch (o->kind) {
  case AX_OP_FWD:
    if (s > 0)
      deps[nd++] = (ax_pipe_op){AX_OP_FWD, s - 1, o->batch, o->micro};
    if (s == 0 && o->batch > 0 && ax_pipe_mode_get(p->mode)->forward_lock) {
      /* The round before is over: every stage finished what its list puts
       * right before its own forward of this unit. */
      size_t units = (size_t)p->n * (size_t)p->U,
             u = (size_t)o->batch * p->U + (size_t)o->micro;
      for (int j = 0; j < K; j++) {
        long at = p->fwd_at[(size_t)j * units + u];
        if (at > 0)
          deps[nd++] = p->ops[(size_t)j * p->per_stage + (size_t)at - 1];
      }
    }
    break;
  case AX_OP_BWD:
  case AX_OP_INPUT_GRAD:
    if (s < K - 1)
      deps[nd++] = (ax_pipe_op){o->kind, s + 1, o->batch, o->micro};
    break;
  default: /* W and STEP follow their own stage's earlier actions only */
    break;
  }
  return nd;
}

int ax_pipe_deps(int mode, int K, int M, const ax_pipe_op *op,
                 ax_pipe_op *deps) {
  ax_pipe_plan *p = NULL;
  if (!op || op->batch < 0 || op->stage < 0 || op->stage >= K ||
      ax_pipe_plan_new(mode, K, M, (long)op->batch + 1, &p) != AX_OK)
    return -1;
  int nd = ax_pipe_plan_deps(p, op, deps);
  ax_pipe_plan_free(p);
  return nd;
}
