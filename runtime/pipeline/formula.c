/* Expected time per mini-batch of each pipeline mode, by an exact
 * simulation of the schedule (see formula.h for the closed forms). */
#include "runtime/pipeline/formula.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/error.h"

enum { SEQ, GPIPE, F1B1, DDG, FR, PIPEDREAM, N_MODES };

static const char *const mode_names[N_MODES] = {
    "sequential", "gpipe", "1f1b", "ddg", "fr", "pipedream"};

#define MAX_STAGES 64

int ax_pipe_mode_index(const char *mode) {
  for (int i = 0; mode && i < N_MODES; i++)
    if (strcmp(mode, mode_names[i]) == 0)
      return i;
  ax_seterr(AX_EINVAL, "unknown pipeline mode '%s' (valid: %s)",
            mode ? mode : "(null)", AX_PIPE_MODES);
  return -1;
}

/* One operation of a stage's schedule: a forward or backward of unit u. */
typedef struct op {
  int bwd, u;
} op;

typedef struct sim {
  int mode, K, U, M, recompute;
  const double *t_f, *t_b;
  op *ops;        /* (K, 2U) operation lists */
  int *n_ops;     /* (K) */
  double *fin_f;  /* (U, K) finish time of F(u, s), -1 until it ran */
  double *fin_b;  /* (U, K) finish time of B(u, s) */
  double *start_f0; /* (U) start time of F(u, 0) */
} sim;

static void push(sim *S, int s, int bwd, int u) {
  S->ops[(size_t)s * 2 * S->U + S->n_ops[s]++] = (op){bwd, u};
}

/* Fills every stage's operation list in the order its schedule runs them. */
static void build_schedule(sim *S) {
  int K = S->K, U = S->U;
  for (int s = 0; s < K; s++) {
    int d = K - 1 - s; /* the seed's d_k for k = s + 1 */
    switch (S->mode) {
    case SEQ:
    case GPIPE: /* backwards in reverse order, as schedule.h runs them */
      for (int u = 0; u < U; u++)
        push(S, s, 0, u);
      for (int u = U - 1; u >= 0; u--)
        push(S, s, 1, u);
      break;
    case F1B1: {
      int w = d < U ? d : U, next_b = 0;
      for (int u = 0; u < w; u++)
        push(S, s, 0, u);
      for (int u = w; u < U; u++) {
        push(S, s, 0, u);
        push(S, s, 1, next_b++);
      }
      while (next_b < U)
        push(S, s, 1, next_b++);
      break;
    }
    case DDG:
    case FR:
      for (int t = 0; t < U; t++) {
        push(S, s, 0, t);
        if (t - d >= 0)
          push(S, s, 1, t - d);
      }
      for (int t = U - d < 0 ? 0 : U - d; t < U; t++)
        push(S, s, 1, t);
      break;
    default: { /* PIPEDREAM */
      int w = d + 1 < U ? d + 1 : U, next_b = 0;
      for (int u = 0; u < w; u++)
        push(S, s, 0, u);
      for (int u = w; u < U; u++) {
        push(S, s, 1, next_b++);
        push(S, s, 0, u);
      }
      while (next_b < U)
        push(S, s, 1, next_b++);
    }
    }
  }
}

/* The time at which every dependency of o on stage s has finished, or -1
 * when one has not run yet. */
static double deps_done(const sim *S, int s, op o) {
  int K = S->K;
  double t = 0;
  if (!o.bwd) {
    if (s > 0) {
      double f = S->fin_f[(size_t)o.u * K + s - 1];
      if (f < 0)
        return -1;
      t = f;
    }
    /* ddg / fr forward locking: round u starts when round u - 1 is over,
     * i.e. after every stage's backward of round u - 1. */
    if ((S->mode == DDG || S->mode == FR) && s == 0 && o.u > 0)
      for (int k = 0; k < K; k++) {
        int bu = o.u - 1 - (K - 1 - k);
        if (bu < 0)
          continue;
        double f = S->fin_b[(size_t)bu * K + k];
        if (f < 0)
          return -1;
        if (f > t)
          t = f;
      }
    return t;
  }
  double f = S->fin_f[(size_t)o.u * K + s];
  if (f < 0)
    return -1;
  t = f;
  if (s + 1 < K) {
    double g = S->fin_b[(size_t)o.u * K + s + 1];
    if (g < 0)
      return -1;
    if (g > t)
      t = g;
  }
  return t;
}

static double op_cost(const sim *S, int s, op o) {
  if (!o.bwd)
    return S->t_f[s];
  int replay = S->mode == FR;
  if (S->mode == GPIPE)
    replay = S->recompute == AX_RECOMPUTE_ALWAYS ||
             (S->recompute == AX_RECOMPUTE_EXCEPT_LAST && o.u != S->U - 1);
  return S->t_b[s] + (replay ? S->t_f[s] : 0.0);
}

/* Runs the schedule; returns the makespan, or -1 on a deadlock. */
static double run(sim *S) {
  int K = S->K, pos[MAX_STAGES] = {0};
  double free_at[MAX_STAGES] = {0}, end = 0;
  for (;;) {
    int progress = 0, left = 0;
    for (int s = 0; s < K; s++) {
      while (pos[s] < S->n_ops[s]) {
        op o = S->ops[(size_t)s * 2 * S->U + pos[s]];
        double ready = deps_done(S, s, o);
        if (ready < 0)
          break;
        double start = ready > free_at[s] ? ready : free_at[s];
        double fin = start + op_cost(S, s, o);
        (o.bwd ? S->fin_b : S->fin_f)[(size_t)o.u * K + s] = fin;
        if (!o.bwd && s == 0)
          S->start_f0[o.u] = start;
        free_at[s] = fin;
        if (fin > end)
          end = fin;
        pos[s]++;
        progress = 1;
      }
      left += pos[s] < S->n_ops[s];
    }
    if (!left)
      return end;
    if (!progress)
      return -1;
  }
}

int ax_formula_time(const char *mode, int K, int M, const double *t_f,
                    const double *t_b, int recompute, double *out) {
  int m = ax_pipe_mode_index(mode);
  if (m < 0)
    return AX_EINVAL;
  if (K < 1 || K > MAX_STAGES || M < 1 || !t_f || !t_b || !out)
    return ax_seterr(AX_EINVAL,
                     "formula: need 1 <= K <= %d (got %d), M >= 1 (got %d) "
                     "and stage time arrays",
                     MAX_STAGES, K, M);
  if (recompute < AX_RECOMPUTE_NEVER || recompute > AX_RECOMPUTE_EXCEPT_LAST)
    return ax_seterr(AX_EINVAL, "formula: recompute option %d unknown",
                     recompute);
  for (int s = 0; s < K; s++)
    if (!(t_f[s] >= 0) || !(t_b[s] >= 0))
      return ax_seterr(AX_EINVAL, "formula: stage %d times (%g, %g) must be "
                       ">= 0", s, t_f[s], t_b[s]);
  int flushed = m == SEQ || m == GPIPE || m == F1B1;
  sim S = {m, K, 0, M, recompute, t_f, t_b, NULL, NULL, NULL, NULL, NULL};
  S.U = m == SEQ ? 1 : flushed ? M : 8 * K + 32;
  S.ops = malloc(sizeof(op) * (size_t)K * 2 * S.U);
  S.n_ops = calloc((size_t)K, sizeof(int));
  S.fin_f = malloc(sizeof(double) * (size_t)K * S.U);
  S.fin_b = malloc(sizeof(double) * (size_t)K * S.U);
  S.start_f0 = calloc((size_t)S.U, sizeof(double));
  int rc = AX_OK;
  if (!S.ops || !S.n_ops || !S.fin_f || !S.fin_b || !S.start_f0) {
    rc = ax_seterr(AX_ENOMEM, "formula: out of memory");
    goto done;
  }
  for (size_t i = 0; i < (size_t)K * S.U; i++)
    S.fin_f[i] = S.fin_b[i] = -1;
  build_schedule(&S);
  double makespan = run(&S);
  if (makespan < 0) {
    rc = ax_seterr(AX_EINTERNAL, "formula: %s schedule deadlocked", mode);
    goto done;
  }
  if (flushed) {
    *out = makespan;
  } else { /* steady state: spacing of stage 0's forwards, second half */
    int a = S.U / 2, b = S.U - 1;
    *out = (S.start_f0[b] - S.start_f0[a]) / (double)(b - a);
  }
done:
  free(S.ops);
  free(S.n_ops);
  free(S.fin_f);
  free(S.fin_b);
  free(S.start_f0);
  return rc;
}

double ax_formula_uniform(const char *mode, int K, int M, double t_f,
                          double t_b, int recompute) {
  int m = ax_pipe_mode_index(mode);
  if (m < 0 || K < 1 || M < 1)
    return -1.0;
  switch (m) {
  case SEQ:
    return K * (t_f + t_b);
  case GPIPE:
    return (M + K - 1) *
           ((recompute == AX_RECOMPUTE_ALWAYS ? 2 * t_f : t_f) + t_b);
  case F1B1:
    return (M + K - 1) * (t_f + t_b);
  case DDG:
    return K * t_f + t_b;
  case FR:
    return K * t_f + t_f + t_b;
  default:
    return t_f + t_b;
  }
}
