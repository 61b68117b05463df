/* The pipeline coordinator: trains a model split into K stages hosted on K
 * agents, in one of the modes of the mode table (schedule/mode.h).
 *
 * ax_pipe_new creates one "axon.pipe.stage" host per agent (stage_host.h),
 * hands each its neighbours' RRefs and the optimizer configuration.
 * ax_pipe_train then runs one driver thread per agent that walks the agent's
 * list of actions (the mode's plan, mode.h). Stage-driven (the default): a
 * driver issues up to opts.ahead actions before the first of them is answered
 * (asynchronous calls through the hosts' RRefs), waiting only for the
 * dependencies that carry no data (the forward lock of ddg and fr); each
 * agent runs its actions in its list's order (stage_line-impl.h) and waits for
 * its inputs itself, so an action starts as soon as its activations or
 * gradients arrive. With opts.ahead = 1 (coordinator-driven) an action is
 * issued once the agent finished its previous one and the actions it
 * depends on (ax_pipe_plan_deps) completed. Activations and gradients go
 * from stage to stage under the unit's distributed autograd context
 * (pushed by their producer: ax_dist_push and ax_dist_pass_grads,
 * runtime/autograd/autograd.h); the coordinator sends control messages,
 * the inputs to the first stage and the labels to the last.
 * Each unit (a micro-batch or a whole mini-batch, as the mode's entry says:
 * mini-batches for sequential, ddg, fr and pipedream, micro-batches for the
 * others) runs in its own distributed autograd context,
 * released once the first stage finished its backward.
 *
 * Errors: the first failing operation stops every driver within ~100 ms;
 * ax_pipe_train returns its code with a message naming the stage and its
 * agent (e.g. a killed agent: AX_EPEERDOWN "stage 2 on agent w3: ...").
 * Every wait is bounded by opts.timeout_ms, counted for an action from
 * when the agent's previous action was answered.
 *
 * Threads: one ax_pipe is used by one thread at a time. The callbacks run
 * on driver threads, one at a time. The node must be initialised with
 * ax_pipe_init (pipeline.h) and joined with the agents. */
#ifndef AX_PIPELINE_COORDINATOR_H
#define AX_PIPELINE_COORDINATOR_H

#include <stdint.h>

#include "axon/kernels/sum_tree.h"
#include "axon/models/module.h"
#include "axon/rref/rref.h"
#include "axon/runtime/pipeline/schedule/mode.h"
#include "axon/runtime/pipeline/schedule/sched_text.h"
#include "axon/runtime/pipeline/trace/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AX_PIPE_MAX_STAGES 16
#define AX_PIPE_MAX_REPLICAS                                                   \
  16 /* data-parallel copies (opts.replicas)                                   \
        times tensor-parallel members */

typedef struct ax_pipe_opts {
  const char *model;         /* "mlp", "resnet20", "bert" */
  const char *model_config;  /* overrides, or NULL */
  int K;                     /* stages (1 .. AX_PIPE_MAX_STAGES) */
  const char *const *agents; /* K agent names, stage s on agents[s] */
  const int *bounds;         /* K + 1 block bounds, or NULL for uniform */
  int mode;                  /* ax_pipe_mode */
  int M;                     /* micro-batches (gpipe, 1f1b) */
  int recompute;             /* AX_RECOMPUTE_* (gpipe) */
  const char *optim_config;  /* models/optim.h keys */
  uint64_t seed;             /* initialisation and dropout seeds */
  ax_device device;          /* device of the stages on their agents */
  int64_t timeout_ms;        /* bound of every wait; default 60000 */
  const ax_device *devices;  /* K devices, stage s on devices[s] (read by
                                ax_pipe_new only); NULL: all on `device` */
  int chunks;                /* chunked modes (interleaved): stages per agent
                                (0 = 2; zbv: always 2); K agents then hold
                                K * chunks stages, placed as the mode says
                                (ax_pipe_opts_stage_rank), and bounds and devices
                                have K * chunks (+ 1) entries. Ignored by the
                                other modes. */
  /* The staleness correction of the asynchronous modes (staleness.h:
   * AX_STALE_NONE, the default, PREDICT or PIPEMARE; anything but none in a
   * flushed mode is AX_EINVAL), carried to every stage with its delay
   * (ax_pipe_delay). */
  int staleness;
  double stale_gamma; /* pipemare: decay of the update average, in (0, 1);
                         0: AX_PIPEMARE_GAMMA */
  int stale_warmup;   /* pipemare: learning-rate warm-up in updates (0: the
                         step size stays lr / delay) */
  /* Stage-driven execution: how many of an agent's actions its driver
   * issues before the first of them is answered (0: AX_PIPE_AHEAD). The
   * stages wait for their inputs themselves and run the agent's actions in
   * its list's order (stage_line-impl.h), so an action starts as soon as its
   * activations or gradients arrive. 1: coordinator-driven, every action
   * issued once its dependencies completed (one round trip per action on
   * the critical path). The math is the same either way. */
  int ahead;
  /* Pipeline x data parallel: R copies of the pipeline (0 or 1: one).
   * `agents` then holds R * K names, replica r's on agents[r K .. r K + K
   * - 1], all distinct, or all one node's name (that node hosts every
   * replica: the emulation, schedule/emulate.h, with the same math). Each
   * train call gives every replica its shard of every mini-batch (rows r B /
   * R .. (r + 1) B / R - 1 of the batch function's B), and at each STEP the
   * R copies of a stage combine their gradients (an all-reduce among them,
   * runtime/autograd/collective.h, in the sum order below) before updating,
   * so every replica keeps the same weights: one pipeline on R times the
   * batch (buffers such as batch-norm statistics stay per replica). The
   * step callback gets each mini-batch once, its loss the whole
   * mini-batch's (summed in replica order, so its bits do not depend on
   * which finished first). When one replica's call
   * fails, the others' calls end with it (AX_ECANCELLED inside; the call
   * returns the failed replica's error, preferring one that lost an agent,
   * "replica r: ..."). Evaluation, stage state, trace, events and statistics
   * are replica 0's. A checkpoint saves replica 0's stages (every replica holds
   * the same weights and optimizer state; batch-norm statistics, used only by
   * evaluation, are replica 0's) and a restore loads them into every replica
   * (stage files on the stages' disks must then be readable by every replica's
   * agents: one host, a shared directory, or AX_CKPT_TO_COORDINATOR); with zero
   * or an optimizer host checkpoints are refused (AX_EUNSUPPORTED). */
  int replicas;
  /* With replicas: 1 or 2 shards the optimizer state and the averaged
   * gradients over the R copies of a stage (ZeRO stages 1 and 2, which are
   * the same here: a stage's gradients are sharded as soon as they are
   * averaged). Each STEP reduce-scatters the summed gradients, steps its
   * 1/R of the parameters with its 1/R of the optimizer state, and
   * all-gathers the parameters: bit-identical to replicas without it, for
   * 1/R of the optimizer state per agent. AX_EINVAL without replicas. A
   * staleness correction runs unchanged (staleness.h). */
  int zero;
  /* ZeRO-Offload adapted: an agent (e.g. a CPU-only host next to the GPU
   * hosts) that keeps every stage's optimizer state and runs its update
   * ("axon.pipe.optim", created there per stage and per replica): at each STEP
   * a stage sends its gradient there and goes on; the updated parameters
   * are copied in before the next operation that reads them (the next
   * forward, once its input is there), so the update overlaps the wait.
   * The same update, to the bit, as the local one (also under a staleness
   * correction, whose learning-rate scale travels with the gradient).
   * NULL: each stage's own. AX_EINVAL with zero: this keeps each stage's
   * optimizer state whole on one agent, zero shards it over the replicas.
   * A checkpoint asks the optimizer host for the state. */
  const char *optimizer_host;
  /* Tensor parallelism (Megatron; models/layers/parallel.h): every stage
   * runs on T agents, each holding its part of the stage's split layers
   * (0 or 1: none). The model must have tensor-parallel layers (its
   * default configuration names the key `tp`: bert), which each agent
   * builds from tp=T,tp_rank=t; AX_EUNSUPPORTED otherwise. `agents` then
   * holds R * T * K names (R: replicas, at least 1), the K of member t of
   * replica r at agents[(r T + t) K ..], all distinct (or all one, as for
   * replicas), and R * T is at most AX_PIPE_MAX_REPLICAS. The T members of
   * a stage run every forward and backward on the same data at once and sum
   * their partial results with ring all-reduces among them (two per encoder
   * layer each way); each member pushes to the same member of the next stage.
   * The step callback gets each mini-batch once. Evaluation runs on every
   * member; stage state, trace, events and statistics are member 0's
   * (ax_pipe_replica(p, r T + t) is member t of replica r). A checkpoint saves
   * replica 0's members, each stage's file per member (stage-SS-tT.axck), and a
   * restore loads member t's into member t of every replica; axon-run
   * eval and export join the parts into the whole model. */
  int tensor_parallel;
  /* With replicas: 1 weighs each replica's gradient by its share of the
   * mini-batch's rows (its loss gradient scaled by R n_r / B), so that
   * unequal shares (B not a multiple of R) still average to the mean over
   * the whole mini-batch; 0 (the default): the replicas' means averaged,
   * PyTorch DDP's rule. The same with equal shares (nothing is scaled).
   * axon-run --elastic sets it: its replicas may shrink to a count that
   * does not divide the batch. */
  int weighted;
  /* The order of the gradient sums (ax_sum_order, kernels/sum_tree.h).
   * AX_SUM_TREE (0, the default): a stage sums its micro-batches'
   * gradients in the fixed binary tree over micro-batches 0 .. M-1, and
   * the replicas combine their sums in the same tree over replicas 0 ..
   * R-1 (a tree all-reduce), each micro-batch's loss divided by the whole
   * mini-batch's label counts: the tree over the mini-batch's R M
   * micro-batches, replica r's micro-batch j being micro-batch r M + j
   * (its rows); the step callback's loss is the same tree over the
   * micro-batches' losses. With M a power of two the weights and losses
   * depend on the micro-batches (their rows and order) only: R = 1, 2, 4
   * at fixed R M (and batch) train to the same bits, and a resume may
   * change R. A stage whose backwards come in micro-batch order (1f1b)
   * then holds up to log2(M) + 1 gradient buffers (partial sums and the
   * unit in flight) where the chain holds 2 (docs/PARALLELISM.md).
   * AX_SUM_CHAIN: micro-batches left to right, each replica's loss its
   * own shard's mean, the replicas' gradients averaged by the ring
   * all-reduce (PyTorch DDP's rule). */
  int sum_order;
  /* The stages' precision (ax_precision, models/module.h: fp32, the
   * default, or bf16), carried to every stage with setup. In bf16 the
   * stages compute as the model's blocks do in one process in bf16 (the
   * rules of module.h), so a pipeline of any split computes what one
   * process computes, and what crosses between stages is AX_BF16: half
   * the bytes. The state (weights, optimizer) is f32 either way. */
  int precision;
  /* A schedule given as data (sched_text.h: a file's lists of one flushed
   * mini-batch), or NULL: the mode's own lists. With one, the drivers walk
   * its plan, its stages and their ranks are the pipeline's (K is its
   * ranks, `chunks` is ignored, bounds and devices have its stages (+ 1)
   * entries), and the stages follow the table entry `mode`, which must be
   * the schedule's (ax_pipe_sched_mode); M must give its units. Copied by
   * ax_pipe_new. Freezing (freeze.h) re-splits the stages and is refused. */
  const ax_pipe_sched *schedule;
} ax_pipe_opts;

/* The stages of a pipeline with options o: the schedule's, else K times
 * the mode's chunks. */
int ax_pipe_opts_stages(const ax_pipe_opts *o);
/* The rank (agent index of a part) that holds stage s: the schedule's
 * placement when there is one, else the mode's (ax_pipe_stage_rank). Every
 * placement question of the coordinator and the state goes through it. */
int ax_pipe_opts_stage_rank(const ax_pipe_opts *o, int s);

#define AX_PIPE_AHEAD 8
#define AX_PIPE_AHEAD_MAX 1024

typedef struct ax_pipe ax_pipe;

/* Creates the stage hosts and sets them up. AX_EINVAL (with a message) on
 * bad options; errors of the agents are returned naming them. */
int ax_pipe_new(ax_node *n, const ax_pipe_opts *o, ax_pipe **out);
/* Tears the hosts down (neighbour links first, then the RRefs). NULL-safe. */
void ax_pipe_free(ax_pipe *p);
/* Its stage count: K, or K * chunks for chunked modes. */
int ax_pipe_stages(const ax_pipe *p);
/* The agent holding stage s (replica 0's), or NULL out of range. */
const char *ax_pipe_stage_agent(const ax_pipe *p, int s);
/* Replica r of a replicated pipeline (opts.replicas), for its stage state
 * or events; p itself for r = 0 of one that is not; NULL out of range. */
ax_pipe *ax_pipe_replica(ax_pipe *p, int r);

/* Mini-batch t on the CPU: new references in *in and *lab (the coordinator
 * releases them). Dim 0 of every tensor is the example dimension times a
 * whole factor (e.g. BERT's (B * T) MLM labels). AX_OK or an error. */
typedef int (*ax_pipe_batch_fn)(void *user, long t, ax_tlist *in,
                                ax_tlist *lab);

typedef struct ax_pipe_step_info {
  long batch;             /* mini-batch index */
  double loss;            /* its loss (sum of the unit losses) */
  double seconds;         /* since ax_pipe_train started */
  int64_t correct, count; /* first output's argmax hits */
} ax_pipe_step_info;
/* Called once per mini-batch, in order, when its last backward finished. */
typedef void (*ax_pipe_step_fn)(void *user, const ax_pipe_step_info *info);

/* Trains n mini-batches (batch indices continue across calls). */
int ax_pipe_train(ax_pipe *p, long n, ax_pipe_batch_fn batch,
                  ax_pipe_step_fn step, void *user);

/* Evaluates n batches (or until batch() returns AX_ECLOSED) forward through
 * the stages without training: accuracy of the first output, mean loss. */
int ax_pipe_evaluate(ax_pipe *p, long n, ax_pipe_batch_fn batch, void *user,
                     double *accuracy, double *loss);

/* A copy of stage s's flat parameters and buffers (buffers: NULL when the
 * stage has none). New references. */
int ax_pipe_stage_state(ax_pipe *p, int s, ax_tensor **params,
                        ax_tensor **buffers);

/* ---- what happened (traces, metrics, tests) ------------------------------ */
typedef struct ax_pipe_event {
  ax_pipe_op op;
  double t_issue, t_done; /* coordinator clock (ax_clock_s seconds) */
  double busy_s;          /* compute time the stage reported (wall) */
  double cpu_s;           /* the CPU time it reported for the action */
  int live;               /* states the stage kept after the op */
  int versions;           /* weight versions it held (live one included) */
  int64_t state_bytes;    /* bytes of those states */
} ax_pipe_event;

/* Moves the events the stages recorded since the last call into dst
 * (stage_events.h: per stage pid, lane 0 forward/backward/weight/
 * recompute/optim with the agent's node rank, live states and weight
 * versions, lane 1 recv, lane 2 send, with bytes and peer). Stages on this
 * host share the coordinator's clock. */
int ax_pipe_trace(ax_pipe *p, ax_trace *dst);

/* Events of the last ax_pipe_train, in completion order (borrowed; valid
 * until the next train or free). */
const ax_pipe_event *ax_pipe_events(const ax_pipe *p, long *n);

typedef struct ax_pipe_stats {
  double seconds; /* wall time of the last ax_pipe_train */
  long batches;
  uint64_t coord_bytes; /* bytes in + out of the coordinator node */
  double busy_frac[AX_PIPE_MAX_STAGES]; /* compute / wall per stage */
  int peak_live[AX_PIPE_MAX_STAGES];
  int peak_versions[AX_PIPE_MAX_STAGES];
  int64_t peak_bytes[AX_PIPE_MAX_STAGES];
} ax_pipe_stats;
void ax_pipe_get_stats(const ax_pipe *p, ax_pipe_stats *out);

/* Parses "always|except-last|never" into AX_RECOMPUTE_*. */
int ax_pipe_recompute_parse(const char *s, int *out);

#ifdef __cplusplus
}
#endif
#endif
