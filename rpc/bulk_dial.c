/* The bulk channel's connections as they start: dialling a peer's data
 * address (TCP with a bounded wait, or this host's shared memory), the
 * socket options, and the mutual authentication of a fresh connection. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/auth-impl.h"
#include "axon/rpc/bulk-impl.h"

void axi_bulk_sock_opts(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Mutual authentication on a fresh connection (plain, or inside the TLS
 * session ssl; bounded wait, 5 s): reads the accepting side's challenge,
 * writes the hello answering it with this node's own nonce, and reads the
 * acceptor's proof over that nonce. Nothing else is sent before the
 * acceptor proved it holds the secret. */
int axi_bulk_authenticate(ax_node *n, int fd, struct ssl_st *ssl,
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

int axi_bulk_parse_hostport(const char *addr, char *host, size_t hl,
                            int *port) {
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
  AX_TRY(axi_bulk_parse_hostport(addr, host, sizeof host, &port));
  snprintf(ps, sizeof ps, "%d", port);
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
  if (getaddrinfo(host, ps, &hints, &ai) || !ai)
    return ax_seterr(AX_EPEERDOWN, "bulk: cannot resolve %s", addr);
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int rc = AX_OK;
  if (fd < 0) {
    rc = ax_seterr(AX_EIO, "bulk: socket: %s", strerror(errno));
  } else {
    axi_bulk_sock_opts(fd);
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
int axi_bulk_dial_peer(axi_bulk *b, const char *addr, int *fd,
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
