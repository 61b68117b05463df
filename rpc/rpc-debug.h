/* Test and debugging hooks of the RPC layer. Not for production code. */
#ifndef AX_RPC_DEBUG_H
#define AX_RPC_DEBUG_H

#include <stddef.h>

#include "axon/rpc/rpc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sends raw bytes as one frame on our control stream to node `to`, as if
 * they were a request: bytes 8..15 (the call id of the frame prefix) are
 * overwritten with a fresh call id whose response completes *out. Used to
 * check that a corrupt frame gets an error reply (AX_EMALFORMED) and that
 * the peer keeps serving. len must be at least 16. */
int ax_rpc_debug_send_raw(ax_node *n, const char *to, const void *frame,
                          size_t len, int64_t timeout_ms, ax_future **out);

/* The control and bulk addresses known for peer `name` ("" if unknown). */
int ax_rpc_debug_peer_addrs(ax_node *n, const char *name, char *ctl,
                            size_t ctl_len, char *bulk, size_t bulk_len);

/* Opens a data connection to addr the way a send would (with this node's
 * authentication), then closes it: AX_OK when the handshake completed, or
 * the error a send would get (a peer that does not prove the secret is
 * AX_EPEERDOWN). */
int ax_rpc_debug_data_handshake(ax_node *n, const char *addr);

/* The bulk channel address of this node ("" when it has none). */
const char *ax_rpc_debug_bulk_addr(const ax_node *n);

/* on != 0: ax_node_create then accepts a TLS certificate whose CN is not
 * the node's name (process-wide), so that a test can check that peers
 * refuse a member saying hello under a name its certificate does not
 * carry. */
void ax_rpc_debug_tls_any_cn(int on);

#ifdef __cplusplus
}
#endif
#endif
