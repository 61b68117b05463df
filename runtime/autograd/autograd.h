/* Distributed autograd: contexts, functions recorded in them, send/recv
 * edges between nodes, and the backward pass that follows those edges.
 *
 * A context (an iteration or a micro-batch) has an id unique across nodes:
 * (rank of the creating node + 1) << 48 | counter. A node "sees" a context
 * when it creates it, or when a call or fetch under it reaches the node.
 *
 * Functions. A module call that should be differentiated across nodes is
 * recorded with ax_dist_record: its input tensors (as received) and output
 * tensors, and a backward callback with its state. The context maps every
 * recorded output tensor (by handle) to its function, and every tensor that
 * arrived from another node with autograd metadata to its remote source.
 *
 * Edges. When tensors that are recorded outputs leave a node under a
 * context (arguments of calls through RRefs, results of such calls, values
 * fetched with to_here, pushes with ax_dist_push) the sender records a
 * SEND (the producing function expects one more gradient contribution) and
 * the receiver records a RECV: a pass-through function whose output is the
 * received tensor and whose input is its remote source. Every local use of
 * a received tensor (a recorded consumer, a backward root) and every send
 * of it onwards is one contribution to that function, which sends their
 * sum back to the source once. So a node that passes on a tensor it
 * received (the driver relay y = B.forward(x); C.forward(y), or a value
 * fetched and re-sent, over any number of hops) returns the tensor's
 * gradient to its original producer.
 * Handlers of RRef calls run with the call's context current, so nested
 * calls inherit it.
 *
 * Backward. ax_dist_backward seeds the roots with ones, runs local
 * functions once all their expected contributions have arrived, and sends
 * input gradients back along RECV edges ("axon.autograd.grad"); every such call
 * is answered only after the receiving node finished its part, so the root
 * returns when every node has finished, and an error anywhere (including
 * AX_EPEERDOWN) is returned at the root. Each function runs its backward
 * once all its expected contributions arrived (one per local consumer, per
 * send and per root seed), with them summed; a consumer whose backward
 * gives no gradient for an input (integer ids, a mask passed through)
 * still reports an empty contribution, and a function none of whose
 * outputs got a gradient does not run its backward (its inputs get empty
 * contributions). A contribution that never comes (a tensor sent under ctx
 * that its receiver neither records as an input nor sends on) keeps its
 * producer from running: fetch values only needed for display without a
 * context.
 *
 * Gradients accumulate per context in buffers keyed by the owner of the
 * parameters (ax_dist_grads), never in a net's own gradient buffer.
 * Releasing a context releases it on every node that saw it (transitively).
 * Contexts created by a node that goes down are released on the others.
 *
 * CUDA: gradients are device tensors of the producing function's device;
 * accumulation uses the device's axpby, and tensors cross nodes through the
 * RPC layer, which copies device memory. Nothing here assumes host memory.
 *
 * Thread safety: every function is thread-safe. One node per process (as
 * for RRefs). */
#ifndef AX_DIST_AUTOGRAD_H
#define AX_DIST_AUTOGRAD_H

#include "axon/models/module.h"
#include "axon/rref/rref.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets up RRefs (ax_rref_init), distributed autograd, the distributed
 * optimizer and the model stage kinds ("mlp.stage", "resnet20.stage",
 * "bert.stage") on n. The single call an agent or coordinator makes after
 * ax_node_create. */
int ax_dist_init(ax_node *n);
/* Frees everything (after ax_node_shutdown, before ax_node_destroy),
 * remote objects first, then the collectives' mailbox if there is one
 * (ax_coll_fini). */
void ax_dist_fini(ax_node *n);

/* ---- contexts ------------------------------------------------------------ */
/* Creates a context and makes it current on the calling thread. */
int ax_dist_context_new(ax_node *n, uint64_t *ctx);
/* Releases ctx here and on every node that saw it, waiting up to
 * timeout_ms for their answers; unreachable peers are skipped (they release
 * it when they see this node go down, or are down themselves). Clears the
 * thread's current context if it was ctx. AX_ESTALE if unknown here. */
int ax_dist_context_release(ax_node *n, uint64_t ctx, int64_t timeout_ms);
/* Contexts alive on this node (tests assert zero at the end). */
long ax_dist_live_contexts(ax_node *n);

/* ---- recording (stage kinds and other differentiable remote calls) ------- */
typedef struct ax_dist_fn_ops {
  /* dout: summed output gradients (borrowed; NULL entries for outputs that
   * got none); din receives new references to input gradients (NULL where
   * none). Runs on a worker thread, once. */
  int (*backward)(void *state, uint64_t ctx, const ax_tlist *dout,
                  ax_tlist *din);
  /* Frees state (after backward, or when the context is released). */
  void (*release)(void *state);
} ax_dist_fn_ops;

/* Records a function in ctx: inputs/outputs are borrowed (outputs are
 * retained by the context). On error state is NOT released (the caller
 * still owns it). */
int ax_dist_record(ax_node *n, uint64_t ctx, const ax_dist_fn_ops *ops,
                   void *state, const ax_tlist *inputs,
                   const ax_tlist *outputs);

/* The gradient buffer of parameter owner `key` in ctx: created zero-filled
 * with n floats on dev on first use. Returns a new reference. */
int ax_dist_grads(ax_node *n, uint64_t ctx, uint64_t key, size_t nfloats,
                  ax_device dev, ax_tensor **out);
/* The accumulated gradients of `key` in ctx (a new reference), or
 * AX_ENOTFOUND when no backward wrote any. */
int ax_dist_get_gradients(ax_node *n, uint64_t ctx, uint64_t key,
                          ax_tensor **out);

/* Takes the gradient buffer of `key` out of ctx (*out: the reference the
 * context held; the context no longer has one). AX_ENOTFOUND when no
 * backward wrote any. Owners that step from several contexts take their
 * buffers as each backward ends and sum them in a fixed order. */
int ax_dist_take_gradients(ax_node *n, uint64_t ctx, uint64_t key,
                           ax_tensor **out);
/* Gives a gradient buffer the caller holds the only reference to back to
 * this node's pool (ax_dist_grads reuses it, zeroed, for a buffer of the
 * same size and device); takes the reference. The pool is bounded; NULL is
 * ignored. */
void ax_dist_grads_recycle(ax_node *n, ax_tensor *g);

/* ---- pushes and takes: tensors a program moves under a context ----------
 * The mirror of the held functions' gradients (below) for what flows
 * forward: a producer pushes tensors under a unit's context to a consumer
 * on another node (or on this one), which takes them when its operation
 * runs (a pipeline stage's activations). `key` addresses the consumer
 * inside the context (e.g. the id of the consumer's RRef), so consumers
 * sharing a node never mix their inputs; each (ctx, key) is pushed once.
 *
 * ax_dist_push sends t (borrowed; NULL entries travel as "no tensor") to
 * node `to` under ctx (non-zero) for `key`, without waiting: the send
 * edges of t's recorded outputs are recorded here and their descriptor
 * travels with them, so the gradients the consumer sends back along its
 * receive edges reach their producers. The context then stops holding t
 * (ax_dist_forget, before the send: a consumer on this node receives these
 * very tensors). *done (may be NULL: then errors are dropped) completes
 * once the receiver stored the list, with its error (AX_EPEERDOWN when
 * `to` is down). AX_ESTALE if ctx was released here. On the receiver
 * ("axon.autograd.push", run on the receiving thread, which it never
 * blocks) the list is kept as received, in ctx, which the push creates
 * there unless it was released: a push under a released context is dropped
 * (its memory freed, and no error); one nobody takes is freed when the
 * context is released. */
int ax_dist_push(ax_node *n, uint64_t ctx, const char *to, uint64_t key,
                 const ax_tlist *t, ax_future **done);
/* Waits up to timeout_ms (<= 0: 60 s) for the list pushed to key under
 * ctx, moves it onto dev (on the calling thread; new references in *out,
 * NULL entries where the producer pushed none) and records its receive
 * edges in ctx. AX_ETIMEOUT at the deadline, AX_EPEERDOWN as soon as
 * `from` (the producer's node; NULL: not watched) is down, AX_ESTALE if
 * ctx is released, AX_ECLOSED while key is closed. */
int ax_dist_take(ax_node *n, uint64_t ctx, uint64_t key, const char *from,
                 ax_device dev, int64_t timeout_ms, ax_tlist *out);
/* Closes (closed = 1) or reopens (0) consumer key on this node: while it
 * is closed every take on key, waiting or new, fails with AX_ECLOSED (a
 * consumer's teardown wakes its waiting operation). Keys start open;
 * reopening forgets the key. Pushes to a closed key are still kept. */
int ax_dist_take_close(ax_node *n, uint64_t key, int closed);

/* Drops ctx's bookkeeping for tensors t (their recorded output or remote
 * source), once no further send or record will name them: the context then
 * stops holding them. Unknown tensors are ignored. */
int ax_dist_forget(ax_node *n, uint64_t ctx, const ax_tlist *t);

/* ---- held functions: the owner runs the backward when it decides --------
 * A pipeline stage runs a unit's backward when the coordinator asks, not
 * when the gradient arrives. ax_dist_record_held records a function like
 * ax_dist_record, but without a callback: output gradients that arrive
 * (from local functions or "axon.autograd.grad") are summed and kept. The owner
 * then takes them with ax_dist_take_grads, computes the input gradients
 * itself and sends them along the function's input edges with
 * ax_dist_pass_grads (to the producers' functions, local or remote). */
int ax_dist_record_held(ax_node *n, uint64_t ctx, const ax_tlist *inputs,
                        const ax_tlist *outputs, uint64_t *fn);
/* Waits until every expected output gradient of fn arrived (all sends of
 * its outputs under ctx were answered by a gradient), up to timeout_ms, and
 * moves their sums into *dout (new references; NULL entries for outputs
 * that got none; dout->n = the output count). A function none of whose
 * outputs was sent returns at once with no gradients. AX_ETIMEOUT,
 * AX_EPEERDOWN (the consumer's node is down), AX_ESTALE (ctx released or
 * no such function), AX_ESTATE (taken twice). */
int ax_dist_take_grads(ax_node *n, uint64_t ctx, uint64_t fn,
                       int64_t timeout_ms, ax_tlist *dout);
/* Sends din (borrowed; entry i is the gradient of fn's input i, NULL for
 * none, which still reports to that input's producer) along fn's input
 * edges without waiting: *done (may be NULL: then
 * errors are dropped) completes once every receiver stored it, with the
 * first error. On error (returned, *done NULL) the gradients of earlier
 * inputs may have been sent. */
int ax_dist_pass_grads(ax_node *n, uint64_t ctx, uint64_t fn,
                       const ax_tlist *din, ax_future **done);

/* ---- backward ------------------------------------------------------------ */
/* Runs the backward from root tensors on this node (recorded outputs, or
 * tensors fetched under ctx), seeded with ones. Waits up to timeout_ms. */
int ax_dist_backward(ax_node *n, uint64_t ctx, const ax_tlist *roots,
                     int64_t timeout_ms);
/* Same, with roots given as value RRefs (their owners seed them). */
int ax_dist_backward_rrefs(ax_node *n, uint64_t ctx, ax_rref *const *roots,
                           int nroots, int64_t timeout_ms);

/* ---- debugging ----------------------------------------------------------- */
/* Delays every "axon.autograd.grad" handler on this node by ms (tests that kill
 * a peer during a backward). Also remote: "axon.autograd.debug" [ms]. */
void ax_dist_debug_grad_delay(ax_node *n, int64_t ms);

#ifdef __cplusplus
}
#endif
#endif
