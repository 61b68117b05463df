/* The write side of the TCP bulk channel: the per-connection queue of
 * outgoing frames, written with sendmsg across frame boundaries, inline by
 * the sending thread while the socket takes the bytes, and corked on the
 * I/O thread while it handles a burst of incoming frames. */
#include <errno.h>
#include <sys/socket.h>

#include "axon/rpc/bulk-impl.h"

/* Bytes of f not yet written. */
static size_t frame_left(const bframe *f) {
  size_t n = 0;
  for (size_t i = f->seg; i < f->nseg; i++)
    n += f->segs[i].iov_len - (i == f->seg ? f->off : 0);
  return n;
}

/* Points iov at what is left of the queued frames, across frame
 * boundaries, so that one sendmsg carries a burst of small frames
 * (c->mu held). Returns the count. */
int axi_bulk_gather_locked(bconn *c, struct iovec *iov) {
  int n = 0;
  for (bframe *f = c->q_head; f && n < AXI_BULK_WIOV; f = f->next)
    n += axi_bulk_frame_iov(f, iov + n, AXI_BULK_WIOV - n);
  return n;
}

/* Consumes w written bytes from the head of the queue (c->mu held) and
 * returns the frames now fully written, for the caller to free. */
bframe *axi_bulk_advance_locked(bconn *c, size_t w) {
  bframe *done = NULL, **dt = &done;
  while (c->q_head && w > 0) {
    bframe *f = c->q_head;
    size_t left = frame_left(f);
    if (w < left) {
      axi_bulk_frame_advance(f, w);
      break;
    }
    axi_bulk_frame_advance(f, left);
    w -= left;
    c->q_head = f->next;
    f->next = NULL;
    *dt = f;
    dt = &f->next;
  }
  if (!c->q_head)
    c->q_tail = &c->q_head;
  return done;
}

/* Writes queued frames from the calling thread while the socket takes
 * them (c->mu held; the caller owns `writing`). Returns 1 when the queue is
 * empty, 0 when the socket is full, -1 on error. */
static int write_inline_locked(bconn *c) {
  while (c->q_head) {
    struct iovec iov[AXI_BULK_WIOV];
    int n = axi_bulk_gather_locked(c, iov);
    ssize_t w = axi_bulk_io_writev(c, iov, n);
    if (w <= 0)
      return (int)w;
    axi_bulk_frames_free(axi_bulk_advance_locked(c, (size_t)w));
  }
  return 1;
}

static __thread int t_corking;
static __thread bconn *t_cork_list;

/* Corking: while the I/O thread handles the frames of one read, frames
 * queued on idle connections (replies of inline handlers, mostly) are only
 * queued; cork_flush then writes each connection's burst with one sendmsg.
 * Thread-local, so that other threads keep writing at once. */
/* Writes c's queue from this thread while the socket takes it and hands
 * the rest to the I/O thread (c->mu held, c->writing clear). */
static void start_write_locked(bconn *c) {
  c->writing = 1;
  int r = write_inline_locked(c);
  if (r == 1) {
    c->writing = 0;
  } else if (r == 0) {
    axi_bulk_wait_writable(c);
  } else {
    c->want_close = 2;
    event_active(c->wev, EV_WRITE, 0);
  }
}

void axi_bulk_wait_writable(bconn *c) {
  if (!c->shm) /* a ring's reader rings when it made room (on_read) */
    event_add(c->wev, NULL);
}

void axi_bulk_cork_begin(void) { t_corking = 1; }

void axi_bulk_cork_flush(void) {
  bconn *c = t_cork_list;
  t_cork_list = NULL;
  t_corking = 0;
  for (bconn *nx; c; c = nx) {
    pthread_mutex_lock(&c->mu);
    nx = c->cork_next;
    c->cork_next = NULL;
    c->corked = 0;
    if (!c->dead && !c->writing && c->q_head)
      start_write_locked(c);
    pthread_mutex_unlock(&c->mu);
  }
}

/* Queues f; when the connection is idle the calling thread writes right
 * away (saving a wake-up of the I/O thread) and hands the rest over to the
 * I/O thread once the socket is full. */
void axi_bulk_queue(bconn *c, bframe *f) {
  pthread_mutex_lock(&c->mu);
  if (c->dead) {
    pthread_mutex_unlock(&c->mu);
    axi_bulk_frames_free(f);
    return;
  }
  *c->q_tail = f;
  c->q_tail = &f->next;
  if (!c->writing && t_corking) {
    if (!c->corked) { /* written by cork_flush when the burst is done */
      c->corked = 1;
      c->cork_next = t_cork_list;
      t_cork_list = c;
    }
  } else if (!c->writing) {
    start_write_locked(c);
  }
  pthread_mutex_unlock(&c->mu);
}
