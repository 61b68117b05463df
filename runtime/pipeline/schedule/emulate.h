/* Single-process emulation of every pipeline mode, and the modelled time of
 * a run.
 *
 * Emulation. A world of one node (ax_pipe_emulator_new) hosts every stage
 * itself: ax_pipe_new with every agent name equal to the node's own name
 * creates the K "axon.pipe.stage" hosts on this node, and the coordinator
 * drives them exactly as it drives agents: the same action lists in the same
 * order, the same dependencies, the same weight versions. Calls to the
 * stages, stage-to-stage pushes ("axon.autograd.push") and gradients along
 * distributed autograd's edges all go through the rpc layer's local path
 * (rpc.h: a node's calls to itself), so no socket carries a tensor and no
 * agent process runs, but the stage code is the very code the agents run:
 * on the CPU the losses and parameters equal the distributed run's bit for
 * bit (tests/test_pipe_emulate.c).
 *
 * Replicas and tensor parallelism (ax_pipe_opts.replicas,
 * .tensor_parallel): with the node's name for all R T K agents the node
 * hosts every part, and each stage host joins its replicas' and members'
 * groups at the rank the coordinator gives it (collective.h:
 * ax_coll_group_new_rank, a node playing several ranks), so the shards of
 * every batch, the all-reduces, ZeRO's halves and the members' sums are the
 * agents' to the bit (tests/test_pipe_emulate_parts.c).
 *
 * Modelled time. The stages' measured compute times per action (the
 * coordinator's events, ax_pipe_events), the fastest per stage and kind, are
 * fed to the timing model (formula.h: a simulation of the same lists: the
 * run's schedule when it was given one, ax_pipe_opts.schedule, else its
 * mode's, both through ax_formula_time_plan), which
 * gives the seconds per mini-batch the run would take with one device per
 * agent (or the cores they share: ax_pipe_costs.cores) and free
 * communication. Stages that share this machine's cores in
 * an emulation still run slower than alone when every run of an action
 * overlapped others, so the times are upper bounds of a dedicated
 * device's. With replicas or tensor-parallel members the events, and so
 * the model, are one part's (replica 0's member 0, ax_pipe_events): the
 * parts run at once, a device each, so a step takes one part's time; a
 * member's actions include its sums with the others, and the replicas'
 * all-reduce at each update is free like every transfer (the model has no
 * link to cost its bytes on).
 *
 * Threads: an emulator node is used like any node (node.h); an
 * ax_pipe_costs is used by one thread at a time. */
#ifndef AX_PIPELINE_EMULATE_H
#define AX_PIPELINE_EMULATE_H

#include "axon/runtime/pipeline/coord/coordinator.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a node named `name` (NULL: "emulator") with `threads` handler
 * threads (0: 4, enough for any number of stages of one pipeline; with
 * replicas or tensor-parallel members, give 4 more than the stages of all
 * the parts: an action run on a worker, with ahead 1 or in evaluation, may
 * wait there in a collective for another part's), the only member of its world
 * (it is its own master, listening on a loopback port no stage uses),
 * ax_pipe_init's it, attaches the loaded plugins (plugin.h) and joins.
 * On error nothing is left running. Free with ax_pipe_emulator_free. */
int ax_pipe_emulator_new(const char *name, int threads, ax_node **out);
/* Shuts the node down and destroys it. NULL-safe. */
void ax_pipe_emulator_free(ax_node *n);

/* Measured per-stage costs of a run: the fastest run of each action kind
 * per stage so far. Other work on the same cores (the other stages of an
 * emulation, other programs) only adds to an action's measured time, so
 * the fastest run is the estimate of a dedicated device's time; a mean
 * would follow the machine's load. With the cores the agents share known
 * (cores > 0) the costs are CPU times, which others' work does not
 * lengthen, and the mean run of each is kept: the core time it takes. */
typedef struct ax_pipe_costs {
  int mode, R, v, M, recompute; /* the run's options (R agents, v chunks) */
  int S;                        /* its stages (ax_pipe_opts_stages) */
  /* The run's schedule (borrowed from the options: it must outlive the
   * costs), or NULL: the mode's lists are modelled. */
  const ax_pipe_sched *schedule;
  /* The cores the R agents share (set after ax_pipe_costs_init, before the
   * first ax_pipe_costs_add): 0 (init's), unknown: the actions' costs are
   * their wall times (busy_s) and each agent has a processor of its own.
   * > 0: their CPU times (cpu_s; the wall time of an action that shares a
   * core counts the time others ran), simulated on that many cores
   * (ax_formula_comm.cores). */
  int cores;
  /* Seconds: forwards, backwards that did not replay a forward, backwards
   * that did (the replay included), weight halves; < 0: none measured. */
  double f[AX_PIPE_MAX_STAGES], b[AX_PIPE_MAX_STAGES], br[AX_PIPE_MAX_STAGES],
      w[AX_PIPE_MAX_STAGES];
  long runs[4][AX_PIPE_MAX_STAGES]; /* runs measured of f, b, br, w */
} ax_pipe_costs;

/* Starts with nothing measured, for a run with options o (mode, K agents,
 * M, chunks, recompute, schedule). */
void ax_pipe_costs_init(ax_pipe_costs *c, const ax_pipe_opts *o);
/* Adds the events of p's last ax_pipe_train. */
void ax_pipe_costs_add(ax_pipe_costs *c, const ax_pipe *p);
/* The stage times the model is fed (per stage, S entries): t_f per
 * forward, t_b per backward without a replayed forward (the model adds the
 * replay itself; from a replaying backward minus t_f when no other was
 * measured) or, for split modes, per input half, and t_w per weight half
 * (0 if none). AX_ESTATE when a stage has no measured forward or backward
 * yet. */
int ax_pipe_costs_times(const ax_pipe_costs *c, double *t_f, double *t_b,
                        double *t_w);
/* The timing model's seconds per mini-batch with those times: the plan the
 * run walks (the schedule's for one mini-batch, else the mode's,
 * ax_formula_mode_plan) simulated by ax_formula_time_plan (formula.h);
 * ax_pipe_costs_times' errors, or the plan's or the model's. */
int ax_pipe_costs_model(const ax_pipe_costs *c, double *seconds_per_batch);

#ifdef __cplusplus
}
#endif
#endif
