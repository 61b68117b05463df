/* The body of a schedule (sched_text.h), shared by the parser
 * (sched_text.c) and the printer and builders (sched_print.c). Internal to
 * runtime/pipeline/schedule/. */
#ifndef AX_PIPELINE_SCHED_TEXT_IMPL_H
#define AX_PIPELINE_SCHED_TEXT_IMPL_H

#include "axon/runtime/pipeline/schedule/sched_text.h"

struct ax_pipe_sched {
  int mode;  /* the table entry the stages follow (flushed) */
  int K, S;  /* ranks, stages */
  int U;     /* units per mini-batch */
  int split; /* 1: the lists have I or W */
  int stage_rank[AX_PIPE_PLAN_MAX_STAGES];
  long len[AX_PIPE_PLAN_MAX_STAGES];        /* rank r's actions */
  ax_pipe_op *ops[AX_PIPE_PLAN_MAX_STAGES]; /* (len[r]), malloc'd */
};

/* An empty schedule (no lists, mode -1), or NULL. */
ax_pipe_sched *axi_pipe_sched_alloc(void);

#endif
