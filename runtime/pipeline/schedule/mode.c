/* The pipeline mode table (mode.h): one entry per mode and its action
 * generator. */
#include "axon/runtime/pipeline/schedule/mode.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/error.h"
#include "axon/runtime/pipeline/schedule/mode_v-impl.h"

static ax_pipe_op op(int kind, int s, long t, int m) {
  ax_pipe_op o = {kind, s, (int)t, m};
  return o;
}

static int min_i(int a, int b) { return a < b ? a : b; }

/* ---- action generators --------------------------------------------------- */
/* F(t) B(t) STEP(t). */
static void act_sequential(int K, int v, int s, int U, long n, ax_pipe_op *o,
                           long *k) {
  for (long t = 0; t < n; t++) {
    o[(*k)++] = op(AX_OP_FWD, s, t, 0);
    o[(*k)++] = op(AX_OP_BWD, s, t, 0);
    o[(*k)++] = op(AX_OP_STEP, s, t, 0);
  }
}

/* Per mini-batch: every forward, then the backwards in reverse, then STEP. */
static void act_gpipe(int K, int v, int s, int U, long n, ax_pipe_op *o,
                      long *k) {
  for (long t = 0; t < n; t++) {
    for (int m = 0; m < U; m++)
      o[(*k)++] = op(AX_OP_FWD, s, t, m);
    for (int m = U - 1; m >= 0; m--)
      o[(*k)++] = op(AX_OP_BWD, s, t, m);
    o[(*k)++] = op(AX_OP_STEP, s, t, 0);
  }
}

/* Per mini-batch: min(d, U) warm-up forwards, pairs F(w+i) B(i), the
 * remaining backwards, then STEP (the flush). */
static void act_1f1b(int K, int v, int s, int U, long n, ax_pipe_op *o,
                     long *k) {
  int w = min_i(K - 1 - s, U);
  for (long t = 0; t < n; t++) {
    for (int m = 0; m < w; m++)
      o[(*k)++] = op(AX_OP_FWD, s, t, m);
    for (int i = 0; i < U - w; i++) {
      o[(*k)++] = op(AX_OP_FWD, s, t, w + i);
      o[(*k)++] = op(AX_OP_BWD, s, t, i);
    }
    for (int m = U - w; m < U; m++)
      o[(*k)++] = op(AX_OP_BWD, s, t, m);
    o[(*k)++] = op(AX_OP_STEP, s, t, 0);
  }
}

/* Over the units g = t U + m in order: F(g), then B(g - d) once g >= d,
 * and STEP(t) after the last unit of mini-batch t; the rest at the end. No
 * flush: ddg, fr and pipedream (U = 1) and 2bw (U = M) share it. */
static void act_delayed(int K, int v, int s, int U, long n, ax_pipe_op *o,
                        long *k) {
  long d = K - 1 - s, total = n * U;
  for (long g = 0; g < total + d; g++) {
    if (g < total)
      o[(*k)++] = op(AX_OP_FWD, s, g / U, (int)(g % U));
    long b = g - d;
    if (b < 0)
      continue;
    o[(*k)++] = op(AX_OP_BWD, s, b / U, (int)(b % U));
    if (b % U == U - 1)
      o[(*k)++] = op(AX_OP_STEP, s, b / U, 0);
  }
}

/* Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM's order): rank r
 * of K holds the v stages c K + r (chunk c). Per mini-batch of U units (a
 * multiple of K), rank r's k-th forward is chunk (k / K) mod v of unit
 * (k / (K v)) K + k mod K, its k-th backward the same unit of chunk
 * v - 1 - (k / K) mod v; (K - r - 1) 2 + (v - 1) K warm-up forwards (all of
 * them when U = K), then one forward and one backward, then the remaining
 * backwards, then the STEP of each of its stages (the flush). */
static ax_pipe_op inter_op(int kind, int K, int v, int r, long t, long k) {
  int c = (int)((k / K) % v), m = (int)((k / ((long)K * v)) * K + k % K);
  if (kind == AX_OP_BWD)
    c = v - 1 - c;
  return op(kind, c * K + r, t, m);
}

static void act_interleaved(int K, int v, int r, int U, long n, ax_pipe_op *o,
                            long *k) {
  long total = (long)v * U;
  long warm = U == K ? total : (long)(K - r - 1) * 2 + (long)(v - 1) * K;
  if (warm > total)
    warm = total;
  for (long t = 0; t < n; t++) {
    for (long i = 0; i < warm; i++)
      o[(*k)++] = inter_op(AX_OP_FWD, K, v, r, t, i);
    for (long i = 0; i < total - warm; i++) {
      o[(*k)++] = inter_op(AX_OP_FWD, K, v, r, t, warm + i);
      o[(*k)++] = inter_op(AX_OP_BWD, K, v, r, t, i);
    }
    for (long i = total - warm; i < total; i++)
      o[(*k)++] = inter_op(AX_OP_BWD, K, v, r, t, i);
    for (int c = 0; c < v; c++)
      o[(*k)++] = op(AX_OP_STEP, c * K + r, t, 0);
  }
}

/* ZB-H1 (Qi et al. 2024): 1F1B's order with the backward split into its
 * input half I, on the critical path, and its weight half W. Every stage
 * keeps the same number of units in flight as stage 0 does in 1F1B (K): a
 * stage with d = K - 1 - s warm-up forwards holds its W back by s, so I
 * starts as early as the gradient allows and the held-back W fill the
 * waits of the cool-down (one W after each cool-down I), then the rest,
 * then STEP. With F = I = W the bubble is (K - 1)(F + I - W), a third of
 * 1F1B's (K - 1)(F + I + W). */
static void act_zbh1(int K, int v, int s, int U, long n, ax_pipe_op *o,
                     long *k) {
  int w = min_i(K - 1 - s, U), lag = s;
  for (long t = 0; t < n; t++) {
    int next_w = 0;
    for (int m = 0; m < w; m++)
      o[(*k)++] = op(AX_OP_FWD, s, t, m);
    for (int i = 0; i < U - w; i++) {
      o[(*k)++] = op(AX_OP_FWD, s, t, w + i);
      o[(*k)++] = op(AX_OP_INPUT_GRAD, s, t, i);
      if (i - lag >= next_w)
        o[(*k)++] = op(AX_OP_WEIGHT_GRAD, s, t, next_w++);
    }
    for (int m = U - w; m < U; m++) {
      o[(*k)++] = op(AX_OP_INPUT_GRAD, s, t, m);
      if (next_w <= m)
        o[(*k)++] = op(AX_OP_WEIGHT_GRAD, s, t, next_w++);
    }
    while (next_w < U)
      o[(*k)++] = op(AX_OP_WEIGHT_GRAD, s, t, next_w++);
    o[(*k)++] = op(AX_OP_STEP, s, t, 0);
  }
}

/* ZB-V (Qi et al. 2024): every agent holds two stages in a V (agent r has
 * stages r and 2K - 1 - r, so the first and the last stage share agent
 * 0), and the backward runs as I and W. The order comes from a greedy
 * simulation with unit costs (F = I = W = 1 per stage): at every step each
 * free agent runs a ready I (the critical path) first, else a ready F while
 * it keeps fewer than 2K units of a stage's activations in flight (1F1B's
 * peak: K units of twice the size), else a ready W; the oldest unit first,
 * the later stage first. Within a stage and kind the units go in order,
 * so one cursor per (stage, kind) holds the simulation's state. The
 * bubble is then K - 1 unit steps per mini-batch against 1F1B's 6 (K - 1).
 * One mini-batch is scheduled and repeated, each ending with the STEPs of
 * the agent's two stages. */
static int zbv_rank(int K, int s) { return s < K ? s : 2 * K - 1 - s; }

static void act_zbv(int K, int v, int r, int U, long n, ax_pipe_op *o,
                    long *k) {
  int S = 2 * K, cap = 2 * K;
  enum { F_ = 0, I_ = 1, W_ = 2 };
  static const int kinds[3] = {AX_OP_FWD, AX_OP_INPUT_GRAD, AX_OP_WEIGHT_GRAD};
  /* next[s][kind]: the next unit; done[s][kind][u]: finish time + 1 */
  int(*next)[3] = calloc((size_t)S, sizeof *next);
  long *done = calloc((size_t)S * 3 * (size_t)U, sizeof *done);
  int *inflight = calloc((size_t)K, sizeof *inflight);
  long *busy = calloc((size_t)K, sizeof *busy);
  ax_pipe_op *mine = malloc(sizeof *mine * (size_t)(6 * U + 1));
  long nmine = 0, left = (long)S * 3 * U;
  if (!next || !done || !inflight || !busy || !mine) {
    free(next), free(done), free(inflight), free(busy), free(mine);
    return; /* the caller sees a short list (AX_EINTERNAL) */
  }
#define DONE(s, q, u) done[((size_t)(s)*3 + (q)) * (size_t)U + (u)]
  for (long t = 0; left > 0; t++) {
    for (int a = 0; a < K; a++) {
      if (busy[a] > t)
        continue;
      int stages[2] = {2 * K - 1 - a, a}; /* the later stage first */
      int best_s = -1, best_q = -1, best_u = 0;
      for (int q = 0; q < 3 && best_s < 0; q++) /* I, F, W in that order */
        for (int j = 0; j < 2; j++) {
          int kind = q == 0 ? I_ : q == 1 ? F_ : W_, st = stages[j];
          int u = next[st][kind];
          if (u >= U)
            continue;
          int ready;
          if (kind == F_)
            ready =
                inflight[a] < cap &&
                (st == 0 || (DONE(st - 1, F_, u) && DONE(st - 1, F_, u) <= t));
          else if (kind == I_)
            ready = DONE(st, F_, u) && DONE(st, F_, u) <= t &&
                    (st == S - 1 ||
                     (DONE(st + 1, I_, u) && DONE(st + 1, I_, u) <= t));
          else
            ready = DONE(st, I_, u) && DONE(st, I_, u) <= t;
          if (ready && (best_s < 0 || u < best_u)) {
            best_s = st;
            best_q = kind;
            best_u = u;
          }
        }
      if (best_s < 0)
        continue;
      DONE(best_s, best_q, best_u) = t + 1; /* finishes at t + 1 */
      next[best_s][best_q]++;
      busy[a] = t + 1;
      inflight[a] += best_q == F_ ? 1 : best_q == W_ ? -1 : 0;
      left--;
      if (a == r)
        mine[nmine++] = op(kinds[best_q], best_s, 0, best_u);
    }
  }
#undef DONE
  axi_vmode_repeat(mine, nmine, K, r, n, o, k);
  free(next), free(done), free(inflight), free(busy), free(mine);
}

/* ---- bounds -------------------------------------------------------------- */
static int live_one(int K, int s, int U) { return 1; }
static int live_all(int K, int s, int U) { return U; }
static int live_1f1b(int K, int s, int U) { return min_i(K - s, U); }
static int live_zbh1(int K, int s, int U) { return min_i(K, U); }
static int live_delay(int K, int s, int U) { return K - s; }
static int live_units(int K, int s, int U) { return U; }

/* ---- closed forms of the timing model (formula.h) ------------------------ */
static double t_seq(int K, int v, int U, double f, double b, int rc) {
  return K * (f + b);
}
static double t_gpipe(int K, int v, int U, double f, double b, int rc) {
  return (U + K - 1) * ((rc == AX_RECOMPUTE_ALWAYS ? 2 * f : f) + b);
}
static double t_1f1b(int K, int v, int U, double f, double b, int rc) {
  return (U + K - 1) * (f + b);
}
static double t_ddg(int K, int v, int U, double f, double b, int rc) {
  return K * f + b;
}
static double t_fr(int K, int v, int U, double f, double b, int rc) {
  return K * f + f + b;
}
static double t_pipedream(int K, int v, int U, double f, double b, int rc) {
  return f + b;
}
static double t_2bw(int K, int v, int U, double f, double b, int rc) {
  return U * (f + b);
}
/* K ranks of v chunks, f and b the times of one chunk: every rank works
 * v U (f + b), plus the (K - 1) chunk steps of the fill and the drain. */
static double t_inter(int K, int v, int U, double f, double b, int rc) {
  return ((double)v * U + K - 1) * (f + b);
}

/* ---- the table ----------------------------------------------------------- */
/* name, summary, unit, flush, forward weights, backward weights, keep,
 * recompute_ok, forward_lock, live bound, actions, closed-form time (NULL:
 * the simulation is the model), chunked (several stages per agent,
 * --chunks), split (the backward runs as I and W). */
static const ax_pipe_mode_def g_modes[AX_MODE_COUNT] = {
    [AX_MODE_SEQUENTIAL] = {"sequential", "one mini-batch at a time",
                            AX_UNIT_MINI, 1, AX_FWD_LATEST, AX_WEIGHTS_CURRENT,
                            AX_KEEP_ACTIVATIONS, 0, 0, live_one, act_sequential,
                            t_seq},
    [AX_MODE_GPIPE] = {"gpipe",
                       "M micro-batches forward, then backward; one update",
                       AX_UNIT_MICRO, 1, AX_FWD_LATEST, AX_WEIGHTS_CURRENT,
                       AX_KEEP_ACTIVATIONS, 1, 0, live_all, act_gpipe, t_gpipe},
    [AX_MODE_1F1B] = {"1f1b", "PipeDream-Flush: one forward, one backward",
                      AX_UNIT_MICRO, 1, AX_FWD_LATEST, AX_WEIGHTS_CURRENT,
                      AX_KEEP_ACTIVATIONS, 0, 0, live_1f1b, act_1f1b, t_1f1b},
    [AX_MODE_DDG] = {"ddg",
                     "delayed gradients with the forward's weights, locked "
                     "forwards",
                     AX_UNIT_MINI, 0, AX_FWD_LATEST, AX_WEIGHTS_STASHED,
                     AX_KEEP_ACTIVATIONS, 0, 1, live_delay, act_delayed, t_ddg},
    [AX_MODE_FR] = {"fr",
                    "features replay: inputs kept, forward replayed with the "
                    "latest weights",
                    AX_UNIT_MINI, 0, AX_FWD_LATEST, AX_WEIGHTS_LATEST,
                    AX_KEEP_INPUTS, 0, 1, live_delay, act_delayed, t_fr},
    [AX_MODE_PIPEDREAM] = {"pipedream", "1F1B without flush, weight stashing",
                           AX_UNIT_MINI, 0, AX_FWD_LATEST, AX_WEIGHTS_STASHED,
                           AX_KEEP_ACTIVATIONS, 0, 0, live_delay, act_delayed,
                           t_pipedream},
    [AX_MODE_2BW] = {"2bw",
                     "PipeDream-2BW: 1F1B over micro-batches without flush, "
                     "two weight versions, one update per mini-batch",
                     AX_UNIT_MICRO, 0, AX_FWD_DOUBLE_BUFFERED,
                     AX_WEIGHTS_STASHED, AX_KEEP_ACTIVATIONS, 0, 0, live_delay,
                     act_delayed, t_2bw},
    [AX_MODE_INTERLEAVED] = {"interleaved",
                             "interleaved 1F1B: --chunks v stages per agent, "
                             "bubble (K-1)/(v M)",
                             AX_UNIT_MICRO, 1, AX_FWD_LATEST,
                             AX_WEIGHTS_CURRENT, AX_KEEP_ACTIVATIONS, 0, 0,
                             live_units, act_interleaved, t_inter, 1},
    [AX_MODE_ZBH1] = {"zb-h1",
                      "zero bubble H1: 1F1B with the backward split into "
                      "input and weight halves, W filling the bubbles",
                      AX_UNIT_MICRO, 1, AX_FWD_LATEST, AX_WEIGHTS_CURRENT,
                      AX_KEEP_ACTIVATIONS, 0, 0, live_zbh1, act_zbh1, NULL, 0,
                      1},
    [AX_MODE_ZBV] = {"zbv",
                     "zero bubble V: two stages per agent in a V, the "
                     "backward split into I and W",
                     AX_UNIT_MICRO, 1, AX_FWD_LATEST, AX_WEIGHTS_CURRENT,
                     AX_KEEP_ACTIVATIONS, 0, 0, live_units, act_zbv, NULL, 1, 1,
                     AX_PLACE_V},
    [AX_MODE_DUALPIPEV] = {"dualpipev",
                           "DualPipeV: zbv's V with forward and backward of "
                           "two units as one action; M >= 2K",
                           AX_UNIT_MICRO, 1, AX_FWD_LATEST, AX_WEIGHTS_CURRENT,
                           AX_KEEP_ACTIVATIONS, 0, 0, axi_vmode_live_dualpipev,
                           axi_vmode_act_dualpipev, NULL, 1, 1, AX_PLACE_V, 2,
                           axi_vmode_weight_halves_dualpipev},
    [AX_MODE_VHALF] = {"v-half",
                       "V-Half: a V with I and W at about half of 1F1B's "
                       "activations",
                       AX_UNIT_MICRO, 1, AX_FWD_LATEST, AX_WEIGHTS_CURRENT,
                       AX_KEEP_ACTIVATIONS, 0, 0, axi_vmode_live_vhalf,
                       axi_vmode_act_vhalf, NULL, 1, 1, AX_PLACE_V},
    [AX_MODE_VMIN] = {"v-min",
                      "V-Min: a V with I and W at about a third of 1F1B's "
                      "activations",
                      AX_UNIT_MICRO, 1, AX_FWD_LATEST, AX_WEIGHTS_CURRENT,
                      AX_KEEP_ACTIVATIONS, 0, 0, axi_vmode_live_vmin,
                      axi_vmode_act_vmin, NULL, 1, 1, AX_PLACE_V},
};

const ax_pipe_mode_def *ax_pipe_mode_get(int mode) {
  if (mode < 0 || mode >= AX_MODE_COUNT) {
    ax_seterr(AX_EINVAL, "unknown pipeline mode %d (valid: %s)", mode,
              ax_pipe_mode_list());
    return NULL;
  }
  return &g_modes[mode];
}

static char g_list[256];
static pthread_once_t g_list_once = PTHREAD_ONCE_INIT;

static void list_build(void) {
  size_t len = 0;
  for (int i = 0; i < AX_MODE_COUNT && len < sizeof g_list; i++)
    len += (size_t)snprintf(g_list + len, sizeof g_list - len, "%s%s",
                            i ? "|" : "", g_modes[i].name);
}

const char *ax_pipe_mode_list(void) {
  pthread_once(&g_list_once, list_build);
  return g_list;
}

int ax_pipe_mode_index(const char *name) {
  for (int i = 0; name && i < AX_MODE_COUNT; i++)
    if (strcmp(name, g_modes[i].name) == 0)
      return i;
  ax_seterr(AX_EINVAL, "unknown pipeline mode '%s' (valid: %s)",
            name ? name : "(null)", ax_pipe_mode_list());
  return -1;
}

const char *ax_pipe_mode_name(int mode) {
  return mode >= 0 && mode < AX_MODE_COUNT ? g_modes[mode].name : "?";
}

int ax_pipe_units(int mode, int M) {
  return mode >= 0 && mode < AX_MODE_COUNT &&
                 g_modes[mode].unit == AX_UNIT_MICRO && M > 1
             ? M
             : 1;
}

int ax_pipe_flushes(int mode) {
  return mode >= 0 && mode < AX_MODE_COUNT && g_modes[mode].flush;
}

int ax_pipe_min_units(int mode, int K) {
  if (mode < 0 || mode >= AX_MODE_COUNT)
    return 1;
  if (g_modes[mode].min_units_per_rank > 0 && K > 0)
    return g_modes[mode].min_units_per_rank * K;
  return g_modes[mode].fwd_weights == AX_FWD_DOUBLE_BUFFERED && K > 2 ? K - 1
                                                                      : 1;
}

int ax_pipe_live_bound(int mode, int K, int s, int M) {
  if (mode < 0 || mode >= AX_MODE_COUNT)
    return 0;
  return g_modes[mode].live_bound(K, s, ax_pipe_units(mode, M));
}

int ax_pipe_version_bound(int mode, int K, int s, int M) {
  if (mode < 0 || mode >= AX_MODE_COUNT)
    return 0;
  if (g_modes[mode].fwd_weights == AX_FWD_DOUBLE_BUFFERED)
    return 2; /* the latest and the shadow */
  return g_modes[mode].bwd_weights == AX_WEIGHTS_STASHED
             ? ax_pipe_live_bound(mode, K, s, M)
             : 1;
}

int ax_pipe_replays(int mode, int recompute, int U, int micro) {
  if (mode < 0 || mode >= AX_MODE_COUNT)
    return 0;
  const ax_pipe_mode_def *m = &g_modes[mode];
  if (m->keep == AX_KEEP_INPUTS)
    return 1;
  if (!m->recompute_ok)
    return 0;
  return recompute == AX_RECOMPUTE_ALWAYS ||
         (recompute == AX_RECOMPUTE_EXCEPT_LAST && micro != U - 1);
}

int ax_pipe_chunks(int mode, int chunks) {
  if (mode < 0 || mode >= AX_MODE_COUNT || !g_modes[mode].chunked)
    return 1;
  if (g_modes[mode].placement == AX_PLACE_V)
    return 2; /* a V has two arms */
  return chunks > 1 ? chunks : 2;
}

int ax_pipe_stage_rank(int mode, int K, int s) {
  if (mode >= 0 && mode < AX_MODE_COUNT &&
      g_modes[mode].placement == AX_PLACE_V)
    return zbv_rank(K, s);
  return s % K;
}

long ax_pipe_nops_chunks(int mode, int v, int M, long n) {
  if (mode < 0 || mode >= AX_MODE_COUNT || n < 0)
    return 0;
  long U = ax_pipe_units(mode, M);
  v = ax_pipe_chunks(mode, v);
  /* F and B (or I and W) of every unit of each of its stages, one STEP per
   * stage and mini-batch */
  return v * ((g_modes[mode].split ? 3 : 2) * n * U + n);
}

long ax_pipe_nops(int mode, int M, long n) {
  return ax_pipe_nops_chunks(mode, 1, M, n);
}

long ax_pipe_nops_rank(int mode, int K, int v, int r, int M, long n) {
  if (mode < 0 || mode >= AX_MODE_COUNT || K < 1 || r < 0 || r >= K || n < 0)
    return 0;
  if (!g_modes[mode].weight_halves)
    return ax_pipe_nops_chunks(mode, v, M, n);
  long U = ax_pipe_units(mode, M);
  v = ax_pipe_chunks(mode, v);
  /* F and B or I of every unit of each stage, its W, the STEPs */
  return n * (v * (2 * U + 1) + g_modes[mode].weight_halves(K, r, (int)U));
}

int ax_pipe_schedule_chunks(int mode, int K, int v, int r, int M, long n,
                            ax_pipe_op *ops, long cap) {
  if (mode < 0 || mode >= AX_MODE_COUNT || K < 1 || r < 0 || r >= K || M < 1 ||
      n < 0 || !ops)
    return ax_seterr(AX_EINVAL,
                     "schedule: bad arguments (mode %d, K %d, "
                     "rank %d, M %d, n %ld)",
                     mode, K, r, M, n);
  v = ax_pipe_chunks(mode, v);
  int U = ax_pipe_units(mode, M);
  if (g_modes[mode].chunked && g_modes[mode].placement == AX_PLACE_LOOP &&
      U % K)
    return ax_seterr(AX_EINVAL,
                     "schedule: %s needs a multiple of %d "
                     "micro-batches (got %d)",
                     g_modes[mode].name, K, U);
  if (U < g_modes[mode].min_units_per_rank * K) /* the lists need them */
    return ax_seterr(AX_EINVAL,
                     "schedule: %s with %d ranks needs at least %d "
                     "micro-batches (got %d)",
                     g_modes[mode].name, K, ax_pipe_min_units(mode, K), U);
  long want = ax_pipe_nops_rank(mode, K, v, r, M, n);
  if (cap < want)
    return ax_seterr(AX_EINVAL, "schedule: %ld actions do not fit in %ld", want,
                     cap);
  long k = 0;
  g_modes[mode].actions(K, v, r, U, n, ops, &k);
  if (k != want)
    return ax_seterr(AX_EINTERNAL, "schedule: %s wrote %ld of %ld actions",
                     g_modes[mode].name, k, want);
  return AX_OK;
}

int ax_pipe_schedule(int mode, int K, int s, int M, long n, ax_pipe_op *ops,
                     long cap) {
  return ax_pipe_schedule_chunks(mode, K, 1, s, M, n, ops, cap);
}
