/* axon-agent: the daemon on each host. It joins the master, serves the
 * registered functions (and those of its --plugin files), answers /healthz
 * and /metrics, and exits cleanly (0) when the master ends the world
 * (ax_node_shutdown_world) or on SIGINT or SIGTERM, with 3 when the master
 * goes away without ending it. */
#include <event2/event.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agents/axon_agent.h"
#include "runtime/dist/autograd.h"
#include "runtime/dist/plugin.h"
#include "runtime/pipeline/pipeline.h"

static void usage(FILE *f) {
  fprintf(f,
      "usage: axon-agent --name NAME --master HOST:PORT [options]\n"
      "\n"
      "  --name NAME          unique node name (required)\n"
      "  --master HOST:PORT   master to join; default from AXON_MASTER_ADDR and\n"
      "                       AXON_MASTER_PORT; equal to --listen: this agent\n"
      "                       is the master\n"
      "  --listen ADDR        control-plane address HOST:PORT (port 0: any;\n"
      "                       default 127.0.0.1:0)\n"
      "  --device DEV         cpu or cuda:N; received tensors land there\n"
      "                       (default cpu)\n"
      "  --device-map MAP     where received tensors land by the device the\n"
      "                       sender had them on: SRC=DST[,SRC=DST...], e.g.\n"
      "                       cuda:0=cpu,cpu=cuda:1 (':' may stand for '=':\n"
      "                       cuda:0:cpu,cpu:cuda:1); devices cpu, cuda, cuda:N;\n"
      "                       unlisted senders' devices land on --device\n"
      "  --threads N          handler worker threads (default 4)\n"
      "  --metrics-port P     serve /healthz and /metrics on this port\n"
      "                       (default: no HTTP endpoint)\n"
      "  --world-size N       nodes in the world, for the master (default 1)\n"
      "  --rank R             this node's rank (default: SLURM_PROCID or\n"
      "                       OMPI_COMM_WORLD_RANK, else assigned by the master)\n"
      "  --join-timeout-ms T  give up joining after T ms (default 60000)\n"
      "  --heartbeat-ms T     ping interval to peers (default 500)\n"
      "  --peer-timeout-ms T  silence before a peer is declared down\n"
      "                       (default 4000)\n"
      "  --max-msg-bytes N    largest tensor payload accepted (default 4 GiB)\n"
      "  --plugin FILE.so     load a plugin: its models, object kinds and\n"
      "                       functions are served here (repeatable;\n"
      "                       runtime/dist/plugin.h)\n"
      "  --stay               keep serving when the master goes away\n"
      "  --help               this text\n");
}

typedef struct agent {
  ax_node *node;
  struct event_base *base;
  int stay, exit_code;
} agent;

static void on_signal(evutil_socket_t sig, short what, void *arg) {
  agent *a = arg;
  fprintf(stderr, "axon-agent %s: signal %d, shutting down\n",
          ax_node_name(a->node), (int)sig);
  event_base_loopbreak(a->base);
}

static void on_tick(evutil_socket_t fd, short what, void *arg) {
  agent *a = arg;
  const char *master = ax_node_master_name(a->node);
  if (!master)
    return;
  /* An agent only serves, so its own part is always done: this says so
   * and looks whether the master ended the world (ax_node_shutdown_world). */
  if (ax_node_wait_leave(a->node, 0) == AX_OK) {
    fprintf(stderr, "axon-agent %s: the master ends the world, exiting\n",
            ax_node_name(a->node));
    event_base_loopbreak(a->base);
    return;
  }
  if (a->stay)
    return;
  /* When the master is gone the world is over. */
  if (strcmp(master, ax_node_name(a->node)) &&
      ax_node_peer_is_down(a->node, master)) {
    fprintf(stderr, "axon-agent %s: master %s is down, exiting\n",
            ax_node_name(a->node), master);
    a->exit_code = 3;
    event_base_loopbreak(a->base);
  }
}

int main(int argc, char **argv) {
  ax_node_opts o;
  ax_node_opts_init(&o);
  int metrics_port = -1;
  int64_t join_ms = 60000;
  const char *device = "cpu", *device_map = NULL;
  agent a = {0};
  static const struct option lo[] = {
      {"name", 1, 0, 'n'},         {"master", 1, 0, 'm'},
      {"listen", 1, 0, 'l'},       {"device", 1, 0, 'd'},
      {"threads", 1, 0, 't'},      {"metrics-port", 1, 0, 'p'},
      {"world-size", 1, 0, 'w'},   {"rank", 1, 0, 'r'},
      {"join-timeout-ms", 1, 0, 'J'}, {"heartbeat-ms", 1, 0, 'H'},
      {"peer-timeout-ms", 1, 0, 'P'}, {"stay", 0, 0, 's'},
      {"max-msg-bytes", 1, 0, 'M'}, {"device-map", 1, 0, 'D'},
      {"plugin", 1, 0, 'L'},       {"help", 0, 0, 'h'},
      {0, 0, 0, 0}};
  ax_node_opts_from_env(&o);
  int c;
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case 'n': o.name = optarg; break;
    case 'm': o.master = optarg; break;
    case 'l': o.listen = optarg; break;
    case 'd': device = optarg; break;
    case 'D': device_map = optarg; break;
    case 't': o.threads = atoi(optarg); break;
    case 'p': metrics_port = atoi(optarg); break;
    case 'w': o.world_size = atoi(optarg); break;
    case 'r': o.rank = atoi(optarg); break;
    case 'J': join_ms = atoll(optarg); break;
    case 'H': o.heartbeat_ms = atoll(optarg); break;
    case 'P': o.peer_timeout_ms = atoll(optarg); break;
    case 's': a.stay = 1; break;
    case 'M': o.max_msg_bytes = (size_t)atoll(optarg); break;
    case 'L': /* models register now, before any node exists */
      if (ax_plugin_load(optarg) != AX_OK) {
        fprintf(stderr, "axon-agent: %s\n", ax_errmsg());
        return 1;
      }
      break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (!o.name || optind != argc) {
    usage(stderr);
    return 2;
  }
  if (ax_device_parse(device, &o.device) != AX_OK) {
    fprintf(stderr, "axon-agent: bad --device %s\n", device);
    return 2;
  }
  if (ax_device_map_parse(device_map, &o.device_map) != AX_OK) {
    fprintf(stderr, "axon-agent: bad --device-map: %s\n", ax_errmsg());
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  if (!o.master)
    o.master = o.listen; /* no master given: this agent is the master */
  int rc = ax_node_create(&o, &a.node);
  if (rc == AX_OK)
    rc = ax_agent_register_builtins(a.node);
  int dist = 0;
  if (rc == AX_OK) /* RRefs, remote stages, dist autograd and optimizer */
    dist = (rc = ax_pipe_init(a.node)) == AX_OK;
  if (rc == AX_OK) /* the plugins' kinds and functions */
    rc = ax_plugin_attach(a.node);
  if (rc != AX_OK) {
    fprintf(stderr, "axon-agent %s: %s: %s\n", o.name, ax_strerror(rc),
            ax_errmsg());
    if (dist) {
      ax_node_shutdown(a.node, 1000);
      ax_dist_fini(a.node);
    }
    ax_node_destroy(a.node);
    return 1;
  }
  char ds[16], dm[512];
  fprintf(stderr, "axon-agent %s: serving on %s, joining %s, device %s%s%s\n",
          o.name, ax_node_address(a.node), o.master,
          ax_device_str(o.device, ds, sizeof ds),
          o.device_map.n ? ", device map " : "",
          ax_device_map_str(&o.device_map, dm, sizeof dm));
  /* Signals are caught from here on: one that arrives while joining is
   * handled (a clean shutdown) as soon as the join returns. */
  a.base = event_base_new();
  struct event *sint = evsignal_new(a.base, SIGINT, on_signal, &a);
  struct event *sterm = evsignal_new(a.base, SIGTERM, on_signal, &a);
  struct event *tick = event_new(a.base, -1, EV_PERSIST, on_tick, &a);
  struct timeval tv = {0, 200000};
  event_add(sint, NULL);
  event_add(sterm, NULL);
  event_add(tick, &tv);
  if ((rc = ax_node_join(a.node, join_ms)) != AX_OK) {
    fprintf(stderr, "axon-agent %s: join failed: %s: %s\n", o.name,
            ax_strerror(rc), ax_errmsg());
    event_free(sint);
    event_free(sterm);
    event_free(tick);
    event_base_free(a.base);
    ax_node_destroy(a.node);
    return 1;
  }
  fprintf(stderr, "axon-agent %s: rank %d of %d\n", o.name,
          ax_node_rank(a.node), ax_node_world_size(a.node));
  if (metrics_port >= 0) {
    char host[128];
    snprintf(host, sizeof host, "%s", ax_node_address(a.node));
    char *colon = strrchr(host, ':');
    if (colon)
      *colon = 0;
    if (ax_agent_http_start(a.base, a.node, host, metrics_port) != AX_OK)
      fprintf(stderr, "axon-agent %s: %s\n", o.name, ax_errmsg());
  }
  event_base_dispatch(a.base);
  ax_agent_http_stop();
  event_free(sint);
  event_free(sterm);
  event_free(tick);
  event_base_free(a.base);
  /* Further signals must not kill the clean shutdown under way. Set after
   * freeing the signal events: libevent restores the previous (default)
   * disposition when they are freed. */
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  ax_node_shutdown(a.node, 5000);
  ax_dist_fini(a.node);
  ax_node_destroy(a.node);
  fprintf(stderr, "axon-agent %s: exited\n", o.name);
  return a.exit_code;
}
