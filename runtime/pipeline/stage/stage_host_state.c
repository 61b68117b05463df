/* The pipeline stage host's per-unit states and statistics, shared by the
 * forward (stage_host.c) and the backward (stage_host_bwd.c): freeing a
 * state and the taken gradients, the net's execution context with the
 * tensor-parallel sum, the optimizer's update count, and the statistics
 * every operation reports. */
#include <stdlib.h>

#include "axon/kernels/clock.h"
#include "axon/runtime/pipeline/stage/stage_host-impl.h"

void axi_pipe_state_free(pstate *st) {
  if (!st)
    return;
  ax_slot_free(st->slot);
  ax_tlist_clear(&st->input);
  ax_tlist_clear(&st->dlogits);
  ax_tlist_clear(&st->labels);
  ax_tensor_release(st->ver);
  free(st);
}

/* ax_exec.tp_allreduce over the tensor-parallel members (a sum). */
static int tp_sum(void *g, ax_tensor *t) {
  return ax_coll_allreduce(g, t, AX_COLL_SUM);
}

ax_exec axi_pipe_host_exec(phost *h, int training) {
  ax_exec ex = ax_net_exec(h->s->net, training);
  if (h->tp) { /* set by setup under s->mu, which the caller holds */
    ex.tp_allreduce = tp_sum;
    ex.tp_user = h->tp;
  }
  return ex;
}

void axi_pipe_grads_clear(phost *h) {
  for (pgrad *g = h->grads, *nx; g; g = nx) {
    nx = g->next;
    ax_tensor_release(g->g);
    free(g);
  }
  h->grads = NULL;
  ax_sum_tree_clear(&h->sum);
}

long axi_pipe_host_steps(const phost *h) {
  if (h->offload)
    return h->offload_steps;
  return h->s->opt ? ax_optim_steps(h->s->opt) : 0;
}

/* ---- statistics reported with every operation ---------------------------- */
/* The agent process's CPU time, all its threads: the handler thread that
 * runs the operation (and its OpenMP workers with more than one compute
 * thread), and the transport's threads that meanwhile send and receive
 * this unit's and other units' tensors. Those threads are not idle during
 * an operation (measured, ResNet20 on 4 agents sharing 2 cores: the
 * process's time is about 8 % over the handler thread's), and what they
 * use competes for the same cores, so the timing model of agents that
 * share cores (ax_pipe_costs.cores) needs it counted. Waits (for a
 * neighbour's tensor, for the stage's lock) and time preempted cost none.
 * In an emulator (every stage in one process) the other stages' work
 * counts too. */
int64_t axi_pipe_host_cpu_us(void) { return ax_clock_cpu_us(1); }

void axi_pipe_host_report(phost *h, int64_t t0, int64_t c0,
                          axi_pipe_report_msg *r) {
  long live = 0, vers = 1;
  size_t bytes = 0;
  for (pstate *st = h->states; st; st = st->next) {
    live++;
    bytes += ax_slot_bytes(st->slot);
    const ax_tlist *kept[3] = {&st->input, &st->dlogits, &st->labels};
    for (int k = 0; k < 3; k++)
      for (int i = 0; i < kept[k]->n; i++)
        bytes += kept[k]->t[i] ? ax_tensor_nbytes(kept[k]->t[i]) : 0;
    int seen = st->ver == NULL || st->ver == h->s->net->params;
    for (pstate *o = h->states; !seen && o != st; o = o->next)
      seen = o->ver == st->ver;
    if (!seen) {
      vers++;
      bytes += ax_tensor_nbytes(st->ver);
    }
  }
  /* Under a correction, a prediction no state uses yet and pipemare's
   * shadow (2bw; its states stash nothing) count too. */
  ax_tensor *extra[2] = {h->stale.pred,
                         h->stale.kind == AX_STALE_PIPEMARE ? h->shadow : NULL};
  for (int i = 0; i < 2; i++) {
    int seen = !extra[i] || extra[i] == h->s->net->params;
    for (pstate *o = h->states; !seen && o; o = o->next)
      seen = o->ver == extra[i];
    if (!seen) {
      vers++;
      bytes += ax_tensor_nbytes(extra[i]);
    }
  }
  h->versions = (int)vers;
  r->busy_us = ax_clock_us() - t0;
  r->cpu_us = axi_pipe_host_cpu_us() - c0;
  r->live = live;
  r->versions = vers;
  r->state_bytes = (int64_t)bytes;
}
