/* Shared declarations of the axon-agent program (agents/axon_agent*.c).
 * The checksum is also used by the tests to check tensors sent through the
 * agent's "axon.test.checksum" built-in. */
#ifndef AX_AGENT_H
#define AX_AGENT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "axon/rpc/rpc.h"

struct event_base;
struct evhttp;

/* Registers the agent's built-in functions: axon.agent.sink and
 * axon.agent.probe (for `axon-run probe`) and the test functions
 * axon.test.echo, add, sleep_ms, chain, checksum, make_tensor, device_of
 * and fail (see axon_agent_builtins.c). */
int ax_agent_register_builtins(ax_node *n);

/* The endpoint's request handling without a socket: an evhttp server on
 * base answering /healthz, /metrics (n's counters) and 404 otherwise; the
 * caller binds it or hands it connections (evhttp_get_request) and frees
 * it. NULL on no memory. */
struct evhttp *ax_agent_http_new(struct event_base *base, ax_node *n);
/* Starts /healthz and /metrics on host:port; AX_EIO if it cannot bind. */
int ax_agent_http_start(struct event_base *base, ax_node *n, const char *host,
                        int port);
void ax_agent_http_stop(void);

/* A 64-bit checksum of n bytes (8-byte words mixed multiplicatively, then
 * the tail bytes). */
static inline uint64_t ax_agent_checksum(const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  uint64_t h = 0xcbf29ce484222325ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < n; i++)
    h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

#endif
