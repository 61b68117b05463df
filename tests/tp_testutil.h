/* The tensor-parallel group of in-process tests: T members (threads of one
 * process) whose ax_exec.tp_allreduce sums through shared memory in rank
 * order (models/layers/parallel.h). Header-only. */
#ifndef AX_TP_TESTUTIL_H
#define AX_TP_TESTUTIL_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/error.h"
#include "axon/kernels/tensor.h"

#define TPT_MAX 4

/* T members meeting at a barrier of T (the caller initialises bar). */
typedef struct tpt_group {
  int T;
  pthread_barrier_t bar;
  ax_tensor *in[TPT_MAX];
} tpt_group;

typedef struct tpt_member {
  tpt_group *g;
  int rank;
} tpt_member;

/* The in-process all-reduce (ax_exec.tp_allreduce, user: a tpt_member):
 * every member sums the members' tensors in rank order, then writes the
 * sum into its own. */
static inline int tpt_sum(void *user, ax_tensor *t) {
  tpt_member *m = user;
  tpt_group *g = m->g;
  g->in[m->rank] = t;
  pthread_barrier_wait(&g->bar);
  size_t n = ax_tensor_numel(t);
  float *s = calloc(n + 1, sizeof *s);
  int bad = 0;
  for (int r = 0; r < g->T; r++) {
    if (ax_tensor_numel(g->in[r]) != n)
      bad = 1;
    else
      for (size_t i = 0; i < n; i++)
        s[i] += ax_f32(g->in[r])[i];
  }
  pthread_barrier_wait(&g->bar);
  memcpy(ax_f32(t), s, n * sizeof *s);
  free(s);
  return bad ? ax_seterr(AX_ESHAPE, "tpt_sum: sizes differ") : AX_OK;
}

#endif
