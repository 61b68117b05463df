/* The bulk channel's I/O thread on one connection: writing its queued
 * frames, reading frames (from the socket, or from the shared-memory ring
 * a wake-up byte announces) and closing it. */
#include <errno.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/bulk-impl.h"

/* ---- closing (I/O thread only) ---------------------------------------- */
void axi_bulk_conn_close(bconn *c, const char *why) {
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
void axi_bulk_on_write(evutil_socket_t fd, short what, void *arg) {
  bconn *c = arg;
  if (c->want_close) {
    axi_bulk_conn_close(
        c, c->want_close == 2 ? "bulk connection lost while sending" : NULL);
    return;
  }
  if (c->handshaking) { /* the TLS handshake wanted to write */
    int h = c->dead ? 0 : axi_bulk_tls_accept(c);
    if (h < 0)
      axi_bulk_conn_close(c, NULL);
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
      axi_bulk_conn_close(c, "bulk connection lost while sending");
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
      axi_bulk_conn_close(c, NULL);
    if (t <= 0)
      return;
  }
  int eof = axi_shm_drain(c) < 0;
  if (c->outgoing) { /* the reader made room, or left */
    if (eof) {
      axi_bulk_conn_close(c, "bulk connection closed by the peer");
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
    axi_bulk_conn_close(c, NULL);
}

void axi_bulk_on_read(evutil_socket_t fd, short what, void *arg) {
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
      axi_bulk_conn_close(c, "bulk connection closed by the peer");
    return;
  }
  if (c->handshaking) {
    int h = axi_bulk_tls_accept(c);
    if (h < 0)
      axi_bulk_conn_close(c, NULL);
    if (h <= 0)
      return;
  }
  axi_bulk_cork_begin();
  int rc = axi_bulk_recv(c);
  axi_bulk_cork_flush();
  if (rc != AX_OK)
    axi_bulk_conn_close(c, NULL);
}
