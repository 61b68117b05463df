/* Tied parameters on the stage host (models/model.h): the sum of a tie's
 * two gradients before the STEP's update. Copies in this stage are summed
 * here; a copy whose partner sits on another stage is summed over the
 * collective group of the two stages that setup names (rank 0 the stage of
 * block a), an all-reduce of the tied range alone. Contract in
 * stage_host-impl.h. */
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/pipeline/stage/stage_host-impl.h"

/* Whether stage s holds block i. */
static int holds(const axi_ag_stage *s, int i) {
  return i >= s->first && i < s->last;
}

int axi_pipe_ties_held(const phost *h) {
  const axi_ag_stage *s = h->s;
  for (int i = 0; i < s->info.n_ties; i++)
    if (holds(s, s->info.ties[i].a) || holds(s, s->info.ties[i].b))
      return 1;
  return 0;
}

/* Checks setup's tie j against the model: a tie that crosses the stage's
 * bounds, once, with this stage at its rank. */
static int check_tie(const axi_ag_stage *s, const axi_pipe_ties *t, int j) {
  const axi_pipe_tie *x = &t->t[j];
  const ax_model_info *info = &s->info;
  int i = (int)x->tie;
  const ax_model_tie *mt = i < info->n_ties ? &info->ties[i] : NULL;
  if (!mt || holds(s, mt->a) == holds(s, mt->b))
    return ax_seterr(AX_EINVAL,
                     "axon.pipe.stage %d: setup names tie %d, which does not "
                     "join its blocks [%d, %d) to another stage's (%s has %d "
                     "ties)",
                     s->index, i, s->first, s->last, s->def->name,
                     info->n_ties);
  if (x->g.rank != (holds(s, mt->a) ? 0 : 1))
    return ax_seterr(AX_EINVAL,
                     "axon.pipe.stage %d: tie %d at rank %lld, but rank 0 is "
                     "block %d's stage",
                     s->index, i, (long long)x->g.rank, mt->a);
  for (int k = 0; k < j; k++)
    if (t->t[k].tie == x->tie)
      return ax_seterr(AX_EINVAL,
                       "axon.pipe.stage %d: setup names tie %d twice", s->index,
                       i);
  return AX_OK;
}

void axi_pipe_ties_free(axi_pipe_xtie *x, int n) {
  for (int j = 0; j < n; j++) {
    if (x[j].op) /* bounded: an aborted group fails it at once */
      ax_coll_wait(x[j].op, 0);
    ax_coll_group_free(x[j].g);
    memset(&x[j], 0, sizeof x[j]);
  }
}

void axi_pipe_ties_abort(axi_pipe_xtie *x, int n, const char *why) {
  for (int j = 0; j < n; j++)
    ax_coll_group_abort(x[j].g, why);
}

int axi_pipe_ties_new(phost *h, const axi_pipe_setup_msg *m, int64_t tmo,
                      axi_pipe_xtie *x, int *n) {
  axi_ag_stage *s = h->s;
  const ax_model_info *info = &s->info;
  const axi_pipe_ties *t = &m->ties;
  int nt = m->has_ties ? (int)t->n : 0;
  *n = 0;
  for (int j = 0; j < nt; j++)
    AX_TRY(check_tie(s, t, j));
  for (int i = 0; i < info->n_ties; i++) { /* every crossing tie named */
    const ax_model_tie *mt = &info->ties[i];
    int named = 0;
    for (int j = 0; j < nt && !named; j++)
      named = t->t[j].tie == i;
    if (!named && holds(s, mt->a) != holds(s, mt->b))
      return ax_seterr(AX_EINVAL,
                       "axon.pipe.stage %d: %s ties block %d to block %d, "
                       "which is on another stage, and setup names no group "
                       "for the tie",
                       s->index, s->def->name, holds(s, mt->a) ? mt->a : mt->b,
                       holds(s, mt->a) ? mt->b : mt->a);
  }
  int err = AX_OK;
  for (int j = 0; j < nt && err == AX_OK; j++) {
    const ax_model_tie *mt = &info->ties[t->t[j].tie];
    int a = t->t[j].g.rank == 0;
    x[j].tie = (int)t->t[j].tie;
    x[j].off = ax_model_block_offset(s->net, s->first, a ? mt->a : mt->b) +
               (a ? mt->off_a : mt->off_b);
    x[j].len = mt->len;
    err = ax_coll_group_new_rank(s->node, t->t[j].g.tag, 2, t->t[j].g.names,
                                 (int)t->t[j].g.rank, tmo, &x[j].g);
    if (err == AX_OK)
      *n = j + 1;
  }
  if (err != AX_OK) {
    axi_pipe_ties_free(x, *n);
    *n = 0;
  }
  return err;
}

int axi_pipe_ties_start(phost *h, ax_tensor *acc) {
  axi_ag_stage *s = h->s;
  int bounds[2] = {s->first, s->last};
  AX_TRY(ax_model_tie_grads(&s->info, 1, bounds, &s->net, &acc));
  for (int j = 0; j < h->n_xties; j++) {
    axi_pipe_xtie *x = &h->xties[j];
    int err =
        ax_coll_allreduce_async(x->g, acc, x->off, x->len, AX_COLL_SUM, &x->op);
    if (err != AX_OK)
      return ax_seterr(err, "axon.pipe.stage %d: tie %d: %s", s->index, x->tie,
                       ax_errmsg());
  }
  return AX_OK;
}

int axi_pipe_ties_wait(phost *h) {
  int err = AX_OK;
  for (int j = 0; j < h->n_xties; j++) {
    axi_pipe_xtie *x = &h->xties[j];
    if (!x->op)
      continue;
    int e = ax_coll_wait(x->op, 0);
    x->op = NULL;
    if (e != AX_OK && err == AX_OK) {
      const char *peer = ax_coll_failed_peer(x->g);
      err = ax_seterr(e, "axon.pipe.stage %d: the gradient of tie %d%s%s: %s",
                      h->s->index, x->tie, peer ? " with " : "",
                      peer ? peer : "", ax_errmsg());
    }
  }
  return err;
}
