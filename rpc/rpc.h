/* Remote calls: a function registry per node, sync and async calls with
 * deadlines, and handlers that may answer later through a future.
 *
 * Nothing received over the wire is executed as code: a call names a
 * function registered with ax_rpc_register on the target node.
 *
 * Async contract: ax_rpc_async either fails (returns an error, no future)
 * or returns a future that completes exactly once: with the results, with
 * the remote error (the remote code; message "node: fn: text"), with
 * AX_ETIMEOUT at the deadline, with AX_EPEERDOWN soon after the peer dies,
 * or with AX_ECLOSED when the local node shuts down. ax_rpc_sync is
 * ax_rpc_async followed by a wait. Calls to this node itself expire at their
 * deadline too. A reply counts only from the node the call went to. Calls
 * made from a handler carry its depth + 1; deeper than
 * ax_node_opts.max_call_depth is AX_EINVAL. */
#ifndef AX_RPC_RPC_H
#define AX_RPC_RPC_H

#include "axon/rpc/future.h"
#include "axon/rpc/node.h"
#include "axon/rpc/value.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-call options; a NULL pointer means all defaults. */
typedef struct ax_call_opts {
  /* 0: the node default, or, for a call made from inside a handler, what
   * is left of that handler's deadline if less (AX_ETIMEOUT when nothing
   * is). < 0: AX_ETIMEOUT (no time left). Deadlines saturate: INT64_MAX
   * means no practical limit. */
  int64_t timeout_ms;
  uint64_t autograd_ctx; /* distributed autograd context id; 0: none */
  int nmeta;             /* extra integer metadata (<= 8 entries) */
  const char *const *meta_key;
  const int64_t *meta_val;
  /* Calls to this node only: the node ax_call_caller() reports to the
   * handler, for a node that re-runs a call it held on behalf of a peer.
   * NULL (and always, for calls to other nodes): this node. */
  const char *on_behalf_of;
} ax_call_opts;

/* Identity and metadata of the call a handler is serving. Valid until the
 * handler returns, or until the deferred future completes. */
typedef struct ax_call_ctx ax_call_ctx;

/* A handler: reads args (borrowed), appends results to out (owned by the
 * runtime) and returns AX_OK, or returns an error code whose ax_errmsg()
 * travels back to the caller. To answer later, call ax_call_defer and
 * return AX_OK; `out` is then ignored. Runs on a worker thread; may block,
 * but should defer rather than wait on nested calls. */
typedef int (*ax_rpc_handler)(ax_call_ctx *ctx, const ax_values *args,
                              ax_values *out, void *user);

/* Registers fn on node n. AX_ESTATE if the name is taken. Names starting
 * with "axon." are reserved for axon's built-ins (AX_EINVAL). */
int ax_rpc_register(ax_node *n, const char *fn, ax_rpc_handler h, void *user);

/* Like ax_rpc_register, for a handler that never blocks and returns quickly
 * (no waits, no sync calls, no long computation; async calls, futures and
 * ax_call_defer are fine). It runs directly on the transport thread that
 * received the call instead of on a worker, which saves a thread hand-off
 * (one wake-up, tens of microseconds on a loaded machine) per call. A
 * blocking handler registered this way stalls every call on the node, and
 * its reply may be sent from that thread too. Calls a node makes to itself
 * run on the calling thread (the future is complete when ax_rpc_async
 * returns), so the caller must not hold a lock the handler takes. */
int ax_rpc_register_inline(ax_node *n, const char *fn, ax_rpc_handler h,
                           void *user);

int ax_rpc_async(ax_node *n, const char *to, const char *fn,
                 const ax_values *args, const ax_call_opts *opts,
                 ax_future **out);
/* Waits for the call's deadline (plus a small grace). On success *out gets
 * the results (caller frees; may be an empty list). */
int ax_rpc_sync(ax_node *n, const char *to, const char *fn,
                const ax_values *args, const ax_call_opts *opts,
                ax_values **out);

/* The reply to ctx will be f's outcome (its values or its error). Takes a
 * reference to f. Call at most once, from the handler, then return AX_OK. */
int ax_call_defer(ax_call_ctx *ctx, ax_future *f);

ax_node *ax_call_node(const ax_call_ctx *ctx);
const char *ax_call_caller(const ax_call_ctx *ctx); /* caller's node name */
const char *ax_call_fn(const ax_call_ctx *ctx);
uint64_t ax_call_autograd_ctx(const ax_call_ctx *ctx);
/* Metadata value for key; AX_ENOTFOUND if absent. */
int ax_call_meta(const ax_call_ctx *ctx, const char *key, int64_t *val);
/* All of the call's metadata: how many entries, and entry i (its key is
 * borrowed, valid while ctx is); AX_EINVAL for i out of range. A layer that
 * re-issues a call later passes them all on. */
int ax_call_meta_count(const ax_call_ctx *ctx);
int ax_call_meta_at(const ax_call_ctx *ctx, int i, const char **key,
                    int64_t *val);
/* Milliseconds left before the caller's deadline; -1 once it has passed
 * (never 0, which ax_call_opts.timeout_ms reads as "the default"). */
int64_t ax_call_remaining_ms(const ax_call_ctx *ctx);

/* Calls in flight in this process: outgoing calls not yet complete plus
 * incoming calls not yet answered (debug counter; tests assert zero). */
long ax_rpc_live_calls(void);

#ifdef __cplusplus
}
#endif
#endif
