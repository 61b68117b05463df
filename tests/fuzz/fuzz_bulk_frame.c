/* libFuzzer harness: the bulk channel's receive state machine
 * (rpc/bulk_frame.c, axi_bulk_recv), the parser an agent runs on every
 * byte arriving on a data connection, from the hello (and, with
 * authentication, its proof) through frame prefixes, headers and tensor
 * bytes.
 *
 * Input: byte 0 selects the mode (bit 0: the node has a shared secret,
 * FUZZ_TOKEN, and the fixed all-zero challenge; bit 1: small limits, so
 * that the limit paths run), bytes 1..4 seed the split of the rest into
 * chunks, and the rest is what the peer sends. The bytes go through a
 * socket pair in those chunks, and axi_bulk_recv runs after each, as the
 * agent's I/O loop runs it when the socket is readable.
 *
 * Complete frames reach the transport's receive callback (axi_rx, given at
 * start: rpc/transport.h); here it is on_frame below, which checks what the
 * decoder hands over instead of running calls. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "axon/rpc/bulk-impl.h"
#include "axon/rpc/value-impl.h"
#include "tests/fuzz/fuzz_common.h"

static uint64_t g_frames;

static void on_frame(ax_node *n, axi_peer *p, axi_stream *s, axi_msg *m,
                     int decode_rc) {
  g_frames++;
  FUZZ_CHECK(p && !s); /* bulk frames come after a hello */
  /* The frame's tensors now belong to the call: its peer's in-flight
   * budget (one connection per peer here) is given back. */
  FUZZ_CHECK(__atomic_load_n(&p->rx_inflight, __ATOMIC_RELAXED) == 0);
  FUZZ_CHECK(m->kind >= AXI_REQUEST && m->kind <= AXI_CHALLENGE);
  if (decode_rc != AX_OK) {
    FUZZ_CHECK(!m->values && !m->pb_); /* left empty on error */
    return;
  }
  for (size_t i = 0; i < ax_values_count(m->values); i++) {
    const axi_value *v = &m->values->v[i];
    FUZZ_CHECK(v->type >= AX_VAL_I64 && v->type <= AX_VAL_EXT);
    if (v->type == AX_VAL_TENSOR) { /* every tensor got its storage */
      FUZZ_CHECK(v->u.t && (v->u.t->data || !ax_tensor_nbytes(v->u.t)));
      FUZZ_CHECK(ax_tensor_nbytes(v->u.t) == axi_frame_tensor_bytes(m, i));
    }
  }
  /* dispatch() clears m after this returns. */
}

/* Bytes waiting in the socket. */
static int pending(int fd) {
  int k = 0;
  return ioctl(fd, FIONREAD, &k) == 0 ? k : 0;
}

/* Runs the receive side until it has consumed what the socket holds
 * (with `closed`: until it sees the end and closes), as the agent's
 * level-triggered loop runs it while the socket is readable; each run must
 * make progress. Returns the state machine's last result. */
static int drain(bconn *c, int closed, size_t bound) {
  for (size_t runs = 0;; runs++) {
    FUZZ_CHECK(runs <= bound); /* no run without progress */
    int rc = axi_bulk_recv(c);
    if (rc != AX_OK || (!closed && pending(c->fd) == 0))
      return rc;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_in in = {data, size, 0};
  uint8_t mode = fuzz_u8(&in);
  uint32_t split = fuzz_u32(&in);
  ax_node *n = fuzz_node_new("fuzz", 2, 0, mode & 1);
  if (mode & 2) {
    n->o.max_hdr_bytes = 256;
    n->o.max_values = 4;
    n->o.max_msg_bytes = 4096;
    n->o.max_inflight_bytes = 1024;
  }
  struct axi_bulk b = {.node = n};
  b.t.node = n;
  b.t.rx.frame = on_frame;
  pthread_mutex_init(&b.mu, NULL);
  pthread_mutex_init(&b.dial_mu, NULL);
  int sv[2];
  FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
  bconn *c = calloc(1, sizeof *c);
  FUZZ_CHECK(c);
  c->b = &b;
  c->fd = sv[0];
  pthread_mutex_init(&c->mu, NULL);
  c->q_tail = &c->q_head;
  /* c->nonce stays zero: the challenge the seeds' proofs answer. */

  /* Chunk sizes: 1 .. 2^(split & 15), from a small generator. */
  uint32_t x = split | 1, maxc = 1u << (split & 15);
  int rc = AX_OK;
  while (in.off < in.n && rc == AX_OK) {
    x = x * 1103515245u + 12345u;
    size_t want = 1 + (x >> 8) % maxc, got;
    const uint8_t *p = fuzz_bytes(&in, want, &got);
    while (got && rc == AX_OK) {
      ssize_t w = write(sv[1], p, got);
      if (w < 0 && errno != EAGAIN && errno != EINTR)
        break;
      if (w > 0) {
        p += w;
        got -= (size_t)w;
      }
      rc = drain(c, 0, in.n + 16);
    }
  }
  if (rc == AX_OK) { /* the peer leaves: the connection reads its end */
    close(sv[1]);
    sv[1] = -1;
    rc = drain(c, 1, in.n + 16);
    FUZZ_CHECK(rc != AX_OK);
  }
  /* What bulk_tcp.c does when a connection closes. */
  axi_bulk_recv_reset(c);
  free(c->stage);
  free(c->rbuf);
  pthread_mutex_destroy(&c->mu);
  free(c);
  close(sv[0]);
  if (sv[1] >= 0)
    close(sv[1]);
  pthread_mutex_destroy(&b.mu);
  pthread_mutex_destroy(&b.dial_mu);
  fuzz_node_free(n); /* checks every peer's in-flight budget is back */
  return 0;
}
