/* The schedule verifier: what every plan (mode.h; a mode's generated lists
 * or lists given as data) passes through before a run uses it.
 *
 * Checks, in this order (the first that fails is reported):
 *
 * 1. Completeness. Every (stage, unit) of every mini-batch has exactly one
 *    F and either one B or one I and one W; its F comes before its B or I
 *    on the list of the rank that holds the stage, its W after its I; every
 *    stage has one STEP per mini-batch, after every action of that
 *    mini-batch's units on the stage and after the STEP before it; a mode
 *    that flushes runs no action of mini-batch t+1 on a stage before its
 *    STEP(t); a double-buffered mode (2bw) no forward of t before STEP(t-2)
 *    (the stage host refuses those). A missing action is reported here (it
 *    is not a hang: the stage host would fail the action that needs it).
 *    Messages name rank, position in its list and action:
 *    "rank 2 action 14 (1W3): W before its I".
 *
 * 2. Deadlock freedom, under the runtime's semantics. A rank runs its list
 *    in order, one action at a time. A send never waits; an action waits
 *    for what it receives and for nothing else: F(s,u) for F(s-1,u)'s
 *    activations, B or I of (s,u) for the input gradient of stage s+1
 *    (whichever of B or I makes it), stage 0's F under a forward lock for
 *    the actions ax_pipe_plan_lock_deps names; W and STEP wait for nothing
 *    but their rank's earlier actions. A composite (with_next) starts when
 *    the dependencies of both parts are met (ax_pipe_plan_deps); this is
 *    what the coordinator-driven driver does (opts.ahead 1), and it only
 *    adds waits to what a stage-driven line does (each part waiting for its
 *    own data), so a plan free of deadlock here is free of it there too
 *    (fewer waits never make a run stop earlier).
 *    The ahead window (opts.ahead > 1) adds no wait the list order does
 *    not: the driver issues action i once its rank's action i - ahead is
 *    answered (or, when i has lock dependencies, once every earlier action
 *    of the rank is, and then the lock's actions are done), and the rank's
 *    line cannot start i before its action i - 1 ended, which is after
 *    i - ahead ended; the driver thread of one rank never holds up another
 *    rank's. So the waits are exactly: the previous action of the rank
 *    list, and the dependencies above.
 *    The model is a simulation in unit steps: at every step each rank whose
 *    next action has its dependencies done (in an earlier step) runs it.
 *    When no rank can move and some have actions left, every such rank
 *    waits at its next action for a dependency that is not done; following
 *    "waits for an action of rank q" from rank to rank must return to a
 *    rank already met: the report names that CYCLE ("rank 0 waits at action
 *    3 (0B1) for 1B1 on rank 1, which waits at action 2 (1F2) for 0F2 on
 *    rank 0, back to rank 0") and draws a rank x step grid of the steps
 *    before the stop (actions as "0F3", composites "0F3+7B1", idle ".",
 *    STEPs as "STEP0": ax_pipe_op_text), with each blocked rank's stuck action
 * after the bar and "<-- here". Not modelled: tied parameters (a tied stage's
 * first action after STEP(t) also waits for the other tied stage's STEP(t); the
 *    coordinator refuses the ties that could hang, coord_ties.c) and
 *    replicas (every replica runs the same plan; their STEPs meet).
 *
 * 3. Peak live units and weight versions per stage, from the lists alone
 *    (each rank's list order): a unit is live on its stage from its F until
 *    its B, or, with a split backward, until its W (the stage host keeps
 *    the unit's state, the forward's saved activations and then the output
 *    gradient I saved, until W; models/module.h, stage/stage_host_bwd.c).
 *    Weight versions, counted as the stage host reports them: the live
 *    weights, plus each other version that a live unit keeps; a unit keeps
 *    the version its forward used only when the mode's backward uses the
 *    stashed weights (bwd_weights AX_WEIGHTS_STASHED): the weights after
 *    the STEPs its stage ran before the F, or, double-buffered (2bw), the
 *    shadow of the STEP before its mini-batch's (t - 1) when that STEP ran.
 *    Flushed modes and fr (replayed with the latest) count 1.
 *
 * 4. Fit, when opts.stage_bytes and opts.mem_cap are given: each stage's
 *    memory in the partitioner's model (ax_stage_memory, partition.h) with
 *    the counts of 3 instead of the table's bounds, summed per rank (an
 *    agent holds its stages at once); a rank over the cap is refused,
 *    naming its stages, its bytes and each stage's live units and weight
 *    versions: "rank 0 (stage 0) needs 2400 bytes, over the cap of 2350: 4
 *    units live (4 with activations), 1 weight versions".
 *
 * Cost: linear in the plan's actions plus the simulated steps times the
 * ranks (K = 16, M = 64, zbv: well under a millisecond).
 * Thread safety: reentrant; the plan is only read. */
#ifndef AX_PIPELINE_VERIFY_H
#define AX_PIPELINE_VERIFY_H

#include <stddef.h>

#include "axon/runtime/pipeline/schedule/mode.h"
#include "axon/runtime/pipeline/schedule/partition.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ax_pipe_verify_opts {
  /* Fit (check 4): one entry per stage of the plan, the sums over its
   * blocks (param_bytes, buffer_bytes, saved_bytes; in_bytes of its first
   * block); NULL: no fit check. */
  const ax_block_profile *stage_bytes;
  size_t mem_cap;   /* bytes per rank (its stages together); 0: no cap */
  int optim_copies; /* as ax_partition_opts */
  int recompute;    /* AX_RECOMPUTE_* (gpipe) */
  int grid_steps;   /* steps drawn before a deadlock (0: 16) */
} ax_pipe_verify_opts;

typedef struct ax_pipe_verify_report {
  int stages;
  long steps;                                 /* simulated unit steps (0 when
                                                 the plan hangs) */
  int peak_live[AX_PIPE_PLAN_MAX_STAGES];     /* units at once, per stage */
  int peak_versions[AX_PIPE_PLAN_MAX_STAGES]; /* weight versions */
  size_t stage_mem[AX_PIPE_PLAN_MAX_STAGES];  /* bytes (with stage_bytes) */
  int ranks;                                  /* with stage_bytes: the plan's */
  size_t rank_mem[AX_PIPE_PLAN_MAX_STAGES];   /* its stages' bytes summed */
  /* On a refusal: the whole explanation (the check's message; for a
   * deadlock the cycle and the grid), malloc'ed; NULL when the plan
   * passed. Free with ax_pipe_verify_report_clear. */
  char *text;
} ax_pipe_verify_report;

/* Verifies plan p (o and r may be NULL: the defaults, no report). AX_OK
 * when every check passes; AX_EINVAL when one fails, with ax_errmsg the
 * first line of the explanation (for a deadlock, the cycle; truncated to
 * the error buffer) and r->text all of it; AX_ENOMEM. The counts of r are
 * filled once the plan is complete, even when it hangs. */
int ax_pipe_verify(const ax_pipe_plan *p, const ax_pipe_verify_opts *o,
                   ax_pipe_verify_report *r);
/* Frees r->text (NULL-safe). */
void ax_pipe_verify_report_clear(ax_pipe_verify_report *r);

/* The mode's own plan for K ranks (chunks as ax_pipe_chunks), M
 * micro-batches and n mini-batches (n >= 2 shows the steady state of the
 * modes that do not flush), verified: what ax_pipe_new checks before any
 * agent is contacted. AX_OK / AX_EINVAL (ax_errmsg) / AX_ENOMEM. */
int ax_pipe_verify_mode(int mode, int K, int chunks, int M, long n);

#ifdef __cplusplus
}
#endif
#endif
