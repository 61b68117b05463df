/* Bulk channel frames: building outgoing frames as I/O vectors that point
 * into tensor storage, and the receive state machine that reads straight
 * into new tensors. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/auth-impl.h"
#include "axon/rpc/bulk-impl.h"
#include "axon/rpc/value-impl.h"

enum { R_HELLO = 0, R_NAME, R_PREFIX, R_HDR, R_BLOB, R_SKIP };

bframe *axi_bulk_frame_new(uint8_t *head, size_t head_len, ax_values *vals) {
  bframe *f = calloc(1, sizeof *f);
  size_t nt = 0;
  for (size_t i = 0; i < ax_values_count(vals); i++)
    nt += vals->v[i].type == AX_VAL_TENSOR;
  if (f)
    f->segs = calloc(nt + 1, sizeof *f->segs);
  if (!f || !f->segs) {
    free(f);
    free(head);
    ax_values_free(vals);
    return NULL;
  }
  f->head = head;
  f->head_len = head_len;
  f->vals = vals;
  f->segs[0].iov_base = head;
  f->segs[0].iov_len = head_len;
  f->nseg = 1;
  for (size_t i = 0; i < ax_values_count(vals); i++) {
    axi_value *v = &vals->v[i];
    if (v->type != AX_VAL_TENSOR)
      continue;
    if (v->u.t->device.type != AX_DEV_CPU) { /* stage device tensors */
      ax_tensor *h = ax_tensor_to(v->u.t, AX_CPU);
      if (!h) {
        f->vals = vals;
        axi_bulk_frames_free(f);
        return NULL;
      }
      ax_tensor_release(v->u.t);
      v->u.t = h;
    }
    f->segs[f->nseg].iov_base = v->u.t->data;
    f->segs[f->nseg].iov_len = ax_tensor_nbytes(v->u.t);
    f->nseg++;
  }
  return f;
}

bframe *axi_bulk_hello(const ax_node *n, const uint8_t *mac,
                       const uint8_t *nonce) {
  /* "name\naddr\nbulk_addr\nincarnation": who is calling, from which
   * process. The receiver checks a known member's control address and
   * incarnation against these. */
  char inc[24];
  snprintf(inc, sizeof inc, "%llu", (unsigned long long)n->incarnation);
  size_t nl = strlen(n->name) + strlen(n->addr) + strlen(n->bulk_addr) +
              strlen(inc) + 3;
  if (nl > AXI_BULK_HELLO_MAX)
    return NULL;
  uint8_t *p = malloc(8 + nl + 1 + AXI_MAC_LEN + AXI_NONCE_LEN);
  if (!p)
    return NULL;
  uint32_t magic = AXI_BULK_HELLO_MAGIC, l = (uint32_t)nl;
  memcpy(p, &magic, 4);
  memcpy(p + 4, &l, 4);
  snprintf((char *)p + 8, nl + 1, "%s\n%s\n%s\n%s", n->name, n->addr,
           n->bulk_addr, inc);
  if (mac) {
    memcpy(p + 8 + nl, mac, AXI_MAC_LEN);
    memcpy(p + 8 + nl + AXI_MAC_LEN, nonce, AXI_NONCE_LEN);
  }
  return axi_bulk_frame_new(p, 8 + nl + (mac ? AXI_MAC_LEN + AXI_NONCE_LEN : 0),
                            NULL);
}

void axi_bulk_frames_free(bframe *f) {
  for (bframe *nx; f; f = nx) {
    nx = f->next;
    free(f->head);
    free(f->segs);
    ax_values_free(f->vals);
    free(f);
  }
}

int axi_bulk_frame_iov(bframe *f, struct iovec *iov, int max) {
  int n = 0;
  for (size_t s = f->seg; s < f->nseg && n < max; s++) {
    size_t off = s == f->seg ? f->off : 0;
    iov[n].iov_base = (char *)f->segs[s].iov_base + off;
    iov[n].iov_len = f->segs[s].iov_len - off;
    n++;
  }
  return n;
}

int axi_bulk_frame_advance(bframe *f, size_t n) {
  while (f->seg < f->nseg) {
    size_t left = f->segs[f->seg].iov_len - f->off;
    if (n < left) {
      f->off += n;
      return 0;
    }
    n -= left;
    f->seg++;
    f->off = 0;
  }
  return 1;
}

/* ---- receiving ---------------------------------------------------------- */
static void uncharge(bconn *c);

void axi_bulk_recv_reset(bconn *c) {
  free(c->hdr);
  c->hdr = NULL;
  axi_msg_clear(&c->m);
  uncharge(c);
  c->rstate = c->peer ? R_PREFIX : R_HELLO;
  c->have = 0;
  c->need = c->peer ? 4 + AXI_PREFIX_LEN : 8;
  c->rpos = c->rlen = 0;
}

/* Serves small reads from the read-ahead buffer, refilled with one large
 * read; reads of a buffer's size or more go straight to dst. Returns 0
 * only when the buffer is empty and the socket has nothing (or a short
 * read showed it drained: the loop is level-triggered, so bytes arriving
 * later wake it again), so the state machine never sleeps on bytes it
 * already holds and a small frame costs one read. */
static ssize_t rd(bconn *c, void *dst, size_t n) {
  if (!c->peer && c->rpos == c->rlen) { /* no read-ahead buffer before the
                                           hello: a stranger costs nothing */
    ssize_t r = c->rdry ? 0 : axi_bulk_io_read(c, dst, n);
    c->rdry = r > 0 && (size_t)r < n;
    return r;
  }
  if (c->rpos == c->rlen) {
    if (c->rdry) /* drained by a short read: epoll will tell us */
      return 0;
    if (n >= AXI_BULK_RBUF ||
        (!c->rbuf && !(c->rbuf = malloc(AXI_BULK_RBUF)))) {
      ssize_t r = axi_bulk_io_read(c, dst, n);
      c->rdry = r > 0 && (size_t)r < n;
      return r;
    }
    ssize_t r = axi_bulk_io_read(c, c->rbuf, AXI_BULK_RBUF);
    if (r <= 0)
      return r;
    c->rdry = (size_t)r < AXI_BULK_RBUF;
    c->rpos = 0;
    c->rlen = (size_t)r;
  }
  size_t k = c->rlen - c->rpos;
  k = k < n ? k : n;
  memcpy(dst, c->rbuf + c->rpos, k);
  c->rpos += k;
  return (ssize_t)k;
}

static int stage_grow(bconn *c, size_t n) {
  if (c->stage_cap >= n)
    return AX_OK;
  uint8_t *p = realloc(c->stage, n);
  if (!p)
    return ax_seterr(AX_ENOMEM, "bulk: no memory for %zu bytes", n);
  c->stage = p;
  c->stage_cap = n;
  return AX_OK;
}

/* Finds the next tensor value at or after c->vi; -1 when none is left. */
static long cur_tensor(bconn *c) {
  ax_values *v = c->m.values;
  while (v && c->vi < v->n && v->v[c->vi].type != AX_VAL_TENSOR)
    c->vi++;
  return (v && c->vi < v->n) ? (long)c->vi : -1;
}

/* Gives the peer's in-flight budget back. */
static void uncharge(bconn *c) {
  if (c->charged && c->peer)
    __atomic_sub_fetch(&c->peer->rx_inflight, c->charged, __ATOMIC_RELAXED);
  c->charged = 0;
}

static void dispatch(bconn *c) {
  axi_msg m = c->m;
  memset(&c->m, 0, sizeof c->m);
  uncharge(c); /* the tensors now belong to the call */
  c->b->t.rx.frame(c->b->node, c->peer, NULL, &m, c->mrc);
  axi_msg_clear(&m);
  c->rstate = R_PREFIX;
  c->have = 0;
  c->need = 4 + AXI_PREFIX_LEN;
}

/* Closes the connection over a broken limit: the reason is logged. */
static int over_limit(bconn *c, const char *what) {
  axi_limit_log(c->b->node, c->peer ? AXI_PNAME(c->peer) : "?", what, 1);
  return AX_ETOOBIG;
}

static int header_done(bconn *c) {
  ax_node *n = c->b->node;
  axi_limits lim = {n->o.max_hdr_bytes, n->o.max_values, n->o.max_msg_bytes};
  c->mrc = axi_frame_decode_body(&c->px, c->hdr, n->o.device, &n->o.device_map,
                                 &lim, 1, &c->m);
  free(c->hdr);
  c->hdr = NULL;
  if (c->mrc == AX_ETOOBIG) /* skipped without storage, and answered */
    axi_limit_log(n, c->peer ? AXI_PNAME(c->peer) : "?", ax_errmsg(), 0);
  c->vi = c->toff = 0;
  c->left = c->px.blob_len;
  c->rstate = c->mrc == AX_OK ? R_BLOB : R_SKIP;
  if (c->mrc != AX_OK)
    return stage_grow(c, AXI_BULK_STEP);
  return AX_OK;
}

/* Gives tensor slot i its storage once `have` of its nb bytes sit in the
 * stage buffer (all of them, or AXI_BULK_LAZY for a large CPU tensor),
 * within the peer's in-flight budget, and copies them in. */
static int tensor_arrived(bconn *c, size_t i, size_t nb) {
  ax_node *n = c->b->node;
  uint64_t now =
      c->peer ? __atomic_add_fetch(&c->peer->rx_inflight, nb, __ATOMIC_RELAXED)
              : nb;
  c->charged += nb;
  if (now > n->o.max_inflight_bytes) {
    char why[160];
    snprintf(why, sizeof why, "%llu tensor bytes in flight over the %zu limit",
             (unsigned long long)now, n->o.max_inflight_bytes);
    return over_limit(c, why);
  }
  AX_TRY(axi_frame_alloc_tensor(&c->m, i, n->o.device, &n->o.device_map));
  ax_tensor *t = c->m.values->v[i].u.t;
  if (t->device.type != AX_DEV_CPU)
    return c->toff == nb ? ax_tensor_write(t, c->stage, nb) : AX_OK;
  if (c->toff)
    memcpy(t->data, c->stage, c->toff);
  return AX_OK;
}

/* With authentication: the hello's proof over our challenge (token), the
 * name of the peer's certificate (TLS), under a name no other member has.
 * Logs and counts a refusal. */
static int hello_ok(bconn *c, const char *name, const char *addr,
                    const char *bulk, const char *incs, const uint8_t *mac) {
  ax_node *n = c->b->node;
  const char *why = NULL;
  char w[400], *end = NULL;
  unsigned long long inc = incs ? strtoull(incs, &end, 10) : 0;
  if (!addr || !bulk || !incs || !*incs || *end)
    why = "a hello without addresses and incarnation";
  else if (n->token_len && !axi_auth_verify(n, AXI_AUTH_BULK, c->nonce, name,
                                            addr, bulk, inc, mac, AXI_MAC_LEN))
    why = "no valid proof of the shared secret";
  else if (c->tls && strcmp(name, c->cn)) {
    snprintf(w, sizeof w, "a certificate for %.100s", c->cn);
    why = w;
  } else if (!axi_hello_member_ok(n, name, addr, inc, n->token_len || c->tls, w,
                                  sizeof w))
    why = w;
  if (!why)
    return 1;
  if (axi_refusal_logged(n))
    fprintf(stderr,
            "axon: %s: closing a data connection (hello as %.100s): "
            "%s\n",
            n->name, name, why);
  return 0;
}

/* Answers an authenticated hello with this node's own proof over the
 * dialler's nonce, written straight to the fresh connection (plain, or in
 * its TLS session; nothing else was ever written to an incoming connection
 * but the challenge, so its few bytes fit at once). */
static int prove(bconn *c, const uint8_t *theirs) {
  uint8_t ack[4 + AXI_MAC_LEN];
  uint32_t magic = AXI_BULK_ACK_MAGIC;
  memcpy(ack, &magic, 4);
  axi_auth_mac(c->b->node, AXI_AUTH_BULK_ACK, theirs, "", "", "", 0, ack + 4);
  return axi_bulk_write_wait(c->fd, c->ssl, ack, sizeof ack,
                             ax_clock_ms() + 100);
}

int axi_bulk_recv(bconn *c) {
  ax_node *n = c->b->node;
  c->rdry = 0;
  if (c->need == 0 && c->rstate == R_HELLO)
    axi_bulk_recv_reset(c);
  for (;;) {
    ssize_t r;
    switch (c->rstate) {
    case R_HELLO:
    case R_NAME:
    case R_PREFIX:
      r = rd(c, c->small + c->have, c->need - c->have);
      if (r <= 0)
        return r < 0 ? AX_ECLOSED : AX_OK;
      if ((c->have += r) < c->need)
        break;
      if (c->rstate == R_HELLO) {
        uint32_t magic, nl;
        memcpy(&magic, c->small, 4);
        memcpy(&nl, c->small + 4, 4);
        if (magic != AXI_BULK_HELLO_MAGIC || nl == 0 || nl > AXI_BULK_HELLO_MAX)
          return AX_EMALFORMED;
        c->rstate = R_NAME;
        c->have = 0;
        c->need = nl + (n->token_len ? AXI_MAC_LEN + AXI_NONCE_LEN : 0);
      } else if (c->rstate == R_NAME) {
        uint8_t mac[AXI_MAC_LEN], theirs[AXI_NONCE_LEN];
        size_t nl = c->need - (n->token_len ? AXI_MAC_LEN + AXI_NONCE_LEN : 0);
        if (n->token_len) {
          memcpy(mac, c->small + nl, AXI_MAC_LEN);
          memcpy(theirs, c->small + nl + AXI_MAC_LEN, AXI_NONCE_LEN);
        }
        c->small[nl] = 0;
        char *name = (char *)c->small, *addr = strchr(name, '\n');
        char *bulk = addr ? strchr(addr + 1, '\n') : NULL;
        char *inc = bulk ? strchr(bulk + 1, '\n') : NULL;
        if (addr)
          *addr++ = 0;
        if (bulk)
          *bulk++ = 0;
        if (inc)
          *inc++ = 0;
        if (!hello_ok(c, name, addr, bulk, inc, mac))
          return AX_EMALFORMED; /* closed before anything else is read */
        if (n->token_len && prove(c, theirs) != AX_OK)
          return AX_ECLOSED;
        /* Addresses come from the membership only (rpc/rendezvous.c): a
         * hello names who is calling, never where this node dials. */
        c->peer = axi_peer_get(n, name, NULL, NULL);
        if (!c->peer)
          return AX_ENOMEM;
        c->rstate = R_PREFIX;
        c->have = 0;
        c->need = 4 + AXI_PREFIX_LEN;
      } else {
        uint32_t magic;
        memcpy(&magic, c->small, 4);
        if (magic != AXI_BULK_MAGIC || axi_prefix_get(c->small + 4, &c->px))
          return AX_EMALFORMED; /* cannot resynchronise: close */
        if (c->px.hdr_len > n->o.max_hdr_bytes) { /* too big to skip */
          char why[160];
          snprintf(why, sizeof why,
                   "frame header of %u bytes over the %zu limit", c->px.hdr_len,
                   n->o.max_hdr_bytes);
          return over_limit(c, why);
        }
        if (!(c->hdr = malloc(c->px.hdr_len ? c->px.hdr_len : 1)))
          return AX_ENOMEM;
        c->rstate = R_HDR;
        c->have = 0;
        c->need = c->px.hdr_len;
        if (c->need == 0)
          AX_TRY(header_done(c));
      }
      break;
    case R_HDR:
      r = rd(c, c->hdr + c->have, c->need - c->have);
      if (r < 0)
        return AX_ECLOSED;
      if ((c->have += r) == c->need)
        AX_TRY(header_done(c));
      else if (r == 0)
        return AX_OK;
      break;
    case R_BLOB: {
      long i = cur_tensor(c);
      if (i < 0) {
        dispatch(c);
        break;
      }
      ax_tensor *t = c->m.values->v[i].u.t;
      size_t nb = axi_frame_tensor_bytes(&c->m, (size_t)i);
      /* Until the tensor has storage, its first bytes (all of them for a
       * small or device tensor) gather in the stage buffer: storage is
       * allocated only for bytes that arrived, so a header announcing a
       * huge tensor costs nothing until its data comes. CPU tensors then
       * come from the receive pool (rpc/pool.c) and take the rest of their
       * bytes directly. */
      int direct = t && t->device.type == AX_DEV_CPU;
      size_t lazy = nb < AXI_BULK_LAZY ? nb : AXI_BULK_LAZY;
      if (!direct)
        AX_TRY(stage_grow(c, t ? nb : lazy));
      uint8_t *base = direct ? (uint8_t *)t->data : c->stage;
      size_t want = (direct || t ? nb : lazy) - c->toff;
      /* An empty tensor may have no storage and the stage no buffer yet:
       * no pointer arithmetic on NULL (only a non-empty read needs one). */
      uint8_t *dst = base ? base + c->toff : NULL;
      r = want ? rd(c, dst, want < AXI_BULK_STEP ? want : AXI_BULK_STEP) : 0;
      if (r < 0)
        return AX_ECLOSED;
      c->toff += r;
      if (!t && c->toff == lazy) {
        AX_TRY(tensor_arrived(c, (size_t)i, nb));
        t = c->m.values->v[i].u.t;
      }
      if (c->toff == nb) {
        if (t->device.type != AX_DEV_CPU && lazy != nb)
          AX_TRY(ax_tensor_write(t, c->stage, nb));
        c->vi++;
        c->toff = 0;
      } else if (r == 0) {
        return AX_OK;
      }
      break;
    }
    case R_SKIP:
      if (c->left == 0) {
        dispatch(c);
        break;
      }
      r = rd(c, c->stage, c->left < AXI_BULK_STEP ? c->left : AXI_BULK_STEP);
      if (r < 0)
        return AX_ECLOSED;
      if (r == 0)
        return AX_OK;
      c->left -= r;
      break;
    }
  }
}
