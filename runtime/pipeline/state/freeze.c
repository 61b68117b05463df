/* Freezing and re-packing (freeze.h) through the mover (state-impl.h):
 * the old pipeline's state is read from its live stages (and its frozen
 * prefix) into the layout-free state, as a checkpoint of it would be; each
 * stage of the new pipeline loads the file the mover cuts for its slot
 * ("ckpt_load" with the file), which it checks as it checks a checkpoint;
 * the frozen blocks become the prefix net on the coordinator
 * (freeze_cache.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/models/model.h"
#include "axon/runtime/pipeline/coord/coordinator-impl.h"
#include "axon/runtime/pipeline/schedule/mode.h"
#include "axon/runtime/pipeline/state/checkpoint.h"
#include "axon/runtime/pipeline/state/freeze.h"
#include "axon/runtime/pipeline/state/state-impl.h"

/* Blocks [0, f) of st on the coordinator's CPU. */
static int prefix_net(const ax_model_def *def, const ax_config *cfg,
                      uint64_t seed, const ax_train_state *st, int f,
                      ax_net **out) {
  ax_net *net = NULL;
  AX_TRY(ax_model_stage(def, cfg, 0, f, AX_CPU, seed, &net));
  if (net->n_params != st->param_at[f] || net->n_buffers != st->buffer_at[f]) {
    ax_net_free(net);
    return ax_seterr(AX_EINTERNAL,
                     "freeze: the prefix has %zu parameters, "
                     "the state's blocks %zu",
                     net->n_params, st->param_at[f]);
  }
  memcpy(net->params->data, st->params, st->param_at[f] * sizeof(float));
  if (st->buffer_at[f])
    memcpy(net->buffers->data, st->buffers, st->buffer_at[f] * sizeof(float));
  *out = net;
  return AX_OK;
}

/* ---- re-packing ---------------------------------------------------------- */

/* Every agent of p, each part's ranks in order, and then those an earlier
 * re-packing left idle. */
static int agents_of(const ax_pipe *p, char (*names)[AXP_NAME]) {
  if (p->npool) {
    memcpy(names, p->pool, (size_t)p->npool * sizeof *names);
    return p->npool;
  }
  int parts = p->nrep ? p->nrep : 1, n = 0;
  for (int i = 0; i < parts; i++) {
    const ax_pipe *q = p->nrep ? p->rep[i] : p;
    for (int r = 0; r < q->R; r++)
      for (int s = 0; s < q->K; s++)
        if (ax_pipe_opts_stage_rank(&q->o, s) == r) {
          snprintf(names[n++], AXP_NAME, "%s", q->agents[s]);
          break;
        }
  }
  return n;
}

typedef struct plan_new {
  int K, R, S, bounds[AX_PIPE_MAX_STAGES + 1];
} plan_new;

/* The new split over `agents` agents, in groups of T (a stage's
 * tensor-parallel members). */
static int plan_split(const ax_pipe *one, const ax_freeze_opts *fo, int n,
                      int f_old, int agents, int T, plan_new *pn) {
  int f = fo->blocks, left = n - f, v = one->v, groups = agents / T;
  int K = fo->K;
  if (K == 0) { /* the old agents times the share of blocks left, rounded
                   up to a divisor of the agents (every agent stays busy)
                   within what the blocks left can hold */
    int most = left / v < one->R ? left / v : one->R;
    K = (one->R * left + (n - f_old) - 1) / (n - f_old);
    while (K < most && groups % K)
      K++;
    K = K > most ? most : K < 1 ? 1 : K;
  }
  if (K < 1 || K > groups || K * v > left)
    return ax_seterr(AX_EINVAL,
                     "freeze: %d agents x %d stages each (x %d "
                     "tensor-parallel members) for %d blocks left on %d "
                     "agents",
                     K, v, T, left, agents);
  pn->K = K;
  pn->S = K * v;
  pn->R = groups / K;
  if (pn->R * T > AX_PIPE_MAX_REPLICAS)
    pn->R = AX_PIPE_MAX_REPLICAS / T;
  AX_TRY(ax_split_uniform(left, pn->S, pn->bounds));
  for (int s = 0; s <= pn->S; s++)
    pn->bounds[s] += f;
  return AX_OK;
}

/* The new pipeline: the old one's options on the new split, its agents and
 * replicas (ZeRO over them while there are two or more: it shards, so the
 * state is the same). */
static int new_pipe(const ax_pipe *one, const plan_new *pn, int T,
                    const char *const *agents, ax_pipe **np) {
  ax_pipe_opts o = one->o;
  o.K = pn->K;
  o.agents = agents;
  o.bounds = pn->bounds;
  o.replicas = pn->R;
  o.tensor_parallel = T;
  o.zero = pn->R > 1 ? one->o.zero : 0;
  o.optimizer_host = one->optim_host[0] ? one->optim_host : NULL;
  return ax_pipe_new(one->node, &o, np);
}

static int repack(ax_pipe *p, ax_pipe *one, const ax_freeze_opts *fo,
                  const ax_model_def *def, const ax_config *cfg, int n,
                  ax_pipe **out) {
  int f_old = axi_pipe_frozen_blocks(p->frozen), f = fo->blocks;
  int T = axi_pipe_members(p);
  char names[4 * AX_PIPE_MAX_STAGES][AXP_NAME];
  const char *agents[4 * AX_PIPE_MAX_STAGES];
  int na = agents_of(p, names);
  for (int i = 0; i < na; i++)
    agents[i] = names[i];
  plan_new pn;
  AX_TRY(plan_split(one, fo, n, f_old, na, T, &pn));
  ax_train_state st;
  AX_TRY(axi_state_snapshot(p, &st));
  ax_net *pre = NULL;
  ax_pipe *np = NULL;
  int err = prefix_net(def, cfg, one->o.seed, &st, f, &pre);
  if (err == AX_OK) { /* it computes as its stages did */
    pre->precision = one->o.precision;
    err = new_pipe(one, &pn, T, agents, &np);
  }
  if (err == AX_OK)
    err = axi_state_load(np, &st, "freeze");
  if (err == AX_OK && !(np->pool = malloc((size_t)na * sizeof *np->pool)))
    err = AX_ENOMEM;
  if (err == AX_OK) {
    np->base = one->base; /* the mini-batch count goes on */
    for (int i = 0; i < np->nrep; i++)
      np->rep[i]->base = one->base;
    memcpy(np->pool, names, (size_t)na * sizeof *names);
    np->npool = na;
    err = axi_pipe_frozen_new(pre, f, fo->cache_bytes, &np->frozen);
  } else {
    ax_net_free(pre);
  }
  ax_state_free(&st);
  if (err != AX_OK) {
    char m[512];
    snprintf(m, sizeof m, "%s", ax_errmsg());
    ax_pipe_free(np);
    return ax_seterr(err, "%s", m);
  }
  *out = np;
  return AX_OK;
}

int ax_pipe_freeze(ax_pipe **pp, const ax_freeze_opts *fo) {
  if (!pp || !*pp || !fo)
    return ax_seterr(AX_EINVAL, "freeze: bad arguments");
  ax_pipe *p = *pp, *one = p->nrep ? p->rep[0] : p;
  if (one->plan)
    return ax_seterr(AX_ESTATE, "freeze: only between ax_pipe_train calls");
  if (one->o.schedule)
    return ax_seterr(AX_EUNSUPPORTED,
                     "freeze: the pipeline runs a schedule's stages and "
                     "placement, and freezing re-splits them");
  AX_TRY(ax_pipe_checkpoint_wait(p));
  const ax_model_def *def = ax_model_find(one->model);
  if (!def)
    return AX_ENOTFOUND;
  ax_config cfg;
  ax_model_info info;
  AX_TRY(ax_model_config(def, one->o.model_config, &cfg));
  AX_TRY(ax_model_describe(def, &cfg, &info));
  int f_old = axi_pipe_frozen_blocks(p->frozen);
  if (fo->blocks <= f_old || fo->blocks >= info.n_blocks)
    return ax_seterr(AX_EINVAL,
                     "freeze: %d blocks (%d frozen already, %d "
                     "in the model: at least one must train)",
                     fo->blocks, f_old, info.n_blocks);
  int rest[2] = {fo->blocks, info.n_blocks}; /* a frozen prefix, one copy */
  AX_TRY(axi_pipe_ties_check(one->model, &info, rest, 1, AX_MODE_GPIPE));
  ax_pipe *np = NULL;
  AX_TRY(repack(p, one, fo, def, &cfg, info.n_blocks, &np));
  ax_pipe_free(p);
  *pp = np;
  return AX_OK;
}

void ax_pipe_freeze_stats(const ax_pipe *p, ax_freeze_stats *out) {
  memset(out, 0, sizeof *out);
  const ax_pipe *one = p->nrep ? p->rep[0] : p;
  out->blocks = axi_pipe_frozen_blocks(p->frozen);
  out->K = one->R;
  out->replicas = p->nrep ? p->nrep / axi_pipe_members(p) : 1;
  if (p->frozen)
    axi_pipe_frozen_counts(p->frozen, &out->hits, &out->misses,
                           &out->cache_bytes);
}

int ax_freeze_schedule_parse(const char *s, ax_freeze_point *pts, int cap,
                             int *n) {
  *n = 0;
  const char *at = s ? s : "";
  while (*at) {
    long step = -1;
    int blocks = 0, K = 0, used = 0;
    int got = sscanf(at, "%ld:%d%n:%d%n", &step, &blocks, &used, &K, &used);
    if (got < 2 || step < 1 || blocks < 1 || K < 0 || *n >= cap ||
        (*n && (step <= pts[*n - 1].step || blocks <= pts[*n - 1].blocks)) ||
        (at[used] && at[used] != ','))
      return ax_seterr(AX_EINVAL,
                       "freeze schedule '%s': entry %d is not "
                       "STEP:BLOCKS[:K] with steps and blocks rising (at "
                       "most %d entries)",
                       s, *n + 1, cap);
    pts[(*n)++] = (ax_freeze_point){step, blocks, K};
    at += used + (at[used] == ',');
  }
  return AX_OK;
}
