/* gRPC core server, completion queue and its poller thread.
 *
 * Shutdown order (each step avoids a known abort in gRPC core): cancel every
 * stream, shut the server down with grpc_server_shutdown_and_notify and
 * wait for its tag, wait for every batch in flight, destroy the server,
 * free the streams, shut the completion queue down and let the poller
 * drain it to GRPC_QUEUE_SHUTDOWN before destroying it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/grpc-impl.h"

void axi_grpc_op_begin(axi_grpc *g) {
  pthread_mutex_lock(&g->mu);
  g->ops_total++;
  pthread_mutex_unlock(&g->mu);
}

void axi_grpc_op_done(axi_grpc *g) {
  pthread_mutex_lock(&g->mu);
  if (--g->ops_total == 0)
    pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static void *poller_main(void *arg) {
  axi_grpc *g = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(
        g->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN)
      break;
    if (ev.type != GRPC_OP_COMPLETE)
      continue;
    axi_op *op = ev.tag;
    op->cb(op, ev.success);
  }
  return NULL;
}

static void request_next(ax_node *n);

static void on_accept(axi_op *op, int ok) {
  axi_grpc *g = (axi_grpc *)((char *)op - offsetof(axi_grpc, accept_op));
  ax_node *n = g->base.node;
  grpc_call *call = g->new_call;
  g->new_call = NULL;
  grpc_call_details_destroy(&g->details);
  grpc_metadata_array_destroy(&g->req_md);
  if (ok && call)
    axi_stream_accept(n, call);
  else if (call)
    grpc_call_unref(call);
  if (ok && !g->stopping)
    request_next(n);
  axi_grpc_op_done(g);
}

static void request_next(ax_node *n) {
  axi_grpc *g = AXI_GRPC(n);
  grpc_call_details_init(&g->details);
  grpc_metadata_array_init(&g->req_md);
  axi_grpc_op_begin(g);
  grpc_call_error e =
      grpc_server_request_call(g->server, &g->new_call, &g->details, &g->req_md,
                               g->cq, g->cq, &g->accept_op);
  if (e != GRPC_CALL_OK) {
    grpc_call_details_destroy(&g->details);
    grpc_metadata_array_destroy(&g->req_md);
    axi_grpc_op_done(g);
  }
}

static void on_shutdown(axi_op *op, int ok) {
  axi_grpc *g = (axi_grpc *)((char *)op - offsetof(axi_grpc, shutdown_op));
  pthread_mutex_lock(&g->mu);
  g->shutdown_done = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

int axi_grpc_start(ax_node *n, const char *listen, const axi_rx *rx,
                   axi_transport **out, char *addr, size_t len) {
  axi_grpc *g = calloc(1, sizeof *g);
  if (!g)
    return ax_seterr(AX_ENOMEM, "grpc: no memory");
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->accept_op.cb = on_accept;
  g->shutdown_op.cb = on_shutdown;
  g->base.ops = &axi_grpc_transport;
  g->base.node = n;
  g->base.rx = *rx;
  grpc_init();
  n->ctl = *out = &g->base; /* streams find it from the node */
  grpc_arg args[3];
  args[0].type = GRPC_ARG_INTEGER;
  args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[0].value.integer = axi_grpc_limit(n);
  args[1].type = GRPC_ARG_INTEGER;
  args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[1].value.integer = -1;
  args[2].type = GRPC_ARG_INTEGER;
  args[2].key = GRPC_ARG_ALLOW_REUSEPORT; /* a taken port must fail */
  args[2].value.integer = 0;
  /* The receive limit alone is checked only once a whole message has been
   * buffered (gRPC core's chttp2 transport, grpc/grpc#43012); a resource
   * quota bounds the memory the transport may take for reading. */
  grpc_arg args_q[4];
  memcpy(args_q, args, sizeof args);
  grpc_resource_quota *q = grpc_resource_quota_create("axon");
  size_t qb = 2 * n->o.max_grpc_msg_bytes;
  grpc_resource_quota_resize(q, qb < (16u << 20) ? (16u << 20) : qb);
  args_q[3].type = GRPC_ARG_POINTER;
  args_q[3].key = GRPC_ARG_RESOURCE_QUOTA;
  args_q[3].value.pointer.p = q;
  args_q[3].value.pointer.vtable = grpc_resource_quota_arg_vtable();
  grpc_channel_args ca = {4, args_q};
  g->cq = grpc_completion_queue_create_for_next(NULL);
  g->server = grpc_server_create(&ca, NULL);
  grpc_resource_quota_unref(q); /* the server holds its own reference */
  grpc_server_register_completion_queue(g->server, g->cq, NULL);
  grpc_server_credentials *cr;
  if (n->tls) { /* every client shows a certificate signed by our CA */
    grpc_ssl_pem_key_cert_pair kp = {n->tls_key_pem, n->tls_cert_pem};
    cr = grpc_ssl_server_credentials_create_ex(
        n->tls_ca_pem, &kp, 1,
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY, NULL);
  } else {
    cr = grpc_insecure_server_credentials_create();
  }
  int port = grpc_server_add_http2_port(g->server, listen, cr);
  grpc_server_credentials_release(cr);
  if (port <= 0) {
    grpc_server_destroy(g->server);
    g->server = NULL;
    grpc_completion_queue_shutdown(g->cq);
    while (grpc_completion_queue_next(g->cq,
                                      gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
               .type != GRPC_QUEUE_SHUTDOWN)
      ;
    grpc_completion_queue_destroy(g->cq);
    free(g);
    n->ctl = *out = NULL;
    grpc_shutdown();
    return ax_seterr(AX_EIO, "grpc: cannot listen on %s", listen);
  }
  /* Report the bound address with the host part of `listen`. */
  const char *colon = strrchr(listen, ':');
  int hl = colon ? (int)(colon - listen) : (int)strlen(listen);
  snprintf(addr, len, "%.*s:%d", hl, listen, port);
  grpc_server_start(g->server);
  if (pthread_create(&g->poller, NULL, poller_main, g) == 0)
    g->poller_started = 1;
  request_next(n);
  return AX_OK;
}

static void timed_wait(axi_grpc *g, int64_t deadline_ms) {
  int64_t left = deadline_ms - ax_clock_ms();
  if (left > 50)
    left = 50;
  if (left < 1)
    left = 1;
  struct timespec ts = ax_clock_after_ms(CLOCK_REALTIME, left);
  pthread_cond_timedwait(&g->cv, &g->mu, &ts);
}

void axi_grpc_stop(axi_transport *t, int64_t timeout_ms) {
  axi_grpc *g = (axi_grpc *)t;
  ax_node *n = t->node;
  int64_t deadline = ax_clock_ms() + (timeout_ms > 0 ? timeout_ms : 1000);
  pthread_mutex_lock(&g->mu);
  g->stopping = 1;
  for (axi_stream *s = g->streams; s; s = s->next)
    grpc_call_cancel(s->call, NULL);
  pthread_mutex_unlock(&g->mu);
  grpc_server_shutdown_and_notify(g->server, g->cq, &g->shutdown_op);
  grpc_server_cancel_all_calls(g->server);
  /* These completions always arrive once calls are cancelled; the deadline
   * only bounds the polling interval, and a warning is printed if gRPC is
   * slow, but destroying anything earlier would abort the process. */
  pthread_mutex_lock(&g->mu);
  int warned = 0;
  while (!g->shutdown_done || g->ops_total > 0) {
    timed_wait(g, deadline);
    if (!warned && ax_clock_ms() > deadline) {
      fprintf(stderr, "axon: %s: gRPC shutdown slower than %lld ms\n", n->name,
              (long long)timeout_ms);
      warned = 1;
      for (axi_stream *s = g->streams; s; s = s->next)
        grpc_call_cancel(s->call, NULL);
    }
  }
  pthread_mutex_unlock(&g->mu);
  grpc_server_destroy(g->server);
  g->server = NULL;
  for (axi_peer *p = n->peers; p; p = p->next)
    axi_grpc_let_go(p, 0); /* cancelled above */
}

/* Called by node destroy once every stream holder is released. */
void axi_grpc_free(axi_transport *t) {
  axi_grpc *g = (axi_grpc *)t;
  grpc_completion_queue_shutdown(g->cq);
  if (g->poller_started)
    pthread_join(g->poller, NULL);
  grpc_completion_queue_destroy(g->cq);
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  t->node->ctl = NULL;
  free(g);
  grpc_shutdown();
}
