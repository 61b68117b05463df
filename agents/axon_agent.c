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
#include "agents/axon_cli.h"

#define P "axon-agent"
#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/autograd/plugin.h"
#include "axon/runtime/pipeline/pipeline.h"

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: axon-agent --name NAME --master HOST:PORT [options]\n"
      "\n"
      "  --name NAME          unique node name (required)\n"
      "  --master HOST:PORT   master to join; default from AXON_MASTER_ADDR "
      "and\n"
      "                       AXON_MASTER_PORT; equal to --listen: this agent\n"
      "                       is the master\n"
      "  --listen ADDR        control-plane address HOST:PORT (port 0: any;\n"
      "                       default 127.0.0.1:0)\n"
      "  --device DEV         cpu or cuda:N; received tensors land there\n"
      "                       (default cpu)\n"
      "  --device-map MAP     where received tensors land by the device the\n"
      "                       sender had them on: SRC=DST[,SRC=DST...], e.g.\n"
      "                       cuda:0=cpu,cpu=cuda:1 (':' may stand for '=':\n"
      "                       cuda:0:cpu,cpu:cuda:1); devices cpu, cuda, "
      "cuda:N;\n"
      "                       unlisted senders' devices land on --device\n"
      "  --threads N          handler worker threads (default 4)\n"
      "  --metrics-port P     serve /healthz and /metrics on this port\n"
      "                       (default: no HTTP endpoint)\n"
      "  --world-size N       nodes in the world, for the master (default 1)\n"
      "  --rank R             this node's rank (default: SLURM_PROCID or\n"
      "                       OMPI_COMM_WORLD_RANK, else assigned by the "
      "master)\n"
      "  --join-timeout-ms T  give up joining after T ms (default 60000); the\n"
      "                       retries while the master is unreachable are\n"
      "                       reported (--join-timeout is the same flag)\n"
      "  --heartbeat-ms T     ping interval to peers (default 500)\n"
      "  --peer-timeout-ms T  silence before a peer is declared down\n"
      "                       (default 4000)\n"
      "  --max-msg-bytes N    largest tensor payload of one message (default\n"
      "                       4G; sizes take a K, M or G suffix)\n"
      "  --max-hdr-bytes N    largest frame header (default 16M)\n"
      "  --max-values N       most values in one message (default 65536)\n"
      "  --max-inflight-bytes N  tensor bytes one peer may have in frames\n"
      "                       being received (default 4G)\n"
      "  --max-grpc-msg-bytes N  control-plane (gRPC) receive limit (64M)\n"
      "  --max-call-depth N   deepest chain of nested calls (default 32)\n"
      "  (limits: docs/SECURITY.md)\n"
      "  --token-file FILE    shared secret (16..256 bytes): peers must prove\n"
      "                       they hold it (default: AXON_TOKEN_FILE, else\n"
      "                       no authentication)\n"
      "  --tls-ca FILE        mutual TLS on both channels (all three, or\n"
      "  --tls-cert FILE      AXON_TLS_CA/CERT/KEY): the CA that signs every\n"
      "  --tls-key FILE       member, this agent's certificate (CN = --name)\n"
      "                       and its key (scripts/make_certs.sh)\n"
      "  --insecure           allow a non-loopback --listen without a token\n"
      "                       or TLS (refused otherwise)\n"
      "  --data-transport T   tcp, tls or shm (default: AXON_DATA_TRANSPORT,\n"
      "                       else tls with TLS, else shm: TCP to other "
      "hosts,\n"
      "                       shared memory to agents of this host)\n"
      "  --plugin FILE.so     load a plugin: its models, object kinds and\n"
      "                       functions are served here (repeatable;\n"
      "                       runtime/autograd/plugin.h)\n"
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
  static const struct option lo[] = {{"name", 1, 0, 'n'},
                                     {"master", 1, 0, 'm'},
                                     {"listen", 1, 0, 'l'},
                                     {"device", 1, 0, 'd'},
                                     {"threads", 1, 0, 't'},
                                     {"metrics-port", 1, 0, 'p'},
                                     {"world-size", 1, 0, 'w'},
                                     {"rank", 1, 0, 'r'},
                                     {"join-timeout-ms", 1, 0, 'J'},
                                     {"heartbeat-ms", 1, 0, 'H'},
                                     {"peer-timeout-ms", 1, 0, 'P'},
                                     {"stay", 0, 0, 's'},
                                     {"max-msg-bytes", 1, 0, 'M'},
                                     {"device-map", 1, 0, 'D'},
                                     {"max-hdr-bytes", 1, 0, 'B'},
                                     {"max-values", 1, 0, 'V'},
                                     {"max-inflight-bytes", 1, 0, 'I'},
                                     {"max-grpc-msg-bytes", 1, 0, 'G'},
                                     {"max-call-depth", 1, 0, 'C'},
                                     {"join-timeout", 1, 0, 'J'},
                                     {"token-file", 1, 0, 'T'},
                                     {"plugin", 1, 0, 'L'},
                                     {"tls-ca", 1, 0, 'A'},
                                     {"tls-cert", 1, 0, 'E'},
                                     {"tls-key", 1, 0, 'K'},
                                     {"insecure", 0, 0, 'X'},
                                     {"data-transport", 1, 0, 'Y'},
                                     {"help", 0, 0, 'h'},
                                     {0, 0, 0, 0}};
  int c, ok = 1;
#define size_flag(flag, dst)                                                   \
  (axi_cli_int(P, flag, optarg, 1, INT64_MAX, 1, &v64)                         \
       ? (*(dst) = (size_t)v64, 1)                                             \
       : 0)
  int64_t v64;
  while (ok && (c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case 'n':
      o.name = optarg;
      break;
    case 'm':
      o.master = optarg;
      break;
    case 'l':
      o.listen = optarg;
      break;
    case 'd':
      device = optarg;
      break;
    case 'D':
      device_map = optarg;
      break;
    case 't':
      ok = axi_cli_i32(P, "--threads", optarg, 1, 1024, &o.threads);
      break;
    case 'p':
      ok = axi_cli_i32(P, "--metrics-port", optarg, 1, 65535, &metrics_port);
      break;
    case 'w':
      ok = axi_cli_i32(P, "--world-size", optarg, 1, 1 << 16, &o.world_size);
      break;
    case 'r':
      ok = axi_cli_i32(P, "--rank", optarg, -1, (1 << 16) - 1, &o.rank);
      break;
    case 'J':
      ok = axi_cli_int(P, "--join-timeout-ms", optarg, 1, INT64_MAX, 0,
                       &join_ms);
      break;
    case 'H':
      ok = axi_cli_int(P, "--heartbeat-ms", optarg, 1, 3600000, 0,
                       &o.heartbeat_ms);
      break;
    case 'P':
      ok = axi_cli_int(P, "--peer-timeout-ms", optarg, 1, INT64_MAX, 0,
                       &o.peer_timeout_ms);
      break;
    case 's':
      a.stay = 1;
      break;
    case 'L': /* models register now, before any node exists */
      if (ax_plugin_load(optarg) != AX_OK) {
        fprintf(stderr, "axon-agent: %s\n", ax_errmsg());
        return 1;
      }
      break;
    case 'T':
      o.token_file = optarg;
      break;
    case 'A':
      o.tls_ca = optarg;
      break;
    case 'E':
      o.tls_cert = optarg;
      break;
    case 'K':
      o.tls_key = optarg;
      break;
    case 'X':
      o.insecure = 1;
      break;
    case 'Y':
      o.data_transport = optarg;
      break;
    case 'M':
      ok = size_flag("--max-msg-bytes", &o.max_msg_bytes);
      break;
    case 'B':
      ok = size_flag("--max-hdr-bytes", &o.max_hdr_bytes);
      break;
    case 'V':
      ok = size_flag("--max-values", &o.max_values);
      break;
    case 'I':
      ok = size_flag("--max-inflight-bytes", &o.max_inflight_bytes);
      break;
    case 'G':
      ok = size_flag("--max-grpc-msg-bytes", &o.max_grpc_msg_bytes);
      break;
    case 'C':
      ok = axi_cli_i32(P, "--max-call-depth", optarg, 1, 1 << 20,
                       &o.max_call_depth);
      break;
    case 'h':
      usage(stdout);
      return 0;
    default:
      usage(stderr);
      return 2;
    }
  }
#undef size_flag
  if (!ok)
    return 2;
  /* The environment (srun, mpirun, the systemd unit's file) fills what the
   * flags left open: --master and --rank win over it. */
  const char *cli_master = o.master;
  if (ax_node_opts_from_env(&o) != AX_OK) {
    fprintf(stderr, "axon-agent: %s\n", ax_errmsg());
    return 2;
  }
  if (cli_master)
    o.master = cli_master;
  if (!o.name || optind != argc) {
    usage(stderr);
    return 2;
  }
  if (!axi_cli_hostport(P, "--listen", o.listen, 0) ||
      (o.master && !axi_cli_hostport(P, "--master", o.master, 1)))
    return 2;
  if (ax_device_parse(device, &o.device) != AX_OK) {
    fprintf(stderr, "axon-agent: bad --device %s\n", device);
    return 2;
  }
  if (ax_device_check(o.device) != AX_OK) {
    fprintf(stderr, "axon-agent: --device %s does not exist here: %s\n", device,
            ax_errmsg());
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
  /* libevent puts back, when a signal event is freed, the disposition it
   * found when the event was added: ignoring, so that a second SIGTERM
   * during the shutdown below cannot kill the process between that and
   * our own SIG_IGN (seen once in CI: an agent sent two SIGTERMs ended by
   * the signal instead of exiting 0). */
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
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
  /* Further signals must not kill the clean shutdown under way: libevent
   * restored the disposition set above (ignore) when freeing the events. */
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  ax_node_shutdown(a.node, 5000);
  ax_dist_fini(a.node);
  ax_node_destroy(a.node);
  fprintf(stderr, "axon-agent %s: exited\n", o.name);
  return a.exit_code;
}
