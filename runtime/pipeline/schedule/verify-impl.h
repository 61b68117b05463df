/* The verifier's parts (verify.h): the plan's index, shared by the
 * completeness and count checks (verify.c) and the deadlock simulation
 * (verify_sim.c). Internal to runtime/pipeline/schedule/. */
#ifndef AX_PIPELINE_VERIFY_IMPL_H
#define AX_PIPELINE_VERIFY_IMPL_H

#include <stdio.h>

#include "axon/runtime/pipeline/schedule/verify.h"

typedef struct axi_verify {
  const ax_pipe_plan *p;
  int K, S, U;
  long n, NU; /* mini-batches, and units in all (n U) */
  const ax_pipe_op *ops[AX_PIPE_PLAN_MAX_STAGES];
  long len[AX_PIPE_PLAN_MAX_STAGES];
  /* (S * AX_OP_KINDS * NU, axi_verify_key): 1 + the action's index in its
   * rank's list (the last one when it appears twice), 0 when absent */
  long *pos;
  unsigned char *count; /* the same keys: how often it appears (max 255) */
} axi_verify;

/* The index of action o's (stage, kind, batch, micro). */
static inline size_t axi_verify_key(const axi_verify *v, const ax_pipe_op *o) {
  return ((size_t)o->stage * AX_OP_KINDS + (size_t)o->kind) * (size_t)v->NU +
         (size_t)o->batch * (size_t)v->U + (size_t)o->micro;
}

/* The deadlock check (verify.h, check 2): simulates the plan; on a stop,
 * writes the cycle (its first line) and the grid of the last `grid_steps`
 * steps to out and returns AX_EINVAL; else AX_OK with *steps the steps
 * taken. AX_ENOMEM. */
int axi_verify_deadlock(const axi_verify *v, int grid_steps, FILE *out,
                        long *steps);

#endif
