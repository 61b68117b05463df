/* The agent's HTTP endpoint (libevent evhttp): /healthz and /metrics in the
 * Prometheus text format. */
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <stdio.h>
#include <string.h>

#include "agents/axon_agent.h"

static struct evhttp *g_http;

static void healthz(struct evhttp_request *req, void *arg) {
  struct evbuffer *b = evbuffer_new();
  evbuffer_add_printf(b, "ok\n");
  evhttp_send_reply(req, HTTP_OK, "OK", b);
  evbuffer_free(b);
}

static void metrics(struct evhttp_request *req, void *arg) {
  ax_node *n = arg;
  struct evbuffer *b = evbuffer_new();
  ax_node_stats s;
  ax_node_stats_get(n, &s);
  const char *node = ax_node_name(n);
  evbuffer_add_printf(b, "# HELP axon_calls_total Calls served, by function.\n"
                         "# TYPE axon_calls_total counter\n");
  ax_fn_stats f;
  for (size_t i = 0; ax_node_fn_stats(n, i, &f) == AX_OK; i++)
    evbuffer_add_printf(b, "axon_calls_total{node=\"%s\",fn=\"%s\"} %llu\n",
                        node, f.fn, (unsigned long long)f.calls);
  evbuffer_add_printf(b, "# HELP axon_call_errors_total Calls answered with an "
                         "error, by function.\n"
                         "# TYPE axon_call_errors_total counter\n");
  for (size_t i = 0; ax_node_fn_stats(n, i, &f) == AX_OK; i++)
    evbuffer_add_printf(b,
                        "axon_call_errors_total{node=\"%s\",fn=\"%s\"} %llu\n",
                        node, f.fn, (unsigned long long)f.errors);
  evbuffer_add_printf(
      b, "# HELP axon_call_latency_seconds Handler latency, by function.\n"
         "# TYPE axon_call_latency_seconds histogram\n");
  for (size_t i = 0; ax_node_fn_stats(n, i, &f) == AX_OK; i++) {
    unsigned long long cum = 0;
    for (int k = 0; k < AX_LAT_BUCKETS; k++) {
      cum += f.lat_count[k];
      if (k == AX_LAT_BUCKETS - 1)
        evbuffer_add_printf(b,
                            "axon_call_latency_seconds_bucket{node=\"%s\",fn="
                            "\"%s\",le=\"+Inf\"} %llu\n",
                            node, f.fn, cum);
      else
        evbuffer_add_printf(b,
                            "axon_call_latency_seconds_bucket{node=\"%s\",fn="
                            "\"%s\",le=\"%g\"} %llu\n",
                            node, f.fn, ax_lat_bounds_s[k], cum);
    }
    evbuffer_add_printf(
        b, "axon_call_latency_seconds_sum{node=\"%s\",fn=\"%s\"} %.9f\n", node,
        f.fn, f.lat_sum_s);
    evbuffer_add_printf(
        b, "axon_call_latency_seconds_count{node=\"%s\",fn=\"%s\"} %llu\n",
        node, f.fn, cum);
  }
  evbuffer_add_printf(
      b,
      "# HELP axon_bytes_in_total Bytes received (control and bulk).\n"
      "# TYPE axon_bytes_in_total counter\n"
      "axon_bytes_in_total{node=\"%s\"} %llu\n"
      "# HELP axon_bytes_out_total Bytes sent (control and bulk).\n"
      "# TYPE axon_bytes_out_total counter\n"
      "axon_bytes_out_total{node=\"%s\"} %llu\n"
      "# HELP axon_calls_in_total Requests received.\n"
      "# TYPE axon_calls_in_total counter\n"
      "axon_calls_in_total{node=\"%s\"} %llu\n"
      "# HELP axon_calls_out_total Calls made.\n"
      "# TYPE axon_calls_out_total counter\n"
      "axon_calls_out_total{node=\"%s\"} %llu\n"
      "# HELP axon_errors_total Requests answered with an error.\n"
      "# TYPE axon_errors_total counter\n"
      "axon_errors_total{node=\"%s\"} %llu\n"
      "# HELP axon_malformed_frames_total Undecodable frames received.\n"
      "# TYPE axon_malformed_frames_total counter\n"
      "axon_malformed_frames_total{node=\"%s\"} %llu\n"
      "# HELP axon_live_futures Futures alive in the process.\n"
      "# TYPE axon_live_futures gauge\n"
      "axon_live_futures{node=\"%s\"} %ld\n"
      "# HELP axon_live_calls Calls in flight in the process.\n"
      "# TYPE axon_live_calls gauge\n"
      "axon_live_calls{node=\"%s\"} %ld\n"
      "# HELP axon_peers Peers by state.\n"
      "# TYPE axon_peers gauge\n"
      "axon_peers{node=\"%s\",state=\"up\"} %d\n"
      "axon_peers{node=\"%s\",state=\"down\"} %d\n",
      node, (unsigned long long)s.bytes_in, node,
      (unsigned long long)s.bytes_out, node, (unsigned long long)s.calls_in,
      node, (unsigned long long)s.calls_out, node,
      (unsigned long long)s.errors_in, node, (unsigned long long)s.malformed,
      node, s.live_futures, node, s.live_calls, node, s.peers_up, node,
      s.peers_down);
  evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                    "text/plain; version=0.0.4");
  evhttp_send_reply(req, HTTP_OK, "OK", b);
  evbuffer_free(b);
}

static void not_found(struct evhttp_request *req, void *arg) {
  evhttp_send_error(req, HTTP_NOTFOUND, "not found");
}

struct evhttp *ax_agent_http_new(struct event_base *base, ax_node *n) {
  struct evhttp *h = evhttp_new(base);
  if (!h) {
    ax_seterr(AX_ENOMEM, "http: no memory");
    return NULL;
  }
  evhttp_set_cb(h, "/healthz", healthz, n);
  evhttp_set_cb(h, "/metrics", metrics, n);
  evhttp_set_gencb(h, not_found, NULL);
  return h;
}

int ax_agent_http_start(struct event_base *base, ax_node *n, const char *host,
                        int port) {
  g_http = ax_agent_http_new(base, n);
  if (!g_http)
    return AX_ENOMEM;
  if (evhttp_bind_socket(g_http, host, (unsigned short)port) != 0) {
    evhttp_free(g_http);
    g_http = NULL;
    return ax_seterr(AX_EIO, "http: cannot bind %s:%d", host, port);
  }
  return AX_OK;
}

void ax_agent_http_stop(void) {
  if (g_http)
    evhttp_free(g_http);
  g_http = NULL;
}
