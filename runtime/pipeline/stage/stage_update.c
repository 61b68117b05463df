/* The update of a STEP on the stage host, once its units' gradients are
 * summed (stage_host_bwd.c): the replicas' combination, the tied copies'
 * sum (stage_tie.c), then the optimizer's step here, on this replica's
 * ZeRO shard or on the optimizer host. Contract in stage_host-impl.h. */
#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/pipeline/stage/stage_host-impl.h"

/* How the replicas' sums combine: in the tree every micro-batch's loss
 * was divided by the whole mini-batch's label counts (the coordinator's
 * norms), so the replicas' sums add up to the mini-batch's gradient;
 * in the chain each replica's is its own shard's mean, and the replicas
 * average them (ring all-reduce, PyTorch DDP's rule). */
static ax_coll_reduce replica_reduce(const phost *h) {
  return h->sum_order == AX_SUM_TREE ? AX_COLL_SUM : AX_COLL_AVG;
}

/* The replicas' combination of the summed gradient (h->acc): the whole of
 * it, or under ZeRO this replica's shard only (the all-reduce's first
 * half, the same bits there). A stage holding a tied copy combines the
 * whole gradient under ZeRO too: a tie's sum needs both copies' whole
 * ranges, which the shards cut anywhere, and the all-reduce gives every
 * shard the reduce-scatter's bits. */
static int combine(phost *h) {
  if (!h->replicas)
    return AX_OK;
  if (h->zero && !h->tied)
    return ax_coll_reduce_scatter(h->replicas, h->acc, replica_reduce(h));
  return ax_coll_allreduce(h->replicas, h->acc, replica_reduce(h));
}

/* The sharded update (ZeRO 1/2), once combine reduced this shard: this
 * shard's optimizer step, then every replica's updated shard (the
 * all-reduce's second half). */
static int zero_update(phost *h) {
  axi_ag_stage *s = h->s;
  int64_t n = (int64_t)h->zero_len;
  ax_tensor *p = ax_tensor_view(s->net->params, h->zero_off, 1, &n),
            *g = ax_tensor_view(h->acc, h->zero_off, 1, &n);
  int err = p && g ? ax_optim_step(s->opt, p, g) : AX_ENOMEM;
  ax_tensor_release(p);
  ax_tensor_release(g);
  return err == AX_OK ? ax_coll_allgather(h->replicas, s->net->params) : err;
}

/* The update of STEP t with its combined gradient h->acc, once the ties'
 * exchanges are in (err: the STEP's error so far, which skips it): the
 * sharded update, or the step boundary then the whole update (here or on
 * the optimizer host); then the correction's record. acc is released.
 * s->mu held. */
static int update(phost *h, long t, int err) {
  axi_ag_stage *s = h->s;
  int tie_err = axi_pipe_ties_wait(h);
  if (err == AX_OK)
    err = tie_err;
  if (err == AX_OK && h->zero)
    err = zero_update(h);
  else {
    if (err == AX_OK) /* boundary t's state, once the update is certain */
      err = axi_pipe_boundary_step(h, t);
    if (err == AX_OK)
      err = h->offload ? axi_pipe_offload_step(h)
                       : ax_optim_step(s->opt, s->net->params, h->acc);
  }
  if (err == AX_OK && !h->offload) /* offloaded: once the weights are back */
    err = axi_stale_after_step(&h->stale, s->net->params, t);
  if (err == AX_OK)
    h->last_step = t;
  if (h->offload) /* still being sent to the optimizer host */
    ax_tensor_release(h->acc);
  else
    ax_dist_grads_recycle(s->node, h->acc);
  h->acc = NULL;
  return err;
}

int axi_pipe_host_settle(phost *h) {
  int err = AX_OK;
  if (h->update_pending) {
    h->update_pending = 0;
    err = h->update_err = update(h, h->update_t, AX_OK);
  } else if (h->update_err) {
    err = ax_seterr(h->update_err,
                    "axon.pipe.stage %d: the update of an earlier STEP "
                    "failed",
                    h->s->index);
  }
  if (err == AX_OK && h->offload) /* the previous update's parameters */
    err = axi_pipe_offload_settle(h);
  return err;
}

void axi_pipe_update_drop(phost *h) {
  if (h->update_pending) {
    axi_pipe_ties_wait(h); /* the groups are aborted: at once */
    ax_dist_grads_recycle(h->s->node, h->acc);
    h->acc = NULL;
  }
  h->update_pending = 0;
  h->update_err = AX_OK;
}

/* The update of STEP t (its sum in h->acc; err: the STEP's error so far):
 * the replicas' combination and the tied copies' sum, then the update.
 *
 * A stage with a tie to another stage starts the tied ranges' exchange
 * and returns with its update pending; the next operation that reads the
 * weights settles it (axi_pipe_host_settle), waiting there for the other
 * stage's STEP t. Waiting inside the STEP instead would deadlock where the
 * two STEPs sit on one agent's line (zbv puts the first and the last stage
 * on agent 0, and its list runs STEP(r) before STEP(2K-1-r); interleaved
 * likewise when K divides the stages' distance), and in ddg and fr, whose
 * forward lock makes stage 0's F(t+1) wait for the last stage's STEP(t)
 * while stage 0's STEP(t) comes after its F(t+1). With the wait moved to
 * the next read no mode deadlocks: in a flushed mode that read belongs to
 * batch t+1, and no action of batch t waits for one of batch t+1; in
 * pipedream and 2bw every action of a stage's list has the round key
 * (g + s: unit g of stage s), on which every dependency of the lists
 * rises or, along a unit's backward chain, stays equal, STEP t has the key
 * (t+1)U + K - 2 on every stage and the next read of either stage a larger
 * one, so STEP t of the other stage never waits for it; ddg and fr run in
 * rounds (the forward lock), STEP t of stage s in round (t+1)U - 1 + d_s
 * and the next read of the later stage b in round (t+1)U + d_b, which is
 * not before stage a's STEP round when the stages are adjacent (d_a = d_b
 * + 1); further apart the tied parameter would need update t before its
 * gradient exists, and the coordinator refuses it (coord_ties.c). */
int axi_pipe_update_begin(phost *h, long t, int err) {
  if (err == AX_OK) /* data parallel: every replica's */
    err = combine(h);
  if (err == AX_OK && h->tied) /* then the tied copies' sum */
    err = axi_pipe_ties_start(h, h->acc);
  if (err == AX_OK && h->n_xties) {
    h->update_pending = 1;
    h->update_t = t;
    return AX_OK;
  }
  return update(h, t, err);
}
