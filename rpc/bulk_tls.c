/* The byte I/O of a bulk connection, plain (read, sendmsg) or TLS 1.3
 * (SSL_read, SSL_write), and the TLS handshakes of both sides.
 *
 * TLS needs three things the plain path does not:
 * - Reads loop on SSL_read while the session holds buffered bytes, so a
 *   short read still means "nothing buffered here" to the caller (a record
 *   decrypted but not yet handed out would not wake epoll again), and use
 *   read-ahead (many records per system call).
 * - Writes coalesce small iovecs into one record and hand large ones over
 *   in bounded steps; after SSL_ERROR_WANT_WRITE OpenSSL must see the same
 *   bytes again, which holds because the queue's head stays put until it
 *   is written (SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER allows a new address).
 * - The handshake: the dialling thread runs it to the end (bounded, as the
 *   connect is), the I/O thread drives the accepting side from readiness.
 * Both sides verify the other's chain against the CA; the common name of
 * the acceptor's certificate must be the member dialled, that of the
 * dialler's the name in its hello (bulk_frame.c). */
#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/auth-impl.h"
#include "axon/rpc/bulk-impl.h"
#include "axon/rpc/tls-impl.h"

#define TLS_COALESCE (16u << 10) /* one record's plaintext */
#define TLS_WSTEP (1u << 20)     /* largest single SSL_write */
#define TLS_WBUF (256u << 10)    /* records written out per system call */
/* Reads above the read-ahead buffer's size (tensor data straight into its
 * storage) drain the socket; refills of that buffer return early. */
#define TLS_BIG_READ (AXI_BULK_RBUF + 1)

/* ---- plain ---------------------------------------------------------------*/
static ssize_t plain_read(bconn *c, void *dst, size_t n) {
  for (;;) {
    ssize_t r = read(c->fd, dst, n);
    if (r > 0)
      return r;
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return 0;
    return -1;
  }
}

static ssize_t plain_writev(bconn *c, const struct iovec *iov, int n) {
  for (;;) {
    struct msghdr mh = {.msg_iov = (struct iovec *)iov,
                        .msg_iovlen = (size_t)n};
    ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL); /* no SIGPIPE */
    if (w > 0)
      return w;
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return 0;
    return -1;
  }
}

/* ---- TLS -----------------------------------------------------------------*/
/* Returns short (the caller then waits for epoll) once the session holds
 * nothing more. */
static ssize_t tls_read(bconn *c, void *dst, size_t n) {
  size_t got = 0;
  if (!c->ssl)
    return -1;
  while (got < n) {
    int k = n - got > INT32_MAX ? INT32_MAX : (int)(n - got);
    int r = SSL_read(c->ssl, (char *)dst + got, k);
    if (r > 0) {
      got += (size_t)r;
      /* Nothing left inside the session: a small read returns short
       * rather than ask the socket again (epoll is level-triggered, so
       * bytes still in the socket wake the loop once more); a large one
       * (tensor data) drains the socket, saving a loop wake-up per
       * read-ahead buffer. */
      if (!SSL_has_pending(c->ssl) && n < TLS_BIG_READ)
        break;
      continue;
    }
    int e = SSL_get_error(c->ssl, r);
    ERR_clear_error();
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
      break; /* a key update may want to write: the next read retries */
    if (e == SSL_ERROR_SYSCALL && errno == EINTR)
      continue;
    return got ? (ssize_t)got : -1; /* closed or broken */
  }
  return (ssize_t)got;
}

/* Puts a write buffer between the session and its socket, so records go
 * out many per system call (on loopback each write also runs the
 * receiver's network stack and wakes it: per 16 KiB record that cost more
 * than the encryption). */
static int tls_buffer_writes(bconn *c) {
  BIO *sock = SSL_get_wbio(c->ssl), *buf = BIO_new(BIO_f_buffer());
  if (!buf || BIO_set_write_buffer_size(buf, TLS_WBUF) != 1 ||
      BIO_up_ref(sock) != 1) {
    BIO_free(buf);
    return -1;
  }
  BIO_push(buf, sock);
  SSL_set0_wbio(c->ssl, buf); /* drops the session's own reference */
  c->tls_buffered = 1;
  return 0;
}

/* Writes out the write buffer: 1 when empty, 0 when the socket is full,
 * -1 on error. */
static int tls_flush(bconn *c) {
  BIO *w = SSL_get_wbio(c->ssl);
  if (BIO_wpending(w) == 0)
    return 1;
  if (BIO_flush(w) == 1)
    return 1;
  return BIO_should_retry(w) ? 0 : -1;
}

/* Encrypts the next bytes past those already taken but not yet out
 * (c->tls_unacked) and reports bytes as written only once their records
 * left the write buffer. */
static ssize_t tls_writev(bconn *c, const struct iovec *iov, int n) {
  if (!c->ssl || n <= 0 || (!c->tls_buffered && tls_buffer_writes(c)))
    return -1;
  size_t skip = c->tls_unacked;
  int i = 0;
  while (i < n && skip >= iov[i].iov_len)
    skip -= iov[i++].iov_len;
  uint8_t buf[TLS_COALESCE];
  const void *p = NULL;
  size_t len = 0;
  if (i < n && iov[i].iov_len - skip >= TLS_COALESCE) { /* large: in place */
    p = (const uint8_t *)iov[i].iov_base + skip;
    len = iov[i].iov_len - skip < TLS_WSTEP ? iov[i].iov_len - skip : TLS_WSTEP;
  } else { /* small ones gathered into one record */
    for (; i < n && len < sizeof buf; i++, skip = 0) {
      size_t k = iov[i].iov_len - skip;
      k = k < sizeof buf - len ? k : sizeof buf - len;
      memcpy(buf + len, (const uint8_t *)iov[i].iov_base + skip, k);
      len += k;
    }
    p = buf;
  }
  while (len > 0) {
    int w = SSL_write(c->ssl, p, (int)len);
    if (w > 0) {
      c->tls_unacked += (size_t)w;
      break;
    }
    int e = SSL_get_error(c->ssl, w);
    ERR_clear_error();
    if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ)
      return 0; /* retried with the same bytes, which the queue keeps */
    if (e == SSL_ERROR_SYSCALL && errno == EINTR)
      continue;
    return -1;
  }
  int f = tls_flush(c);
  if (f <= 0) {
    ERR_clear_error();
    return f;
  }
  ssize_t out = (ssize_t)c->tls_unacked;
  c->tls_unacked = 0;
  return out;
}

ssize_t axi_bulk_io_read(bconn *c, void *dst, size_t n) {
  ssize_t r = c->shm   ? axi_shm_read(c, dst, n)
              : c->tls ? tls_read(c, dst, n)
                       : plain_read(c, dst, n);
  if (r > 0)
    __atomic_add_fetch(&c->b->node->bytes_in, (uint64_t)r, __ATOMIC_RELAXED);
  return r;
}

ssize_t axi_bulk_io_writev(bconn *c, const struct iovec *iov, int n) {
  return c->shm   ? axi_shm_writev(c, iov, n)
         : c->tls ? tls_writev(c, iov, n)
                  : plain_writev(c, iov, n);
}

void axi_bulk_tls_close(bconn *c) {
  SSL_free(c->ssl);
  c->ssl = NULL;
}

/* ---- handshakes ----------------------------------------------------------*/
/* Waits for fd to be ready for what ssl asked for (e), until deadline. */
static int wait_for(int fd, int e, int64_t deadline_ms) {
  int64_t left = deadline_ms - ax_clock_ms();
  struct pollfd pf = {.fd = fd,
                      .events = e == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN};
  return left > 0 && poll(&pf, 1, (int)left) == 1;
}

int axi_bulk_read_wait(int fd, struct ssl_st *ssl, void *buf, size_t len,
                       int64_t deadline_ms) {
  size_t have = 0;
  while (have < len) {
    ssize_t r;
    int e = SSL_ERROR_WANT_READ;
    if (ssl) {
      int k = SSL_read(ssl, (char *)buf + have, (int)(len - have));
      e = k > 0 ? SSL_ERROR_NONE : SSL_get_error(ssl, k);
      ERR_clear_error();
      r = k > 0                                                   ? k
          : e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? 0
                                                                  : -1;
    } else {
      r = read(fd, (char *)buf + have, len - have);
      if (r < 0 && (errno == EAGAIN || errno == EINTR))
        r = 0;
      else if (r == 0)
        r = -1;
    }
    if (r < 0)
      return AX_EPEERDOWN;
    have += (size_t)r;
    if (have < len && r == 0 && !wait_for(fd, e, deadline_ms))
      return AX_EPEERDOWN;
  }
  return AX_OK;
}

int axi_bulk_write_wait(int fd, struct ssl_st *ssl, const void *buf, size_t len,
                        int64_t deadline_ms) {
  size_t done = 0;
  while (done < len) {
    ssize_t w;
    int e = SSL_ERROR_WANT_WRITE;
    if (ssl) {
      int k = SSL_write(ssl, (const char *)buf + done, (int)(len - done));
      e = k > 0 ? SSL_ERROR_NONE : SSL_get_error(ssl, k);
      ERR_clear_error();
      w = k > 0                                                   ? k
          : e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? 0
                                                                  : -1;
    } else {
      w = write(fd, (const char *)buf + done, len - done);
      if (w < 0 && (errno == EAGAIN || errno == EINTR))
        w = 0;
    }
    if (w < 0)
      return AX_EPEERDOWN;
    done += (size_t)w;
    if (done < len && w == 0 && !wait_for(fd, e, deadline_ms))
      return AX_EPEERDOWN;
  }
  while (ssl) { /* a session with a write buffer (tls_buffer_writes) */
    BIO *b = SSL_get_wbio(ssl);
    if (BIO_wpending(b) == 0 || BIO_flush(b) == 1)
      break;
    ERR_clear_error();
    if (!BIO_should_retry(b) ||
        !wait_for(fd, SSL_ERROR_WANT_WRITE, deadline_ms))
      return AX_EPEERDOWN;
  }
  return AX_OK;
}

struct ssl_st *axi_bulk_tls_connect(ax_node *n, int fd, const char *want,
                                    const char *addr) {
  SSL *s = SSL_new(n->tls_ctx);
  if (!s || SSL_set_fd(s, fd) != 1) {
    SSL_free(s);
    ax_seterr(AX_ENOMEM, "bulk: no memory for a TLS session");
    return NULL;
  }
  int64_t end = ax_clock_ms() + 5000;
  for (;;) {
    int r = SSL_connect(s);
    if (r == 1)
      break;
    int e = SSL_get_error(s, r);
    unsigned long ee = ERR_peek_error();
    char why[200] = "connection closed";
    if (ee)
      ERR_error_string_n(ee, why, sizeof why);
    ERR_clear_error();
    if ((e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) &&
        wait_for(fd, e, end))
      continue;
    long v = SSL_get_verify_result(s);
    SSL_free(s);
    ax_seterr(AX_EPEERDOWN, "bulk: TLS handshake with %s failed: %s%s%s", addr,
              e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE
                  ? "timed out"
                  : why,
              v != X509_V_OK ? ": " : "",
              v != X509_V_OK ? X509_verify_cert_error_string(v) : "");
    return NULL;
  }
  X509 *x = SSL_get1_peer_certificate(s);
  char cn[AXI_CN_MAX] = "";
  int ok = x && axi_tls_x509_cn(x, cn, sizeof cn) == AX_OK &&
           (!want || !strcmp(cn, want));
  X509_free(x);
  if (!ok) {
    SSL_free(s);
    ax_seterr(AX_EPEERDOWN,
              "bulk: %s, dialled as %s, shows a certificate "
              "for '%s'",
              addr, want ? want : "a member", cn);
    return NULL;
  }
  return s;
}

struct ssl_st *axi_bulk_tls_new(ax_node *n, int fd) {
  SSL *s = SSL_new(n->tls_ctx);
  if (s && SSL_set_fd(s, fd) != 1) {
    SSL_free(s);
    s = NULL;
  }
  if (s)
    SSL_set_accept_state(s);
  return s;
}

/* Logs and counts a refused data connection. */
static int refuse(bconn *c, const char *why) {
  ax_node *n = c->b->node;
  if (axi_refusal_logged(n))
    fprintf(stderr, "axon: %s: closing a data connection: TLS: %s\n", n->name,
            why);
  return -1;
}

int axi_bulk_tls_accept(bconn *c) {
  ax_node *n = c->b->node;
  int r = SSL_accept(c->ssl);
  if (r != 1) {
    int e = SSL_get_error(c->ssl, r);
    unsigned long ee = ERR_peek_error();
    ERR_clear_error();
    if (e == SSL_ERROR_WANT_READ)
      return 0;
    if (e == SSL_ERROR_WANT_WRITE) { /* the I/O thread retries when writable */
      event_add(c->wev, NULL);
      return 0;
    }
    char why[200] = "the peer left during the handshake";
    if (ee)
      ERR_error_string_n(ee, why, sizeof why);
    long v = SSL_get_verify_result(c->ssl);
    if (v != X509_V_OK) {
      char w2[300];
      snprintf(w2, sizeof w2, "%s (%s)", why, X509_verify_cert_error_string(v));
      return refuse(c, w2);
    }
    return refuse(c, why);
  }
  X509 *x = SSL_get1_peer_certificate(c->ssl);
  int ok = x && axi_tls_x509_cn(x, c->cn, sizeof c->cn) == AX_OK;
  X509_free(x);
  if (!ok)
    return refuse(c, "a certificate without a common name");
  c->handshaking = 0;
  if (n->token_len) { /* the challenge, now inside the session */
    uint8_t chal[4 + AXI_NONCE_LEN];
    uint32_t magic = AXI_BULK_CHAL_MAGIC;
    memcpy(chal, &magic, 4);
    struct iovec iov = {chal, sizeof chal};
    if (axi_auth_nonce(chal + 4) != AX_OK ||
        tls_writev(c, &iov, 1) != (ssize_t)sizeof chal)
      return refuse(c, "cannot send the challenge");
    memcpy(c->nonce, chal + 4, AXI_NONCE_LEN);
  }
  return 1;
}
