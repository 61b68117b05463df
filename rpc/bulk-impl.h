/* Internals of the TCP bulk channel (bulk_tcp.c: connections and the
 * libevent loop; bulk_frame.c: outgoing frames and the receive state
 * machine). */
#ifndef AX_RPC_BULK_IMPL_H
#define AX_RPC_BULK_IMPL_H

#include <event2/event.h>
#include <event2/listener.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "axon/rpc/node-impl.h"

#define AXI_BULK_HELLO_MAGIC 0x48425841u /* "AXBH" */
#define AXI_BULK_CHAL_MAGIC 0x43425841u  /* "AXBC": magic, 16-byte nonce */
#define AXI_BULK_ACK_MAGIC                                                     \
  0x50425841u /* "AXBP": magic, the acceptor's                                 \
                 32-byte proof */
/* "name\naddr\nbulk_addr\nincarnation" bytes (a name of up to 255, two
 * addresses of up to 127, a 64-bit number in decimal) */
#define AXI_BULK_HELLO_MAX 540
#define AXI_BULK_IOV 16
#define AXI_BULK_STEP (4u << 20)  /* largest single read */
#define AXI_BULK_RBUF (64u << 10) /* read-ahead buffer for small frames */
#define AXI_BULK_WIOV 64          /* iovecs per sendmsg, across frames */
/* Bytes of a tensor that must have arrived before its storage is
 * allocated (they wait in the connection's stage buffer). */
#define AXI_BULK_LAZY (1u << 20)

/* An outgoing frame: head bytes then the bytes of each tensor in vals. */
typedef struct bframe {
  uint8_t *head;
  size_t head_len;
  ax_values *vals; /* tensors moved to the CPU at queue time */
  size_t seg, off; /* progress: segment (0 = head) and offset in it */
  size_t nseg;
  struct iovec *segs;
  struct bframe *next;
} bframe;

typedef struct axi_shm_ring axi_shm_ring;

typedef struct bconn {
  struct axi_bulk *b;
  axi_peer *peer; /* incoming: set by the hello */
  int fd, outgoing, dead, writing, want_close;
  /* TLS (bulk_tls.c): the session (NULL once closed) and, on incoming
   * connections, whether the handshake is still running and the common
   * name of the peer's verified certificate, which its hello must carry.
   * The session is used by one thread at a time: the I/O thread reads,
   * the one writer (`writing`) writes, and an outgoing connection's
   * reads for EOF take mu. */
  int tls, handshaking;
  struct ssl_st *ssl;
  /* Records go out through a write buffer (many per system call): bytes
   * SSL_write took but whose records are still in that buffer are not yet
   * reported as written, so the queue keeps them until they are out. */
  int tls_buffered;
  size_t tls_unacked;
  char cn[256];
  /* Shared memory (bulk_shm.c): the connection is a Unix socket and its
   * frames cross `ring`; an incoming one has no ring until the dialler's
   * first byte brought it. */
  int shm;
  axi_shm_ring *ring;
  struct event *rev, *wev;
  pthread_mutex_t mu; /* guards the queue, writing and dead */
  bframe *q_head, **q_tail;
  /* receive state (I/O thread only) */
  int rstate;
  uint8_t small[4 + AXI_PREFIX_LEN + AXI_BULK_HELLO_MAX + 32 + 16 + 1];
  uint8_t nonce[16]; /* incoming, with authentication: our challenge */
  size_t have, need;
  axi_prefix px;
  uint8_t *hdr;
  axi_msg m;
  int mrc;
  size_t vi, toff;
  uint64_t left;
  uint64_t charged; /* bytes counted in peer->rx_inflight for this frame */
  /* Receive buffer: the first bytes of a tensor before its storage exists,
   * whole device tensors, skipped bytes. Freed when the connection closes. */
  uint8_t *stage;
  size_t stage_cap;
  /* Read-ahead: small reads (prefixes, headers, small tensors) are served
   * from one large read, so a small frame costs about one system call and
   * a burst of frames shares it. */
  uint8_t *rbuf;
  size_t rpos, rlen;
  int rdry; /* the last read came back short: the socket is drained */
  /* Replies queued while the I/O thread handles a burst of frames leave
   * together when the burst is done (see queue_frame). */
  int corked;
  struct bconn *cork_next;
  struct bconn *next;
} bconn;

typedef struct axi_bulk {
  axi_transport t; /* the node's n->data */
  ax_node *node;
  int tls; /* every connection runs TLS (axi_tls_transport) */
  /* "shm" (shm_listener set): peers whose data address carries this
   * host's identity are dialled on their Unix socket with a ring */
  char host_id[64];
  struct evconnlistener *shm_listener;
  struct event_base *base;
  struct event *stop_ev; /* activated by stop: ends the I/O loop */
  struct evconnlistener *listener;
  pthread_t thread;
  pthread_mutex_t mu, dial_mu;
  bconn *conns;
} axi_bulk;

/* bulk_frame.c */
bframe *axi_bulk_frame_new(uint8_t *head, size_t head_len, ax_values *vals);
/* The first frame on a connection: n's name, addresses and incarnation,
 * then, with authentication, mac (32 bytes: the proof over the receiver's
 * challenge) and the sender's own nonce (16 bytes) for the receiver's
 * answer; both NULL without. */
bframe *axi_bulk_hello(const ax_node *n, const uint8_t *mac,
                       const uint8_t *nonce);
void axi_bulk_frames_free(bframe *f); /* frees the whole list */
/* Fills iov with what is left of f; returns the count. */
int axi_bulk_frame_iov(bframe *f, struct iovec *iov, int max);
/* Consumes n written bytes; returns 1 when f is fully written. */
int axi_bulk_frame_advance(bframe *f, size_t n);
/* Reads what the socket has and dispatches complete frames. Returns an
 * error when the connection must be closed. */
int axi_bulk_recv(bconn *c);
void axi_bulk_recv_reset(bconn *c);

/* bulk_tls.c: the byte I/O of a connection, plain or TLS, and the TLS
 * handshakes. */
/* Reads up to n bytes: the count, 0 when nothing is there now (TLS: the
 * session needs more bytes from the socket), -1 when the connection is
 * finished. */
ssize_t axi_bulk_io_read(bconn *c, void *dst, size_t n);
/* Writes from iov (n entries): the bytes taken, 0 when the socket is full,
 * -1 on error. With TLS, after a 0 the next call must start with the same
 * bytes (the queue's head does not move while a frame is unwritten). */
ssize_t axi_bulk_io_writev(bconn *c, const struct iovec *iov, int n);
/* Reads exactly len bytes from a fresh connection (plain, or through ssl)
 * before deadline_ms: AX_OK, or AX_EPEERDOWN. */
int axi_bulk_read_wait(int fd, struct ssl_st *ssl, void *buf, size_t len,
                       int64_t deadline_ms);
/* Writes all of len bytes the same way: AX_OK, or AX_EPEERDOWN. */
int axi_bulk_write_wait(int fd, struct ssl_st *ssl, const void *buf, size_t len,
                        int64_t deadline_ms);
/* bulk_io.c: the I/O thread's handlers of connection c (the event's arg):
 * its write event sends queued frames, its read event takes frames in.
 * axi_bulk_conn_close closes c (I/O thread only; why: the error its
 * pending sends get, NULL for a clean close). */
void axi_bulk_on_write(evutil_socket_t fd, short what, void *arg);
void axi_bulk_on_read(evutil_socket_t fd, short what, void *arg);
void axi_bulk_conn_close(bconn *c, const char *why);
/* bulk_dial.c: a connection's start. TCP_NODELAY and non-blocking. */
void axi_bulk_sock_opts(int fd);
/* HOST:PORT of addr into host (hl bytes) and *port; AX_EINVAL when it has
 * no port. */
int axi_bulk_parse_hostport(const char *addr, char *host, size_t hl, int *port);
/* Connects to the node whose data address is addr: on this host's shared
 * memory when both run "shm" here (*ring set; a Unix socket that cannot be
 * reached falls back to TCP), else over TCP with a bounded wait (5 s). */
int axi_bulk_dial_peer(axi_bulk *b, const char *addr, int *fd,
                       axi_shm_ring **ring);
/* Mutual authentication on a fresh connection (plain, or inside the TLS
 * session ssl; 5 s at most): AX_OK once the acceptor proved it holds the
 * secret; AX_EPEERDOWN otherwise (the reason named). */
int axi_bulk_authenticate(ax_node *n, int fd, struct ssl_st *ssl,
                          axi_shm_ring *ring, const char *addr);
/* Dialling side: the TLS handshake on the connected socket fd (5 s at
 * most), then the acceptor's certificate CN must be `want` (NULL: any
 * member). The session, or NULL with the error set (the reason named). */
struct ssl_st *axi_bulk_tls_connect(ax_node *n, int fd, const char *want,
                                    const char *addr);
/* Accepting side: a session for fd, in server mode. NULL on no memory. */
struct ssl_st *axi_bulk_tls_new(ax_node *n, int fd);
/* Runs an incoming connection's handshake on: 1 when done (c->cn set; with
 * a token the challenge has been sent), 0 while it waits for the peer, -1
 * when the peer is refused (logged and counted in auth_refused). */
int axi_bulk_tls_accept(bconn *c);
/* Frees the session (c->mu held or the connection unreachable). */
void axi_bulk_tls_close(bconn *c);

/* bulk_shm.c: the shared-memory path. A data address "HOST:PORT" of a
 * node that runs "shm" carries AXI_SHM_SUFFIX and its host's identity; the
 * node also listens on the abstract Unix socket named after HOST:PORT. */
#define AXI_SHM_SUFFIX "+shm."
#define AXI_SHM_RING (4u << 20) /* bytes of a connection's ring */
#define AXI_SHM_MIN (64u << 10) /* rings an acceptor takes */
#define AXI_SHM_MAX (64u << 20) /* a stranger maps no more */
struct sockaddr_un;
/* This host's identity: boot id and network namespace. */
int axi_shm_host_id(char *out, size_t len);
/* Whether bulk_addr carries host_id. */
int axi_shm_same_host(const char *bulk_addr, const char *host_id);
int axi_shm_listen_addr(const char *hostport, struct sockaddr_un *sa,
                        socklen_t *len);
/* Connects to the Unix socket of the node at hostport (non-blocking fd). */
int axi_shm_dial(const char *hostport, int *out);
/* Dialler: makes a sealed ring of size bytes and sends it over fd. */
int axi_shm_offer(int fd, size_t size, axi_shm_ring **out);
/* Acceptor: takes the offered ring into c->ring: 1 done, 0 not yet, -1
 * close. */
int axi_shm_take(bconn *c);
/* Puts len bytes in a fresh ring (the hello): AX_OK or AX_EPEERDOWN. */
int axi_shm_put(axi_shm_ring *r, int fd, const void *buf, size_t len);
/* Reads the doorbells off c's socket: -1 once the peer closed it. */
int axi_shm_drain(bconn *c);
/* The byte I/O of a ring (axi_bulk_io_read / axi_bulk_io_writev). */
ssize_t axi_shm_read(bconn *c, void *dst, size_t n);
ssize_t axi_shm_writev(bconn *c, const struct iovec *iov, int n);
void axi_shm_ring_free(axi_shm_ring *r);

/* bulk_write.c */
/* Points iov (AXI_BULK_WIOV entries) at what is left of c's queued
 * frames; returns the count (c->mu held). */
int axi_bulk_gather_locked(bconn *c, struct iovec *iov);
/* Consumes w written bytes from the head of c's queue and returns the
 * frames now fully written, for the caller to free (c->mu held). */
bframe *axi_bulk_advance_locked(bconn *c, size_t w);
/* Queues f (taken) on c. When c is idle the calling thread writes at once
 * (saving a wake-up of the I/O thread) and hands whatever the socket does
 * not take to the I/O thread; between cork_begin and cork_flush on this
 * thread the write waits for the flush. A dead connection frees f. */
void axi_bulk_queue(bconn *c, bframe *f);
void axi_bulk_cork_begin(void);
/* After a write took 0 bytes: waits for the socket to take more (TCP), or
 * for the reader's doorbell (shared memory: the ring is full). */
void axi_bulk_wait_writable(bconn *c);
void axi_bulk_cork_flush(void);

#endif
