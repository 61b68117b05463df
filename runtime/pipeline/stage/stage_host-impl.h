/* Internals of the pipeline stage host (stage_host.c: creation, setup,
 * forward, state and teardown; stage_host_bwd.c: backward and the update
 * rule of each mode; stage_host_state.c: what both share). Contract of the
 * methods in stage_host.h. */
#ifndef AX_PIPELINE_STAGE_HOST_IMPL_H
#define AX_PIPELINE_STAGE_HOST_IMPL_H

#include "axon/runtime/autograd/collective.h"
#include "axon/runtime/autograd/stage-impl.h"
#include "axon/runtime/pipeline/schedule/mode.h"
#include "axon/runtime/pipeline/stage/fault-impl.h"
#include "axon/runtime/pipeline/stage/stage_line-impl.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"
#include "axon/runtime/pipeline/stage/staleness-impl.h"
#include "axon/runtime/pipeline/state/ckpt_file-impl.h"
#include "axon/runtime/pipeline/trace/trace.h"

typedef struct axi_pipe_sent axi_pipe_sent;         /* stage_xfer.c */
typedef struct axi_pipe_boundary axi_pipe_boundary; /* stage_boundary.c */
typedef struct axi_pipe_session axi_pipe_session;   /* stage_decode.c */

typedef struct pstate { /* one unit between its forward and its backward */
  long batch;
  int micro;
  uint64_t seed;
  uint64_t fn;      /* its held function in the unit's context */
  int input_done;   /* split modes: I ran, W has not */
  ax_slot *slot;    /* saved activations; NULL when replayed */
  ax_tlist input;   /* kept inputs (replay) */
  ax_tlist dlogits; /* last stage: d loss / d logits (empty when the head
                       fused the loss and keeps its gradients in slot) */
  /* A replayed last stage: the unit's labels, on the stage's device, their
   * norms and the gradient's scale, from which the replay computes the
   * loss's gradient (ax_forward_xent); no labels otherwise. */
  ax_tlist labels;
  int64_t norm[AX_TLIST_MAX];
  float scale;
  ax_tensor *ver; /* weights the forward used (ddg, pipedream) */
  struct pstate *next;
} pstate;

typedef struct pgrad { /* a unit's parameter gradients, taken from its
                         context after its backward, until its STEP */
  long batch;
  int micro;
  ax_tensor *g;
  struct pgrad *next;
} pgrad;

/* A tie (models/model.h) with one copy on this stage and the other on
 * another: its gradient is summed over the group of the two stages. */
typedef struct axi_pipe_xtie {
  int tie;          /* the model's tie index */
  size_t off, len;  /* this stage's copy in its flat parameters */
  ax_coll_group *g; /* the two stages (setup), rank 0 holding block a */
  ax_coll_op *op;   /* the exchange a STEP started (s->mu) */
} axi_pipe_xtie;

typedef struct phost {
  axi_ag_stage *s;
  int is_last;
  const ax_pipe_mode_def *def; /* the mode's table entry */
  ax_rref *prev, *next;
  uint64_t self;       /* the id of its own RRef (setup): the key its input is
                          pushed to (stage_xfer.c) */
  axi_pipe_sent *sent; /* its first failed send (its own lock; everything
                          else under s->mu) */
  pstate *states;
  pgrad *grads;    /* taken, not yet summed (s->mu) */
  int sum_order;   /* ax_sum_order of the micro-batch sum and of the
                      replicas' all-reduce (setup) */
  ax_sum_tree sum; /* micro-batches 0 .. sum.leaves-1 of sum_batch, summed
                      so far (their partial sums: gradient buffers) */
  long sum_batch;
  ax_tensor *acc;    /* during a STEP: the finished sum */
  long last_step;    /* batch of the last STEP, -1 before the first */
  ax_tensor *shadow; /* double-buffered modes: weights before the last
                        STEP, used by every forward of batch shadow_for */
  long shadow_for;
  axi_stale stale; /* the staleness correction (staleness.h; s->mu) */
  ax_trace *tr;    /* stage-side events (stage_events.h); its own lock */
  int versions; /* weight versions at the last axi_pipe_host_report (s->mu) */
  axi_pipe_line *line;      /* its rank's order (stage_line-impl.h) */
  ax_coll_group *replicas;  /* the same stage in every replica (--replicas):
                               each STEP combines the gradients over it;
                               NULL: one replica (s->mu to use it; set
                               and freed also under group_mu) */
  ax_coll_group *tp;        /* the same stage in every tensor-parallel member of
                               this replica: its split layers sum over it
                               (axi_pipe_host_exec); NULL: none (as replicas) */
  pthread_mutex_t group_mu; /* lets host_quiesce abort the groups while an
                               action waits in one holding s->mu */
  /* Checkpoint files being written in the background ("ckpt_save" with
   * async; stage_ckpt.c), until "ckpt_wait" collects them. */
  pthread_mutex_t ckpt_mu;
  pthread_cond_t ckpt_cv;
  struct axi_pipe_ckpt_write *writes;
  int zero; /* optimizer state and averaged gradients sharded over
               the replicas (ZeRO 1/2): the optimizer holds only */
  size_t zero_off, zero_len; /* this shard of the parameters */
  int optim_kind; /* the optimizer's kind (ax_optim_kind; setup), also
                     while it lives on another agent */
  int tp_members, tp_member; /* its model configuration's tp and tp_rank
                                (1 and 0 without tensor parallelism) */
  ax_rref *offload; /* the optimizer on another agent ("axon.pipe.optim",
                       stage_offload.c), or NULL: the local one (s->mu) */
  ax_future *offload_pending; /* its update in flight: the parameters come
                                 back before anything reads them (s->mu) */
  int offload_err;            /* a failed update: every later one fails */
  long offload_steps;    /* the updates of that optimizer whose parameters came
                            back: its step count (0 after its "init", a
                            checkpoint's after "state_set"; s->mu) */
  axi_pipe_boundary *bd; /* the last step boundary ("boundary" keep;
                            stage_boundary.c), or NULL (s->mu) */
  /* Tied parameters (models/model.h): the ties whose other copy is on
   * another stage (set and freed as the groups above). A STEP sums the
   * ties' gradients, starts their exchanges and leaves its update pending
   * (the gradient in acc) until they are done: the next operation that
   * reads the parameters settles it (axi_pipe_host_settle), so a STEP
   * never waits for the other stage's STEP (stage_update.c says why
   * that cannot deadlock). */
  axi_pipe_xtie xties[AX_MODEL_MAX_TIES];
  int n_xties;
  int tied;           /* the stage holds a copy of some tie (setup) */
  int update_pending; /* STEP update_t waits for its exchanges (s->mu) */
  long update_t;
  int update_err; /* a failed pending update: every later one fails */
  axi_pipe_session *sessions; /* decoding sessions and their caches
                                 (stage_decode.c; s->mu) */
} phost;

/* The data path (stage_xfer.c). init gives a new host its record of
 * failed sends; open (setup) makes `self` its key and forgets earlier
 * failures; close (teardown) wakes and fails its waiting take and every
 * later one until it is opened again; free forgets the key and the
 * record. error: the first failed send since open, as an error (AX_OK:
 * none). */
int axi_pipe_xfer_init(phost *h);
int axi_pipe_xfer_open(phost *h, uint64_t self);
void axi_pipe_xfer_close(phost *h);
void axi_pipe_xfer_free(phost *h);
int axi_pipe_xfer_error(phost *h);
/* A forward's input: the activations prev pushed to this host under ctx,
 * on the stage's device with their receive edges recorded, waited for up
 * to timeout_ms (*wait_us: how long). A forward's output: pushed to next
 * under ctx, not waited for (a failure is kept). */
int axi_pipe_take_input(phost *h, uint64_t ctx, long batch, int micro,
                        int64_t timeout_ms, ax_tlist *in, int64_t *wait_us);
int axi_pipe_push_output(phost *h, uint64_t ctx, long batch, int micro,
                         const ax_tlist *y);
/* Their mirror in a backward: the output gradient next sent back to the
 * unit's function fn, on the stage's device (*wait_us: the wait); the
 * input gradient passed back along fn's receive edges, not waited for. */
int axi_pipe_take_grad(phost *h, uint64_t ctx, uint64_t fn, long batch,
                       int micro, int64_t timeout_ms, ax_tlist *dy,
                       int64_t *wait_us);
int axi_pipe_pass_grad(phost *h, uint64_t ctx, uint64_t fn, long batch,
                       int micro, const ax_tlist *din);

/* The net's exec (ax_net_exec) with the host's tensor-parallel sum. */
ax_exec axi_pipe_host_exec(phost *h, int training);
/* The updates the stage's optimizer made: the local one's step count, or
 * the optimizer host's (offload_steps; s->mu held). */
long axi_pipe_host_steps(const phost *h);
/* Frees a state and everything it keeps (NULL-safe). */
void axi_pipe_state_free(pstate *st);
/* The CPU time an operation's report counts (microseconds; differences
 * only): the process's, all its threads (stage_host_state.c says why). */
int64_t axi_pipe_host_cpu_us(void);
/* Fills the statistics of r (stage_msg-impl.h: busy_us since t0_us, cpu_us
 * since c0_us (axi_pipe_host_cpu_us), live states, weight versions, state
 * bytes; s->mu held) and keeps the weight versions in h->versions for the
 * stage events. */
void axi_pipe_host_report(phost *h, int64_t t0_us, int64_t c0_us,
                          axi_pipe_report_msg *r);
/* How long an operation waits for its neighbour's tensors: what is left of
 * its call's deadline (at most 10 minutes). */
static inline int64_t axi_pipe_wait_ms(ax_call_ctx *cc) {
  int64_t left = ax_call_remaining_ms(cc);
  return left < 1 ? 1 : left > 600000 ? 600000 : left;
}
/* "decode" and "decode_end" (stage_decode.c); the drop of every decoding
 * session (teardown; s->mu held). */
int axi_pipe_host_decode(ax_call_ctx *cc, void *obj, const ax_values *args,
                         ax_values *out);
int axi_pipe_host_decode_end(ax_call_ctx *cc, void *obj, const ax_values *args,
                             ax_values *out);
void axi_pipe_sessions_clear(phost *h);
/* "fwd" (stage_host_fwd.c). */
int axi_pipe_host_fwd(ax_call_ctx *cc, void *obj, const ax_values *args,
                      ax_values *out);
/* The inputs of a forward or a decode (stage_host_fwd.c). *ctx receives
 * the distributed autograd context the call runs under; an operation that
 * takes or pushes activations (no `given` tensors, or not the last stage)
 * or `train` is refused without one, with `why` (a sentence's end) after
 * the stage's name. A failed send of the data path fails it next
 * (axi_pipe_xfer_error). Then the coordinator's tensors `given` are moved
 * to the stage's device (stage 0), or else the activations prev pushed
 * under ctx are taken, whose receive edges are recorded in that context
 * (axi_pipe_take_input; batch and micro name them in events and errors),
 * and the time waited for them is added to *t0_us, the start of the
 * operation's busy time. The caller clears in on every path. */
int axi_pipe_host_inputs(ax_call_ctx *cc, phost *h, const ax_tlist *given,
                         long batch, int micro, int train, const char *why,
                         uint64_t *ctx, ax_tlist *in, int64_t *t0_us);
/* The "bwd", "bwdi", "bwdw" and "step" methods (stage_host_bwd.c). */
int axi_pipe_host_bwd(ax_call_ctx *cc, void *obj, const ax_values *args,
                      ax_values *out);
int axi_pipe_host_bwd_input(ax_call_ctx *cc, void *obj, const ax_values *args,
                            ax_values *out);
int axi_pipe_host_bwd_weight(ax_call_ctx *cc, void *obj, const ax_values *args,
                             ax_values *out);
int axi_pipe_host_step(ax_call_ctx *cc, void *obj, const ax_values *args,
                       ax_values *out);
/* "axon.pipe.optim" (stage_offload.c): registers the kind; one STEP through
 * h->offload (the gradient in h->acc and the learning-rate scale
 * h->stale.lr_scale go there, the parameters come back; s->mu held). */
int axi_pipe_optim_register(ax_node *n);
int axi_pipe_offload_step(phost *h);
/* Waits for the update in flight, if any, and copies its parameters into
 * the stage's (s->mu held): every operation that reads the parameters
 * calls it first, so the update overlaps what comes between (the next
 * forward's wait for its input). The update is then counted
 * (offload_steps) and the staleness correction sees it
 * (axi_stale_after_step of batch last_step, the STEP that sent it).
 * Sticky: after a failed update it returns that failure. */
int axi_pipe_offload_settle(phost *h);
/* Drops an update in flight (teardown; s->mu held). */
void axi_pipe_offload_drop(phost *h);
/* The optimizer host's state (after the update in flight: call settle
 * first): *m borrows *reply, which the caller frees (s->mu held). */
int axi_pipe_offload_state_get(phost *h, ax_values **reply,
                               axi_pipe_optim_state_msg *m);
/* Sets it there: the optimizer host checks m's sizes against its own and
 * changes nothing when they differ (s->mu held). */
int axi_pipe_offload_state_set(phost *h, const axi_pipe_optim_state_msg *m);
/* "ckpt_save", "ckpt_load", "ckpt_drop" (stage_ckpt.c). */
int axi_pipe_host_ckpt_save(ax_call_ctx *cc, void *obj, const ax_values *args,
                            ax_values *out);
int axi_pipe_host_ckpt_load(ax_call_ctx *cc, void *obj, const ax_values *args,
                            ax_values *out);
int axi_pipe_host_ckpt_drop(ax_call_ctx *cc, void *obj, const ax_values *args,
                            ax_values *out);
/* The stage's state as a checkpoint file in memory (*buf malloc'd, the
 * caller frees); with optim_only, a file of its optimizer state only
 * (holds_params = 0). AX_ESTATE unless the stage is at a consistent cut.
 * A stage whose optimizer is on another agent asks it for its state. */
int axi_pipe_ckpt_snapshot(phost *h, int optim_only, uint8_t **buf, size_t *len,
                           char sha[2 * AX_SHA256_LEN + 1]);
/* Checks r (a stage file) against the stage, then loads it: all or
 * nothing (an optimizer host refuses state of another size before the
 * stage changes anything). A file with holds_params = 0 loads only the
 * optimizer state; its range (optim.off, optim.len) must be this stage's
 * (its ZeRO shard, or all its parameters). */
int axi_pipe_ckpt_apply(phost *h, const axi_ckr *r);
/* "ckpt_mem_save", "ckpt_mem_load" (stage_ckpt_mem.c; stage_host.h). */
int axi_pipe_host_ckpt_mem_save(ax_call_ctx *cc, void *obj,
                                const ax_values *args, ax_values *out);
int axi_pipe_host_ckpt_mem_load(ax_call_ctx *cc, void *obj,
                                const ax_values *args, ax_values *out);
/* The agent's store of in-memory checkpoint copies ("axon.pipe.mem_keep",
 * "axon.pipe.mem_fetch", "axon.pipe.mem_forget"; stage_ckpt_mem.c). */
int axi_pipe_mem_store_register(ax_node *n);
/* "ckpt_wait" [path]: the outcome of the background write of path. */
int axi_pipe_host_ckpt_wait(ax_call_ctx *cc, void *obj, const ax_values *args,
                            ax_values *out);
/* Waits for every background write and forgets them (teardown). */
void axi_pipe_ckpt_writes_drain(phost *h);
/* Drops the taken gradients and the running sum (s->mu held). */
void axi_pipe_grads_clear(phost *h);
/* The last step boundary (stage_boundary.c; s->mu held, no-ops unless
 * "boundary" keep was called): _fwd at a training forward of micro-batch
 * 0 of batch, before it runs; _step in STEP t once the replicas' average
 * is in, before the update changes anything; _free drops the copies (and
 * the keeping); _op runs keep or rewind of the method "boundary"
 * (stage_host.h; stop is the host's, stage_host.c) and fills its reply. */
int axi_pipe_boundary_fwd(phost *h, long batch);
int axi_pipe_boundary_step(phost *h, long t);
void axi_pipe_boundary_free(phost *h);
int axi_pipe_boundary_op(phost *h, const axi_pipe_boundary_msg *m,
                         axi_pipe_boundary_reply_msg *r);

/* Tied parameters (stage_tie.c). _new: the groups of setup's ties into
 * x[0 .. *n) after checking them against the model (each a tie that
 * crosses the stage's bounds, once, at this stage's rank; every crossing
 * tie named; AX_EINVAL otherwise; nothing left on error); _abort and
 * _free: as ax_coll_group_abort and _free, the exchange in flight waited
 * for first; _held: whether the stage holds a copy of a tie; _start (s->mu
 * held): the ties inside the stage summed in acc (ax_model_tie_grads),
 * then every crossing tie's all-reduce (sum) of its range of acc started;
 * _wait (s->mu held): waits for them (the first error, naming the tie). */
int axi_pipe_ties_new(phost *h, const axi_pipe_setup_msg *m, int64_t tmo,
                      axi_pipe_xtie *x, int *n);
void axi_pipe_ties_abort(axi_pipe_xtie *x, int n, const char *why);
void axi_pipe_ties_free(axi_pipe_xtie *x, int n);
int axi_pipe_ties_held(const phost *h);
int axi_pipe_ties_start(phost *h, ax_tensor *acc);
int axi_pipe_ties_wait(phost *h);
/* The update of STEP t, its units' gradients summed in h->acc (err: the
 * STEP's error so far, which skips the update but releases acc; s->mu
 * held; stage_update.c): combined over the replicas, the tied copies'
 * gradients summed, then applied, or left pending while a tie's exchange
 * with another stage is in flight (below). */
int axi_pipe_update_begin(phost *h, long t, int err);
/* The pending update of the last STEP, if any (its ties' exchanges waited
 * for, then the update), then the optimizer host's update in flight
 * (axi_pipe_offload_settle): every operation that reads the parameters or
 * the optimizer state calls it first (s->mu held). Sticky: after a failed
 * update it returns that failure until the next setup. _drop forgets a
 * pending update (teardown, a stop; s->mu held, the groups aborted). */
int axi_pipe_host_settle(phost *h);
void axi_pipe_update_drop(phost *h);

/* Registers "axon.pipe.stage" on n (called by ax_pipe_init, pipeline.h). */
int axi_pipe_host_register(ax_node *n);

#endif
