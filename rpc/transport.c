/* The one table of transports (see rpc/transport.h). */
#include <stdio.h>
#include <string.h>

#include "axon/rpc/transport.h"

static const axi_transport_ops *const g_transports[] = {
    &axi_grpc_transport, /* control: gRPC core streams */
    &axi_tcp_transport,  /* data: framed TCP (rpc/bulk_tcp.c) */
    &axi_tls_transport,  /* data: the same with mutual TLS 1.3 (bulk_tls.c) */
    &axi_shm_transport,  /* data: the same, with shared-memory rings between
                            nodes of one host (bulk_shm.c) */
};
#define NTRANSPORTS (sizeof g_transports / sizeof g_transports[0])

const axi_transport_ops *axi_transport_find(const char *name, int role) {
  for (size_t i = 0; name && i < NTRANSPORTS; i++)
    if (g_transports[i]->role == role && !strcmp(g_transports[i]->name, name))
      return g_transports[i];
  return NULL;
}

const char *axi_transport_names(int role) {
  static char names[2][128];
  char *out = names[role == AXI_TRANSPORT_DATA];
  size_t len = 0;
  out[0] = 0;
  for (size_t i = 0; i < NTRANSPORTS; i++)
    if (g_transports[i]->role == role && len + 1 < sizeof names[0]) {
      int w = snprintf(out + len, sizeof names[0] - len, "%s%s",
                       len ? ", " : "", g_transports[i]->name);
      len += w > 0 ? (size_t)w : 0;
    }
  return out;
}
