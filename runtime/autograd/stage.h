/* Remote modules: model stages created by name on agents, and the
 * distributed optimizer over their parameters.
 *
 * Kinds "NAME.stage", one for every model ax_model_find knows on the node
 * that creates the object: the built-ins ("mlp.stage", "resnet20.stage",
 * "bert.stage", "sleep.stage") and every model registered with
 * ax_model_register (models/model.h), whether it was registered before or
 * after ax_dist_init (ax_dist_init installs an RRef kind resolver,
 * ax_robj_set_resolver, that makes the kind on first use). They build blocks
 * [splits[stage], splits[stage+1]) of the model with the same initialisation as
 * the whole model. Configuration: stage=K, splits=B0/B1/.../BK (block bounds;
 * default: uniform over nstages=N, default 1), seed=S (default 1); every other
 * key overrides the model's configuration (e.g. widths=784/64/32/10).
 *
 * Methods (through ax_rref_rpc_* or the wrappers below):
 *  - "forward" [i64 seed, i64 n_labels, inputs..., labels...]: inputs are
 *    tensors or ONE value RRef whose value holds the input tensors (fetched
 *    directly from its owner, stage to stage). With n_labels > 0 the stage
 *    returns [loss (1)] (mean cross-entropy), else its outputs. Under a
 *    distributed autograd context it trains (batch statistics, running
 *    statistics updated) and records its backward in the context, its
 *    parameter gradients accumulating in the context's buffer for this
 *    stage; without one it evaluates.
 *  - "parameters" []: [an object RRef to the stage's parameter set
 *    ("stage.params", methods "optim_init" [config] and "step" under a
 *    context, answering [1] when it stepped and [0] when the context held
 *    no gradient for it)], used by the distributed optimizer.
 *  - "state_save" []: [params (P), buffers (Q) or an empty tensor].
 *  - "state_load" [params, buffers]: copies them in (sizes must match).
 *  - "gradients" []: [the context's accumulated gradients (P)] under the
 *    call's autograd context (AX_ENOTFOUND when none).
 * Calls on one stage are serialised by a lock (shared with its optimizer).
 *
 * Gradient buffers and their keys. A differentiable remote object
 * accumulates its parameter gradients per distributed autograd context, in
 * the buffer ax_dist_grads(node, ctx, key, n, dev) returns (autograd.h), and
 * never in a net's own gradient buffer. The key names the owner of the
 * parameters on its node: it must be the same for the object's backward
 * (which writes the buffer) and its optimizer step (which reads it with
 * ax_dist_get_gradients), and distinct from every other owner's key on that
 * node. Model stages draw theirs from a process-wide counter starting at 1;
 * an object of a user kind can take its own address, (uint64_t)(uintptr_t)
 * obj, which never collides with those. A buffer lives as long as its
 * context on that node (until ax_dist_context_release reaches it).
 *
 * The contract of a remote object the distributed optimizer steps. Any
 * object kind (not only "stage.params") whose RRefs are passed to
 * ax_dist_optim_new must provide two methods:
 *  - "optim_init" [str config]: creates or replaces the object's local
 *    optimizer from a models/optim.h configuration ("opt=sgd,lr=0.05").
 *    Called once per object by ax_dist_optim_new, without an autograd
 *    context; an error fails ax_dist_optim_new.
 *  - "step" []: one update with the gradients of the call's autograd
 *    context, which is current on the handler's thread
 *    (ax_autograd_ctx_current). It reads them with ax_dist_get_gradients
 *    under its key; AX_ENOTFOUND means the object got no gradient in that
 *    context, and it must then leave its parameters and optimizer state
 *    unchanged ("stage.params" still steps with zeros there). It
 *    answers [] or an error, which ax_dist_optim_step returns.
 * Both may run on any worker thread, concurrently with the object's other
 * methods (e.g. a backward of another context): the object serialises them
 * with its own lock, as stages do. ax_dist_optim_step calls "step" on every
 * object in parallel and waits for all of them.
 */
#ifndef AX_DIST_STAGE_H
#define AX_DIST_STAGE_H

#include "axon/runtime/autograd/autograd.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates an instance of module kind `kind` on node `to`; returns its RRef
 * at once (creation errors surface on first use). */
int ax_remote_module(ax_node *n, const char *to, const char *kind,
                     const char *config, ax_device dev, ax_rref **out);

/* "forward" with the given arguments (see above); _async returns a future
 * of the outputs, _remote keeps them on the stage's node as a value RRef
 * (the next stage fetches it directly). */
int ax_rmod_forward(ax_node *n, ax_rref *mod, const ax_values *args,
                    ax_values **out);
int ax_rmod_forward_async(ax_node *n, ax_rref *mod, const ax_values *args,
                          ax_future **out);
int ax_rmod_forward_remote(ax_node *n, ax_rref *mod, const ax_values *args,
                           ax_rref **out);
/* The stage's parameter set as an object RRef. */
int ax_rmod_parameters(ax_node *n, ax_rref *mod, ax_rref **out);
/* Copies of the flat parameters and buffers (buffers: NULL when none). */
int ax_rmod_state_save(ax_node *n, ax_rref *mod, ax_tensor **params,
                       ax_tensor **buffers);
int ax_rmod_state_load(ax_node *n, ax_rref *mod, ax_tensor *params,
                       ax_tensor *buffers);

/* ---- distributed optimizer ---------------------------------------------- */
typedef struct ax_dist_optim ax_dist_optim;
/* One local optimizer (models/optim.h config string, e.g.
 * "opt=sgd,lr=0.05,momentum=0.9") per parameter-set RRef, created on its
 * owner (replacing any earlier one there). Any number of RRefs; they are
 * retained. Every entry is checked before any owner's optimizer is
 * replaced: AX_EINVAL when an entry is NULL or a value RRef, when the
 * configuration is bad, or when two entries are parameter sets of the same
 * stage (it would be stepped twice); an owner's error (e.g. an RRef that
 * is not a parameter set) is returned naming the failing entry and owner. */
int ax_dist_optim_new(ax_node *n, ax_rref *const *params, int nparams,
                      const char *optim_config, ax_dist_optim **out);
/* Steps every owner in parallel with the gradients of ctx (0: the thread's
 * current context), each under its owner's lock; waits up to timeout_ms.
 * A parameter set that got no gradient in ctx (no backward wrote its
 * buffer: e.g. its stage ran no forward under ctx, or its output was not
 * on the path of the roots) is NOT stepped: its parameters and its
 * optimizer state (momentum, Adam moments, step count and so the
 * learning-rate schedule) stay as they are, as in torch when a parameter's
 * .grad is None. On error some owners may have stepped. timeout_ms: 0 means
 * 60 s; negative (an exhausted remaining time) is AX_ETIMEOUT at once. */
int ax_dist_optim_step(ax_dist_optim *o, uint64_t ctx, int64_t timeout_ms);
/* The same; *stepped (may be NULL) receives the number of parameter sets
 * that had gradients and were stepped. */
int ax_dist_optim_step_count(ax_dist_optim *o, uint64_t ctx, int64_t timeout_ms,
                             int *stepped);
void ax_dist_optim_free(ax_dist_optim *o); /* NULL-safe */

#ifdef __cplusplus
}
#endif
#endif
