/* gRPC streams as they begin: a new stream's state and callbacks, the
 * server's side of an accepted call (the challenge first, with a shared
 * secret) and the client's call to a peer (its channel credentials: mutual
 * TLS that checks the server's certificate names the member dialled). The
 * stream's life, its sends and its frames are grpc_stream.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/auth-impl.h"
#include "axon/rpc/grpc-impl.h"
#include "axon/rpc/tls-impl.h"

static axi_stream *stream_new(ax_node *n, grpc_call *call, int client) {
  axi_stream *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->node = n;
  s->call = call;
  s->client = client;
  s->q_tail = &s->q_head;
  s->details = grpc_empty_slice();
  pthread_mutex_init(&s->mu, NULL);
  grpc_metadata_array_init(&s->init_md);
  grpc_metadata_array_init(&s->trail_md);
  s->op_start.cb = axi_stream_on_start;
  s->op_send.cb = axi_stream_on_send;
  s->op_recv.cb = axi_stream_on_recv;
  s->op_end.cb = axi_stream_on_end;
  s->op_status.cb = axi_stream_on_status;
  axi_grpc *g = AXI_GRPC(n);
  pthread_mutex_lock(&g->mu);
  s->refs = 1; /* the creator's reference */
  s->next = g->streams;
  if (g->streams)
    g->streams->prev = s;
  g->streams = s;
  pthread_mutex_unlock(&g->mu);
  return s;
}

void axi_stream_accept(ax_node *n, grpc_call *call) {
  axi_stream *s = stream_new(n, call, 0);
  if (!s) {
    grpc_call_cancel(call, NULL);
    grpc_call_unref(call);
    return;
  }
  grpc_op ops[1];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  axi_stream_batch(s, ops, 1, &s->op_start);
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[0].data.recv_close_on_server.cancelled = &s->cancelled;
  axi_stream_batch(s, ops, 1, &s->op_end);
  if (n->tls) { /* the name gRPC verified against our CA */
    grpc_auth_context *ac = grpc_call_auth_context(call);
    grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(
        ac, GRPC_X509_CN_PROPERTY_NAME);
    const grpc_auth_property *pr =
        ac ? grpc_auth_property_iterator_next(&it) : NULL;
    if (pr && pr->value_length < sizeof s->cn &&
        !memchr(pr->value, 0, pr->value_length)) {
      memcpy(s->cn, pr->value, pr->value_length);
      s->cn[pr->value_length] = 0;
    }
    if (ac)
      grpc_auth_context_release(ac);
    s->need_auth = 1; /* the HELLO must carry that name */
  }
  if (n->token_len) { /* the challenge: nothing is read before its answer */
    s->need_auth = 1;
    axi_msg c = {
        .kind = AXI_CHALLENGE, .auth = s->nonce, .auth_len = AXI_NONCE_LEN};
    uint8_t *buf;
    size_t len, bl;
    if (axi_auth_nonce(s->nonce) != AX_OK ||
        axi_frame_encode(&c, 4, 1, &buf, &len, &bl) != AX_OK ||
        axi_stream_send(s, buf, len) != AX_OK)
      s->rejected = 1; /* every frame is dropped; the peer times out */
  }
  axi_stream_start_recv(s);
  axi_stream_release(s); /* lives on through its ops and peer->in */
}

/* What the client side of a TLS stream expects of the server. */
typedef struct tls_want {
  char node[128], name[256], addr[128];
} tls_want;

/* gRPC's verify callback (after the chain checked out against the CA and
 * the certificate matched the target name): its CN must be the name of the
 * member we dial. Non-zero fails the handshake. */
static int verify_cn(const char *target, const char *pem, void *user) {
  tls_want *w = user;
  char cn[AXI_CN_MAX] = "";
  if (!w || !w->name[0])
    return 0;
  if (axi_tls_pem_cn(pem, cn, sizeof cn) == AX_OK && !strcmp(cn, w->name))
    return 0;
  fprintf(stderr,
          "axon: %s: %s, dialled as %s, shows a certificate for "
          "'%s'\n",
          w->node, w->addr, w->name, cn);
  return 1;
}

/* The channel credentials for p: insecure, or mutual TLS with our key pair
 * and the CA, checking the server's certificate against p's name (set as
 * the target name, since peers are dialled by address). A master known by
 * its address only ("@HOST:PORT", before the membership) is checked
 * against that address: its certificate must name it (a SAN). May add the
 * override to args (one spare entry). */
static grpc_channel_credentials *
channel_creds(ax_node *n, axi_peer *p, grpc_channel_args *ca, grpc_arg *args) {
  if (!n->tls)
    return grpc_insecure_credentials_create();
  tls_want *w = calloc(1, sizeof *w);
  const char *name = p->alias ? p->alias : p->name[0] != '@' ? p->name : "";
  if (w) {
    snprintf(w->node, sizeof w->node, "%s", n->name);
    snprintf(w->name, sizeof w->name, "%s", name);
    snprintf(w->addr, sizeof w->addr, "%s", p->addr);
  }
  if (w && w->name[0]) {
    args[ca->num_args].type = GRPC_ARG_STRING;
    args[ca->num_args].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
    args[ca->num_args].value.string = w->name;
    ca->num_args++;
  }
  grpc_ssl_pem_key_cert_pair kp = {n->tls_key_pem, n->tls_cert_pem};
  grpc_ssl_verify_peer_options vo = {verify_cn, w, free};
  return grpc_ssl_credentials_create_ex(n->tls_ca_pem, &kp, &vo, NULL);
}

int axi_stream_open(ax_node *n, axi_peer *p, axi_stream **out) {
  if (!p->addr || !*p->addr)
    return ax_seterr(AX_EPEERDOWN, "peer %s has no address", AXI_PNAME(p));
  char target[160];
  int digit = p->addr[0] >= '0' && p->addr[0] <= '9';
  snprintf(target, sizeof target, "%s%s", digit ? "ipv4:" : "", p->addr);
  grpc_arg args[5];
  const char *keys[4] = {
      GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
      GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, GRPC_ARG_ENABLE_RETRIES};
  int vals[4] = {axi_grpc_limit(n), -1, 1, 0};
  for (int i = 0; i < 4; i++) {
    args[i].type = GRPC_ARG_INTEGER;
    args[i].key = (char *)keys[i];
    args[i].value.integer = vals[i];
  }
  grpc_channel_args ca = {4, args};
  grpc_channel_credentials *cr = channel_creds(n, p, &ca, args);
  grpc_channel *ch = grpc_channel_create(target, cr, &ca);
  grpc_channel_credentials_release(cr);
  grpc_slice method = grpc_slice_from_static_string(AXI_STREAM_METHOD);
  grpc_call *call = grpc_channel_create_call(
      ch, NULL, GRPC_PROPAGATE_DEFAULTS, AXI_GRPC(n)->cq, method, NULL,
      gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  axi_stream *s = call ? stream_new(n, call, 1) : NULL;
  if (!s) {
    if (call)
      grpc_call_unref(call);
    grpc_channel_destroy(ch);
    return ax_seterr(AX_ENOMEM, "stream: cannot create a call to %s", target);
  }
  s->chan = ch;
  s->peer = p;
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[1].data.recv_initial_metadata.recv_initial_metadata = &s->init_md;
  axi_stream_batch(s, ops, 2, &s->op_start);
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[0].data.recv_status_on_client.trailing_metadata = &s->trail_md;
  ops[0].data.recv_status_on_client.status = &s->status;
  ops[0].data.recv_status_on_client.status_details = &s->details;
  axi_stream_batch(s, ops, 1, &s->op_end);
  axi_msg hello = {.kind = AXI_HELLO,
                   .node = n->name,
                   .addr = n->addr,
                   .bulk_addr = n->bulk_addr,
                   .incarnation = n->incarnation};
  uint8_t *buf;
  size_t len, bl;
  if (n->token_len) /* the HELLO answers the server's challenge */
    s->hold = 1;
  else if (axi_frame_encode(&hello, 4, 1, &buf, &len, &bl) == AX_OK)
    axi_stream_send(s, buf, len);
  axi_stream_start_recv(s);
  *out = s; /* the creator's reference goes to p->out */
  return AX_OK;
}
