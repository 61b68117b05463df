/* The TCP bulk channel: one framed TCP connection per ordered node pair
 * (a Unix socket and a shared-memory ring to a node of this host under
 * "shm", bulk_shm.c), driven by a libevent loop on its own thread. libevent
 * only reports readiness; bytes move with our own readv/writev straight between
 * the socket and tensor storage in large steps (bufferevents would copy through
 * 4 KiB reads). Connections are closed only on the I/O thread and freed
 * only when the channel stops, so a pointer held by a sender stays valid. */
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

static void set_sock_opts(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static bconn *conn_new(axi_bulk *b, int fd, axi_peer *p, int outgoing,
                       struct ssl_st *ssl, int shm, axi_shm_ring *ring);

/* ---- closing (I/O thread only) ---------------------------------------- */
static void conn_close(bconn *c, const char *why) {
  if (c->dead)
    return;
  event_del(c->rev);
  event_del(c->wev);
  pthread_mutex_lock(&c->mu); /* a sender may be writing inline */
  axi_bulk_tls_close(c);
  axi_shm_ring_free(c->ring); /* unmapped: a peer that left costs nothing */
  c->ring = NULL;
  close(c->fd);
  c->fd = -1;
  c->dead = 1;
  bframe *q = c->q_head;
  c->q_head = NULL;
  c->q_tail = &c->q_head;
  pthread_mutex_unlock(&c->mu);
  axi_bulk_frames_free(q);
  axi_bulk_recv_reset(c);
  /* Receive buffers go now: a peer that left costs no memory. */
  free(c->stage);
  c->stage = NULL;
  c->stage_cap = 0;
  free(c->rbuf);
  c->rbuf = NULL;
  c->rpos = c->rlen = 0;
  if (c->outgoing && c->peer && why)
    axi_peer_down(c->peer, NULL, why);
}

/* ---- writing ---------------------------------------------------------- */
static void on_write(evutil_socket_t fd, short what, void *arg) {
  bconn *c = arg;
  if (c->want_close) {
    conn_close(c, c->want_close == 2 ? "bulk connection lost while sending"
                                     : NULL);
    return;
  }
  if (c->handshaking) { /* the TLS handshake wanted to write */
    int h = c->dead ? 0 : axi_bulk_tls_accept(c);
    if (h < 0)
      conn_close(c, NULL);
    else if (h > 0) /* the session may already hold the peer's first bytes */
      event_active(c->rev, EV_READ, 0);
    return;
  }
  for (;;) {
    struct iovec iov[AXI_BULK_WIOV];
    pthread_mutex_lock(&c->mu);
    if (!c->q_head) {
      c->writing = 0;
      pthread_mutex_unlock(&c->mu);
      return;
    }
    /* Only the writer pops frames; senders append behind it. */
    int n = axi_bulk_gather_locked(c, iov);
    pthread_mutex_unlock(&c->mu);
    ssize_t w = axi_bulk_io_writev(c, iov, n);
    if (w == 0) {
      axi_bulk_wait_writable(c);
      return;
    }
    if (w < 0) {
      conn_close(c, "bulk connection lost while sending");
      return;
    }
    pthread_mutex_lock(&c->mu);
    bframe *done = axi_bulk_advance_locked(c, (size_t)w);
    pthread_mutex_unlock(&c->mu);
    axi_bulk_frames_free(done);
  }
}

/* ---- reading ---------------------------------------------------------- */
/* A shared-memory connection's socket: the ring first (incoming), then
 * doorbells; the bytes stay in the ring until read, so an EOF is acted on
 * after what the ring still holds. */
static void on_read_shm(bconn *c) {
  if (!c->outgoing && !c->ring) {
    int t = axi_shm_take(c);
    if (t < 0)
      conn_close(c, NULL);
    if (t <= 0)
      return;
  }
  int eof = axi_shm_drain(c) < 0;
  if (c->outgoing) { /* the reader made room, or left */
    if (eof) {
      conn_close(c, "bulk connection closed by the peer");
      return;
    }
    pthread_mutex_lock(&c->mu);
    int writing = c->writing;
    pthread_mutex_unlock(&c->mu);
    if (writing)
      event_active(c->wev, EV_WRITE, 0);
    return;
  }
  axi_bulk_cork_begin();
  int rc = axi_bulk_recv(c);
  axi_bulk_cork_flush();
  if (rc != AX_OK || eof)
    conn_close(c, NULL);
}

static void on_read(evutil_socket_t fd, short what, void *arg) {
  bconn *c = arg;
  if (c->dead)
    return;
  if (c->shm) {
    on_read_shm(c);
    return;
  }
  if (c->outgoing) { /* nothing is expected back: EOF means the peer left */
    char tmp[64];
    pthread_mutex_lock(&c->mu); /* a TLS session has one user at a time */
    ssize_t r = axi_bulk_io_read(c, tmp, sizeof tmp);
    pthread_mutex_unlock(&c->mu);
    if (r < 0)
      conn_close(c, "bulk connection closed by the peer");
    return;
  }
  if (c->handshaking) {
    int h = axi_bulk_tls_accept(c);
    if (h < 0)
      conn_close(c, NULL);
    if (h <= 0)
      return;
  }
  axi_bulk_cork_begin();
  int rc = axi_bulk_recv(c);
  axi_bulk_cork_flush();
  if (rc != AX_OK)
    conn_close(c, NULL);
}

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
  c->rev = event_new(b->base, fd, EV_READ | EV_PERSIST, on_read, c);
  c->wev = event_new(b->base, fd, EV_WRITE, on_write, c);
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
  set_sock_opts(fd);
  accept_conn(arg, fd, 0);
}

/* A node of this host on the Unix socket: its ring comes with its first
 * byte (on_read_shm). */
static void on_accept_shm(struct evconnlistener *l, evutil_socket_t fd,
                          struct sockaddr *sa, int len, void *arg) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  accept_conn(arg, fd, 1);
}

/* Mutual authentication on a fresh connection (plain, or inside the TLS
 * session ssl; bounded wait, 5 s): reads the accepting side's challenge,
 * writes the hello answering it with this node's own nonce, and reads the
 * acceptor's proof over that nonce. Nothing else is sent before the
 * acceptor proved it holds the secret. */
static int authenticate(ax_node *n, int fd, struct ssl_st *ssl,
                        axi_shm_ring *ring, const char *addr) {
  int64_t end = ax_clock_ms() + 5000;
  uint8_t chal[4 + AXI_NONCE_LEN];
  uint32_t magic = 0;
  if (axi_bulk_read_wait(fd, ssl, chal, sizeof chal, end) == AX_OK)
    memcpy(&magic, chal, 4);
  else if (ax_clock_ms() >= end) /* silence is not a wrong secret */
    return ax_seterr(AX_EPEERDOWN,
                     "bulk: no challenge from %s within 5 s "
                     "(overloaded or hung)",
                     addr);
  if (magic != AXI_BULK_CHAL_MAGIC)
    return ax_seterr(AX_EPEERDOWN,
                     "bulk: no authentication challenge from %s (does it run "
                     "with the same token?)",
                     addr);
  uint8_t mac[AXI_MAC_LEN], mine[AXI_NONCE_LEN];
  AX_TRY(axi_auth_nonce(mine));
  axi_auth_mac(n, AXI_AUTH_BULK, chal + 4, n->name, n->addr, n->bulk_addr,
               n->incarnation, mac);
  bframe *h = axi_bulk_hello(n, mac, mine);
  if (!h)
    return ax_seterr(AX_ENOMEM, "bulk: no memory");
  /* The hello takes the frames' way: the ring, on shared memory. */
  int wrc = ring ? axi_shm_put(ring, fd, h->head, h->head_len)
                 : axi_bulk_write_wait(fd, ssl, h->head, h->head_len, end);
  axi_bulk_frames_free(h);
  uint8_t ack[4 + AXI_MAC_LEN];
  magic = 0;
  int rrc =
      wrc == AX_OK ? axi_bulk_read_wait(fd, ssl, ack, sizeof ack, end) : wrc;
  if (rrc == AX_OK)
    memcpy(&magic, ack, 4);
  else /* no answer (a timeout under load, or closed): not a refusal */
    return ax_seterr(AX_EPEERDOWN, "bulk: %s did not answer the hello%s", addr,
                     ax_clock_ms() >= end
                         ? " within 5 s (overloaded or hung)"
                         : " (it closed the connection: does it run "
                           "with the same token?)");
  if (magic != AXI_BULK_ACK_MAGIC ||
      !axi_auth_verify(n, AXI_AUTH_BULK_ACK, mine, "", "", "", 0, ack + 4,
                       AXI_MAC_LEN)) {
    if (axi_refusal_logged(n))
      fprintf(stderr,
              "axon: %s: %s did not prove the shared secret on the "
              "data channel\n",
              n->name, addr);
    return ax_seterr(AX_EPEERDOWN, "bulk: %s did not prove the shared secret",
                     addr);
  }
  return AX_OK;
}

/* HOST:PORT of a data address (without its shared-memory suffix). */
static void addr_hostport(const char *addr, char *out, size_t len) {
  const char *s = strstr(addr, AXI_SHM_SUFFIX);
  size_t k = s ? (size_t)(s - addr) : strlen(addr);
  snprintf(out, len, "%.*s", (int)k, addr);
}

static int parse_hostport(const char *addr, char *host, size_t hl, int *port) {
  const char *c = strrchr(addr, ':');
  if (!c || (size_t)(c - addr) >= hl)
    return ax_seterr(AX_EINVAL, "bulk: bad address %s", addr);
  memcpy(host, addr, c - addr);
  host[c - addr] = 0;
  *port = atoi(c + 1);
  return AX_OK;
}

/* Connects with a bounded wait (5 s). */
static int dial(const char *full, int *out) {
  char host[128], ps[16], addr[160];
  int port = 0;
  addr_hostport(full, addr, sizeof addr);
  AX_TRY(parse_hostport(addr, host, sizeof host, &port));
  snprintf(ps, sizeof ps, "%d", port);
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
  if (getaddrinfo(host, ps, &hints, &ai) || !ai)
    return ax_seterr(AX_EPEERDOWN, "bulk: cannot resolve %s", addr);
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int rc = AX_OK;
  if (fd < 0) {
    rc = ax_seterr(AX_EIO, "bulk: socket: %s", strerror(errno));
  } else {
    set_sock_opts(fd);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS)
      rc = ax_seterr(AX_EPEERDOWN, "bulk: connect %s: %s", addr,
                     strerror(errno));
    if (rc == AX_OK) {
      struct pollfd pf = {.fd = fd, .events = POLLOUT};
      int err = 0;
      socklen_t el = sizeof err;
      if (poll(&pf, 1, 5000) != 1 ||
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) || err)
        rc = ax_seterr(AX_EPEERDOWN, "bulk: connect %s: %s", addr,
                       err ? strerror(err) : "timed out");
    }
    if (rc != AX_OK)
      close(fd);
  }
  freeaddrinfo(ai);
  if (rc == AX_OK)
    *out = fd;
  return rc;
}

/* Connects to the node whose data address is addr: on this host's shared
 * memory when both run "shm" here (*ring set; a Unix socket that cannot be
 * reached falls back to TCP), else over TCP. */
static int dial_peer(axi_bulk *b, const char *addr, int *fd,
                     axi_shm_ring **ring) {
  *ring = NULL;
  if (b->shm_listener && axi_shm_same_host(addr, b->host_id)) {
    char hp[160];
    addr_hostport(addr, hp, sizeof hp);
    if (axi_shm_dial(hp, fd) == AX_OK) {
      int rc = axi_shm_offer(*fd, AXI_SHM_RING, ring);
      if (rc != AX_OK)
        close(*fd);
      return rc;
    }
  }
  return dial(addr, fd);
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
    int fd = -1, rc = dial_peer(b, addr, &fd, &ring);
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
        (rc = authenticate(b->node, fd, ssl, ring, who)) != AX_OK) {
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
  AX_TRY(dial_peer(b, addr, &fd, &ring));
  struct ssl_st *ssl = NULL;
  int rc = AX_OK;
  if (b->tls && !(ssl = axi_bulk_tls_connect(t->node, fd, NULL, addr)))
    rc = AX_EPEERDOWN;
  if (rc == AX_OK && t->node->token_len)
    rc = authenticate(t->node, fd, ssl, ring, addr);
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
  if (parse_hostport(listen, host, sizeof host, &port) != AX_OK)
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
    conn_close(c, NULL);
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
