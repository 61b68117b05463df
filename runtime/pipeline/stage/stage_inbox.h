/* Stage to stage transfer of the pipeline stage host (stage_host.c): a
 * stage PUSHES the activations of a forward to the next stage as soon as
 * they exist, without waiting for an answer; the neighbour's operation
 * takes them from its inbox, waiting if they are still on the wire. The
 * producer's thread writes the bytes, and the consumer's transport thread
 * stores them (an inline handler), so neither side waits for the other's
 * busy core: a pull would need the producer to serve a request while it
 * computes its next operation. Internal to runtime/pipeline/.
 *
 * Addressing: every host registers its inbox under the global id of its
 * own RRef (ax_rref_id, passed by the coordinator at setup); a producer
 * sends "axon.pipe.give" [id, batch, micro, desc, tensors or i64 0 ...]
 * (axi_pipe_give_msg, stage_msg-impl.h) to
 * the owner of its neighbour's RRef, under the unit's distributed autograd
 * context: desc is the sender's ax_dist_send_edges descriptor, which the
 * consumer turns into receive edges (ax_dist_recv_edges) when it uses the
 * tensors. Only activations travel this way; gradients go back along
 * those edges ("axon.autograd.grad", runtime/autograd/autograd.h).
 *
 * Errors: a push that fails (peer down, no such inbox) is remembered by the
 * producer's inbox and returned by its next operation (axi_pipe_inbox_error);
 * a consumer waits at most until its call's deadline, and gives up early
 * when the producer's node is down or the inbox is closed (teardown).
 *
 * Threads: every function may be called from any thread. */
#ifndef AX_PIPELINE_STAGE_INBOX_H
#define AX_PIPELINE_STAGE_INBOX_H

#include <pthread.h>
#include <stdint.h>

#include "axon/models/module.h"
#include "axon/rref/rref.h"
#include "axon/runtime/pipeline/trace/trace.h"

#define AXP_ACTIVATIONS 0
#define AXP_GRADIENTS 1

typedef struct axi_pipe_ientry axi_pipe_ientry;

/* What came with a pushed list: its context, the producing node and the
 * autograd descriptor (malloc'd; axi_pipe_received_clear frees it). */
typedef struct axi_pipe_received {
  uint64_t ctx;
  char from[64];
  void *desc;
  size_t len;
  int64_t wait_us; /* how long the take waited for them */
} axi_pipe_received;
void axi_pipe_received_clear(axi_pipe_received *r);

typedef struct axi_pipe_inbox {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  axi_pipe_ientry *head;
  int stage;     /* for messages and trace events */
  ax_device dev; /* where received tensors are moved */
  uint64_t id;   /* registered under this id; 0 = not registered */
  int closed;    /* teardown: waiters give up */
  int err;       /* first failed push of this host (AX_OK: none) */
  char msg[256];
  ax_trace *tr; /* events (may be NULL) */
} axi_pipe_inbox;

void axi_pipe_inbox_init(axi_pipe_inbox *ib, int stage, ax_device dev,
                         ax_trace *tr);
/* Unregisters, wakes waiters (AX_ECLOSED), drops every entry. The inbox
 * may be registered again afterwards (axi_pipe_inbox_open). */
void axi_pipe_inbox_close(axi_pipe_inbox *ib);
/* Close, then destroy the lock and condition. */
void axi_pipe_inbox_destroy(axi_pipe_inbox *ib);
/* Registers ib under id (reopening it); AX_ESTATE if id is taken. */
int axi_pipe_inbox_open(axi_pipe_inbox *ib, uint64_t id);

/* Registers the inline "axon.pipe.give" handler on n (once per node). */
int axi_pipe_inbox_register_rpc(ax_node *n);

/* Sends t (borrowed) to the inbox of the host `to` refers to under ctx
 * (0: none; else its send edges are recorded and the context then forgets
 * t, ax_dist_forget, before it is sent), without waiting for the
 * answer; a failure is recorded in `self` (the producer's inbox). Records a
 * send event. AX_OK once queued. */
int axi_pipe_push(ax_node *n, axi_pipe_inbox *self, ax_rref *to, uint64_t ctx,
                  long batch, int micro, const ax_tlist *t);
/* The completion callback of a send whose failure the producer keeps:
 * user = (uintptr_t) the producer inbox's id. */
void axi_pipe_on_pushed(ax_future *f, void *user);

/* Takes (kind, batch, micro) from ib into *t (new references on ib->dev)
 * and *meta (the caller clears it), waiting until timeout_ms passes, the
 * inbox is closed, or `from` (the producer's node, may be NULL) is down.
 * Records a recv event covering the wait. */
int axi_pipe_inbox_take(axi_pipe_inbox *ib, ax_node *n, const char *from,
                        long batch, int micro, int64_t timeout_ms, ax_tlist *t,
                        axi_pipe_received *meta);

/* The first failed push of this host, as an error (AX_OK if none). */
int axi_pipe_inbox_error(axi_pipe_inbox *ib);

#endif
