/* RRefs: references to values and objects owned by one node.
 *
 * An RRef names a value (a value list produced by a registered function) or
 * an object (an instance of a registered object kind, e.g. a model stage)
 * that lives on its OWNER node. Other nodes hold USER references. Ids are
 * globally unique: (rank of the creating node << 48) | counter.
 *
 * Protocol (after PyTorch's RRef notes, implemented independently):
 *  - ax_remote returns a user RRef at once; the owner creates the value and
 *    answers the creation call, which confirms the creator's fork. A
 *    creation error (or a timeout of the creation call) is stored in the
 *    RRef and returned by its next use (to_here, calls, wait).
 *  - An RRef passed as an argument or result is FORKED: the sender makes a
 *    new fork id; the receiver registers it with the owner ("fork") and,
 *    once the owner confirmed it, tells the sender ("accept"). The sender
 *    does not release its own fork while it has unaccepted children, and a
 *    receiver does not send its delete before its fork is confirmed, so no
 *    order of message arrival frees a value some user still holds.
 *  - When the last local handle of a user fork is released, the owner is
 *    told ("delete"); the owner frees the value once no fork and no local
 *    handle remains.
 *  - If the owner goes down, user forks are dropped silently and later uses
 *    return AX_EPEERDOWN; if a user goes down, the owner drops its forks.
 *    The owner knows the holder of every fork: forks registered by users
 *    carry it, and a user that receives a fork made by the owner itself
 *    names itself in an "accept" to the owner.
 *  - Sweeps: a child fork never accepted (its message was lost with a
 *    failed call, or its receiver died first) stops holding its parent
 *    after the fork timeout (default 30 s; ax_rref_debug_delay
 *    "fork_timeout"); so does an owner-made fork whose holder never
 *    announced itself. A message slower than that timeout may find its
 *    value freed: its receiver then gets AX_ESTALE, never a crash.
 *  - Stale ids: an owner answers a fetch, call or fork naming an id it does
 *    not hold at once with AX_ESTALE when the id was freed there (a ring of
 *    the last 1024 freed ids), was minted there (its own values are created
 *    synchronously), or the caller's reference was already acknowledged by
 *    the owner. Otherwise the message may have overtaken the creation (a
 *    "fork"/fetch can arrive before the "create"), so it waits for it: up
 *    to 1 s when the id's counter is at or below the highest the owner has
 *    seen created by that creator (only a reordered create can still come),
 *    up to 10 s (never past the call's deadline) above it; then AX_ESTALE
 *    (AX_ETIMEOUT when the call's own deadline comes first).
 *
 * Process model: one node per process uses RRefs (ax_rref_init on a second
 * node in the same process returns AX_ESTATE). The reason is the value
 * codec: ax_value_ext_ops.decode (rpc/value.h) gets the bytes and the
 * sender's name but not the receiving node, so a decoded RRef is attached
 * to the process's one initialised node. Lifting this needs the node passed
 * to decode (an rpc/ change), after which the table (rref_table.c's g_rc)
 * can become per node; nothing else in rref/ assumes one node. Tests that
 * need several RRef nodes therefore use several processes.
 *
 * Handles: ax_rref is reference counted and thread-safe. Functions
 * returning a new ax_rref* give the caller one reference. Value lists hold
 * their own references (ax_values_add_rref retains). */
#ifndef AX_RREF_H
#define AX_RREF_H

#include <stdint.h>

#include "axon/models/config.h"
#include "axon/rpc/rpc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ax_rref ax_rref;

/* The extension kind RRefs use inside value lists (rpc/value.h). */
#define AX_VALUE_EXT_RREF 1u

typedef enum ax_rref_type {
  AX_RREF_VALUE = 0,
  AX_RREF_OBJECT = 1
} ax_rref_type;

/* ---- set-up -------------------------------------------------------------- */
/* Registers the RRef protocol functions ("axon.rref.*") on n, the value
 * extension (once per process) and starts the protocol thread. Call after
 * ax_node_create and before ax_node_join returns on any peer that may send
 * RRefs here. Takes the node's peer-down callback (see ax_rref_peer_down).
 * AX_ESTATE if another node of this process is initialised. */
int ax_rref_init(ax_node *n);
/* Stops the protocol thread and frees every owned value, object and user
 * record without messaging. Call after ax_node_shutdown and before
 * ax_node_destroy. NULL-safe, idempotent. */
void ax_rref_fini(ax_node *n);
/* What the peer-down callback does (exposed so that a layer above that
 * installs its own callback can chain it). */
void ax_rref_peer_down(ax_node *n, const char *peer);

/* ---- creation ------------------------------------------------------------ */
/* Asks node `to` to run its registered function fn(args) and keep the
 * result as a value it owns. Returns the user RRef at once (to == this
 * node: an owner RRef, created synchronously). opts: deadline of the
 * creation; autograd_ctx passes a distributed autograd context (0: the
 * current one of this thread). */
int ax_remote(ax_node *n, const char *to, const char *fn, const ax_values *args,
              const ax_call_opts *opts, ax_rref **out);

/* ---- handles ------------------------------------------------------------- */
ax_rref *ax_rref_retain(ax_rref *r); /* NULL-safe; returns r */
void ax_rref_release(ax_rref *r);    /* NULL-safe */
uint64_t ax_rref_id(const ax_rref *r);
const char *ax_rref_owner(const ax_rref *r); /* owner node name */
int ax_rref_is_owner(const ax_rref *r);
ax_rref_type ax_rref_type_of(const ax_rref *r);
/* 1 once the owner knows this reference (owner handles: always 1). */
int ax_rref_confirmed(const ax_rref *r);
/* Waits up to timeout_ms for the creation outcome: AX_OK, the stored
 * creation error, or AX_ETIMEOUT (the RRef stays usable). */
int ax_rref_wait_created(ax_rref *r, int64_t timeout_ms);

/* ---- values -------------------------------------------------------------- */
/* A copy of the value (tensors shared) fetched from the owner within
 * timeout_ms (0: 60 s; negative: AX_ETIMEOUT at once, an exhausted
 * remaining time; INT64_MAX: no practical limit). Returns the creation error if
 * it failed, AX_ETIMEOUT past the deadline, AX_EUNSUPPORTED for objects. Under
 * a distributed autograd context (current or autograd_ctx) the transfer is
 * recorded as a send on the owner and a recv here. */
int ax_rref_to_here(ax_node *n, ax_rref *r, int64_t timeout_ms,
                    uint64_t autograd_ctx, ax_values **out);
/* On the owner: the value list (borrowed, valid while r is held), or
 * AX_ESTATE when not the owner or not created yet, or the creation error. */
int ax_rref_local_value(ax_rref *r, const ax_values **out);
/* On the owner: the object (borrowed, valid while r is held). */
int ax_rref_local_object(ax_rref *r, void **obj);

/* ---- calls through an RRef ---------------------------------------------- */
/* Calls method `method` of the referenced object on its owner (objects
 * only). Same contract as ax_rpc_async; opts->autograd_ctx 0 means the
 * thread's current context. Tensors of args that are outputs recorded in
 * the context are sent with autograd edges. */
int ax_rref_rpc_async(ax_node *n, ax_rref *r, const char *method,
                      const ax_values *args, const ax_call_opts *opts,
                      ax_future **out);
int ax_rref_rpc_sync(ax_node *n, ax_rref *r, const char *method,
                     const ax_values *args, const ax_call_opts *opts,
                     ax_values **out);
/* Like ax_rref_rpc_async, but the result stays on the owner as a new value
 * RRef returned at once. */
int ax_rref_remote(ax_node *n, ax_rref *r, const char *method,
                   const ax_values *args, const ax_call_opts *opts,
                   ax_rref **out);

/* ---- value lists --------------------------------------------------------- */
int ax_values_add_rref(ax_values *v, ax_rref *r); /* retains r */
/* Borrowed; retain it to keep it beyond the list. AX_EBADARG otherwise. */
int ax_values_get_rref(const ax_values *v, size_t i, ax_rref **out);

/* ---- object kinds -------------------------------------------------------- */
/* A method: reads args (borrowed), appends results to out. May defer with
 * ax_call_defer like an RPC handler. Runs on a worker thread with the
 * call's autograd context current. */
typedef int (*ax_robj_method)(ax_call_ctx *ctx, void *obj,
                              const ax_values *args, ax_values *out);

typedef struct ax_robj_method_def {
  const char *name;
  ax_robj_method fn;
} ax_robj_method_def;

typedef struct ax_robj_kind {
  const char *name;
  /* Builds an object from a configuration "k=v,..." on device dev. */
  int (*create)(ax_node *n, const char *config, ax_device dev, void **obj);
  void (*destroy)(void *obj);
  const ax_robj_method_def *methods; /* terminated by {NULL, NULL} */
  /* Optional, used instead of create when set: the constructor also gets
   * the kind, so one constructor can serve kinds made at run time (e.g.
   * one per model, told apart through `user`). */
  int (*create_kind)(const struct ax_robj_kind *kind, ax_node *n,
                     const char *config, ax_device dev, void **obj);
  void *user; /* for create_kind; the RRef layer never touches it */
} ax_robj_kind;

/* A method that answers later calls this instead of ax_call_defer (so the
 * call layer knows not to attach results itself), then returns AX_OK. */
int ax_robj_defer(ax_call_ctx *ctx, ax_future *f);

/* Registers a kind on n (kind must outlive the node). AX_ESTATE if taken;
 * AX_EINVAL without a name or without create and create_kind. */
int ax_robj_register(ax_node *n, const ax_robj_kind *kind);
/* Kinds made on demand. When an object of a kind that is not registered on
 * n is to be created here, the resolver (if one is set) is asked for it
 * with the kind's name; a kind it returns is registered as by
 * ax_robj_register and used. It returns NULL when it has no such kind. It
 * must return the same pointer for the same name, and the kind must outlive
 * the node. It runs on a worker thread and must not block. One resolver per
 * node (the distributed runtime sets one for "NAME.stage", stage.h); NULL
 * removes it. */
typedef const ax_robj_kind *(*ax_robj_resolver)(ax_node *n, const char *kind,
                                                void *user);
void ax_robj_set_resolver(ax_node *n, ax_robj_resolver fn, void *user);
/* Creates an object of `kind` on node `to`; returns its RRef at once. */
int ax_remote_object(ax_node *n, const char *to, const char *kind,
                     const char *config, ax_device dev,
                     const ax_call_opts *opts, ax_rref **out);
/* Makes a local object (created by the caller; ownership passes to the
 * RRef, destroyed with kind->destroy when the last reference goes) into an
 * owner RRef, e.g. to return a sub-object from a method. */
int ax_rref_own_object(ax_node *n, const ax_robj_kind *kind, void *obj,
                       ax_rref **out);

/* ---- autograd hooks (installed by runtime/autograd) ---------------------- */
/* The layer above records distributed autograd edges for tensors that cross
 * nodes through RRef calls and fetches. send: `vals` leave for node `to`
 * under ctx; returns a malloc'ed descriptor (or NULL, len 0 when nothing
 * needs gradients). recv: `vals` arrived from `from` with that descriptor.
 * Hooks run on worker threads and must not block on the network. */
typedef struct ax_rref_grad_hooks {
  int (*send)(ax_node *n, uint64_t ctx, const char *to, const ax_values *vals,
              size_t first, void **desc, size_t *len);
  int (*recv)(ax_node *n, uint64_t ctx, const char *from, const ax_values *vals,
              size_t first, const void *desc, size_t len);
} ax_rref_grad_hooks;
void ax_rref_set_grad_hooks(const ax_rref_grad_hooks *h);

/* The calling thread's current distributed autograd context (0: none).
 * Handlers of RRef calls run with the call's context current. */
uint64_t ax_autograd_ctx_current(void);
void ax_autograd_ctx_set_current(uint64_t ctx);

/* Built-in kind "rref.box" (registered by ax_rref_init): holds RRefs.
 * Methods: "put" [rrefs...] -> [count]; "send" [box] puts every held RRef
 * into another box; "clear" []; "fetch" [index, timeout_ms] -> the value
 * of the index-th RRef. Used to build fork trees in tests. */

/* ---- debugging ----------------------------------------------------------- */
/* Live RRef records on this node: values/objects owned, and user forks
 * (including forks whose delete is still to be sent). Remotely:
 * "axon.rref.live" [] -> [owned, users, world size known there]. */
int ax_rref_live(ax_node *n, long *owned, long *users);
/* Writes one line per live record into buf (truncated to len). Remotely:
 * "axon.rref.list" [] -> [str]. */
int ax_rref_debug_list(ax_node *n, char *buf, size_t len);
/* Delays the protocol messages of one kind sent BY this node: "fork",
 * "accept" or "delete" (ms = 0 removes the delay). For tests forcing
 * message orders; also callable remotely as "axon.rref.debug" [kind, ms].
 * Two more kinds: "create" makes this node, as owner, sleep ms in the
 * creation handler before registering the value (a create that arrives
 * late; blocks one handler thread), and "fork_timeout" sets the sweep
 * timeout (0: the default, 30 s). */
int ax_rref_debug_delay(ax_node *n, const char *msg, int64_t ms);

#ifdef __cplusplus
}
#endif
#endif
