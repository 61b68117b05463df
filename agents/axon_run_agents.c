/* axon-run train's agents after a failure (axon_run.h, axi_run_agents): the
 * lost ones found among every replica's and member's, each replaced by a
 * spare or its restarted self, or with --elastic its replica dropped
 * (and taken back once the agent rejoined), and the pipeline built anew
 * on the agents kept. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "agents/axon_run.h"
#include "axon/kernels/clock.h"
#include "axon/runtime/pipeline/state/recover.h"

/* The replica of agent k of the run's layout (part r T + t, K each). */
static int replica_of(const axi_run_agents *g, int k) {
  return k / (g->K * g->T);
}

static int kept_replicas(const axi_run_agents *g) {
  int n = 0;
  for (int r = 0; r < g->R; r++)
    n += !g->dropped[r];
  return n;
}

/* The options' agents: the kept replicas' in the run's order. */
static void lay_out(axi_run_agents *g) {
  int n = 0;
  for (int k = 0; k < g->n_agents; k++)
    if (!g->dropped[replica_of(g, k)])
      g->act[n++] = g->cur[k];
  g->o->agents = g->act;
  g->o->replicas = kept_replicas(g);
}

void axi_run_agents_init(axi_run_agents *g, const axi_run_pipe_args *a,
                         ax_node *node, ax_pipe_opts *o, const char **cur) {
  memset(g, 0, sizeof *g);
  g->a = a;
  g->node = node;
  g->o = o;
  g->cur = cur;
  g->K = a->K;
  g->T = a->tensor_parallel > 1 ? a->tensor_parallel : 1;
  g->R = a->replicas > 1 ? a->replicas : 1;
  g->n_agents = a->K * AXR_PARTS(a);
  lay_out(g);
}

void axi_run_agents_built(axi_run_agents *g) {
  for (int k = 0; k < g->n_agents; k++)
    if (ax_node_member_incarnation(g->node, g->cur[k], &g->inc[k]) != AX_OK)
      g->inc[k] = 0;
}

/* 1 if agent k of a kept replica is down or is no longer the process the
 * pipeline was built on. */
static int agent_lost(axi_run_agents *g, int k) {
  return !g->dropped[replica_of(g, k)] &&
         !ax_node_member_alive_as(g->node, g->cur[k], g->inc[k]);
}

/* The lost agents (peer-down comes within the node's peer timeout of a
 * hang; at once for a killed process), waited for up to 5 s, into lost[]
 * (indices into cur); their count, 0 when none is. */
static int find_lost(axi_run_agents *g, int *lost) {
  int n = 0;
  double until = ax_clock_s() + 5.0;
  while (g->node && !n && ax_clock_s() < until) {
    for (int k = 0; k < g->n_agents; k++)
      if (agent_lost(g, k))
        lost[n++] = k;
    if (!n)
      usleep(50 * 1000);
  }
  return n;
}

int axi_run_agents_lost(axi_run_agents *g, const char **names, int max) {
  int lost[2 * AX_PIPE_MAX_STAGES], n = find_lost(g, lost);
  for (int i = 0; i < n && i < max; i++)
    names[i] = g->cur[lost[i]];
  return n < max ? n : max;
}

/* --elastic: agent k's replica is dropped and the batch split over the
 * replicas left; their gradients are weighed by their shares of it
 * (ax_pipe_opts.weighted), so the update is still the mean over the
 * whole batch. */
static int drop(axi_run_agents *g, int k, int failure, const char *why) {
  int r = replica_of(g, k), left = kept_replicas(g) - !g->dropped[r];
  if (left < 1)
    return ax_seterr(failure, "%s (%s lost; --elastic: no replica is left)",
                     why, g->cur[k]);
  g->dropped[r] = 1;
  g->lost_at[r] = k;
  fprintf(stderr,
          "axon-run: stage agent %s lost (%s); no spare: going on with %d "
          "replica(s), the batch of %d split over them (--elastic)\n",
          g->cur[k], why, left, g->a->batch);
  return AX_OK;
}

/* Agent cur[k], lost: replaced by the next spare, else its replica
 * dropped (--elastic), else waited for under its name (--restarts). */
static int replace(axi_run_agents *g, int k, int failure, const char *why) {
  const axi_run_pipe_args *a = g->a;
  if (g->next_spare < a->nspares) {
    const char *spare = a->spares[g->next_spare++];
    fprintf(stderr,
            "axon-run: stage agent %s lost (%s); rebuilding the "
            "pipeline with spare %s\n",
            g->cur[k], why, spare);
    g->cur[k] = spare;
    return AX_OK;
  }
  if (a->elastic)
    return drop(g, k, failure, why);
  if (g->restarts >= a->restarts)
    return ax_seterr(failure,
                     "%s (%s lost too, and no spare or restart is "
                     "left)",
                     why, g->cur[k]);
  g->restarts++;
  fprintf(stderr,
          "axon-run: stage agent %s lost (%s); waiting up to 60 s "
          "for it to rejoin (restart %d of %d)\n",
          g->cur[k], why, g->restarts, a->restarts);
  double end = ax_clock_s() + 60.0;
  while (ax_node_peer_is_down(g->node, g->cur[k]) && ax_clock_s() < end)
    usleep(50 * 1000);
  if (ax_node_peer_is_down(g->node, g->cur[k]))
    return ax_seterr(failure, "%s (no replacement joined as %s within 60 s)",
                     why, g->cur[k]);
  uint64_t inc = 0;
  ax_node_member_incarnation(g->node, g->cur[k], &inc);
  fprintf(stderr,
          "axon-run: %s rejoined; rebuilding the pipeline (its "
          "incarnation %llu)\n",
          g->cur[k], (unsigned long long)inc);
  return AX_OK;
}

/* Frees *p and builds it anew on the kept replicas' agents; their stages
 * keep their step boundaries when they can recover live. */
static int build(axi_run_agents *g, ax_pipe **p) {
  ax_pipe_free(*p);
  *p = NULL;
  lay_out(g);
  ax_pipe *np = NULL;
  AX_TRY(ax_pipe_new(g->node, g->o, &np));
  *p = np;
  axi_run_agents_built(g);
  if (axi_run_live(g->a) && ax_pipe_live_check(np) == AX_OK)
    return ax_pipe_keep_boundary(np);
  return AX_OK;
}

int axi_run_agents_rebuild(axi_run_agents *g, int failure, ax_pipe **p) {
  const axi_run_pipe_args *a = g->a;
  char why[768];
  snprintf(why, sizeof why, "%s", ax_errmsg());
  if (!g->node || (g->next_spare >= a->nspares && g->restarts >= a->restarts &&
                   !a->elastic))
    return ax_seterr(failure, "%s", why);
  int lost[2 * AX_PIPE_MAX_STAGES], n = find_lost(g, lost);
  if (!n) /* no stage agent is down: not a lost stage */
    return ax_seterr(failure, "%s", why);
  for (int i = 0; i < n; i++)
    if (!g->dropped[replica_of(g, lost[i])]) /* one agent per replica */
      AX_TRY(replace(g, lost[i], failure, why));
  return build(g, p);
}

int axi_run_agents_can_grow(axi_run_agents *g) {
  int any = 0;
  for (int r = 0; r < g->R; r++) {
    if (!g->dropped[r])
      continue;
    if (g->restarts >= g->a->restarts)
      return -1; /* no rejoin is waited for */
    any = 1;
    for (int k = r * g->K * g->T; k < (r + 1) * g->K * g->T; k++)
      if (ax_node_peer_is_down(g->node, g->cur[k]))
        return 0;
  }
  return any ? 1 : -1;
}

int axi_run_agents_grow(axi_run_agents *g, ax_pipe **p) {
  for (int r = 0; r < g->R; r++)
    if (g->dropped[r]) {
      g->dropped[r] = 0;
      g->restarts++;
      fprintf(stderr,
              "axon-run: %s rejoined; growing back to replica %d "
              "(restart %d of %d)\n",
              g->cur[g->lost_at[r]], r, g->restarts, g->a->restarts);
    }
  return build(g, p);
}
