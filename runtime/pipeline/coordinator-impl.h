/* Internal structure of the coordinator (coordinator.c: set-up, evaluation,
 * state; coord_run.c: the driver threads of ax_pipe_train). */
#ifndef AX_PIPELINE_COORDINATOR_IMPL_H
#define AX_PIPELINE_COORDINATOR_IMPL_H

#include <pthread.h>

#include "runtime/pipeline/coordinator.h"

#define AXP_NAME 64

typedef struct axp_batch { /* one mini-batch while it is in flight */
  int loaded;
  ax_tlist in, lab;
  int64_t norm[AX_TLIST_MAX]; /* kept labels per output in the mini-batch */
  int units_left;             /* first-stage backwards still to run */
  double loss;
  int64_t correct, count;
} axp_batch;

struct ax_pipe {
  ax_node *node;
  ax_pipe_opts o;
  char agents[AX_PIPE_MAX_STAGES][AXP_NAME];
  char model[AXP_NAME];
  int K, U, ignore_index;
  ax_rref *host[AX_PIPE_MAX_STAGES];
  long base;      /* global id of the next train call's first mini-batch */
  long eval_ids;  /* ids of evaluation batches (negative) */
  /* One train call. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  long n;
  unsigned char *done; /* [K][2][n * U] */
  uint64_t *ctx;       /* per unit or per mini-batch */
  axp_batch *b;        /* [n] */
  int err;
  char msg[512];
  ax_pipe_batch_fn batch_fn;
  ax_pipe_step_fn step_fn;
  void *user;
  double t0;
  ax_pipe_event *ev;
  long nev, cap_ev;
  ax_pipe_stats stats;
};

/* Records the first error of a run as "stage s on agent A: ..." and wakes
 * every driver. mu held. */
void axp_fail(ax_pipe *p, int s, int err, const char *what);

#endif
