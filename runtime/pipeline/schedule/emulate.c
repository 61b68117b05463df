/* Single-process emulation (a world of one node hosting every stage) and
 * the modelled time of a run from its measured costs (emulate.h). */
#include "axon/runtime/pipeline/schedule/emulate.h"

#include <stdio.h>
#include <string.h>

#include "axon/runtime/autograd/plugin.h"
#include "axon/runtime/pipeline/pipeline.h"
#include "axon/runtime/pipeline/schedule/formula.h"

int ax_pipe_emulator_new(const char *name, int threads, ax_node **out) {
  *out = NULL;
  if (threads < 0 || threads > 1024)
    return ax_seterr(AX_EINVAL, "emulator: %d threads", threads);
  ax_node_opts no;
  ax_node_opts_init(&no);
  no.name = name ? name : "emulator";
  /* Stages' forwards wait for their inputs on workers, but the pushes
   * that deliver them run on the pushing thread (an inline handler's call
   * to its own node, rpc.h), so the default pool serves any number of
   * stages. */
  no.threads = threads ? threads : 4;
  no.master = NULL;
  no.world_size = 1;
  no.rank = 0;
  ax_node *n = NULL;
  AX_TRY(ax_node_create(&no, &n));
  int err = ax_pipe_init(n);
  if (err != AX_OK) {
    ax_node_destroy(n);
    return err;
  }
  if (err == AX_OK)
    err = ax_plugin_attach(n);
  if (err == AX_OK)
    err = ax_node_join(n, 10000);
  if (err != AX_OK) {
    char m[400];
    snprintf(m, sizeof m, "%s", ax_errmsg());
    ax_pipe_emulator_free(n);
    return ax_seterr(err, "emulator: %s", m);
  }
  *out = n;
  return AX_OK;
}

void ax_pipe_emulator_free(ax_node *n) {
  if (!n)
    return;
  ax_node_shutdown(n, 5000);
  ax_dist_fini(n);
  ax_node_destroy(n);
}

void ax_pipe_costs_init(ax_pipe_costs *c, const ax_pipe_opts *o) {
  memset(c, 0, sizeof *c);
  c->mode = o->mode;
  c->R = o->K;
  c->v = ax_pipe_chunks(o->mode, o->chunks);
  c->M = o->M;
  c->recompute = o->recompute;
  c->S = ax_pipe_opts_stages(o);
  c->schedule = o->schedule;
  for (int s = 0; s < AX_PIPE_MAX_STAGES; s++)
    c->f[s] = c->b[s] = c->br[s] = c->w[s] = -1.0;
}

/* Adds x, a run of one action kind of one stage, to its cost *m after *n
 * runs: the fastest wall time, or the mean CPU time with cores known (CPU
 * time does not grow while others run, so its mean is the core time the
 * action takes; the fastest run would be an uncommon, lucky one). */
static void keep(const ax_pipe_costs *c, double *m, long *n, double x) {
  if (c->cores > 0)
    *m = *n > 0 ? *m + (x - *m) / (double)(*n + 1) : x;
  else if (*m < 0 || x < *m)
    *m = x;
  ++*n;
}

void ax_pipe_costs_add(ax_pipe_costs *c, const ax_pipe *p) {
  long n;
  const ax_pipe_event *ev = ax_pipe_events(p, &n);
  int U = ax_pipe_units(c->mode, c->M), S = c->S;
  for (long i = 0; i < n; i++) {
    const ax_pipe_op *o = &ev[i].op;
    int s = o->stage;
    double t = c->cores > 0 ? ev[i].cpu_s : ev[i].busy_s;
    if (s < 0 || s >= S)
      continue;
    switch (o->kind) {
    case AX_OP_FWD:
      keep(c, &c->f[s], &c->runs[0][s], t);
      break;
    case AX_OP_BWD:
    case AX_OP_INPUT_GRAD:
      if (ax_pipe_replays(c->mode, c->recompute, U, o->micro))
        keep(c, &c->br[s], &c->runs[2][s], t);
      else
        keep(c, &c->b[s], &c->runs[1][s], t);
      break;
    case AX_OP_WEIGHT_GRAD:
      keep(c, &c->w[s], &c->runs[3][s], t);
      break;
    default:
      break;
    }
  }
}

int ax_pipe_costs_times(const ax_pipe_costs *c, double *t_f, double *t_b,
                        double *t_w) {
  for (int s = 0; s < c->S; s++) {
    if (c->f[s] < 0 || (c->b[s] < 0 && c->br[s] < 0))
      return ax_seterr(AX_ESTATE,
                       "modelled time: stage %d has no measured "
                       "forward or backward yet",
                       s);
    t_f[s] = c->f[s];
    double replayed = c->br[s] - c->f[s];
    t_b[s] = c->b[s] >= 0 ? c->b[s] : (replayed > 0 ? replayed : 0.0);
    t_w[s] = c->w[s] >= 0 ? c->w[s] : 0.0;
  }
  return AX_OK;
}

int ax_pipe_costs_model(const ax_pipe_costs *c, double *seconds_per_batch) {
  double tf[AX_PIPE_MAX_STAGES], tb[AX_PIPE_MAX_STAGES], tw[AX_PIPE_MAX_STAGES];
  AX_TRY(ax_pipe_costs_times(c, tf, tb, tw));
  ax_formula_comm shared = {.cores = c->cores};
  ax_pipe_plan *plan = NULL;
  AX_TRY(c->schedule
             ? ax_pipe_sched_plan(c->schedule, 1, &plan)
             : ax_formula_mode_plan(c->mode, c->R, c->v, c->M, &shared, &plan));
  int rc = ax_formula_time_plan(plan, tf, tb, tw, c->recompute, &shared,
                                seconds_per_batch);
  ax_pipe_plan_free(plan);
  return rc;
}
