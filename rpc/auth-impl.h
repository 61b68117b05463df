/* Shared-secret authentication of both channels (rpc/auth.c).
 *
 * With a token (ax_node_opts.token_file or AXON_TOKEN_FILE), the side that
 * accepts a connection first sends a fresh random nonce (the challenge);
 * the dialling side answers with its hello carrying
 * HMAC-SHA256(token, label, nonce, name, addr, bulk_addr, incarnation),
 * and nothing else
 * it sends is read before that proof checks out. The hello also carries a
 * fresh nonce of the dialling side, and the accepting side answers with
 * its own proof over that nonce (under its own label) before the dialling
 * side sends or accepts anything else: both ends hold the secret, or
 * nothing but the proofs crosses. The secret never crosses the wire; a
 * recorded proof is useless against another nonce. */
#ifndef AX_RPC_AUTH_IMPL_H
#define AX_RPC_AUTH_IMPL_H

#include "axon/rpc/node-impl.h"

#define AXI_NONCE_LEN 16
#define AXI_MAC_LEN 32
#define AXI_AUTH_HELLO "axon-hello-v1" /* control stream label */
#define AXI_AUTH_BULK "axon-bulk-v1"   /* data channel label */
/* The accepting side's answers (distinct labels: a dialler's proof is never
 * a valid acceptor's proof). */
#define AXI_AUTH_HELLO_ACK "axon-hello-ack-v1"
#define AXI_AUTH_BULK_ACK "axon-bulk-ack-v1"

/* Reads the token file into n (none named: no authentication). AX_EINVAL
 * if it cannot be read or holds fewer than 16 or more than AXI_TOKEN_MAX
 * bytes (a trailing newline is dropped). */
int axi_auth_load(ax_node *n);
/* Counts a refused connection (ax_node_stats' auth_refused) and says
 * whether to log it: the first 20, then every 1000th, so that a stranger
 * cannot flood stderr. */
int axi_refusal_logged(ax_node *n);
/* AXI_NONCE_LEN random bytes. */
int axi_auth_nonce(uint8_t *out);
/* out (AXI_MAC_LEN bytes) = HMAC-SHA256(token, label, nonce, the names,
 * the incarnation). */
void axi_auth_mac(const ax_node *n, const char *label, const uint8_t *nonce,
                  const char *name, const char *addr, const char *bulk,
                  uint64_t inc, uint8_t *out);
/* 1 if mac is the MAC of these inputs (constant-time compare). */
int axi_auth_verify(const ax_node *n, const char *label, const uint8_t *nonce,
                    const char *name, const char *addr, const char *bulk,
                    uint64_t inc, const uint8_t *mac, size_t mac_len);
/* 0, with the reason in why (len bytes), if a hello under a known
 * member's name must be refused: it comes from another process than the
 * one the membership names (a stale one, or a newer one while the member
 * is not down), or, when the channel is authenticated (token or TLS),
 * from another control address while the member is up. Both channels'
 * hellos are checked here. */
int axi_hello_member_ok(ax_node *n, const char *name, const char *addr,
                        uint64_t inc, int authenticated, char *why, size_t len);

#endif
