/* The gRPC control transport's entry in the transport table
 * (rpc/transport.h): sending on a peer's streams, dropping them, and the
 * connection references the dispatcher holds for replies. */
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/grpc-impl.h"

static int grpc_connect(axi_transport *t, axi_peer *p) {
  return axi_stream_open(t->node, p, &p->out);
}

/* No stream to p: the error, with why the last one ended when it did
 * (p->mu held). */
static int no_stream_locked(const axi_peer *p) {
  return ax_seterr(AX_EPEERDOWN, "%s: no stream%s%s%s", AXI_PNAME(p),
                   *p->down_why ? " (the last one: " : "", p->down_why,
                   *p->down_why ? ")" : "");
}

static int grpc_send(axi_transport *t, axi_peer *p, const axi_msg *m,
                     axi_stream *via) {
  (void)t;
  pthread_mutex_lock(&p->mu);
  axi_stream *s = axi_stream_alive(via)                                ? via
                  : axi_stream_alive(p->in) && m->kind == AXI_RESPONSE ? p->in
                                                                       : p->out;
  if (s)
    axi_stream_retain(s);
  int rc = s ? AX_OK : no_stream_locked(p);
  pthread_mutex_unlock(&p->mu);
  if (!s)
    return rc;
  uint8_t *buf;
  size_t len, blob;
  rc = axi_frame_encode(m, 4, 1, &buf, &len, &blob);
  if (rc == AX_OK)
    rc = axi_stream_send(s, buf, len);
  axi_stream_release(s);
  if (rc == AX_ECLOSED)
    rc = ax_seterr(AX_EPEERDOWN, "%s: stream closed", AXI_PNAME(p));
  return rc;
}

static int grpc_send_raw(axi_transport *t, axi_peer *p, uint8_t *buf,
                         size_t len) {
  (void)t;
  pthread_mutex_lock(&p->mu);
  axi_stream *s = p->out;
  if (s)
    axi_stream_retain(s);
  int rc = s ? AX_OK : no_stream_locked(p);
  pthread_mutex_unlock(&p->mu);
  if (!s) {
    free(buf);
    return rc;
  }
  rc = axi_stream_send(s, buf, len);
  axi_stream_release(s);
  return rc;
}

void axi_grpc_let_go(axi_peer *p, int cancel) {
  pthread_mutex_lock(&p->mu);
  axi_stream *out = p->out, *in = p->in;
  p->out = p->in = NULL;
  pthread_mutex_unlock(&p->mu);
  if (cancel) {
    axi_stream_cancel(out);
    axi_stream_cancel(in);
  }
  axi_stream_release(out);
  axi_stream_release(in);
}

static void grpc_drop_peer(axi_transport *t, axi_peer *p) {
  (void)t;
  axi_grpc_let_go(p, 1);
}

static void grpc_ref(axi_stream *s, int delta) {
  if (s && delta > 0)
    axi_stream_retain(s);
  else if (s)
    axi_stream_release(s);
}

const axi_transport_ops axi_grpc_transport = {
    .name = "grpc",
    .role = AXI_TRANSPORT_CONTROL,
    .start = axi_grpc_start,
    .send = grpc_send,
    .drop_peer = grpc_drop_peer,
    .stop = axi_grpc_stop,
    .free = axi_grpc_free,
    .connect = grpc_connect,
    .alive = axi_stream_alive,
    .ref = grpc_ref,
    .send_raw = grpc_send_raw,
};
