/* Nodes: one per process (agent or coordinator), with a unique name and
 * rank, a control-plane server (gRPC), a bulk channel for large tensors, a
 * function registry and a pool of worker threads that run handlers.
 *
 * Rendezvous: one node is the master (its own address is opts.master, or
 * opts.master is NULL). The others join it with their name and addresses;
 * the master publishes the membership once opts.world_size nodes joined.
 * Names then resolve to ranks and addresses on every node.
 *
 * Threads: every function here is thread-safe. A node must be created after
 * any fork() of the process (gRPC aborts otherwise). */
#ifndef AX_RPC_NODE_H
#define AX_RPC_NODE_H

#include <stddef.h>
#include <stdint.h>

#include "axon/kernels/device.h"
#include "axon/rpc/future.h"
#include "axon/rpc/value.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ax_node ax_node;

typedef struct ax_node_opts {
  const char *name;   /* required; unique in the world */
  const char *listen; /* control address "HOST:PORT" (port 0: any); default
                         "127.0.0.1:0" */
  const char *master; /* "HOST:PORT" of the master; NULL: this node is it */
  int world_size;     /* nodes expected by the master (>= 1); joiners may
                         pass 0 */
  int rank;           /* -1: assigned by the master in join order */
  int threads;        /* handler worker threads; default 4 */
  ax_device device;   /* device that received tensors land on; CPU */
  /* Where received tensors land by the device the SENDER had them on
   * (kernels/device.h: ax_device_map_parse("cuda:0=cpu,cpu=cuda:1")); a
   * sender device not listed lands on `device`. Empty by default. The
   * sender copies device tensors to the host, the receiver copies them to
   * the mapped device. ax_node_create checks that `device` and every
   * mapped destination exist here (AX_ENODEV otherwise). */
  ax_device_map device_map;
  int64_t timeout_ms;      /* default call deadline; 60000. Deadlines
                              saturate: INT64_MAX means no practical
                              limit. */
  int64_t heartbeat_ms;    /* ping interval; 500 */
  int64_t peer_timeout_ms; /* silence before a peer is down; 4000 */
  size_t bulk_threshold;   /* tensor bytes from which the bulk channel is
                              used; 1 MiB */
  /* Limits on what one peer may send (a frame over a limit closes that
   * peer's connection, with the reason logged on stderr; the node keeps
   * serving the others). See docs/SECURITY.md. */
  size_t max_msg_bytes;      /* largest tensor payload (sum of a frame's
                                tensor bytes) accepted; 4 GiB */
  size_t max_hdr_bytes;      /* largest frame header (protobuf body: names,
                                strings, bytes values, descriptors); 16 MiB */
  size_t max_values;         /* most values in one message; 65536 */
  size_t max_inflight_bytes; /* tensor storage one peer may hold in frames
                                still being received; 4 GiB */
  size_t max_grpc_msg_bytes; /* gRPC receive limit on the control plane
                                (server and channels; at most INT_MAX);
                                64 MiB */
  /* Deepest chain of nested calls (a handler calling on, each hop adding
   * one); deeper calls fail with AX_EINVAL. Carried in each request. 32. */
  int max_call_depth;
  /* Shared-secret authentication: a file holding the secret (16 to 256
   * bytes). NULL: AXON_TOKEN_FILE if set, else none. With a secret, both
   * channels accept a peer only after it proved, by an HMAC-SHA256 over a
   * fresh nonce, that it holds the same secret (docs/SECURITY.md). */
  const char *token_file;
  /* Mutual TLS on both channels (docs/SECURITY.md): PEM files of the CA
   * that signs every member, of this node's certificate (its subject CN is
   * the node's name) and of its private key. All three or none (else
   * AX_EINVAL); each NULL field falls back to AXON_TLS_CA, AXON_TLS_CERT,
   * AXON_TLS_KEY. With TLS, a peer is accepted only with a certificate
   * signed by that CA whose CN is the name it says hello with; with a
   * token too, both are checked. The files are read once, in
   * ax_node_create. */
  const char *tls_ca, *tls_cert, *tls_key;
  /* Allows listening on a non-loopback address with neither a token nor
   * TLS; without it ax_node_create refuses such a node (AX_EINVAL). */
  int insecure;
  /* Which path small calls and replies take. 0 (default): the framed TCP
   * channel, once the peer's channel address is known (from its hello or
   * the membership); the gRPC stream then carries hellos, heartbeats and
   * messages sent before that. It costs about half of gRPC's per-message
   * overhead. 1: the gRPC stream, for everything under bulk_threshold. */
  int small_over_grpc;
  /* The data transport, by its name in the transport table
   * (rpc/transport.h): "tcp" for framed TCP, "tls" for the same with
   * mutual TLS 1.3, "shm" for framed TCP to other hosts and a
   * shared-memory ring to the nodes of this host (same boot and network
   * namespace) that run "shm" too; NULL: $AXON_DATA_TRANSPORT if set,
   * else "tls" with TLS credentials, else "shm". An
   * unknown name is AX_EINVAL, with the known names listed, and so is
   * "tls" without TLS credentials or another name with them. */
  const char *data_transport;
} ax_node_opts;

/* Fills defaults. */
void ax_node_opts_init(ax_node_opts *o);
/* Applies the environment: AXON_MASTER_ADDR/AXON_MASTER_PORT (master
 * "ADDR:PORT", port 29500 when AXON_MASTER_PORT is unset or empty; kept in
 * a static buffer, so not thread-safe) and, when o->rank < 0, the rank from
 * SLURM_PROCID, else OMPI_COMM_WORLD_RANK. Unset or empty variables change
 * nothing. AX_EINVAL, naming the variable and its value, for a port that
 * is not an integer in [1, 65535], a rank that is not one in [0, 65535] or
 * an address over 249 bytes; o is then left as it was. */
int ax_node_opts_from_env(ax_node_opts *o);

/* Creates a node and starts serving (before joining, so a master can
 * accept joins). AX_EINVAL on bad options (among them: unreadable token or
 * TLS files, a certificate whose CN is not o->name, a non-loopback listen
 * address with neither a token nor TLS and no o->insecure), AX_ENODEV when
 * o->device or a destination of o->device_map does not exist on this machine,
 * AX_EIO if the address cannot be bound. */
int ax_node_create(const ax_node_opts *o, ax_node **out);

/* Rendezvous with the master; blocks until the membership is complete or
 * timeout_ms passed (AX_ETIMEOUT). The master itself waits for the others.
 * Retries while the master is not yet reachable. Calls from peers that
 * arrive before this node knows the membership wait (their deadline still
 * runs) and are served once it does, so a handler can always resolve its
 * caller's rank. Register handlers before joining. */
int ax_node_join(ax_node *n, int64_t timeout_ms);

/* Graceful shutdown: stops accepting calls, waits up to timeout_ms for
 * running handlers, then fails every pending future with AX_ECLOSED and
 * tears the transports down. Never hangs on dead peers. Idempotent. */
int ax_node_shutdown(ax_node *n, int64_t timeout_ms);
/* Shuts down (1 s grace) if needed and frees the node. NULL-safe. */
void ax_node_destroy(ax_node *n);

/* ---- ending a world (after torch's rpc.shutdown(graceful=True)) --------
 * The master ends the world when its program is done; every other member
 * says when its own program is done (ax_node_wait_leave; a serving agent
 * says so as soon as it has joined), then waits to be told to leave.
 *
 * ax_node_shutdown_world runs two phases, each a call to every member that
 * is not down, in parallel:
 *  1. drain: a member answers once its program is done (it called
 *     ax_node_wait_leave) and it has no call in flight, incoming or
 *     outgoing. So no member leaves while another still works with it.
 *  2. leave: the member's ax_node_wait_leave returns AX_OK; an agent then
 *     stops as on SIGTERM and exits 0.
 * Members that did not drain in time are still told to leave (their
 * in-flight calls then fail as peers go). Nothing here shuts the nodes down:
 * every process still calls ax_node_shutdown itself, the master last. */
typedef struct ax_world_report {
  int members; /* members asked: the world minus the calling node */
  int left;    /* drained, then told to leave */
  int down;    /* down before or during the shutdown (not counted late) */
  int late;    /* did not drain before the deadline; told to leave anyway */
  int failed;  /* answered the request with another error */
} ax_world_report;

/* Ends the world from its master (the rendezvous master; AX_ESTATE on any
 * other node or before the join), within timeout_ms for the drain phase
 * (the leave phase gets what is left, at least 1 s). Returns AX_OK when
 * every member that was not down drained and left; otherwise AX_ETIMEOUT
 * (some were late) or the first other error, with a message naming each
 * late or failed member and why ("world shutdown: late: w2 (still busy: 1
 * incoming, 0 outgoing call(s))"). rep (may be NULL) gets the counts.
 * Blocks the calling thread; call it once. */
int ax_node_shutdown_world(ax_node *master, int64_t timeout_ms,
                           ax_world_report *rep);

/* On a member: says this node's program is done (from the first call on,
 * so a drain request can be answered once no call is in flight), then
 * waits up to timeout_ms (0: just looks) until the master told it to leave
 * (AX_OK), the master is down (AX_EPEERDOWN) or the node is shutting down
 * (AX_ECLOSED); AX_ETIMEOUT otherwise. Once told, every later call returns
 * AX_OK. AX_ESTATE on the master itself or before the join. */
int ax_node_wait_leave(ax_node *n, int64_t timeout_ms);

const char *ax_node_name(const ax_node *n);
int ax_node_rank(const ax_node *n);       /* -1 before join */
int ax_node_world_size(const ax_node *n); /* 0 before join */
/* The bound control address, e.g. "127.0.0.1:40123". */
const char *ax_node_address(const ax_node *n);
/* This process's incarnation: its start time in ns since the epoch. A
 * member that restarts under its name rejoins with a new one; the world
 * then refuses the old process's connections (docs/SECURITY.md,
 * "Restarted members"). */
uint64_t ax_node_incarnation(const ax_node *n);
/* Name of the member with this rank (borrowed; valid for the node's life);
 * AX_ENOTFOUND if unknown. */
int ax_node_member(const ax_node *n, int rank, const char **name);
/* Rank of a named member; AX_ENOTFOUND if unknown. */
int ax_node_rank_of(const ax_node *n, const char *name, int *rank);
/* Name of the master (borrowed), or NULL before join. */
const char *ax_node_master_name(const ax_node *n);
/* 1 if the named peer is known and has been declared down. */
int ax_node_peer_is_down(ax_node *n, const char *name);
/* The incarnation of the process the membership names for member `name`
 * (this node's own for its name); AX_ENOTFOUND before the membership
 * names it. */
int ax_node_member_incarnation(ax_node *n, const char *name, uint64_t *inc);
/* 1 if member `name` is not declared down and is still the process of
 * incarnation inc (0: whichever), else 0: what a caller that noted a
 * member's incarnation uses to tell whether it lost that process. */
int ax_node_member_alive_as(ax_node *n, const char *name, uint64_t inc);

/* Calls fn(n, user) once n is shut down, as ax_node_destroy frees it
 * (newest first): the layers above drop what they keep per node.
 * AX_ENOMEM, or AX_OK. */
int ax_node_on_destroy(ax_node *n, void (*fn)(ax_node *n, void *user),
                       void *user);

/* Called (from an I/O thread; must not block) when a peer is declared
 * down. One callback per node; NULL removes it. */
typedef void (*ax_peer_down_cb)(ax_node *n, const char *peer, void *user);
void ax_node_on_peer_down(ax_node *n, ax_peer_down_cb cb, void *user);

/* ---- statistics (for /metrics and the tests) ---------------------------- */
#define AX_LAT_BUCKETS 14
/* Upper bounds (seconds) of the latency histogram; the last is +Inf. */
extern const double ax_lat_bounds_s[AX_LAT_BUCKETS];

typedef struct ax_fn_stats {
  const char *fn; /* borrowed; valid for the node's life */
  uint64_t calls, errors;
  uint64_t lat_count[AX_LAT_BUCKETS]; /* non-cumulative */
  double lat_sum_s;
} ax_fn_stats;

typedef struct ax_node_stats {
  uint64_t bytes_in, bytes_out; /* control plane and bulk, payload bytes */
  uint64_t calls_in, calls_out, errors_in;
  uint64_t malformed;    /* undecodable frames received */
  uint64_t forged;       /* replies dropped: not from the callee */
  uint64_t limit_drops;  /* frames refused or connections closed
                            over a limit (ax_node_opts) */
  uint64_t auth_refused; /* connections closed without a valid
                            proof of the shared secret, or with
                            no valid certificate for the name
                            they said hello with */
  long live_calls;       /* process-wide, see ax_rpc_live_calls */
  long live_futures;     /* process-wide */
  int peers_up, peers_down;
} ax_node_stats;

void ax_node_stats_get(ax_node *n, ax_node_stats *out);
/* Stats of the i-th registered function; AX_ENOTFOUND past the end. */
int ax_node_fn_stats(ax_node *n, size_t i, ax_fn_stats *out);

#ifdef __cplusplus
}
#endif
#endif
