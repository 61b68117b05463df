/* gRPC streams: one long-lived bidirectional call per ordered node pair.
 *
 * Each gRPC message carries a batch of frames ([u32 len][frame]...): while
 * one send is in flight, later frames queue up and leave together, which
 * keeps the per-message cost of gRPC off the per-call path. One receive is
 * always outstanding while the stream lives. A client stream reports the
 * peer down when its call ends (connection lost, server gone). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/auth-impl.h"
#include "axon/rpc/grpc-impl.h"
#include "axon/rpc/tls-impl.h"

#define STREAM_BATCH_MAX (8u << 20) /* bytes per gRPC message */

static axi_stream *of(axi_op *op, size_t off) {
  return (axi_stream *)((char *)op - off);
}

static void stream_destroy(axi_stream *s) {
  grpc_call_unref(s->call);
  if (s->chan)
    grpc_channel_destroy(s->chan);
  for (axi_sbuf *b = s->q_head, *nx; b; b = nx) {
    nx = b->next;
    free(b->p);
    free(b);
  }
  grpc_metadata_array_destroy(&s->init_md);
  grpc_metadata_array_destroy(&s->trail_md);
  grpc_slice_unref(s->details);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* Drops one count (ops or refs) and frees s when both reach zero. */
static void stream_put(axi_stream *s, int is_op) {
  axi_grpc *g = AXI_GRPC(s->node);
  pthread_mutex_lock(&g->mu);
  if (is_op) {
    s->ops--;
    if (--g->ops_total == 0)
      pthread_cond_broadcast(&g->cv);
  } else {
    s->refs--;
  }
  int fr = s->ops == 0 && s->refs == 0;
  if (fr) {
    if (s->prev)
      s->prev->next = s->next;
    else
      g->streams = s->next;
    if (s->next)
      s->next->prev = s->prev;
    pthread_cond_broadcast(&g->cv);
  }
  pthread_mutex_unlock(&g->mu);
  if (fr)
    stream_destroy(s);
}

void axi_stream_retain(axi_stream *s) {
  axi_grpc *g = AXI_GRPC(s->node);
  pthread_mutex_lock(&g->mu);
  s->refs++;
  pthread_mutex_unlock(&g->mu);
}

void axi_stream_release(axi_stream *s) {
  if (s)
    stream_put(s, 0);
}

grpc_call_error axi_stream_batch(axi_stream *s, const grpc_op *ops, size_t n,
                                 axi_op *op) {
  axi_grpc *g = AXI_GRPC(s->node);
  pthread_mutex_lock(&g->mu);
  s->ops++;
  g->ops_total++;
  pthread_mutex_unlock(&g->mu);
  grpc_call_error e = grpc_call_start_batch(s->call, ops, n, op, NULL);
  if (e != GRPC_CALL_OK)
    stream_put(s, 1);
  return e;
}

static void mark_dead(axi_stream *s) {
  pthread_mutex_lock(&s->mu);
  s->dead = 1;
  axi_sbuf *b = s->q_head;
  s->q_head = NULL;
  s->q_tail = &s->q_head;
  pthread_mutex_unlock(&s->mu);
  for (axi_sbuf *nx; b; b = nx) {
    nx = b->next;
    free(b->p);
    free(b);
  }
}

int axi_stream_alive(axi_stream *s) {
  return s && !__atomic_load_n(&s->dead, __ATOMIC_ACQUIRE);
}

void axi_stream_cancel(axi_stream *s) {
  if (s)
    grpc_call_cancel(s->call, NULL);
}

/* Starts the next send with everything queued (s->mu held). */
static void send_next_locked(axi_stream *s) {
  if (s->sending || !s->q_head || s->dead || s->hold == 1)
    return;
  size_t max = s->hold == 2 ? 1 : 64; /* 2: the HELLO alone */
  if (s->hold == 2)
    s->hold = 1;
  grpc_slice slices[64];
  size_t ns = 0, bytes = 0;
  while (s->q_head && ns < max && (ns == 0 || bytes < STREAM_BATCH_MAX)) {
    axi_sbuf *b = s->q_head;
    s->q_head = b->next;
    uint32_t fl = (uint32_t)(b->len - 4);
    memcpy(b->p, &fl, 4);
    slices[ns++] = grpc_slice_new(b->p, b->len, free);
    bytes += b->len;
    free(b);
  }
  if (!s->q_head)
    s->q_tail = &s->q_head;
  s->send_bb = grpc_raw_byte_buffer_create(slices, ns);
  for (size_t i = 0; i < ns; i++)
    grpc_slice_unref(slices[i]);
  __atomic_add_fetch(&s->node->bytes_out, bytes, __ATOMIC_RELAXED);
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_MESSAGE;
  op.data.send_message.send_message = s->send_bb;
  s->sending = 1;
  if (axi_stream_batch(s, &op, 1, &s->op_send) != GRPC_CALL_OK) {
    grpc_byte_buffer_destroy(s->send_bb);
    s->send_bb = NULL;
    s->sending = 0;
    s->dead = 1;
  }
}

int axi_stream_send(axi_stream *s, uint8_t *buf, size_t len) {
  axi_sbuf *b = malloc(sizeof *b);
  if (!b) {
    free(buf);
    return ax_seterr(AX_ENOMEM, "stream: no memory");
  }
  b->p = buf;
  b->len = len;
  b->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->dead) {
    pthread_mutex_unlock(&s->mu);
    free(buf);
    free(b);
    return ax_seterr(AX_ECLOSED, "stream: closed");
  }
  *s->q_tail = b;
  s->q_tail = &b->next;
  send_next_locked(s);
  pthread_mutex_unlock(&s->mu);
  return AX_OK;
}

void axi_stream_on_send(axi_op *op, int ok) {
  axi_stream *s = of(op, offsetof(axi_stream, op_send));
  pthread_mutex_lock(&s->mu);
  grpc_byte_buffer_destroy(s->send_bb);
  s->send_bb = NULL;
  s->sending = 0;
  if (ok)
    send_next_locked(s);
  pthread_mutex_unlock(&s->mu);
  if (!ok)
    mark_dead(s);
  stream_put(s, 1);
}

void axi_stream_start_recv(axi_stream *s) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &s->recv_bb;
  if (axi_stream_batch(s, &op, 1, &s->op_recv) != GRPC_CALL_OK)
    mark_dead(s);
}

static void send_server_status(axi_stream *s) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  op.data.send_status_from_server.status = GRPC_STATUS_OK;
  axi_stream_batch(s, &op, 1, &s->op_status);
}

/* Closes a server stream whose first frame is not a valid proof of the
 * shared secret, or whose hello this node refuses, before anything it sent
 * is decoded further; the dialler gets why (PERMISSION_DENIED). */
static void reject(axi_stream *s, const char *why) {
  ax_node *n = s->node;
  s->rejected = 1;
  if (axi_refusal_logged(n))
    fprintf(stderr,
            "axon: %s: closing an unauthenticated control stream: "
            "%s\n",
            n->name, why);
  grpc_call_cancel_with_status(s->call, GRPC_STATUS_PERMISSION_DENIED, why,
                               NULL);
}

/* The first frame of a server stream under authentication: a small HELLO
 * (checked from its prefix before decoding) whose proof matches our nonce,
 * under a name no other member has. Returns 1 if s may go on. */
static int check_hello(axi_stream *s, const uint8_t *p, size_t len) {
  ax_node *n = s->node;
  axi_prefix x;
  if (len < AXI_PREFIX_LEN || axi_prefix_get(p, &x) != AX_OK ||
      x.kind != AXI_HELLO || x.blob_len || x.hdr_len > 2048 ||
      len != AXI_PREFIX_LEN + x.hdr_len) {
    reject(s, "the first frame is not a hello");
    return 0;
  }
  axi_msg m;
  char why[400];
  int ok = axi_frame_decode(p, len, AX_CPU, NULL, 0, &m) == AX_OK;
  if (!ok)
    reject(s, "the hello does not decode");
  else if (n->token_len &&
           (m.auth_len != AXI_MAC_LEN + AXI_NONCE_LEN ||
            !axi_auth_verify(n, AXI_AUTH_HELLO, s->nonce, m.node, m.addr,
                             m.bulk_addr, m.incarnation, m.auth,
                             AXI_MAC_LEN))) {
    reject(s, "no valid proof of the shared secret");
    ok = 0;
  } else if (n->tls && strcmp(m.node, s->cn)) {
    snprintf(why, sizeof why, "a hello as %.100s with a certificate for %.100s",
             m.node, s->cn[0] ? s->cn : "(no name)");
    reject(s, why);
    ok = 0;
  } else if (!axi_hello_member_ok(n, m.node, m.addr, m.incarnation, 1, why,
                                  sizeof why)) {
    reject(s, why);
    ok = 0;
  }
  if (ok && n->token_len) { /* our own proof, over the caller's nonce */
    uint8_t mac[AXI_MAC_LEN], *buf;
    size_t blen, bl;
    axi_auth_mac(n, AXI_AUTH_HELLO_ACK, m.auth + AXI_MAC_LEN, n->name, n->addr,
                 n->bulk_addr, n->incarnation, mac);
    axi_msg ack = {.kind = AXI_HELLO,
                   .node = n->name,
                   .addr = n->addr,
                   .bulk_addr = n->bulk_addr,
                   .incarnation = n->incarnation,
                   .auth = mac,
                   .auth_len = AXI_MAC_LEN};
    if (axi_frame_encode(&ack, 4, 1, &buf, &blen, &bl) != AX_OK ||
        axi_stream_send(s, buf, blen) != AX_OK)
      ok = 0;
  }
  axi_msg_clear(&m);
  if (ok)
    s->need_auth = 0;
  return ok;
}

static void stream_up(axi_stream *s);

/* A client stream's HELLO from the server: its proof over our nonce. Only
 * then does anything held back leave. */
static void check_server_proof(axi_stream *s, const axi_msg *m) {
  ax_node *n = s->node;
  if (__atomic_load_n(&s->hold, __ATOMIC_ACQUIRE) != 1)
    return;
  if (!axi_auth_verify(n, AXI_AUTH_HELLO_ACK, s->mine, m->node, m->addr,
                       m->bulk_addr, m->incarnation, m->auth, m->auth_len)) {
    reject(s, "the server did not prove the shared secret");
    return;
  }
  pthread_mutex_lock(&s->mu);
  __atomic_store_n(&s->hold, 0, __ATOMIC_RELEASE);
  send_next_locked(s);
  pthread_mutex_unlock(&s->mu);
  if (s->peer)
    stream_up(s);
}

/* A client stream got the server's challenge: the HELLO with our proof
 * leaves first, then everything held back. */
static void answer_challenge(axi_stream *s, const axi_msg *c) {
  ax_node *n = s->node;
  if (!s->hold || c->auth_len != AXI_NONCE_LEN)
    return;
  uint8_t proof[AXI_MAC_LEN + AXI_NONCE_LEN];
  if (axi_auth_nonce(s->mine) != AX_OK)
    return;
  axi_auth_mac(n, AXI_AUTH_HELLO, c->auth, n->name, n->addr, n->bulk_addr,
               n->incarnation, proof);
  memcpy(proof + AXI_MAC_LEN, s->mine, AXI_NONCE_LEN);
  axi_msg hello = {.kind = AXI_HELLO,
                   .node = n->name,
                   .addr = n->addr,
                   .bulk_addr = n->bulk_addr,
                   .incarnation = n->incarnation,
                   .auth = proof,
                   .auth_len = sizeof proof};
  uint8_t *buf;
  size_t blen, bl;
  axi_sbuf *b = malloc(sizeof *b);
  if (!b || axi_frame_encode(&hello, 4, 1, &buf, &blen, &bl) != AX_OK) {
    free(b);
    return;
  }
  b->p = buf;
  b->len = blen;
  pthread_mutex_lock(&s->mu);
  b->next = s->q_head; /* ahead of whatever was held */
  if (!s->q_head)
    s->q_tail = &b->next;
  s->q_head = b;
  __atomic_store_n(&s->hold, 2, __ATOMIC_RELEASE); /* the HELLO alone */
  send_next_locked(s);
  pthread_mutex_unlock(&s->mu);
}

/* Handles one frame that arrived on s. */
static void on_one_frame(axi_stream *s, const uint8_t *p, size_t len) {
  ax_node *n = s->node;
  axi_msg m;
  if (s->rejected || (s->need_auth && !check_hello(s, p, len)))
    return;
  axi_limits lim = {n->o.max_hdr_bytes, n->o.max_values, n->o.max_msg_bytes};
  int rc =
      axi_frame_decode_lim(p, len, n->o.device, &n->o.device_map, &lim, &m);
  if (s->client && n->token_len &&
      __atomic_load_n(&s->hold, __ATOMIC_ACQUIRE) &&
      !(rc == AX_OK && (m.kind == AXI_CHALLENGE || m.kind == AXI_HELLO))) {
    axi_msg_clear(&m); /* nothing but the handshake before the server's proof */
    return;
  }
  if (rc == AX_OK && m.kind == AXI_HELLO && s->client) {
    if (n->token_len)
      check_server_proof(s, &m);
    axi_msg_clear(&m);
    return;
  }
  char why[300]; /* without authentication, the hello is checked here */
  if (rc == AX_OK && m.kind == AXI_HELLO && !s->client && !n->token_len &&
      !n->tls &&
      !axi_hello_member_ok(n, m.node, m.addr, m.incarnation, 0, why,
                           sizeof why)) {
    axi_msg_clear(&m);
    reject(s, why);
    return;
  }
  if (rc == AX_OK && m.kind == AXI_HELLO) {
    /* Addresses come from the membership only (rpc/rendezvous.c): a hello
     * names who is calling, never where this node dials. Messages to a
     * member this node cannot reach yet wait for the membership
     * (rpc/peer_early.c; docs/SECURITY.md, "Addresses"). */
    axi_peer *pe = axi_peer_get(n, m.node, NULL, NULL);
    if (pe && !s->client) {
      axi_stream_retain(s);
      pthread_mutex_lock(&pe->mu);
      axi_stream *old = pe->in;
      pe->in = s;
      pthread_mutex_unlock(&pe->mu);
      axi_stream_release(old);
      s->peer = pe;
    }
    axi_msg_clear(&m);
    return;
  }
  if (rc == AX_OK && m.kind == AXI_PING) {
    axi_msg pong = {.kind = AXI_PONG, .call_id = m.call_id};
    uint8_t *buf;
    size_t blen, bl;
    if (axi_frame_encode(&pong, 4, 1, &buf, &blen, &bl) == AX_OK)
      axi_stream_send(s, buf, blen);
    axi_msg_clear(&m);
    return;
  }
  if (rc == AX_OK && m.kind == AXI_PONG) {
    axi_msg_clear(&m);
    return;
  }
  if (rc == AX_OK && m.kind == AXI_CHALLENGE) {
    if (s->client)
      answer_challenge(s, &m);
    axi_msg_clear(&m);
    return;
  }
  if (!s->peer) { /* nothing before HELLO is acceptable */
    axi_msg_clear(&m);
    return;
  }
  AXI_GRPC(n)->base.rx.frame(n, s->peer, s, &m, rc);
}

void axi_stream_on_recv(axi_op *op, int ok) {
  axi_stream *s = of(op, offsetof(axi_stream, op_recv));
  grpc_byte_buffer *bb = s->recv_bb;
  s->recv_bb = NULL;
  if (ok && bb) {
    if (s->client && s->peer)
      __atomic_store_n(&s->peer->last_recv_ms, ax_clock_ms(), __ATOMIC_RELAXED);
    grpc_byte_buffer_reader r;
    grpc_byte_buffer_reader_init(&r, bb);
    grpc_slice sl = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    grpc_byte_buffer_destroy(bb);
    const uint8_t *p = GRPC_SLICE_START_PTR(sl);
    size_t len = GRPC_SLICE_LENGTH(sl);
    __atomic_add_fetch(&s->node->bytes_in, len, __ATOMIC_RELAXED);
    while (len >= 4 && !s->rejected) {
      uint32_t fl;
      memcpy(&fl, p, 4);
      if (fl > len - 4) {
        __atomic_add_fetch(&s->node->malformed, 1, __ATOMIC_RELAXED);
        break;
      }
      on_one_frame(s, p + 4, fl);
      p += 4 + fl;
      len -= 4 + fl;
    }
    grpc_slice_unref(sl);
    if (axi_stream_alive(s))
      axi_stream_start_recv(s);
  } else {
    if (bb)
      grpc_byte_buffer_destroy(bb);
    if (!s->client && ok && !s->dead)
      send_server_status(s); /* the client half-closed */
    mark_dead(s);
  }
  stream_put(s, 1);
}

/* A client stream is up once the server answered, and, with
 * authentication, once its challenge was answered: a server without the
 * same setting leaves the peer connecting until the connect timeout. */
static void stream_up(axi_stream *s) {
  axi_peer *p = s->peer;
  pthread_mutex_lock(&p->mu);
  if (p->out == s && p->state == AXI_PEER_CONNECTING)
    p->state = AXI_PEER_UP;
  p->last_recv_ms = ax_clock_ms();
  pthread_mutex_unlock(&p->mu);
  s->established = 1;
}

void axi_stream_on_start(axi_op *op, int ok) {
  axi_stream *s = of(op, offsetof(axi_stream, op_start));
  if (ok && s->client && s->peer &&
      !__atomic_load_n(&s->hold, __ATOMIC_ACQUIRE))
    stream_up(s);
  stream_put(s, 1);
}

void axi_stream_on_end(axi_op *op, int ok) {
  axi_stream *s = of(op, offsetof(axi_stream, op_end));
  mark_dead(s);
  if (s->client && s->peer) {
    char why[400];
    char *d = grpc_slice_to_c_string(s->details);
    /* A stream that never came up: say what to check, or why the peer
     * refused it. */
    if (s->status == GRPC_STATUS_PERMISSION_DENIED)
      snprintf(why, sizeof why, "%s refused the connection: %.300s",
               AXI_PNAME(s->peer), d ? d : "");
    else
      snprintf(why, sizeof why, "stream to %s ended%s (gRPC status %d: %.200s)",
               AXI_PNAME(s->peer),
               s->established ? ""
               : s->node->tls ? " before it was up [this node uses TLS: "
                                "does the peer, with a certificate of the "
                                "same CA?]"
                              : " before it was up [this node uses no TLS: "
                                "does the peer?]",
               (int)s->status, d ? d : "");
    gpr_free(d);
    axi_peer_down(s->peer, s, why);
  }
  stream_put(s, 1);
}

void axi_stream_on_status(axi_op *op, int ok) {
  stream_put(of(op, offsetof(axi_stream, op_status)), 1);
}
