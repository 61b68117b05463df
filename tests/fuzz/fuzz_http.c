/* libFuzzer harness: the agent's HTTP endpoint (agents/axon_agent_http.c),
 * /healthz, /metrics and the 404 answer, behind libevent's request
 * parser, as axon-agent --metrics-port serves them.
 *
 * LLVMFuzzerInitialize builds the endpoint with ax_agent_http_new (the
 * function ax_agent_http_start uses) over a bare node (fuzz_common.h) and
 * binds it to an ephemeral loopback port. Each input is what one client
 * sends on a fresh connection; the client then closes its side, and the
 * loop runs until the endpoint has closed the connection. Whatever comes
 * back must be HTTP responses (a status line first). */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/http.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agents/axon_agent.h"
#include "tests/fuzz/fuzz_common.h"

static struct event_base *g_base;
static struct evhttp *g_http;
static struct sockaddr_in g_addr;
static ax_node *g_node;
static int g_refused; /* connects that failed in a row */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  signal(SIGPIPE, SIG_IGN);
  g_node = fuzz_node_new("fuzz", 1, 0, 0);
  FUZZ_CHECK(axi_rendezvous_init(g_node) == AX_OK); /* some functions */
  g_base = event_base_new();
  FUZZ_CHECK(g_base);
  g_http = ax_agent_http_new(g_base, g_node);
  FUZZ_CHECK(g_http);
  evhttp_set_timeout(g_http, 5);
  struct evhttp_bound_socket *bs =
      evhttp_bind_socket_with_handle(g_http, "127.0.0.1", 0);
  FUZZ_CHECK(bs);
  socklen_t len = sizeof g_addr;
  FUZZ_CHECK(getsockname(evhttp_bound_socket_get_fd(bs),
                         (struct sockaddr *)&g_addr, &len) == 0);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  FUZZ_CHECK(fd >= 0);
  if (connect(fd, (struct sockaddr *)&g_addr, sizeof g_addr) != 0) {
    /* Out of local ports (or a reused one's 4-tuple still taken), a full
     * accept queue that refused or timed out the connection, a signal: the
     * harness's limits, not the endpoint's.
     * An endpoint that stopped accepting altogether fails after many in a
     * row. */
    int e = errno;
    if (e != EADDRNOTAVAIL && e != EADDRINUSE && e != EAGAIN &&
        e != ECONNREFUSED && e != ETIMEDOUT && e != EINTR) {
      char what[128];
      snprintf(what, sizeof what, "connect to the endpoint: %s", strerror(e));
      fuzz_fail(__FILE__, __LINE__, what);
    }
    FUZZ_CHECK(++g_refused < 10000);
    close(fd);
    return 0;
  }
  g_refused = 0;
  /* Closed with a reset: no TIME_WAIT on either side, so millions of
   * inputs do not run the loopback out of ports. */
  struct linger lg = {1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  /* Loopback takes a small request at once; the endpoint reads it all. */
  size_t off = 0;
  while (off < size) {
    ssize_t w = send(fd, data + off, size - off, MSG_DONTWAIT);
    if (w > 0)
      off += (size_t)w;
    else if (w < 0 && errno != EAGAIN && errno != EINTR)
      break;
    event_base_loop(g_base, EVLOOP_NONBLOCK);
  }
  shutdown(fd, SHUT_WR);
  char reply[4096];
  size_t total = 0;
  char head[8] = "";
  for (int spins = 0;; spins++) {
    event_base_loop(g_base, EVLOOP_NONBLOCK);
    ssize_t r = recv(fd, reply, sizeof reply, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
      break; /* the endpoint closed the connection */
    if (r > 0) {
      if (total < sizeof head - 1)
        memcpy(head + total, reply,
               (size_t)r < sizeof head - 1 - total ? (size_t)r
                                                   : sizeof head - 1 - total);
      total += (size_t)r;
      spins = 0;
    }
    /* An endpoint that neither answers nor closes hangs its client. */
    if (spins > 1000) /* then wait for events, bounded by its timeout */
      FUZZ_CHECK(event_base_loop(g_base, EVLOOP_ONCE) == 0 && spins < 1100);
  }
  close(fd);
  if (total >= 5) /* evhttp answers in the request's version */
    FUZZ_CHECK(!strncmp(head, "HTTP/", 5));
  return 0;
}
