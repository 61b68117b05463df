/* Test hooks (see rpc/rpc-debug.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/node-impl.h"
#include "axon/rpc/rpc-debug.h"
#include "axon/rpc/tls-impl.h"

int ax_rpc_debug_send_raw(ax_node *n, const char *to, const void *frame,
                          size_t len, int64_t timeout_ms, ax_future **out) {
  if (len < 16)
    return ax_seterr(AX_EINVAL, "debug: frame shorter than 16 bytes");
  axi_peer *p = axi_peer_find(n, to);
  if (!p)
    return ax_seterr(AX_ENOTFOUND, "debug: no node named %s", to);
  /* An ordinary pending call, whose id the raw frame carries. */
  ax_future *f = ax_future_new();
  uint8_t *buf = malloc(len + 4);
  axi_pcall *c = f && buf
                     ? axi_pcall_add(n, p, "(raw frame)", f,
                                     axi_add_sat(ax_clock_ms(), timeout_ms))
                     : NULL;
  if (!c) {
    ax_future_release(f);
    free(buf);
    return AX_ENOMEM;
  }
  uint64_t id = c->id;
  memcpy(buf + 4, frame, len);
  memcpy(buf + 4 + 8, &id, 8);
  /* The control connection carries it; a ping-less open is enough. */
  pthread_mutex_lock(&p->mu);
  int rc = AX_OK;
  if (p->state == AXI_PEER_DOWN)
    rc = ax_seterr(AX_EPEERDOWN, "debug: %s is down", to);
  else if (!p->out && (rc = n->ctl->ops->connect(n->ctl, p)) == AX_OK) {
    p->state = AXI_PEER_CONNECTING;
    p->connect_ms = p->last_ping_ms = ax_clock_ms();
  }
  pthread_mutex_unlock(&p->mu);
  if (rc == AX_OK)
    rc = n->ctl->ops->send_raw(n->ctl, p, buf, len + 4);
  else
    free(buf);
  /* On failure the timer completes the call at its deadline; the future is
   * still returned so that the caller sees exactly one outcome. */
  *out = f;
  return AX_OK;
}

int ax_rpc_debug_peer_addrs(ax_node *n, const char *name, char *ctl,
                            size_t ctl_len, char *bulk, size_t bulk_len) {
  axi_peer *p = axi_peer_find(n, name);
  if (!p)
    return ax_seterr(AX_ENOTFOUND, "debug: no node named %s", name);
  pthread_mutex_lock(&p->mu);
  snprintf(ctl, ctl_len, "%s", p->addr ? p->addr : "");
  snprintf(bulk, bulk_len, "%s", p->bulk_addr ? p->bulk_addr : "");
  pthread_mutex_unlock(&p->mu);
  return AX_OK;
}

int ax_rpc_debug_data_handshake(ax_node *n, const char *addr) {
  pthread_rwlock_rdlock(&n->data_lk);
  int rc = n->data && n->data->ops->probe
               ? n->data->ops->probe(n->data, addr)
               : ax_seterr(AX_EUNSUPPORTED, "debug: no data transport");
  pthread_rwlock_unlock(&n->data_lk);
  return rc;
}

const char *ax_rpc_debug_bulk_addr(const ax_node *n) { return n->bulk_addr; }

void ax_rpc_debug_tls_any_cn(int on) {
  __atomic_store_n(&axi_tls_any_cn, on, __ATOMIC_RELAXED);
}
