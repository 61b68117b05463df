/* Expected time per mini-batch of each pipeline mode: the yardstick the
 * synthetic-stage benchmark compares measured times with.
 *
 * Modes are named as on the command line (ax_pipe_mode_list, mode.h).
 * Stages are 0-based here (s in [0, K)); Kang's 1-based k is s + 1 and
 * d_k = K - k = K - 1 - s.
 *
 * Units. t_f[s] and t_b[s] are the forward and backward times of stage s for
 * ONE unit of work that flows through the pipeline: a micro-batch for gpipe
 * and 1f1b (a mini-batch is M of them), a mini-batch for sequential, ddg, fr
 * and pipedream (M is ignored there). Communication and optimizer time are
 * not modelled: fold them into t_f / t_b when they matter.
 *
 * How the time is computed. ax_formula_time simulates the mode's own action
 * lists and dependencies (ax_pipe_plan, mode.h: no second copy of the
 * schedules; any plan, a schedule file's too: ax_formula_time_plan): each
 * action starts when its stage is free and its dependencies have finished, so
 * unequal stages are handled. With equal stages the results are the closed
 * forms of the mode table (ax_pipe_mode_def.uniform_time; t_f, t_b per stage;
 * T_F = K t_f, T_B = K t_b):
 *
 *  - sequential: one mini-batch goes forward through every stage, then
 *    backward; nothing overlaps: K (t_f + t_b) = T_F + T_B.
 *  - gpipe: M forwards then M backwards per stage, flushed. The last
 *    micro-batch leaves stage K-1's forward at (M + K - 1) t_f; the
 *    backwards mirror it, so the mini-batch takes (M + K - 1)(t_f + t_b).
 *    Recompute adds one forward to each recomputed backward: always ->
 *    (M + K - 1)(2 t_f + t_b); "except last" (every micro-batch but the
 *    last recomputes) -> slightly less, computed by the simulation.
 *  - 1f1b (PipeDream-Flush): stage s runs min(K-1-s, M) warm-up forwards,
 *    then alternates one forward and one backward, then drains. Same
 *    critical path as gpipe: (M + K - 1)(t_f + t_b); it saves memory, not
 *    time.
 *  - ddg: the forward of mini-batch t runs through all stages (T_F), then
 *    every stage runs its delayed backward in parallel (t_b); the next
 *    forward starts when the round is over (Kang's forward locking):
 *    K t_f + t_b = T_F + T_B / K per mini-batch in steady state.
 *  - fr: as ddg, but each backward first replays the stage's forward:
 *    K t_f + (t_f + t_b). (Kang's table writes T_F + T_B / K for FR
 *    too, counting the replay inside T_B.)
 *  - pipedream: stage s runs K - s warm-up forwards, then alternates one
 *    backward and one forward and never flushes. In steady state every
 *    stage is always busy: t_f + t_b = (T_F + T_B) / K per mini-batch;
 *    with unequal stages, max_s (t_f[s] + t_b[s]).
 * For the modes without a flush (ddg, fr, pipedream) the result is the
 * steady-state period, measured in the simulation as the spacing of stage
 * 0's forwards after the warm-up; for the flushed modes it is the makespan of
 * one mini-batch. */
#ifndef AX_PIPELINE_FORMULA_H
#define AX_PIPELINE_FORMULA_H

#include "axon/runtime/pipeline/schedule/mode.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Expected seconds per mini-batch of `mode` with K stages (1..64) and M
 * micro-batches (>= 1; ignored by the modes without micro-batches), stage
 * times t_f[K], t_b[K] (seconds, >= 0, units as above) and a recompute
 * option (gpipe only; others ignore it). Transfers: ax_formula_time_comm.
 * Returns AX_OK, or AX_EINVAL with a message on a bad argument (out is then
 * untouched). */
int ax_formula_time(const char *mode, int K, int M, const double *t_f,
                    const double *t_b, int recompute, double *out);

/* The same with K ranks (agents) of v stages each (chunked modes, mode.h):
 * t_f and t_b have K v entries, stage i on rank i mod K. */
int ax_formula_time_chunks(const char *mode, int K, int v, int M,
                           const double *t_f, const double *t_b, int recompute,
                           double *out);

/* The same with the backward's two halves timed apart: t_b[s] is the input
 * half, t_w[s] the weight half (NULL: none), so a whole backward costs
 * t_b + t_w and split modes run I (t_b) and W (t_w) as separate actions. */
int ax_formula_time_split(const char *mode, int K, int v, int M,
                          const double *t_f, const double *t_b,
                          const double *t_w, int recompute, double *out);

/* Transfers and per-action costs, for predictions on real links (axon-run
 * plan). Stage s's forward outputs reach stage s + 1 fwd[s] seconds after
 * its forward ends; stage s + 1's input gradient reaches stage s bwd[s]
 * seconds after that stage's backward (or input half) ends (s in [0, S-1),
 * S = K v stages; NULL: no transfer time). Every F, B, I and W action
 * costs per_action seconds more (the call or push that starts it and its
 * handler); stage s's optimizer step (STEP) takes step[s] seconds (NULL:
 * none). With issue_rtt (K entries: the round trip between the coordinator
 * and rank r), actions reach a rank through the coordinator's window of
 * `ahead` outstanding actions per rank (ax_pipe_opts.ahead): action k of
 * rank r starts no earlier than half a round trip after the start (k <
 * ahead), or a round trip after action k - ahead finished; the result is
 * then the steady-state time per mini-batch, flushed modes included.
 * fwd_busy / bwd_busy ([S - 1]: seconds a transfer occupies the link
 * from stage s to s + 1, or back; NULL: 0): each link carries one
 * transfer at a time, in the order they are sent; a transfer starts when
 * the link is free and arrives fwd[s] (bwd[s]) seconds after it left.
 * cores: the processors the K ranks share (agents on one host with fewer
 * cores than agents); 0 or >= K: each rank has its own, as without comm.
 * With 0 < cores < K an action also needs a free core: list scheduling,
 * in time order. Whenever a core is free, the next action of each rank
 * whose dependencies have finished (and whose rank is free) is a
 * candidate; the one that can start first starts, the lowest rank on a
 * tie, on the core that was free first, and holds it for its cost (no
 * preemption). Without transfers or an issue window, with 1 core every mode's
 * time is the sum of its actions' costs per mini-batch. */
typedef struct ax_formula_comm {
  const double *fwd, *bwd;
  double per_action;
  const double *step;
  const double *issue_rtt;
  int ahead;
  const double *fwd_busy, *bwd_busy;
  int cores;
} ax_formula_comm;

/* ax_formula_time_split with transfers and per-action costs (comm may be
 * NULL: none). */
int ax_formula_time_comm(const char *mode, int K, int v, int M,
                         const double *t_f, const double *t_b,
                         const double *t_w, int recompute,
                         const ax_formula_comm *comm, double *out);

/* The same simulation on any plan (a mode's lists, ax_pipe_plan_new, or
 * lists given as data, ax_pipe_plan_new_lists): t_f, t_b, t_w (may be NULL)
 * and comm's stage arrays have ax_pipe_plan_stages(plan) entries,
 * issue_rtt ax_pipe_plan_ranks(plan). The result is per mini-batch: a
 * mode without flush gives the steady-state period (the plan should hold
 * enough mini-batches for one: the wrappers above use 8 K + 32); a flushed
 * mode the makespan of a plan of one mini-batch, or the spacing of the
 * flushes with more. The mode-name functions above build the mode's plan
 * and call this. AX_EINVAL on a bad argument, AX_EINTERNAL when the lists
 * deadlock, AX_ENOMEM. */
int ax_formula_time_plan(const ax_pipe_plan *plan, const double *t_f,
                         const double *t_b, const double *t_w, int recompute,
                         const ax_formula_comm *comm, double *out);

/* The plan the mode-name functions above simulate: mode m's lists (K
 * ranks, v chunks, M micro-batches) for one mini-batch of a flushed mode
 * (five when comm has an issue window, which carries one into the next),
 * else 8 K + 32, enough for a steady state. ax_pipe_plan_new's errors. */
int ax_formula_mode_plan(int mode, int K, int v, int M,
                         const ax_formula_comm *comm, ax_pipe_plan **out);

/* One action of a simulated (or traced) run: its rank, the action, and
 * when it started and ended (seconds from the run's start). A composite
 * (op.with_next) is one slot: `next` is its second part and `end` that
 * part's end; else next.kind is -1. */
typedef struct ax_pipe_slot {
  int rank;
  ax_pipe_op op, next;
  double start, end;
} ax_pipe_slot;

/* The timeline of the same simulation: every action of the plan as a slot
 * (*out, malloc'd, the caller frees; *n slots), rank by rank, each rank's
 * in its list's order. Errors as ax_formula_time_plan (*out NULL, *n 0).
 * Drawn by timeline.h. */
int ax_formula_timeline(const ax_pipe_plan *plan, const double *t_f,
                        const double *t_b, const double *t_w, int recompute,
                        const ax_formula_comm *comm, ax_pipe_slot **out,
                        long *n);

/* The closed form for K equal stages (see above); -1.0 for an unknown mode
 * or K, M < 1, or a mode without one. For gpipe, recompute ALWAYS is included,
 * EXCEPT_LAST is not (use ax_formula_time). */
double ax_formula_uniform(const char *mode, int K, int M, double t_f,
                          double t_b, int recompute);
/* ... and for K ranks of v equal stages (t_f, t_b per stage). */
double ax_formula_uniform_chunks(const char *mode, int K, int v, int M,
                                 double t_f, double t_b, int recompute);

#ifdef __cplusplus
}
#endif
#endif
