/* gRPC core control plane: completion queue, server and streams. Only
 * grpc_server.c, grpc_stream.c and grpc_stream_open.c include this
 * header. */
#ifndef AX_RPC_GRPC_IMPL_H
#define AX_RPC_GRPC_IMPL_H

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "axon/rpc/node-impl.h"

#define AXI_STREAM_METHOD "/axon.Axon/Stream"

/* A completion-queue tag: every started batch carries one and yields
 * exactly one completion, delivered to cb by the poller thread. */
typedef struct axi_op {
  void (*cb)(struct axi_op *op, int ok);
} axi_op;

typedef struct axi_sbuf {
  uint8_t *p;
  size_t len;
  struct axi_sbuf *next;
} axi_sbuf;

struct axi_stream {
  ax_node *node;
  axi_peer *peer; /* server streams: set by the HELLO frame */
  int client;
  grpc_call *call;
  grpc_channel *chan; /* client streams own their channel */
  pthread_mutex_t mu;
  int refs; /* holders (peer->out/in, calls); guarded by g->mu */
  int ops;  /* batches in flight; guarded by g->mu */
  int dead; /* no more sends or receives */
  int established;
  /* Authentication (rpc/auth-impl.h, rpc/tls-impl.h). Server streams:
   * need_auth until the HELLO checked out (the proof against nonce with a
   * token, the name against cn with TLS); rejected once it did not.
   * Client streams with a token: hold until the server proved the secret:
   * 1, nothing leaves (until the CHALLENGE came); 2, only the HELLO at the
   * head of the queue may leave; then 1 again until the server's answering
   * HELLO carried a proof over mine (our nonce). */
  int need_auth, rejected, hold;
  uint8_t nonce[16], mine[16];
  /* Server streams with TLS: the common name of the client's certificate
   * (verified against the CA by gRPC); its HELLO must carry this name. */
  char cn[256];
  axi_sbuf *q_head, **q_tail;
  int sending;
  grpc_byte_buffer *send_bb, *recv_bb;
  grpc_metadata_array init_md, trail_md, req_md;
  grpc_status_code status;
  grpc_slice details;
  int cancelled;
  axi_op op_start, op_send, op_recv, op_end, op_status;
  axi_stream *next, *prev;
};

typedef struct axi_grpc {
  axi_transport base; /* the node's n->ctl */
  grpc_completion_queue *cq;
  grpc_server *server;
  pthread_t poller;
  int poller_started;
  /* accepting calls */
  axi_op accept_op;
  grpc_call *new_call;
  grpc_call_details details;
  grpc_metadata_array req_md;
  axi_op shutdown_op;
  int shutdown_done, stopping;
  /* every live stream, and the batches in flight */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  axi_stream *streams;
  long ops_total;
} axi_grpc;

/* The node's gRPC control transport. */
#define AXI_GRPC(n) ((axi_grpc *)(n)->ctl)

/* The gRPC receive limit (GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH) of n. */
static inline int axi_grpc_limit(const ax_node *n) {
  return n->o.max_grpc_msg_bytes > 0x7fffffff ? 0x7fffffff
                                              : (int)n->o.max_grpc_msg_bytes;
}

/* grpc_server.c: the transport's start, stop and free. */
int axi_grpc_start(ax_node *n, const char *listen, const axi_rx *rx,
                   axi_transport **out, char *addr, size_t len);
/* Cancels every stream, shuts the server down (waits for gRPC) and lets go
 * of the peers' streams. */
void axi_grpc_stop(axi_transport *t, int64_t timeout_ms);
/* Shuts the completion queue down and frees it, once no stream is held. */
void axi_grpc_free(axi_transport *t);

/* grpc_transport.c: takes p's streams (p->out, p->in) and lets go of them,
 * cancelling them first when `cancel` is set. */
void axi_grpc_let_go(axi_peer *p, int cancel);

/* grpc_stream_open.c: opens our client stream to p (p->mu held); sends
 * HELLO first. grpc_stream.c: the rest below. */
int axi_stream_open(ax_node *n, axi_peer *p, axi_stream **out);
/* Queues one encoded frame (buf taken; it starts with 4 spare bytes for
 * the batch length). AX_ECLOSED if the stream is dead. */
int axi_stream_send(axi_stream *s, uint8_t *buf, size_t len);
int axi_stream_alive(axi_stream *s);
void axi_stream_retain(axi_stream *s);
void axi_stream_release(axi_stream *s);
void axi_stream_cancel(axi_stream *s);

/* Starts a batch on s with tag op (counted in s->ops). */
grpc_call_error axi_stream_batch(axi_stream *s, const grpc_op *ops, size_t n,
                                 axi_op *op);
/* grpc_stream_open.c: wraps an accepted server call into a stream and
 * starts receiving (axi_stream_open, above, is there too). */
void axi_stream_accept(ax_node *n, grpc_call *call);
/* grpc_stream.c, for grpc_stream_open.c: the callbacks of a stream's ops
 * (start, send, receive, end, status) and the receive kept outstanding. */
void axi_stream_on_start(axi_op *op, int ok);
void axi_stream_on_send(axi_op *op, int ok);
void axi_stream_on_recv(axi_op *op, int ok);
void axi_stream_on_end(axi_op *op, int ok);
void axi_stream_on_status(axi_op *op, int ok);
void axi_stream_start_recv(axi_stream *s);
void axi_grpc_op_done(axi_grpc *g);
void axi_grpc_op_begin(axi_grpc *g);

#endif
