/* Internals of the collectives (runtime/autograd/collective.h): the per-node
 * mailbox, groups with their communication thread, operations, and the
 * send/receive primitives the algorithms in collective_ring.c use. The
 * files, bottom to top: collective.c (mailbox, failure state, send and
 * receive), collective_ring.c (the algorithms), collective_group.c (groups
 * and their thread), collective_ops.c (the public operations). */
#ifndef AX_DIST_COLLECTIVE_IMPL_H
#define AX_DIST_COLLECTIVE_IMPL_H

#include <pthread.h>

#include "axon/rpc/future.h"
#include "axon/runtime/autograd/collective.h"

#define AXI_COLL_TAG 64
#define AXI_COLL_FN "axon.coll.put"

/* One received message waiting to be taken. */
typedef struct axi_coll_msg {
  struct axi_coll_msg *next;
  char tag[AXI_COLL_TAG];
  int64_t seq, step;
  ax_tensor *t; /* one reference */
} axi_coll_msg;

/* The mailbox of one node; every group of the node waits on its cv. */
typedef struct axi_coll_box {
  struct axi_coll_box *next_box;
  ax_node *node;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  axi_coll_msg *head;
} axi_coll_box;

typedef enum {
  AXI_OP_ALLREDUCE,
  AXI_OP_BCAST,
  AXI_OP_NEIGH,
  AXI_OP_REDUCE_SCATTER, /* the all-reduce's first half */
  AXI_OP_ALLGATHER       /* and its second */
} axi_coll_kind;

struct ax_coll_op {
  struct ax_coll_op *next;
  ax_coll_group *g;
  axi_coll_kind kind;
  ax_tensor *t, *a, *b; /* references held by the op */
  size_t off, n;
  ax_coll_reduce reduce;
  int root;
  int64_t seq;
  int done, rc, abandoned;
  char msg[256];
};

struct ax_coll_group {
  ax_node *node;
  axi_coll_box *box;
  char tag[AXI_COLL_TAG]; /* "<base>" or "<base>.e<epoch>" */
  char base[AXI_COLL_TAG];
  int epoch, size, rank;
  ax_sum_order order; /* of its reductions (ax_coll_group_set_order) */
  char **members;
  /* A name appears more than once (ranks that share a node): messages are
   * addressed to a rank (axi_coll_tag_of), not only to a node. */
  int shared;
  char rx_tag[AXI_COLL_TAG]; /* the tag this member's messages carry */
  int64_t timeout_ms;
  pthread_t th;
  int started;
  pthread_mutex_t mu; /* queue, op completion, failure state */
  pthread_cond_t cv;
  ax_coll_op *qhead, *qtail;
  int stop;
  int64_t next_seq;
  int failed_rc;
  char failed_peer[128];
  char abort_why[128]; /* ax_coll_group_abort's reason */
  int notified;        /* the other members were told this group failed */
  /* Sends not yet answered (touched by the communication thread only). */
  ax_future **sends;
  int *send_to;
  int nsends, capsends;
};

/* collective.c */
/* The mailbox of node n (ax_coll_init), or NULL. */
axi_coll_box *axi_coll_box_find(ax_node *n);
/* Drops the messages of group `tag` waiting in b (every one: NULL). */
void axi_coll_drop_msgs(axi_coll_box *b, const char *tag);
/* The tag of the messages to member `rank` of g: g's tag, or
 * "<tag>@<rank>" in a group whose names repeat. */
void axi_coll_tag_of(const ax_coll_group *g, int rank, char out[AXI_COLL_TAG]);
/* Records g's first failure: rc, and the member to blame (or NULL). */
void axi_coll_set_failed(ax_coll_group *g, int rc, const char *peer);
/* Reaps g's answered sends; returns the first failure (and records it). */
int axi_coll_check_sends(ax_coll_group *g);
/* Tells the other members, once, that g failed here, so that their waits
 * fail at once. */
void axi_coll_notify_abort(ax_coll_group *g);
/* Sends elements [off, off + n) of host tensor t (copied) to member `to`
 * as message (seq, step) of g. */
int axi_coll_send(ax_coll_group *g, int to, int64_t seq, int64_t step,
                  const float *src, size_t n);
/* Takes message (seq, step) of g into dst (n elements; AX_ESHAPE if the
 * sizes differ). add != 0: dst += message, else dst = message. Bounded by
 * the deadline (absolute ms, ax_clock_ms); fails with AX_EPEERDOWN as soon
 * as a member is down or a send failed. */
int axi_coll_recv(ax_coll_group *g, int64_t seq, int64_t step, float *dst,
                  size_t n, int add, int64_t deadline_ms);
/* collective_ring.c: runs one operation on host data. */
int axi_coll_run(ax_coll_op *op, float *data);
/* collective_group.c: queues op on its group's thread. */
int axi_coll_submit(ax_coll_op *op);

#endif
