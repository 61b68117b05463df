/* Expected time per mini-batch of each pipeline mode: a simulation of a
 * plan (a mode's own action lists, mode.h, or lists given as data) with
 * their dependencies, and the timeline of each action; the closed forms for
 * equal stages live in the mode table. */
#include "axon/runtime/pipeline/schedule/formula.h"

#include <stdlib.h>
#include <string.h>

#include "axon/kernels/error.h"
#include "axon/runtime/pipeline/schedule/mode.h"

#define MAX_STAGES 64

typedef struct sim {
  const ax_pipe_plan *plan;
  int mode, K, S, U, recompute;  /* ranks, stages, units */
  const double *t_f, *t_b, *t_w; /* t_w NULL: no weight half apart */
  const ax_formula_comm *comm;   /* NULL: no transfers */
  double *fin;       /* (AX_OP_KINDS, K, units): finish time, -1 until run */
  double *start_f0;  /* (units) start of F(u) on stage 0 */
  double *batch_end; /* (n) when mini-batch b's last action finished */
  double *fin_pos[MAX_STAGES]; /* with an issue window: finish by position */
  /* with queued links: (S, units) arrival of stage s's output at s + 1
   * (arr_f) and of stage s + 1's input gradient at s (arr_b), and when
   * each link is next free */
  double *arr_f, *arr_b;
  double free_f[MAX_STAGES], free_b[MAX_STAGES];
  size_t units;
  /* ax_formula_timeline: each action's start and end, rank r's list from
   * slot_off[r] on (NULL: not kept) */
  double *slot_start, *slot_end;
  long slot_off[MAX_STAGES];
} sim;

static double *fin_at(const sim *S, int kind, int s, long u) {
  return &S->fin[((size_t)kind * S->S + (size_t)s) * S->units + (size_t)u];
}

static long unit_of(const sim *S, const ax_pipe_op *o) {
  return (long)o->batch * S->U + o->micro;
}

static int is_bwd(int kind) {
  return kind == AX_OP_BWD || kind == AX_OP_INPUT_GRAD;
}

/* With transfers: when d's output reaches o, or -1 (not a transfer). */
static double arrival(const sim *S, const ax_pipe_op *d, const ax_pipe_op *o) {
  if (!S->arr_f)
    return -1;
  size_t u = (size_t)unit_of(S, d);
  if (d->kind == AX_OP_FWD && o->kind == AX_OP_FWD && d->stage == o->stage - 1)
    return S->arr_f[(size_t)d->stage * S->units + u];
  if (is_bwd(d->kind) && is_bwd(o->kind) && d->stage == o->stage + 1)
    return S->arr_b[(size_t)o->stage * S->units + u];
  return -1;
}

/* Boundary b's link: when a tensor sent at `sent` arrives; the link is
 * busy `busy` seconds per tensor, in the order sent (a stage's actions are
 * simulated in order, so its sends are too), then `lat` away. */
static double send_on(double *free_at, double sent, double busy, double lat) {
  double t0 = sent > *free_at ? sent : *free_at;
  *free_at = t0 + busy;
  return *free_at + lat;
}

static double at_or_0(const double *a, int i) { return a ? a[i] : 0; }

/* With transfers: o finished at fin; its output leaves on its link. */
static void send_out(sim *S, const ax_pipe_op *o, double fin) {
  const ax_formula_comm *c = S->comm;
  int s = o->stage;
  size_t u = (size_t)unit_of(S, o);
  if (o->kind == AX_OP_FWD && s + 1 < S->S)
    S->arr_f[(size_t)s * S->units + u] = send_on(
        &S->free_f[s], fin, at_or_0(c->fwd_busy, s), at_or_0(c->fwd, s));
  else if (is_bwd(o->kind) && s > 0)
    S->arr_b[(size_t)(s - 1) * S->units + u] =
        send_on(&S->free_b[s - 1], fin, at_or_0(c->bwd_busy, s - 1),
                at_or_0(c->bwd, s - 1));
}

/* When every dependency of o has finished (and what it sent arrived), or
 * -1 if one has not run. */
static double ready_at(const sim *S, const ax_pipe_op *o) {
  ax_pipe_op deps[MAX_STAGES + 2];
  int nd = ax_pipe_plan_deps(S->plan, o, deps);
  double t = 0;
  for (int i = 0; i < nd; i++) {
    double f = *fin_at(S, deps[i].kind, deps[i].stage, unit_of(S, &deps[i]));
    if (f < 0)
      return -1;
    double a = arrival(S, &deps[i], o);
    if (a >= 0)
      f = a;
    if (f > t)
      t = f;
  }
  return t;
}

static double cost(const sim *S, const ax_pipe_op *o) {
  int st = o->stage;
  double extra = S->comm && o->kind != AX_OP_STEP ? S->comm->per_action : 0;
  double w = S->t_w ? S->t_w[st] : 0.0,
         replay = ax_pipe_replays(S->mode, S->recompute, S->U, o->micro)
                      ? S->t_f[st]
                      : 0.0;
  switch (o->kind) {
  case AX_OP_FWD:
    return extra + S->t_f[st];
  case AX_OP_BWD: /* the whole backward: both halves */
    return extra + replay + S->t_b[st] + w;
  case AX_OP_INPUT_GRAD:
    return extra + replay + S->t_b[st];
  case AX_OP_WEIGHT_GRAD:
    return extra + w;
  default: /* STEP: the optimizer's time when given */
    return S->comm && S->comm->step ? S->comm->step[st] : 0.0;
  }
}

/* When action o (position pos of rank r's list, ready at `ready`, the rank
 * free at free_r) may start: not before the coordinator issued it when
 * actions go through its window. */
static double earliest(const sim *S, int r, long pos, double ready,
                       double free_r) {
  double start = ready > free_r ? ready : free_r;
  const ax_formula_comm *c = S->comm;
  if (c && c->issue_rtt) { /* not before the coordinator sent it */
    int w = c->ahead > 0 ? c->ahead : 1;
    double issued = pos < w ? c->issue_rtt[r] / 2
                            : S->fin_pos[r][pos - w] + c->issue_rtt[r];
    start = issued > start ? issued : start;
  }
  return start;
}

/* Records that o (position pos of rank r's list) ran from start to fin. */
static void commit(sim *S, int r, long pos, const ax_pipe_op *o, double start,
                   double fin) {
  if (S->arr_f)
    send_out(S, o, fin);
  if (S->fin_pos[r])
    S->fin_pos[r][pos] = fin;
  if (fin > S->batch_end[o->batch])
    S->batch_end[o->batch] = fin;
  *fin_at(S, o->kind, o->stage, unit_of(S, o)) = fin;
  if (o->kind == AX_OP_FWD && o->stage == 0)
    S->start_f0[unit_of(S, o)] = start;
  if (S->slot_start) {
    S->slot_start[S->slot_off[r] + pos] = start;
    S->slot_end[S->slot_off[r] + pos] = fin;
  }
}

/* Runs every rank's list in order, each rank on its own processor; returns
 * the makespan, or -1 on a deadlock. */
static double run(sim *S) {
  long pos[MAX_STAGES] = {0}, len[MAX_STAGES];
  const ax_pipe_op *lists[MAX_STAGES];
  double free_at[MAX_STAGES] = {0}, end = 0;
  for (int r = 0; r < S->K; r++)
    lists[r] = ax_pipe_plan_actions(S->plan, r, &len[r]);
  for (;;) {
    int progress = 0, left = 0;
    for (int r = 0; r < S->K; r++) {
      while (pos[r] < len[r]) {
        const ax_pipe_op *o = &lists[r][pos[r]];
        double ready = ready_at(S, o);
        if (ready < 0)
          break;
        double start = earliest(S, r, pos[r], ready, free_at[r]);
        double fin = start + cost(S, o);
        commit(S, r, pos[r], o, start, fin);
        free_at[r] = fin;
        if (fin > end)
          end = fin;
        pos[r]++;
        progress = 1;
      }
      left += pos[r] < len[r];
    }
    if (!left)
      return end;
    if (!progress)
      return -1;
  }
}

/* The same with the ranks sharing `cores` (< K) processors: list
 * scheduling (formula.h). Each round starts the ranks' next action that can
 * start first (its inputs there, its rank free, a core free), the lowest
 * rank on a tie, on the core that is free first. */
static double run_shared(sim *S, int cores) {
  long pos[MAX_STAGES] = {0}, len[MAX_STAGES];
  const ax_pipe_op *lists[MAX_STAGES];
  double free_at[MAX_STAGES] = {0}, core_free[MAX_STAGES] = {0}, end = 0;
  for (int r = 0; r < S->K; r++)
    lists[r] = ax_pipe_plan_actions(S->plan, r, &len[r]);
  for (;;) {
    int c = 0, best = -1, left = 0;
    for (int i = 1; i < cores; i++)
      if (core_free[i] < core_free[c])
        c = i;
    double best_t = 0;
    for (int r = 0; r < S->K; r++) {
      if (pos[r] >= len[r])
        continue;
      left = 1;
      double ready = ready_at(S, &lists[r][pos[r]]);
      if (ready < 0)
        continue;
      double t = earliest(S, r, pos[r], ready, free_at[r]);
      t = t > core_free[c] ? t : core_free[c];
      if (best < 0 || t < best_t) {
        best = r;
        best_t = t;
      }
    }
    if (best < 0)
      return left ? -1 : end;
    const ax_pipe_op *o = &lists[best][pos[best]];
    double fin = best_t + cost(S, o);
    commit(S, best, pos[best], o, best_t, fin);
    free_at[best] = core_free[c] = fin;
    if (fin > end)
      end = fin;
    pos[best]++;
  }
}

int ax_formula_time(const char *mode, int K, int M, const double *t_f,
                    const double *t_b, int recompute, double *out) {
  return ax_formula_time_chunks(mode, K, 1, M, t_f, t_b, recompute, out);
}

int ax_formula_time_chunks(const char *mode, int K, int v, int M,
                           const double *t_f, const double *t_b, int recompute,
                           double *out) {
  return ax_formula_time_split(mode, K, v, M, t_f, t_b, NULL, recompute, out);
}

int ax_formula_time_split(const char *mode, int K, int v, int M,
                          const double *t_f, const double *t_b,
                          const double *t_w, int recompute, double *out) {
  return ax_formula_time_comm(mode, K, v, M, t_f, t_b, t_w, recompute, NULL,
                              out);
}

/* Checks the costs of S stages (K ranks) and the recompute option. */
static int check_costs(int K, int S, const double *t_f, const double *t_b,
                       const double *t_w, int recompute,
                       const ax_formula_comm *comm) {
  if (recompute < AX_RECOMPUTE_NEVER || recompute > AX_RECOMPUTE_EXCEPT_LAST)
    return ax_seterr(AX_EINVAL, "formula: recompute option %d unknown",
                     recompute);
  for (int s = 0; s < S; s++)
    if (!(t_f[s] >= 0) || !(t_b[s] >= 0) || (t_w && !(t_w[s] >= 0)) ||
        (comm && comm->step && !(comm->step[s] >= 0)))
      return ax_seterr(AX_EINVAL,
                       "formula: stage %d times (%g, %g) must be "
                       ">= 0",
                       s, t_f[s], t_b[s]);
  if (comm && !(comm->per_action >= 0))
    return ax_seterr(AX_EINVAL, "formula: per-action cost must be >= 0");
  if (comm && comm->cores < 0)
    return ax_seterr(AX_EINVAL, "formula: %d cores", comm->cores);
  for (int s = 0; comm && s + 1 < S; s++) /* the links: S - 1 */
    if ((comm->fwd && !(comm->fwd[s] >= 0)) ||
        (comm->fwd_busy && !(comm->fwd_busy[s] >= 0)) ||
        (comm->bwd_busy && !(comm->bwd_busy[s] >= 0)) ||
        (comm->bwd && !(comm->bwd[s] >= 0)))
      return ax_seterr(AX_EINVAL, "formula: transfer times must be >= 0");
  for (int r = 0; comm && comm->issue_rtt && r < K; r++)
    if (!(comm->issue_rtt[r] >= 0))
      return ax_seterr(AX_EINVAL, "formula: round trips must be >= 0");
  return AX_OK;
}

static void sim_free(sim *S) {
  free(S->fin);
  free(S->start_f0);
  free(S->batch_end);
  free(S->arr_f);
  free(S->arr_b);
  free(S->slot_start);
  free(S->slot_end);
  for (int r = 0; r < S->K; r++)
    free(S->fin_pos[r]);
}

/* Simulates plan with the given costs (checked); *makespan is -1 on a
 * deadlock. With `record`, every action's start and end are kept
 * (S->slot_start / slot_end at S->slot_off[r] + position). The caller
 * frees S with sim_free. */
static int simulate(sim *S, const ax_pipe_plan *plan, const double *t_f,
                    const double *t_b, const double *t_w, int recompute,
                    const ax_formula_comm *comm, int record, double *makespan) {
  int K = ax_pipe_plan_ranks(plan), St = ax_pipe_plan_stages(plan);
  long n = ax_pipe_plan_batches(plan);
  *S = (sim){.plan = plan,
             .mode = ax_pipe_plan_mode(plan),
             .K = K,
             .S = St,
             .U = ax_pipe_plan_units(plan),
             .recompute = recompute,
             .t_f = t_f,
             .t_b = t_b,
             .t_w = t_w,
             .comm = comm};
  if (!t_f || !t_b)
    return ax_seterr(AX_EINVAL, "formula: need stage time arrays");
  AX_TRY(check_costs(K, St, t_f, t_b, t_w, recompute, comm));
  S->units = (size_t)n * (size_t)S->U;
  S->fin = malloc(sizeof(double) * AX_OP_KINDS * (size_t)S->S * S->units);
  S->start_f0 = calloc(S->units, sizeof(double));
  S->batch_end = calloc((size_t)n, sizeof(double));
  int nofin = 0;
  if (comm && (comm->fwd || comm->bwd || comm->fwd_busy || comm->bwd_busy)) {
    S->arr_f = malloc(sizeof(double) * (size_t)S->S * S->units);
    S->arr_b = malloc(sizeof(double) * (size_t)S->S * S->units);
    nofin |= !S->arr_f || !S->arr_b;
  }
  long total = 0;
  for (int r = 0; r < K; r++) {
    long len;
    ax_pipe_plan_actions(plan, r, &len);
    S->slot_off[r] = total;
    total += len;
    if (comm && comm->issue_rtt)
      nofin |= !(S->fin_pos[r] = calloc((size_t)len + 1, sizeof(double)));
  }
  if (record) {
    S->slot_start = calloc((size_t)total + 1, sizeof(double));
    S->slot_end = calloc((size_t)total + 1, sizeof(double));
    nofin |= !S->slot_start || !S->slot_end;
  }
  if (!S->fin || !S->start_f0 || !S->batch_end || nofin)
    return ax_seterr(AX_ENOMEM, "formula: out of memory");
  for (size_t i = 0; i < AX_OP_KINDS * (size_t)S->S * S->units; i++)
    S->fin[i] = -1;
  int cores = comm ? comm->cores : 0;
  *makespan = cores > 0 && cores < K ? run_shared(S, cores) : run(S);
  return AX_OK;
}

int ax_formula_time_plan(const ax_pipe_plan *plan, const double *t_f,
                         const double *t_b, const double *t_w, int recompute,
                         const ax_formula_comm *comm, double *out) {
  if (!plan || !out)
    return ax_seterr(AX_EINVAL, "formula: NULL plan or result");
  sim S;
  double makespan;
  int rc = simulate(&S, plan, t_f, t_b, t_w, recompute, comm, 0, &makespan);
  long n = ax_pipe_plan_batches(plan);
  long a = (long)S.units / 2, b = (long)S.units - 1;
  if (rc == AX_OK && makespan < 0)
    rc = ax_seterr(AX_EINTERNAL, "formula: %s schedule deadlocked",
                   ax_pipe_mode_name(S.mode));
  if (rc == AX_OK) {
    if (n > 1 && ax_pipe_flushes(S.mode)) /* steady state: the spacing of
                                              the flushes */
      *out = (S.batch_end[n - 1] - S.batch_end[0]) / (double)(n - 1);
    else if (ax_pipe_flushes(S.mode) || b <= a)
      *out = makespan / (double)n;
    else /* steady state: spacing of stage 0's forwards, second half,
          * times the units of a mini-batch */
      *out = S.U * (S.start_f0[b] - S.start_f0[a]) / (double)(b - a);
  }
  sim_free(&S);
  return rc;
}

int ax_formula_timeline(const ax_pipe_plan *plan, const double *t_f,
                        const double *t_b, const double *t_w, int recompute,
                        const ax_formula_comm *comm, ax_pipe_slot **out,
                        long *n) {
  if (!plan || !out || !n)
    return ax_seterr(AX_EINVAL, "formula: NULL plan or result");
  *out = NULL;
  *n = 0;
  sim S;
  double makespan;
  int rc = simulate(&S, plan, t_f, t_b, t_w, recompute, comm, 1, &makespan);
  if (rc == AX_OK && makespan < 0)
    rc = ax_seterr(AX_EINTERNAL, "formula: %s schedule deadlocked",
                   ax_pipe_mode_name(S.mode));
  long total = S.K ? S.slot_off[S.K - 1] : 0, len = 0, k = 0;
  if (rc == AX_OK) {
    ax_pipe_plan_actions(plan, S.K - 1, &len);
    total += len;
    if (!(*out = calloc((size_t)total + 1, sizeof **out)))
      rc = ax_seterr(AX_ENOMEM, "formula: out of memory");
  }
  for (int r = 0; rc == AX_OK && r < S.K; r++) {
    const ax_pipe_op *l = ax_pipe_plan_actions(plan, r, &len);
    for (long i = 0; i < len; i++) { /* a composite is one slot */
      ax_pipe_slot *o = &(*out)[k++];
      long j = l[i].with_next && i + 1 < len ? i + 1 : i;
      *o = (ax_pipe_slot){.rank = r,
                          .op = l[i],
                          .start = S.slot_start[S.slot_off[r] + i],
                          .end = S.slot_end[S.slot_off[r] + j]};
      o->next = l[j];
      o->next.kind = j > i ? l[j].kind : -1;
      i = j;
    }
  }
  *n = k;
  sim_free(&S);
  return rc;
}

int ax_formula_mode_plan(int mode, int K, int v, int M,
                         const ax_formula_comm *comm, ax_pipe_plan **out) {
  /* Flushed modes: one mini-batch (several when the coordinator's window
   * carries one into the next). Others: long enough for a steady state. */
  int window = comm && comm->issue_rtt;
  long n = ax_pipe_flushes(mode) ? (window ? 5 : 1) : 8L * K + 32;
  return ax_pipe_plan_new(mode, K, v, M, n, out);
}

int ax_formula_time_comm(const char *mode, int K, int v, int M,
                         const double *t_f, const double *t_b,
                         const double *t_w, int recompute,
                         const ax_formula_comm *comm, double *out) {
  int m = ax_pipe_mode_index(mode);
  if (m < 0)
    return AX_EINVAL;
  v = ax_pipe_chunks(m, v);
  if (K < 1 || K * v > MAX_STAGES || M < 1 || !t_f || !t_b || !out)
    return ax_seterr(AX_EINVAL,
                     "formula: need 1 <= K v <= %d (got %d x %d), M >= 1 "
                     "(got %d) and stage time arrays",
                     MAX_STAGES, K, v, M);
  AX_TRY(check_costs(K, K * v, t_f, t_b, t_w, recompute, comm));
  ax_pipe_plan *plan = NULL;
  AX_TRY(ax_formula_mode_plan(m, K, v, M, comm, &plan));
  int rc = ax_formula_time_plan(plan, t_f, t_b, t_w, recompute, comm, out);
  ax_pipe_plan_free(plan);
  return rc;
}

double ax_formula_uniform(const char *mode, int K, int M, double t_f,
                          double t_b, int recompute) {
  return ax_formula_uniform_chunks(mode, K, 1, M, t_f, t_b, recompute);
}

double ax_formula_uniform_chunks(const char *mode, int K, int v, int M,
                                 double t_f, double t_b, int recompute) {
  int m = ax_pipe_mode_index(mode);
  if (m < 0 || K < 1 || M < 1) {
    ax_clearerr();
    return -1.0;
  }
  if (!ax_pipe_mode_get(m)->uniform_time)
    return -1.0;
  return ax_pipe_mode_get(m)->uniform_time(
      K, ax_pipe_chunks(m, v), ax_pipe_units(m, M), t_f, t_b, recompute);
}
