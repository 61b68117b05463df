/* Tied parameters (models/model.h) in a pipeline: which layouts can hold
 * them, and the groups of stages that sum them (the stage hosts' side is
 * runtime/pipeline/stage/stage_tie.c). */
#include <stdio.h>
#include <string.h>

#include "axon/runtime/pipeline/coord/coordinator-impl.h"

/* The stage of S (bounds) that holds block i, or -1 (a frozen block). */
static int stage_of(const int *bounds, int S, int i) {
  for (int s = 0; s < S; s++)
    if (i >= bounds[s] && i < bounds[s + 1])
      return s;
  return -1;
}

int axi_pipe_ties_check(const char *model, const ax_model_info *info,
                        const int *bounds, int S, int mode) {
  const ax_pipe_mode_def *def = ax_pipe_mode_get(mode);
  for (int i = 0; i < info->n_ties; i++) {
    const ax_model_tie *t = &info->ties[i];
    int sa = stage_of(bounds, S, t->a), sb = stage_of(bounds, S, t->b);
    if (sa < 0 && sb >= 0)
      return ax_seterr(AX_EINVAL,
                       "pipeline: %s ties block %d to block %d, and the "
                       "frozen prefix [0, %d) holds block %d only: a tied "
                       "parameter is one parameter, frozen or trained",
                       model, t->b, t->a, bounds[0], t->a);
    /* ddg and fr run in rounds (the forward lock): stage sb's forward of
     * the round after its STEP t uses update t, whose tied gradient needs
     * stage sa's backward of batch t, sb - sa rounds later. */
    if (def && def->forward_lock && sb - sa >= 2)
      return ax_seterr(AX_EUNSUPPORTED,
                       "pipeline: %s ties block %d (stage %d) to block %d "
                       "(stage %d), and under %s's forward lock stage %d's "
                       "next forward after update t needs the tied gradient "
                       "of batch t, which stage %d makes %d rounds later: "
                       "put the two blocks on one stage or on adjacent ones",
                       model, t->b, sb, t->a, sa, def->name, sb, sa, sb - sa);
  }
  return AX_OK;
}

void axi_pipe_ties_setup(ax_pipe *p, int s, const ax_model_info *info,
                         uint64_t id, const axi_pipe_replica_of *rep,
                         axi_pipe_setup_msg *m,
                         char tags[AX_MODEL_MAX_TIES][48]) {
  m->ties.n = 0;
  for (int i = 0; i < info->n_ties; i++) {
    int sa = stage_of(p->bounds, p->K, info->ties[i].a),
        sb = stage_of(p->bounds, p->K, info->ties[i].b);
    if (sa == sb || (sa != s && sb != s))
      continue;
    snprintf(tags[i], 48, "ti%016llx.%d.r%d.t%d", (unsigned long long)id, i,
             rep ? rep->r : 0, rep ? rep->t : 0);
    axi_pipe_tie *x = &m->ties.t[m->ties.n++];
    x->tie = i;
    x->g =
        (axi_pipe_group){2, s == sb, tags[i], {p->agents[sa], p->agents[sb]}};
  }
  if (!m->ties.n)
    return;
  p->tied = 1;
  m->has_ties = 1;
}

/* Every stage is called: the settle message (stage_msg-impl.h). */
static int settle_args(void *user, int s, ax_values **a) {
  (void)user;
  (void)s;
  *a = ax_values_new();
  return *a ? axi_pipe_settle_encode(*a) : AX_ENOMEM;
}

int axi_pipe_ties_settle(ax_pipe *p) {
  if (!p->tied)
    return AX_OK;
  return axi_pipe_all_stages(p, 0, "settle", settle_args, NULL, NULL);
}
