/* The TCP bulk channel: one framed TCP connection per ordered node pair
 * (a Unix socket and a shared-memory ring to a node of this host under
 * "shm", bulk_shm.c), driven by a libevent loop on its own thread. libevent
 * only reports readiness; bytes move with our own readv/writev straight between
 * the socket and tensor storage in large steps (bufferevents would copy through
 * 4 KiB reads). Connections are closed only on the I/O thread and freed
 * only when the channel stops, so a pointer held by a sender stays valid.
 * A connection's I/O handlers are in bulk_io.c, dialling and the mutual
 * authentication in bulk_dial.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/auth-impl.h"
#include "axon/rpc/bulk-impl.h"

static pthread_once_t g_evthread_once = PTHREAD_ONCE_INIT;
static void evthread_init(void) { evthread_use_pthreads(); }

static bconn *conn_new(axi_bulk *b, int fd, axi_peer *p, int outgoing,
                       struct ssl_st *ssl, int shm, axi_shm_ring *ring);

/* ---- connections ------------------------------------------------------ */
static bconn *conn_new(axi_bulk *b, int fd, axi_peer *p, int outgoing,
                       struct ssl_st *ssl, int shm, axi_shm_ring *ring) {
  bconn *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->shm = shm;
  c->ring = ring;
  c->b = b;
  c->fd = fd;
  c->tls = b->tls;
  c->ssl = ssl;
  c->handshaking = b->tls && !outgoing;
  c->peer = p;
  c->outgoing = outgoing;
  c->q_tail = &c->q_head;
  pthread_mutex_init(&c->mu, NULL);
  c->rev = event_new(b->base, fd, EV_READ | EV_PERSIST, axi_bulk_on_read, c);
  c->wev = event_new(b->base, fd, EV_WRITE, axi_bulk_on_write, c);
  if (!c->rev || !c->wev) {
    if (c->rev)
      event_free(c->rev);
    if (c->wev)
      event_free(c->wev);
    free(c);
    return NULL;
  }
  pthread_mutex_lock(&b->mu);
  c->next = b->conns;
  b->conns = c;
  pthread_mutex_unlock(&b->mu);
  event_add(c->rev, NULL);
  return c;
}

static void conn_free(bconn *c) {
  event_free(c->rev);
  event_free(c->wev);
  pthread_mutex_destroy(&c->mu);
  free(c->stage);
  free(c->rbuf);
  free(c);
}

/* Frees the closed incoming connections (I/O thread): nothing but the list
 * refers to them (senders hold outgoing ones only). */
static void sweep_dead(axi_bulk *b) {
  bconn *dead = NULL;
  pthread_mutex_lock(&b->mu);
  for (bconn **pp = &b->conns; *pp;) {
    bconn *c = *pp;
    if (c->dead && !c->outgoing) {
      *pp = c->next;
      c->next = dead;
      dead = c;
    } else {
      pp = &c->next;
    }
  }
  pthread_mutex_unlock(&b->mu);
  for (bconn *nx; dead; dead = nx) {
    nx = dead->next;
    conn_free(dead);
  }
}

static void accept_conn(axi_bulk *b, int fd, int shm) {
  sweep_dead(b);
  if (b->tls) { /* the challenge, if any, follows the handshake */
    struct ssl_st *ssl = axi_bulk_tls_new(b->node, fd);
    bconn *c = ssl ? conn_new(b, fd, NULL, 0, ssl, 0, NULL) : NULL;
    if (!c) {
      axi_bulk_tls_close(&(bconn){.ssl = ssl});
      close(fd);
    }
    return;
  }
  uint8_t chal[4 + AXI_NONCE_LEN];
  uint32_t magic = AXI_BULK_CHAL_MAGIC;
  memcpy(chal, &magic, 4);
  /* With authentication the challenge goes first (a fresh socket takes
   * these few bytes at once). */
  if (b->node->token_len &&
      (axi_auth_nonce(chal + 4) != AX_OK ||
       write(fd, chal, sizeof chal) != (ssize_t)sizeof chal)) {
    close(fd);
    return;
  }
  bconn *c = conn_new(b, fd, NULL, 0, NULL, shm, NULL);
  if (!c)
    close(fd);
  else if (b->node->token_len)
    memcpy(c->nonce, chal + 4, AXI_NONCE_LEN);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd,
                      struct sockaddr *sa, int len, void *arg) {
  axi_bulk_sock_opts(fd);
  accept_conn(arg, fd, 0);
}

/* A node of this host on the Unix socket: its ring comes with its first
 * byte (on_read_shm). */
static void on_accept_shm(struct evconnlistener *l, evutil_socket_t fd,
                          struct sockaddr *sa, int len, void *arg) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  accept_conn(arg, fd, 1);
}

/* The frame of m: its head (magic, prefix, body) and its tensors, sent
 * from their storage; NULL on no memory. */
static bframe *frame_of(ax_node *n, const axi_msg *m) {
  uint8_t *buf;
  size_t len, blob;
  if (axi_frame_encode(m, 4, 0, &buf, &len, &blob) != AX_OK)
    return NULL;
  ax_values *vals = ax_values_clone(m->values);
  bframe *f = vals ? axi_bulk_frame_new(buf, len, vals) : NULL;
  if (!f) {
    free(buf);
    ax_values_free(vals);
    return NULL;
  }
  uint32_t magic = AXI_BULK_MAGIC;
  memcpy(buf, &magic, 4);
  __atomic_add_fetch(&n->bytes_out, len + blob, __ATOMIC_RELAXED);
  return f;
}

/* p's outgoing connection when it is up, read without dial_mu: the
 * pointer is written under dial_mu, and an outgoing connection is freed
 * only when the transport stops. */
static bconn *live_conn(axi_peer *p) {
  bconn *c = __atomic_load_n(&p->bulk_conn, __ATOMIC_ACQUIRE);
  if (!c)
    return NULL;
  pthread_mutex_lock(&c->mu);
  int dead = c->dead;
  pthread_mutex_unlock(&c->mu);
  return dead ? NULL : c;
}

static int tcp_send(axi_transport *t, axi_peer *p, const axi_msg *m,
                    axi_stream *via) {
  (void)via;
  axi_bulk *b = (axi_bulk *)t;
  /* The frame is encoded only once a connection is up: encoding an RRef
   * forks it, and a fork encoded for a frame that never leaves would stay
   * without a holder until the sweep. A send over a live connection never
   * waits for dial_mu: a dial holds it for up to the hello's 5 s, and an
   * I/O thread answering an inline call behind it could not send the
   * challenge that dial (or another member's) waits for. */
  bconn *c = live_conn(p);
  int locked = !c;
  if (locked)
    pthread_mutex_lock(&b->dial_mu); /* one dial per peer at a time */
  if (locked && (!(c = p->bulk_conn) || c->dead)) {
    const char *addr = p->bulk_addr;
    axi_shm_ring *ring = NULL;
    int fd = -1, rc = axi_bulk_dial_peer(b, addr, &fd, &ring);
    bframe *h = NULL;
    struct ssl_st *ssl = NULL;
    /* With TLS, the acceptor must hold a certificate for the member we
     * dial (any member's while only the master's address is known). */
    const char *want = p->alias ? p->alias : p->name[0] != '@' ? p->name : NULL;
    if (rc == AX_OK && b->tls &&
        !(ssl = axi_bulk_tls_connect(b->node, fd, want, addr))) {
      close(fd);
      rc = AX_EPEERDOWN;
    }
    char who[400]; /* the member we meant to reach, for the messages */
    snprintf(who, sizeof who, "%s (%s)", addr, p->name);
    if (rc == AX_OK && b->node->token_len &&
        (rc = axi_bulk_authenticate(b->node, fd, ssl, ring, who)) != AX_OK) {
      axi_bulk_tls_close(&(bconn){.ssl = ssl});
      close(fd);
    }
    if (rc == AX_OK && !(c = conn_new(b, fd, p, 1, ssl, ring != NULL, ring))) {
      axi_bulk_tls_close(&(bconn){.ssl = ssl});
      close(fd);
      rc = ax_seterr(AX_ENOMEM, "bulk: no memory");
    }
    if (rc != AX_OK)
      axi_shm_ring_free(ring);
    if (rc != AX_OK) {
      pthread_mutex_unlock(&b->dial_mu);
      axi_bulk_frames_free(h);
      return rc;
    }
    if (!b->node->token_len) /* with a token the hello went already */
      h = axi_bulk_hello(b->node, NULL, NULL);
    if (h)
      axi_bulk_queue(c, h);
    __atomic_store_n(&p->bulk_conn, c, __ATOMIC_RELEASE);
  }
  if (locked)
    pthread_mutex_unlock(&b->dial_mu);
  pthread_mutex_lock(&c->mu);
  int dead = c->dead;
  pthread_mutex_unlock(&c->mu);
  if (dead)
    return ax_seterr(AX_EPEERDOWN, "bulk: connection to %s lost", AXI_PNAME(p));
  bframe *f = frame_of(t->node, m);
  if (!f)
    return ax_seterr(AX_ENOMEM, "bulk: no memory");
  axi_bulk_queue(c, f);
  return AX_OK;
}

static int tcp_probe(axi_transport *t, const char *addr) {
  axi_bulk *b = (axi_bulk *)t;
  int fd = -1;
  axi_shm_ring *ring = NULL;
  AX_TRY(axi_bulk_dial_peer(b, addr, &fd, &ring));
  struct ssl_st *ssl = NULL;
  int rc = AX_OK;
  if (b->tls && !(ssl = axi_bulk_tls_connect(t->node, fd, NULL, addr)))
    rc = AX_EPEERDOWN;
  if (rc == AX_OK && t->node->token_len)
    rc = axi_bulk_authenticate(t->node, fd, ssl, ring, addr);
  axi_bulk_tls_close(&(bconn){.ssl = ssl});
  axi_shm_ring_free(ring);
  close(fd);
  return rc;
}

static void tcp_drop_peer(axi_transport *t, axi_peer *p) {
  axi_bulk *b = (axi_bulk *)t;
  pthread_mutex_lock(&b->dial_mu);
  bconn *c = p->bulk_conn;
  if (c) {
    pthread_mutex_lock(&c->mu);
    if (!c->want_close)
      c->want_close = 1;
    pthread_mutex_unlock(&c->mu);
    event_active(c->wev, EV_WRITE, 0);
  }
  pthread_mutex_unlock(&b->dial_mu);
}

/* The stop request, run on the I/O thread: a loopbreak from another thread
 * before the loop started would be lost (event_base_loop clears the flag
 * when it starts), an activated event is not. */
static void on_stop(evutil_socket_t fd, short what, void *arg) {
  (void)fd, (void)what;
  event_base_loopbreak(((axi_bulk *)arg)->base);
}

static __thread const axi_bulk *t_io; /* set on a channel's I/O thread */

static void *io_main(void *arg) {
  axi_bulk *b = arg;
  t_io = b;
  event_base_loop(b->base, EVLOOP_NO_EXIT_ON_EMPTY);
  return NULL;
}

/* The transport contract's would_block: on this channel's I/O thread, a
 * peer without a live connection (only this thread frees connections, so
 * the pointer is safe to read here). Seen in CI: two members' first
 * all-reduce, each answering the other's put inline, both dialled and
 * waited 5 s for a challenge the other's stopped loop could not send. */
static int tcp_would_block(axi_transport *t, axi_peer *p) {
  if (t_io != (const axi_bulk *)t)
    return 0;
  const bconn *c = p->bulk_conn;
  return !c || c->dead;
}

/* "shm": listens on the Unix socket named after the bound TCP address
 * and appends this host's identity to the data address, so that nodes of
 * this host running "shm" dial it there. Without either, the channel is
 * plain TCP (said once on stderr). */
static void start_shm(axi_bulk *b, char *addr, size_t len) {
  struct sockaddr_un sa;
  socklen_t sl;
  const char *why = NULL;
  if (axi_shm_host_id(b->host_id, sizeof b->host_id) != AX_OK ||
      axi_shm_listen_addr(addr, &sa, &sl) != AX_OK)
    why = ax_errmsg();
  else if (!(b->shm_listener = evconnlistener_new_bind(
                 b->base, on_accept_shm, b,
                 LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1,
                 (struct sockaddr *)&sa, sl)))
    why = "cannot listen on its Unix socket";
  else if (strlen(addr) + strlen(AXI_SHM_SUFFIX) + strlen(b->host_id) >= len)
    why = "address too long";
  if (why) {
    fprintf(stderr, "axon: %s: shared memory off (%s): data over TCP\n",
            b->node->name, why);
    if (b->shm_listener)
      evconnlistener_free(b->shm_listener);
    b->shm_listener = NULL;
    return;
  }
  strcat(addr, AXI_SHM_SUFFIX);
  strcat(addr, b->host_id);
}

/* Starts the channel of `ops` (tcp, tls or shm: every connection's TLS is
 * decided before the listener accepts any). */
static int start_ops(const axi_transport_ops *ops, ax_node *n,
                     const char *listen, const axi_rx *rx, axi_transport **out,
                     char *addr, size_t len) {
  pthread_once(&g_evthread_once, evthread_init);
  char host[128];
  int port = 0;
  if (axi_bulk_parse_hostport(listen, host, sizeof host, &port) != AX_OK)
    return ax_seterr(AX_EINVAL, "bulk: cannot listen on %s", listen);
  axi_bulk *b = calloc(1, sizeof *b);
  if (!b)
    return ax_seterr(AX_ENOMEM, "bulk: no memory");
  b->t.ops = ops;
  b->tls = ops == &axi_tls_transport;
  b->t.node = n;
  b->t.rx = *rx;
  b->node = n;
  pthread_mutex_init(&b->mu, NULL);
  pthread_mutex_init(&b->dial_mu, NULL);
  b->base = event_base_new();
  struct sockaddr_in sin = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port)};
  if (!b->base || inet_pton(AF_INET, host, &sin.sin_addr) != 1) {
    if (b->base)
      event_base_free(b->base);
    free(b);
    return ax_seterr(AX_EINVAL, "bulk: cannot listen on %s", host);
  }
  b->listener = evconnlistener_new_bind(
      b->base, on_accept, b, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, -1,
      (struct sockaddr *)&sin, sizeof sin);
  if (!b->listener) {
    event_base_free(b->base);
    free(b);
    return ax_seterr(AX_EIO, "bulk: cannot listen on %s", host);
  }
  struct sockaddr_in bound;
  socklen_t bl = sizeof bound;
  getsockname(evconnlistener_get_fd(b->listener), (struct sockaddr *)&bound,
              &bl);
  snprintf(addr, len, "%s:%d", host, ntohs(bound.sin_port));
  if (ops == &axi_shm_transport)
    start_shm(b, addr, len);
  b->stop_ev = event_new(b->base, -1, 0, on_stop, b);
  if (!b->stop_ev || pthread_create(&b->thread, NULL, io_main, b)) {
    if (b->stop_ev)
      event_free(b->stop_ev);
    if (b->shm_listener)
      evconnlistener_free(b->shm_listener);
    evconnlistener_free(b->listener);
    event_base_free(b->base);
    free(b);
    return ax_seterr(AX_ENOMEM, "bulk: cannot start the I/O thread");
  }
  *out = &b->t;
  return AX_OK;
}

static int tcp_start(ax_node *n, const char *listen, const axi_rx *rx,
                     axi_transport **out, char *addr, size_t len) {
  return start_ops(&axi_tcp_transport, n, listen, rx, out, addr, len);
}

/* The same channel, with shared memory to the nodes of this host that run
 * it too (bulk_shm.c). */
static int shm_start(ax_node *n, const char *listen, const axi_rx *rx,
                     axi_transport **out, char *addr, size_t len) {
  return start_ops(&axi_shm_transport, n, listen, rx, out, addr, len);
}

/* The same channel with TLS on every connection (bulk_tls.c). */
static int tls_start(ax_node *n, const char *listen, const axi_rx *rx,
                     axi_transport **out, char *addr, size_t len) {
  if (!n->tls_ctx)
    return ax_seterr(AX_EINVAL, "bulk: TLS without credentials");
  return start_ops(&axi_tls_transport, n, listen, rx, out, addr, len);
}

static void tcp_stop(axi_transport *t, int64_t timeout_ms) {
  (void)timeout_ms; /* the I/O thread ends at once */
  axi_bulk *b = (axi_bulk *)t;
  event_active(b->stop_ev, EV_READ, 0); /* see on_stop */
  pthread_join(b->thread, NULL);
  evconnlistener_free(b->listener);
  if (b->shm_listener)
    evconnlistener_free(b->shm_listener);
  for (bconn *c = b->conns, *nx; c; c = nx) {
    nx = c->next;
    c->peer = NULL; /* no peer-down reports while stopping */
    axi_bulk_conn_close(c, NULL);
    conn_free(c);
  }
  for (axi_peer *p = b->node->peers; p; p = p->next)
    p->bulk_conn = NULL;
  event_free(b->stop_ev);
  event_base_free(b->base);
}

static void tcp_free(axi_transport *t) {
  axi_bulk *b = (axi_bulk *)t;
  pthread_mutex_destroy(&b->mu);
  pthread_mutex_destroy(&b->dial_mu);
  free(b);
}

/* The three entries share the channel; only what start sets up differs. */
#define BULK_ENTRY(entry_name, start_fn)                                       \
  {                                                                            \
    .name = entry_name, .role = AXI_TRANSPORT_DATA, .start = start_fn,         \
    .send = tcp_send, .drop_peer = tcp_drop_peer, .stop = tcp_stop,            \
    .free = tcp_free, .probe = tcp_probe, .would_block = tcp_would_block,      \
  }

const axi_transport_ops axi_tcp_transport = BULK_ENTRY("tcp", tcp_start);
const axi_transport_ops axi_tls_transport = BULK_ENTRY("tls", tls_start);
const axi_transport_ops axi_shm_transport = BULK_ENTRY("shm", shm_start);
