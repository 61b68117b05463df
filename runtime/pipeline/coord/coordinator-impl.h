/* Internal structure of the coordinator (coordinator.c: set-up, evaluation,
 * state; coord_run.c: the driver threads of ax_pipe_train). */
#ifndef AX_PIPELINE_COORDINATOR_IMPL_H
#define AX_PIPELINE_COORDINATOR_IMPL_H

#include <pthread.h>

#include "axon/models/model.h"
#include "axon/models/net.h"
#include "axon/runtime/pipeline/coord/coordinator.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"

#define AXP_NAME 64

typedef struct axi_pipe_batch { /* one mini-batch while it is in flight */
  int loaded;
  ax_tlist in, lab;
  int64_t norm[AX_TLIST_MAX]; /* kept labels per output in the mini-batch */
  double scale;               /* the loss gradient's scale (0: none, 1;
                                 replicas.c sets it, ax_pipe_opts.weighted) */
  int units_left;             /* first-stage backwards still to run */
  int64_t correct, count;
} axi_pipe_batch;

typedef struct axi_pipe_frozen axi_pipe_frozen; /* a frozen prefix (freeze.h) */

/* Creating one part of a replicated or tensor-parallel pipeline
 * (replicas.c): R data replicas of T tensor-parallel members each, this
 * part's replica r and member t, the group tags' id and every part's
 * agents (part r T + t at agents[(r T + t) ranks ..]). */
typedef struct axi_pipe_replica_of {
  int R, r;
  uint64_t id;
  const char *const *agents;
  int T, t;
} axi_pipe_replica_of;

struct ax_pipe {
  ax_node *node;
  int nrep;            /* > 0: the front of nrep parts (below); */
  int replica;         /* a part's replica index (0 when none) */
  int member, members; /* a part's tensor-parallel member index and
                          count (0 and 1 when none): its stage files
                          in a checkpoint are its own */
  struct axi_pipe_ckpt_job *ckpt_job; /* the outermost object's checkpoint
                                    still being written (checkpoint.c) */
  axi_pipe_frozen *frozen;            /* the outermost object's frozen prefix
                                    (freeze.h), or NULL */
  char (*pool)[AXP_NAME]; /* after a freeze: every agent the pipelines
                             before it had (some may be idle), for the
                             next re-packing; npool names */
  int npool;
  ax_pipe *rep[AX_PIPE_MAX_REPLICAS]; /* every call goes to them (rep[0]:
                              evaluation, state, trace, events, statistics) */
  ax_pipe_opts o;
  char agents[AX_PIPE_MAX_STAGES][AXP_NAME];
  char model[AXP_NAME];
  char model_config[512];             /* o.model_config's copy ("" when none) */
  int K, U, ignore_index;             /* K: stages (agents x chunks) */
  int bounds[AX_PIPE_MAX_STAGES + 1]; /* stage s: blocks [bounds[s], [s+1]) */
  int R, v;             /* agents (ranks, one driver each), chunks */
  ax_pipe_sched *sched; /* o.schedule's copy (o.schedule points to it) */
  int tied;             /* its stages exchange tied gradients (coord_ties.c) */
  ax_rref *host[AX_PIPE_MAX_STAGES];
  ax_rref *optim[AX_PIPE_MAX_STAGES]; /* on o.optimizer_host, or NULL */
  char optim_host[AXP_NAME];          /* o.optimizer_host's name */
  uint64_t line[AX_PIPE_MAX_STAGES];  /* each agent's line id (random;
                                         stage_line-impl.h) */
  int64_t gen;   /* train calls so far (the lines' "pipe.gen") */
  long base;     /* global id of the next train call's first mini-batch */
  long eval_ids; /* ids of evaluation batches (negative) */
  /* One train call. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  long n;
  ax_pipe_plan *plan;  /* every stage's actions (mode.h) */
  unsigned char *done; /* [K][AX_OP_KINDS][n * U] */
  uint64_t *ctx;       /* one per unit */
  int *stages_left;    /* per unit: stages still to finish its backward */
  axi_pipe_batch *b;   /* [n] */
  double *losses;      /* per unit: its loss, summed per mini-batch in the
                          sum order (axi_pipe_sum_losses) */
  int err;
  char msg[512];
  ax_pipe_batch_fn batch_fn;
  ax_pipe_step_fn step_fn;
  void *user;
  /* A part whose losses are divided by the whole mini-batch's label
   * counts (replicas in the sum tree, replicas.c): gives them for
   * mini-batch gid (called with user right after batch_fn loaded it).
   * NULL: its own labels' counts. */
  int (*norm_fn)(void *user, long gid, int64_t *norm);
  double t0;
  ax_pipe_event *ev;
  long nev, cap_ev;
  ax_pipe_stats stats;
  /* Background releaser (coord_run.c): contexts of finished units are
   * queued here (under mu) and released on every node by one thread, so
   * the release round trips stay off the drivers' critical path. */
  pthread_t rel_thread;
  pthread_cond_t rel_cv;
  uint64_t *relq; /* [n * U + 1] ring of contexts to release */
  long rel_head, rel_tail;
  int rel_stop, rel_running;
  long rel_failed; /* releases that returned an error */
};

/* The background releaser (coord_release.c). axi_pipe_release_start allocates a
 * queue for `units` contexts and starts the thread (AX_ENOMEM, or an error
 * when the thread cannot start: the caller then releases synchronously, see
 * axi_pipe_release_push). axi_pipe_release_push queues ctx (mu held); when the
 * thread is not running it returns 0 and the caller releases ctx itself.
 * axi_pipe_release_stop (mu NOT held) lets the thread drain the queue, each
 * release bounded by the run's timeout, joins it and frees the queue. */
int axi_pipe_release_start(ax_pipe *p, size_t units);
int axi_pipe_release_push(ax_pipe *p, uint64_t ctx);
void axi_pipe_release_stop(ax_pipe *p);

/* A zeroed pipeline of node n with a copy of o whose caller-owned arrays
 * and strings (agents, bounds, devices, optimizer_host) are cleared and
 * whose schedule is its own copy (p->sched, freed with p); NULL on no
 * memory (coordinator.c). */
ax_pipe *axi_pipe_alloc(ax_node *n, const ax_pipe_opts *o);
/* The checks of o.schedule against the other options (AX_EINVAL naming
 * both; AX_OK without one), and the plan of p's next n mini-batches: the
 * schedule's or the mode's (coord_sched.c). */
int axi_pipe_check_schedule(const ax_pipe_opts *o);
int axi_pipe_plan_of(const ax_pipe *p, long n, ax_pipe_plan **out);
/* One pipeline, or replica rep->r of R (rep may be NULL), as ax_pipe_new
 * (coordinator.c). */
int axi_pipe_create(ax_node *n, const ax_pipe_opts *o,
                    const axi_pipe_replica_of *rep, ax_pipe **out);
/* Tied parameters (models/model.h; coord_ties.c). _check: whether the S
 * stages of bounds (from bounds[0]: a frozen prefix before it) can hold
 * info's ties in mode: AX_EINVAL for a frozen prefix holding one copy of
 * a tie only, AX_EUNSUPPORTED for copies two or more stages apart in a
 * mode with the forward lock (ddg, fr), each naming the blocks. _setup:
 * stage s's part of setup (stage_msg-impl.h), the ties with one copy on
 * stage s and the other on another stage of p, each with the group of the
 * two stages' agents in this replica and member (tags from id, written
 * into tags); with any, the "ties" part is present and p->tied is set. */
int axi_pipe_ties_check(const char *model, const ax_model_info *info,
                        const int *bounds, int S, int mode);
/* At the end of a train call of a pipeline whose stages exchange tied
 * gradients (p->tied): every stage's pending update applied ("settle", all
 * stages at once), so that the call returns with every update made. */
int axi_pipe_ties_settle(ax_pipe *p);
void axi_pipe_ties_setup(ax_pipe *p, int s, const ax_model_info *info,
                         uint64_t id, const axi_pipe_replica_of *rep,
                         axi_pipe_setup_msg *m,
                         char tags[AX_MODEL_MAX_TIES][48]);
/* A train call of one pipeline, not a front, as ax_pipe_train without a
 * frozen prefix (coord_run.c). */
int axi_pipe_train_one(ax_pipe *p, long n, ax_pipe_batch_fn batch,
                       ax_pipe_step_fn step, void *user);
/* The arguments of action o in *out (new; the caller frees them), p->mu
 * held (reads and fills the mini-batch cache). A backward with `step` also
 * runs the STEP that follows it in the stage's list (coord_args.c). */
int axi_pipe_make_args(ax_pipe *p, const ax_pipe_op *o, int step,
                       ax_values **out);
/* ax_pipe_new / ax_pipe_train of a replicated pipeline (replicas.c). */
int axi_pipe_replicas_new(ax_node *n, const ax_pipe_opts *o, ax_pipe **out);
int axi_pipe_replicas_train(ax_pipe *p, long n, ax_pipe_batch_fn batch,
                            ax_pipe_step_fn step, void *user);

/* The sum of v[0 .. n-1] in `order` (ax_sum_order, sum_tree.h), as the
 * gradients are summed: a mini-batch's unit losses, replicas' losses; v is
 * scratch afterwards (coord_loss.c). */
double axi_pipe_sum_losses(int order, double *v, int n);

/* The loss divisors of a mini-batch's labels: per label tensor, its
 * entries other than ignore (coord_loss.c). */
void axi_pipe_label_counts(const ax_tlist *lab, int ignore, int64_t *norm);

/* The first stage whose agent this node sees down, or -1. */
int axi_pipe_down_stage(const ax_pipe *p);
/* Records the first error of a run as "stage s on agent A: ..." and wakes
 * every driver. mu held. */
void axi_pipe_fail(ax_pipe *p, int s, int err, const char *what);

/* coord_stages.c. Calls method on every stage of p (not a front) at once,
 * under autograd context ctx (0: none), and waits for every issued call:
 * args(s) builds stage s's arguments (AX_OK with *out NULL: stage s is
 * not called), reply (NULL: none) reads its answer.
 * The first error is returned as "stage s on agent A: ..." (the form of
 * axi_pipe_stage_err, which turns the current error into it). The calls'
 * deadline is axi_pipe_timeout (ax_pipe_opts.timeout_ms, else 60 s). With
 * a context, the first failed call releases it at once, so the stages
 * waiting for what the failed one would have pushed fail now (AX_ESTALE)
 * rather than at their deadline; the caller's own release then finds it
 * gone. */
typedef int (*axi_pipe_args_fn)(void *user, int s, ax_values **out);
typedef int (*axi_pipe_reply_fn)(void *user, int s, const ax_values *r);
int axi_pipe_all_stages(ax_pipe *p, uint64_t ctx, const char *method,
                        axi_pipe_args_fn args, axi_pipe_reply_fn reply,
                        void *user);
int axi_pipe_stage_err(ax_pipe *p, int s, int err);
int64_t axi_pipe_timeout(const ax_pipe *p);

/* The frozen prefix of a pipeline (freeze.h; freeze_cache.c): blocks
 * [0, blocks) as a net on the coordinator's CPU (taken, also on error),
 * with the AutoCache of its outputs (budget bytes; 0: 1 GiB; < 0: none). */
int axi_pipe_frozen_new(ax_net *net, int blocks, int64_t budget,
                        axi_pipe_frozen **out);
void axi_pipe_frozen_free(axi_pipe_frozen *f);        /* NULL-safe */
int axi_pipe_frozen_blocks(const axi_pipe_frozen *f); /* 0 for NULL */
ax_net *axi_pipe_frozen_net(axi_pipe_frozen *f);
void axi_pipe_frozen_counts(axi_pipe_frozen *f, long *hits, long *misses,
                            int64_t *bytes);
/* Drops every cached output (the prefix's values changed). */
void axi_pipe_frozen_clear_cache(axi_pipe_frozen *f);
/* Replaces the inputs in (CPU tensors, a mini-batch) by the prefix's
 * outputs, from the cache where it has them. Thread-safe. */
int axi_pipe_frozen_apply(axi_pipe_frozen *f, ax_tlist *in);
/* A caller's batch and step functions behind the prefix: pass
 * axi_pipe_frozen_batch / axi_pipe_frozen_step with a feed as their user. */
typedef struct axi_pipe_frozen_feed {
  axi_pipe_frozen *f;
  ax_pipe_batch_fn batch;
  ax_pipe_step_fn step;
  void *user;
} axi_pipe_frozen_feed;
int axi_pipe_frozen_batch(void *feed, long t, ax_tlist *in, ax_tlist *lab);
void axi_pipe_frozen_step(void *feed, const ax_pipe_step_info *si);

/* Tensor-parallel members per replica of p (a front: its parts'; 1 when
 * none): nrep = replicas x members. */
static inline int axi_pipe_members(const ax_pipe *p) {
  return p->nrep ? p->rep[0]->members : p->members > 1 ? p->members : 1;
}

#endif
