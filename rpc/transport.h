/* The transport contract. Every way messages move between nodes is one
 * entry of one table (rpc/transport.c), found by name: the control
 * transport ("grpc": hellos, heartbeats, small messages before the data
 * address is known, replies that must stay on the stream a request came
 * on) and a data transport (calls, replies and tensors once the peer's
 * data address is known: "tcp", "tls", or "shm", TCP with shared-memory
 * rings to the nodes of the same host). A new transport is one more entry;
 * nothing else in rpc/ names a transport's files.
 *
 * A transport hands what it receives to the callback given at start, so no
 * transport knows the dispatcher. It may use the node's peer table
 * (axi_peer_get, axi_peer_down: rpc/peer.c), the codec, the authentication
 * helpers and the limits in the node's options.
 *
 * Only rpc/ includes this header. */
#ifndef AX_RPC_TRANSPORT_H
#define AX_RPC_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "axon/rpc/codec-impl.h"

typedef struct ax_node ax_node;
typedef struct axi_peer axi_peer;
/* A control connection to or from a peer (the gRPC transport's stream). */
typedef struct axi_stream axi_stream;

enum { AXI_TRANSPORT_CONTROL = 1, AXI_TRANSPORT_DATA = 2 };

/* Where a transport delivers what it received; given at start. */
typedef struct axi_rx {
  /* A decoded frame from p; s is the control connection it came on (NULL
   * for a data transport). Takes the contents of m. decode_rc is AX_OK, or
   * why the body could not be decoded (the id and kind are still valid, so
   * a request can be answered with the error). Runs on the transport's
   * receiving thread. */
  void (*frame)(ax_node *n, axi_peer *p, axi_stream *s, axi_msg *m,
                int decode_rc);
} axi_rx;

typedef struct axi_transport axi_transport;

typedef struct axi_transport_ops {
  const char *name; /* the table's key */
  int role;         /* AXI_TRANSPORT_CONTROL or AXI_TRANSPORT_DATA */
  /* Starts serving: listen is "HOST:PORT" (port 0: any); writes the bound
   * "HOST:PORT" to addr. Received frames go to rx. AX_EIO if the address
   * cannot be bound. */
  int (*start)(ax_node *n, const char *listen, const axi_rx *rx,
               axi_transport **out, char *addr, size_t len);
  /* Sends m (not taken; tensors stay referenced until written) to p.
   * Control: on `via` when it is alive (the connection a request came on),
   * else on the peer's incoming connection for a response, else on its
   * outgoing one. Data: on the connection to p's data address, opened on
   * first use. AX_EPEERDOWN (or AX_ECLOSED) when it cannot be sent. */
  int (*send)(axi_transport *t, axi_peer *p, const axi_msg *m, axi_stream *via);
  /* Drops every connection to or from p (p was declared down). */
  void (*drop_peer)(axi_transport *t, axi_peer *p);
  /* Stops serving: closes every connection and the listener, waiting up
   * to timeout_ms for the transport's own threads to settle. */
  void (*stop)(axi_transport *t, int64_t timeout_ms);
  /* Frees t after stop, once nothing holds its connections. */
  void (*free)(axi_transport *t);
  /* Test hook (rpc/rpc-debug.h), data transports: opens a connection to
   * addr with the handshake a send does, then closes it. */
  int (*probe)(axi_transport *t, const char *addr);
  /* Data transports, optional: 1 when a send to p from the calling thread
   * would first have to open a connection and wait for the peer's side of
   * the handshake on the transport's own I/O thread (a reply sent by an
   * inline handler): the message then takes the control transport, since
   * two nodes answering each other's first calls at once would each wait
   * for the other's stopped loop. */
  int (*would_block)(axi_transport *t, axi_peer *p);

  /* Control transports only (NULL for data transports): */
  /* Opens p's outgoing control connection p->out, hello first (p->mu
   * held). */
  int (*connect)(axi_transport *t, axi_peer *p);
  /* Whether s (may be NULL) can still carry a message. */
  int (*alive)(axi_stream *s);
  /* Takes (delta 1) or lets go of (delta -1) a reference to s; NULL-safe. */
  void (*ref)(axi_stream *s, int delta);
  /* Test hooks (rpc/rpc-debug.h): queues len raw bytes (taken; the first 4
   * are spare for the transport's length) on p->out. */
  int (*send_raw)(axi_transport *t, axi_peer *p, uint8_t *buf, size_t len);
} axi_transport_ops;

/* Every transport instance starts with this. */
struct axi_transport {
  const axi_transport_ops *ops;
  ax_node *node;
  axi_rx rx;
};

/* The entry named `name` with the given role, or NULL. */
const axi_transport_ops *axi_transport_find(const char *name, int role);
/* The names of the entries with `role`, comma-separated, for messages. */
const char *axi_transport_names(int role);

/* The table's entries. */
extern const axi_transport_ops axi_grpc_transport;
extern const axi_transport_ops axi_tcp_transport;
extern const axi_transport_ops axi_tls_transport;
extern const axi_transport_ops axi_shm_transport;

#endif
