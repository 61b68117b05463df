/* The data-parallel example's per-replica state: node, group, model, data,
 * optimizer and the scratch tensors of EASGD / D-PSGD. */
#ifndef DP_STATE_H
#define DP_STATE_H

#include "dp.h"
#include <axon/kernels/rng.h>
#include <axon/models/data/dataset.h>
#include <axon/models/loss.h>
#include <axon/models/model.h>
#include <axon/models/optim.h>
#include <axon/rpc/rpc.h>
#include <axon/rref/rref.h>
#include <axon/runtime/autograd/autograd.h>
#include <axon/runtime/autograd/collective.h>
#include <axon/runtime/pipeline/coord/train.h>

enum { DP_ALLREDUCE, DP_EASGD, DP_DPSGD };

typedef struct dp_state {
  const dp_opts *o;
  int algo, rank, world, reforms;
  ax_node *node;
  ax_coll_group *group;
  ax_model_info info;
  ax_net *net;
  ax_slot *slot;
  ax_optim *opt;
  ax_dataset *train, *test;
  int32_t *perm;
  int perm_valid, epoch;
  int64_t pos;
  long step;
  double alpha;
  ax_tensor *center;      /* EASGD centre variable, or NULL */
  ax_tensor *aux1, *aux2; /* (n_params) scratch */
  ax_tensor *sync;        /* (3): step, position, epoch */
  int left;               /* the world ended (dp_leave) */
} dp_state;

/* Creates the node, joins, forms the ring and builds everything. */
int dp_state_open(dp_state *s, const dp_opts *o);
/* The end of training on every survivor: total samples/s (in: this
 * replica's rate; out: the sum), the model to report (EASGD: the centre;
 * D-PSGD: the replicas' average; batch-norm statistics averaged), its test
 * accuracy on rank 0 (-1 elsewhere) and the parameter dump. */
int dp_state_finish(dp_state *s, double *rate, double *total, double *acc);
/* Ends the world once every replica is done: rank 0 (the rendezvous
 * master) with ax_node_shutdown_world, which waits for the others' last
 * messages; the others say they are done and wait to be told to leave (a
 * master already gone leaves nobody to wait for). So no replica leaves while
 * another still exchanges with it. */
int dp_leave(ax_node *n, int rank);
/* Frees everything, checking that no call, future, RRef or context is
 * left. NULL-safe parts. */
void dp_state_close(dp_state *s);
/* "live_calls=0 live_futures=0 rrefs=0 contexts=0" as of the last close. */
const char *dp_live_report(void);

#endif
