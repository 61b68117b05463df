/* Internal structure of nodes, peers, calls and transports. Nothing outside
 * rpc/ includes this file. Locking order: node->mu, then peer->mu, then
 * the pending-call table's lock, then a transport's own locks. */
#ifndef AX_RPC_NODE_IMPL_H
#define AX_RPC_NODE_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "axon/rpc/builtin-impl.h"
#include "axon/rpc/codec-impl.h"
#include "axon/rpc/rpc.h"
#include "axon/rpc/transport.h"

typedef struct axi_peer axi_peer;
typedef struct axi_early axi_early;   /* a message waiting for an address */
typedef struct axi_pcalls axi_pcalls; /* the pending-call table (pcall.c) */
typedef struct axi_tick axi_tick;     /* a tick hook (timer.c) */

/* ---- peers ----------------------------------------------------------- */
enum { AXI_PEER_IDLE = 0, AXI_PEER_CONNECTING, AXI_PEER_UP, AXI_PEER_DOWN };

struct axi_peer {
  ax_node *node;
  char *name, *addr, *bulk_addr;
  char *alias; /* a second name (the master's real name), set once */
  int rank;
  /* The incarnation the membership names for this peer (mu); 0: not yet
   * known. A hello from another one is refused while the peer is not down. */
  uint64_t incarnation;
  int state; /* guarded by mu */
  /* Why the peer was last declared down (mu): a send that finds no
   * stream says so, e.g. a stream that never came up and the TLS or
   * token hint its end gave. */
  char down_why[256];
  axi_stream *out;    /* our control connection to the peer (one ref) */
  axi_stream *in;     /* the peer's control connection to us (one ref) */
  void *bulk_conn;    /* owned by the data transport */
  int64_t connect_ms; /* when out was opened */
  int64_t last_recv_ms, last_ping_ms;
  /* Tensor bytes allocated for frames from this peer still being received
   * (atomic; bounded by ax_node_opts.max_inflight_bytes). */
  uint64_t rx_inflight;
  /* Messages waiting for the peer's address from the membership
   * (peer_early.c), in order; guarded by mu. */
  axi_early *early;
  int early_count, early_flushing;
  size_t early_bytes;
  pthread_mutex_t mu;
  axi_peer *next;
};

/* The name to show for a peer: its real name once known. */
#define AXI_PNAME(p) ((p)->alias ? (p)->alias : (p)->name)

/* ---- calls ------------------------------------------------------------- */
typedef struct axi_pcall { /* an outgoing call waiting for its response */
  uint64_t id;
  axi_peer *peer; /* the callee; NULL for a call to ourselves */
  ax_future *f;
  int64_t deadline_ms;
  char *fn;
  struct axi_pcall *next;
} axi_pcall;

typedef struct axi_fn {
  char *name;
  ax_rpc_handler h;
  void *user;
  int inline_;            /* run on the receiving transport thread */
  uint64_t calls, errors; /* atomics */
  uint64_t lat_count[AX_LAT_BUCKETS];
  uint64_t lat_sum_us;
  struct axi_fn *next;
} axi_fn;

struct ax_call_ctx { /* an incoming call */
  ax_node *node;
  axi_peer *peer;     /* NULL for a call to ourselves */
  axi_stream *stream; /* the stream it arrived on (one ref) or NULL */
  uint64_t local_id;  /* local calls: the pending call completed instead of
                         a reply (it may have expired already) */
  axi_msg msg;        /* decoded request (owns args) */
  axi_fn *fn;
  int64_t t0_us, deadline_ms;
  ax_future *deferred;
  char *lmeta[AXI_MAX_META]; /* local calls: copied metadata keys */
  char *behalf;              /* local calls: ax_call_opts.on_behalf_of */
  struct ax_call_ctx *next;  /* worker queue */
};

#define AXI_TOKEN_MAX 256

struct ax_node {
  ax_node_opts o;
  char *name, *listen, *master;
  char addr[128], bulk_addr[128];
  /* This process's incarnation: its start time in ns since the epoch, sent
   * in every hello and join. The membership records each member's; a hello
   * from another incarnation of a live member is refused (auth.c). */
  uint64_t incarnation;
  int rank, world_size;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  axi_peer *peers;
  axi_fn *fns;
  int closing, closed, leaked;
  long incalls; /* incoming calls not yet answered (atomic) */
  axi_peer *master_peer;
  char *master_name; /* from the membership */
  /* members, indexed by rank, after join; a name replaced by a later
   * membership is retired (kept until destroy: ax_node_member lends it) */
  char **member_name;
  int nmembers;
  char **retired_names;
  int nretired;
  /* Until the membership is known (joined), calls from peers to anything
   * but the rendezvous built-ins wait in held: handlers may need ranks. */
  int joined;
  struct ax_call_ctx *held_head, **held_tail;
  /* master rendezvous state */
  struct axi_join *joins;
  axi_pcalls *pcalls; /* outgoing calls (pcall.c) */
  /* workers: started on demand, up to o.threads (call.c), guarded by mu
   * with the queue: q_len calls queued, idle_workers waiting for one */
  pthread_t *workers;
  int nworkers, idle_workers, q_len;
  ax_call_ctx *q_head, **q_tail;
  int q_stop;
  pthread_cond_t q_cv;
  /* transports (rpc/transport.h) */
  axi_transport *ctl;       /* the control transport */
  axi_transport *data;      /* read under data_lk; NULL once stopping or when
                               the data transport could not start */
  pthread_rwlock_t data_lk; /* users of data hold it shared */
  pthread_t timer_thread;
  int timer_stop;
  axi_tick *ticks; /* run by the timer thread, in registration order */
  ax_peer_down_cb down_cb;
  void *down_user;
  struct axi_on_destroy *on_destroy; /* ax_node_on_destroy, newest first */
  /* ending the world (leave.c), under mu */
  int leave_ready;        /* this node's program is done */
  int leave_told;         /* the master told it to leave */
  ax_future *leave_drain; /* the deferred answer to a drain request */
  int64_t leave_deadline_ms;
  /* stats (atomics) */
  uint64_t bytes_in, bytes_out, calls_in, calls_out, errors_in, malformed;
  uint64_t forged, limit_drops;
  /* the shared secret (rpc/auth.c); token_len 0: no authentication */
  uint8_t token[AXI_TOKEN_MAX];
  size_t token_len;
  uint64_t auth_refused; /* connections refused for a bad proof or
                            certificate (atomic) */
  /* mutual TLS (rpc/tls.c); tls 0: none. The PEM texts go to gRPC, the
   * context to the data channel. */
  int tls;
  char *tls_ca_pem, *tls_cert_pem, *tls_key_pem;
  struct ssl_ctx_st *tls_ctx;
};

/* a + b for deadlines, saturating at INT64_MAX (b >= 0 assumed). */
static inline int64_t axi_add_sat(int64_t a, int64_t b) {
  return b > 0 && a > INT64_MAX - b ? INT64_MAX : a + b;
}

/* counters.c: adds d to the process's live calls (ax_rpc_live_calls). */
void axi_live_calls_add(long d);
/* The end of ax_node_destroy: frees what n owns (rendezvous state, peers,
 * registered functions, member names, TLS credentials, locks, the
 * pending-call table) and n itself. Only when no thread, transport or
 * worker uses n any more; the control transport, if any, is already
 * freed. The harnesses of tests/fuzz end their bare nodes with it. */
void axi_node_free(ax_node *n);

/* timer.c: the node's timer thread runs every tick hook each AXI_TICK_MS,
 * in registration order, without n->mu, with the time of the tick
 * (ax_clock_ms). The node's parts register theirs as the node is created
 * (node.c); a hook registered later runs from the next tick on. */
#define AXI_TICK_MS 20
typedef void (*axi_tick_fn)(ax_node *n, int64_t now_ms, void *arg);
int axi_node_on_tick(ax_node *n, axi_tick_fn fn, void *arg);
void axi_node_ticks_free(ax_node *n); /* after the timer stopped */
void *axi_timer_main(void *arg);

/* peer.c */
axi_peer *axi_peer_find(ax_node *n, const char *name);
/* Finds or creates the peer `name` (addresses may be NULL/empty; known
 * addresses are updated). NULL on no memory. */
axi_peer *axi_peer_get(ax_node *n, const char *name, const char *addr,
                       const char *bulk_addr);
/* Declares p down if `s` is still its current stream (NULL: whatever the
 * stream), failing its pending calls with AX_EPEERDOWN. */
void axi_peer_down(axi_peer *p, axi_stream *s, const char *why);
/* Routes a message to p, opening its control connection if needed: over
 * the data transport once p's data address is known (only from
 * bulk_threshold tensor bytes with small_over_grpc), else over the control
 * transport (on `via`, a reply route or our own connection). */
int axi_peer_route(axi_peer *p, const axi_msg *m, axi_stream *via);
/* Whether m can reach p without dialling: on `via`, or, for a response,
 * on p's own control connection to us (p->mu held). */
int axi_peer_way_back_locked(const axi_peer *p, const axi_msg *m,
                             axi_stream *via);
/* Tick hook: declares down the peers whose heartbeats stopped or whose
 * connection did not come up in time, and pings the others every
 * ax_node_opts.heartbeat_ms. */
void axi_peer_heartbeat(ax_node *n, int64_t now_ms, void *arg);

/* peer_early.c */
/* Sends a message to p: queued while p's address is not known and no
 * connection leads back to it before this node applied the membership, or
 * while earlier messages to p still wait; else routed at once
 * (axi_peer_route). */
int axi_peer_send(axi_peer *p, const axi_msg *m, axi_stream *via);
/* Messages waiting for a peer's address (p->mu held for the _locked ones):
 * whether m must wait; queues a copy of m (AX_ETOOBIG past the bounds);
 * sends what waits once p's address is known; frees the queue (node
 * destroy). */
int axi_peer_early_wanted_locked(const axi_peer *p, const axi_msg *m,
                                 axi_stream *via);
int axi_peer_early_queue_locked(axi_peer *p, const axi_msg *m);
void axi_peer_early_flush(axi_peer *p);
void axi_peer_early_free(axi_peer *p);
/* Tick hook: drops (logged) what waited longer than
 * ax_node_opts.timeout_ms for its peer's address. */
void axi_peer_early_expire(ax_node *n, int64_t now_ms, void *arg);
/* Resets a down peer so the next send reconnects (join retries only). */
void axi_peer_reset(axi_peer *p);

/* call.c, the dispatcher: the node's axi_rx.frame (rpc/transport.h). */
void axi_on_frame(ax_node *n, axi_peer *p, axi_stream *s, axi_msg *m,
                  int decode_rc);
int axi_calls_start(ax_node *n);
void axi_calls_stop(ax_node *n);
/* Queues c for the workers, starting one more when every worker is busy
 * and fewer than ax_node_opts.threads run. */
void axi_calls_enqueue(ax_node *n, ax_call_ctx *c);
/* Marks n joined and hands the calls held until then to the workers. */
void axi_calls_joined(ax_node *n);
/* Runs a call on the calling thread (an inline handler's call, from a
 * remote peer or from this node itself) and answers it. */
void axi_call_run(ax_call_ctx *c);
/* rpc/pcall.c, the pending-call table: */
int axi_pcalls_init(ax_node *n);
void axi_pcalls_free(ax_node *n);
/* Outgoing calls still pending. */
long axi_pcall_count(ax_node *n);
/* Fails calls on peer p (NULL: all) with err. */
void axi_calls_fail(ax_node *n, axi_peer *p, int err, const char *why);
/* Tick hook: fails the calls whose deadline passed with AX_ETIMEOUT. */
void axi_calls_expire(ax_node *n, int64_t now_ms, void *arg);
/* The incoming call whose handler runs on this thread, or NULL. Nested calls
 * made from it inherit its remaining time and depth. */
ax_call_ctx *axi_call_current(void);
/* Registers an outgoing call to p (NULL: this node) with deadline
 * deadline_ms; returns it with its id set and a reference to f, or NULL on
 * no memory. */
axi_pcall *axi_pcall_add(ax_node *n, axi_peer *p, const char *fn, ax_future *f,
                         int64_t deadline_ms);
/* Completes the pending call id (vals taken) if it went to p (NULL: this
 * node); a call that went elsewhere is left alone and the reply counted as
 * forged. Returns 1 if a call was completed. */
int axi_pcall_complete(ax_node *n, axi_peer *p, uint64_t id, int err,
                       ax_values *vals, const char *msg);
/* Unlinks c (whose id is id) and frees it, unless something (peer down)
 * completed it already; for a call whose request could not be sent. */
void axi_pcall_drop(ax_node *n, axi_pcall *c, uint64_t id);
/* Logs a limit a peer broke (rate-limited) and counts it; closing: its
 * connection is being closed (else the frame was refused and answered). */
void axi_limit_log(ax_node *n, const char *peer, const char *what, int closing);
/* leave.c: the "axon.node.leave" built-in of ax_node_shutdown_world. */
int axi_leave_init(ax_node *n);
/* Tick hook: answers a pending drain request once drained or at its
 * deadline. */
void axi_leave_tick(ax_node *n, int64_t now_ms, void *arg);
/* Fails a pending drain request (shutdown, after the timer stopped). */
void axi_leave_close(ax_node *n);

/* rendezvous.c (the master's side) and rendezvous_member.c */
/* Membership list: [world, master name, (name, addr, bulk, incarnation)
 * per rank]. */
#define AXI_MEMBER_FIELDS 4
/* Whether n is the rendezvous master (its master address is its own). */
int axi_is_master(ax_node *n);
int axi_rendezvous_init(ax_node *n);
void axi_rendezvous_fini(ax_node *n);
/* Records a membership list (the master's answer to "axon.rendezvous.join":
 * world, master name, then name, address and bulk address per rank) on n; a
 * list of the wrong shape is ignored. */
void axi_rendezvous_apply(ax_node *n, const ax_values *v);
/* Fails the joins still waiting for the world (at the start of shutdown,
 * while the transport can still answer them). */
void axi_rendezvous_close(ax_node *n);

#endif
