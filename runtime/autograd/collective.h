/* Collectives over the runtime's RPC: ring or tree all-reduce, a bucketed
 * all-reduce that overlaps the backward, neighbour exchange on a ring
 * (D-PSGD) and broadcast, between the members of a group of nodes.
 *
 * Transport: every message is one call of the built-in function
 * "axon.coll.put" [tag, seq, step, tensor] on the receiving node, which
 * stores the tensor in that node's mailbox (an inline handler that never
 * blocks). Tensors of bulk_threshold bytes (1 MiB) and more travel over the
 * bulk channel like any other call. A message may arrive before the
 * receiver starts the operation: it waits in the mailbox.
 *
 * Ordering contract: every member of a group submits the same operations
 * (same kind, same element range, same root) in the same order; operation
 * k on one member pairs with operation k on the others. Operations of one
 * group run one at a time, in submission order, on the group's
 * communication thread, so an async operation overlaps the caller's
 * computation.
 *
 * Tensors: flat f32 tensors (any shape, treated as numel elements). CPU
 * tensors are reduced in place; tensors on another device are staged
 * through host memory. The caller must not write the range an operation
 * works on until the operation is waited for.
 *
 * Failure: every wait is bounded by the group's timeout (AX_ETIMEOUT). When
 * a member of the group is down (ax_node_peer_is_down, or a send to it
 * failed) the operation fails with AX_EPEERDOWN and ax_coll_failed_peer
 * names it; the tensor's range then holds partial sums. Every later
 * operation of that group fails at once with the same error. A member
 * whose group fails (an operation's error, or ax_coll_group_abort) tells
 * the other members once ("axon.coll.put" with seq -1): their waits in that
 * group then fail at once with AX_ECANCELLED naming it, rather than at
 * their timeout. Survivors call
 * ax_coll_group_shrink to form a new ring without the dead members (every
 * survivor must do it, and should then re-synchronise state, e.g. with
 * ax_coll_broadcast from rank 0 of the new group).
 *
 * Threads: one group is used by one caller thread at a time; distinct
 * groups may be used concurrently. */
#ifndef AX_DIST_COLLECTIVE_H
#define AX_DIST_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

#include "axon/kernels/sum_tree.h"
#include "axon/kernels/tensor.h"
#include "axon/rpc/node.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Registers "axon.coll.put" and the mailbox on n. Call once after
 * ax_node_create (before join, so early messages find the handler). */
int ax_coll_init(ax_node *n);
/* Frees the mailbox (after ax_node_shutdown, once every group of n is
 * freed). NULL-safe and idempotent. */
void ax_coll_fini(ax_node *n);

typedef struct ax_coll_group ax_coll_group;

/* A group of the named members (this node must be one of them, once);
 * ring order is the order of `members`, this node's rank its index. `tag`
 * (<= 55 characters) must be the same on every member and unique among the
 * live groups of the node. timeout_ms bounds every wait of every
 * operation (<= 0: 60 s). Starts the group's communication thread. */
int ax_coll_group_new(ax_node *n, const char *tag, int n_members,
                      const char *const *members, int64_t timeout_ms,
                      ax_coll_group **out);
/* The same as member `rank` (members[rank] must be this node's name; -1:
 * ax_coll_group_new's rule). A name may appear more than once: one node
 * then plays several members, each rank through its own group object with
 * the same tag (one process standing in for several, as the emulation of
 * replicated pipelines does, emulate.h). Messages of such a group are
 * addressed to a rank ("<tag>@<rank>" on the wire), so that ranks of one
 * node never take each other's; the algorithms, and so the bits of every
 * result, are those of the same group over distinct nodes. A node down
 * fails every rank it plays. */
int ax_coll_group_new_rank(ax_node *n, const char *tag, int n_members,
                           const char *const *members, int rank,
                           int64_t timeout_ms, ax_coll_group **out);
/* The group of the members of g that are not down (the failed peer always
 * counts as down), in the same order, with tag "<tag>.e<epoch+1>". g stays
 * valid and must still be freed. AX_EPEERDOWN if this node is not among the
 * survivors. */
int ax_coll_group_shrink(ax_coll_group *g, ax_coll_group **out);
/* Fails the group from outside its caller's thread: the operation in
 * flight (its waits wake at once) and every later one fail with
 * AX_ECANCELLED naming `why`. For an owner that ends the group's work while
 * a caller waits in it (a member that will never send is not down). No-op
 * if the group failed already. NULL-safe. */
void ax_coll_group_abort(ax_coll_group *g, const char *why);
/* Waits (bounded) for submitted operations, stops the thread, drops the
 * group's undelivered messages. NULL-safe. */
void ax_coll_group_free(ax_coll_group *g);

/* The order in which g's reductions (all-reduce and its reduce-scatter
 * half) sum the members' values, the members being the leaves in rank
 * order (kernels/sum_tree.h):
 *  - AX_SUM_CHAIN, a new group's: the ring (below); each chunk summed
 *    along the ring from its own first member;
 *  - AX_SUM_TREE: the sum tree over ranks 0 .. N-1 for every element: each
 *    member sends its pieces of the others' chunks straight to them and
 *    sums its own chunk's N pieces in the tree (the same bytes sent as the
 *    ring, each once; sends run one piece ahead of the sums, so a mailbox
 *    holds a few pieces per member). The all-gather, the shards and the
 *    AVG division (once, after the sum) are the ring's.
 * Every member must set the same order, before the group's first
 * operation; a shrunk group keeps it. NULL-safe. */
void ax_coll_group_set_order(ax_coll_group *g, ax_sum_order order);

int ax_coll_group_size(const ax_coll_group *g);
int ax_coll_group_rank(const ax_coll_group *g);
const char *ax_coll_group_member(const ax_coll_group *g, int rank);
/* The member whose death failed an operation (borrowed), or NULL. */
const char *ax_coll_failed_peer(const ax_coll_group *g);

typedef enum ax_coll_reduce {
  AX_COLL_SUM = 0,
  AX_COLL_AVG = 1, /* the sum divided by the group size */
} ax_coll_reduce;

/* An operation in flight. Completed by ax_coll_wait, which frees it. */
typedef struct ax_coll_op ax_coll_op;

/* All-reduce of elements [off, off + n) of t (n = 0: to the end):
 * reduce-scatter (in the group's order) then all-gather over the group's
 * ring, the range cut into size() chunks (the last ones one element
 * shorter when n is not divisible). Every member ends with bit-identical
 * values. Each member sends 2 (N - 1) / N of the range's bytes. */
int ax_coll_allreduce_async(ax_coll_group *g, ax_tensor *t, size_t off,
                            size_t n, ax_coll_reduce op, ax_coll_op **out);
/* Waits up to timeout_ms (<= 0: the group's timeout plus 1 s) and frees the
 * op; returns its outcome. On AX_ETIMEOUT of this wait the operation is
 * still abandoned safely (the group fails every later operation). */
int ax_coll_wait(ax_coll_op *op, int64_t timeout_ms);
/* The sync form: the whole tensor. */
int ax_coll_allreduce(ax_coll_group *g, ax_tensor *t, ax_coll_reduce op);

/* The two halves of ax_coll_allreduce on the whole of t, for sharded
 * optimizer state (ZeRO): after ax_coll_reduce_scatter this member's shard
 * of t (ax_coll_shard) holds the reduction of every member's, with the very
 * bits ax_coll_allreduce gives there (the rest of t is scratch); after
 * ax_coll_allgather every member's t holds every member's shard. */
int ax_coll_reduce_scatter(ax_coll_group *g, ax_tensor *t, ax_coll_reduce op);
int ax_coll_allgather(ax_coll_group *g, ax_tensor *t);
/* This member's shard [*off, *off + *len) of an n-element tensor. */
void ax_coll_shard(const ax_coll_group *g, size_t n, size_t *off, size_t *len);

/* Copies root's t into every member's t (a pipeline along the ring). */
int ax_coll_broadcast(ax_coll_group *g, ax_tensor *t, int root);

/* Neighbour exchange on the ring: sends x to both neighbours and receives
 * the previous member's x into from_prev and the next member's into
 * from_next (all of x's element count). With 2 members both are the one
 * peer; with 1, both get a copy of x. x may be on any device (it is
 * copied to the host); from_prev and from_next must be CPU tensors
 * (AX_EUNSUPPORTED naming the device otherwise). */
int ax_coll_neighbors_async(ax_coll_group *g, ax_tensor *x,
                            ax_tensor *from_prev, ax_tensor *from_next,
                            ax_coll_op **out);

/* ---- bucketed all-reduce, overlapped with the backward -------------------
 * Usage for one step (grads: the net's flat gradient buffer):
 *   ax_coll_buckets *b; ax_coll_buckets_begin(g, net->grads, 1 << 20,
 *                                             AX_COLL_AVG, &b);
 *   ax_exec ex = ax_net_exec(net, 1);
 *   ex.grad_ready = ax_coll_buckets_ready; ex.grad_ready_user = b;
 *   ax_backward(net->root, &ex, slot, &dout, &din);
 *   rc = ax_coll_buckets_end(b, 0);   // flushes, waits, frees
 * Ready ranges are gathered into contiguous buckets of at least
 * bucket_bytes; each full bucket's all-reduce starts at once on the
 * group's thread while the backward goes on. Ranges that were never
 * reported are reduced by _end. All members must report the same ranges. */
typedef struct ax_coll_buckets ax_coll_buckets;
int ax_coll_buckets_begin(ax_coll_group *g, ax_tensor *grads,
                          size_t bucket_bytes, ax_coll_reduce op,
                          ax_coll_buckets **out);
/* Marks [off, off + n) final; has the signature of ax_exec.grad_ready.
 * Errors are kept and returned by _end. */
void ax_coll_buckets_ready(void *b, size_t off, size_t n);
/* Submits what is left, waits for every bucket (timeout_ms <= 0: the
 * group's), frees b and returns the first error. */
int ax_coll_buckets_end(ax_coll_buckets *b, int64_t timeout_ms);

#ifdef __cplusplus
}
#endif
#endif
