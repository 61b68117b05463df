/* axon-agent: the daemon on each host. It joins the master, serves the
 * registered functions (and those of its --plugin files), answers /healthz
 * and /metrics, and exits cleanly (0) when the master ends the world
 * (ax_node_shutdown_world) or on SIGINT or SIGTERM, with 3 when the master
 * goes away without ending it. */
#include <event2/event.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agents/axon_agent.h"
#include "agents/axon_cli.h"

#define P "axon-agent"
#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/autograd/plugin.h"
#include "axon/runtime/pipeline/pipeline.h"

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

/* What the command line fills. */
typedef struct agent_cli {
  ax_node_opts o;
  int metrics_port; /* -1: no HTTP endpoint */
  int64_t join_ms;
  const char *device_map;
  int stay;
} agent_cli;

/* --plugin: its models register now, before any node exists. */
static int load_plugin(void *dst, const char *s) {
  if (ax_plugin_load(s) == AX_OK)
    return 0;
  fprintf(stderr, "axon-agent: %s\n", ax_errmsg());
  return 1;
}

#define F(field) offsetof(agent_cli, field)
#define SIZE_OPT(name, field, text)                                            \
  {                                                                            \
    name, "N", AXI_CLI_SIZE, F(field), 1, INT64_MAX, AXI_CLI_UNITS,            \
        .help = text                                                           \
  }

static const axi_cli_opt g_opts[] = {
    {"name", "NAME", AXI_CLI_STR, F(o.name),
     .help = "unique node name (required)"},
    {"master", "HOST:PORT", AXI_CLI_STR, F(o.master),
     .help = "master to join; default from AXON_MASTER_ADDR and\n"
             "AXON_MASTER_PORT; equal to --listen: this agent\n"
             "is the master"},
    {"listen", "ADDR", AXI_CLI_STR, F(o.listen),
     .help = "control-plane address HOST:PORT (port 0: any;\n"
             "default 127.0.0.1:0)"},
    {"device", "DEV", AXI_CLI_DEVICE, F(o.device),
     .help = "cpu or cuda:N; received tensors land there\n(default cpu)"},
    {"device-map", "MAP", AXI_CLI_STR, F(device_map),
     .help = "where received tensors land by the device the\n"
             "sender had them on: SRC=DST[,SRC=DST...], e.g.\n"
             "cuda:0=cpu,cpu=cuda:1 (':' may stand for '=':\n"
             "cuda:0:cpu,cpu:cuda:1); devices cpu, cuda, cuda:N;\n"
             "unlisted senders' devices land on --device"},
    {"threads", "N", AXI_CLI_INT, F(o.threads), 1, 1024,
     .help = "handler worker threads (default 4)"},
    {"metrics-port", "P", AXI_CLI_INT, F(metrics_port), 1, 65535,
     .help = "serve /healthz and /metrics on this port\n"
             "(default: no HTTP endpoint)"},
    {"world-size", "N", AXI_CLI_INT, F(o.world_size), 1, 1 << 16,
     .help = "nodes in the world, for the master (default 1)"},
    {"rank", "R", AXI_CLI_INT, F(o.rank), -1, (1 << 16) - 1,
     .help = "this node's rank (default: SLURM_PROCID or\n"
             "OMPI_COMM_WORLD_RANK, else assigned by the master)"},
    {"join-timeout-ms", "T", AXI_CLI_I64, F(join_ms), 1, INT64_MAX,
     .help = "give up joining after T ms (default 60000); the\n"
             "retries while the master is unreachable are\n"
             "reported (--join-timeout is the same flag)"},
    {"join-timeout", "T", AXI_CLI_I64, F(join_ms), 1, INT64_MAX},
    {"heartbeat-ms", "T", AXI_CLI_I64, F(o.heartbeat_ms), 1, 3600000,
     .help = "ping interval to peers (default 500)"},
    {"peer-timeout-ms", "T", AXI_CLI_I64, F(o.peer_timeout_ms), 1, INT64_MAX,
     .help = "silence before a peer is declared down\n(default 4000)"},
    SIZE_OPT("max-msg-bytes", o.max_msg_bytes,
             "largest tensor payload of one message (default\n"
             "4G; sizes take a K, M or G suffix)"),
    SIZE_OPT("max-hdr-bytes", o.max_hdr_bytes,
             "largest frame header (default 16M)"),
    SIZE_OPT("max-values", o.max_values,
             "most values in one message (default 65536)"),
    SIZE_OPT("max-inflight-bytes", o.max_inflight_bytes,
             "tensor bytes one peer may have in frames\n"
             "being received (default 4G)"),
    SIZE_OPT("max-grpc-msg-bytes", o.max_grpc_msg_bytes,
             "control-plane (gRPC) receive limit (64M)"),
    {"max-call-depth", "N", AXI_CLI_INT, F(o.max_call_depth), 1, 1 << 20,
     .help = "deepest chain of nested calls (default 32)"},
    {.help = "  (limits: docs/SECURITY.md)"},
    {"token-file", "FILE", AXI_CLI_STR, F(o.token_file),
     .help = "shared secret (16..256 bytes): peers must prove\n"
             "they hold it (default: AXON_TOKEN_FILE, else\n"
             "no authentication)"},
    {"tls-ca", "FILE", AXI_CLI_STR, F(o.tls_ca),
     .help = "mutual TLS on both channels (all three, or\n"
             "AXON_TLS_CA/CERT/KEY): the CA that signs every\nmember"},
    {"tls-cert", "FILE", AXI_CLI_STR, F(o.tls_cert),
     .help = "this agent's certificate (CN = --name)"},
    {"tls-key", "FILE", AXI_CLI_STR, F(o.tls_key),
     .help = "its key (scripts/make_certs.sh)"},
    {"insecure", NULL, AXI_CLI_FLAG, F(o.insecure),
     .help = "allow a non-loopback --listen without a token\n"
             "or TLS (refused otherwise)"},
    {"data-transport", "T", AXI_CLI_STR, F(o.data_transport),
     .help = "tcp, tls or shm (default: AXON_DATA_TRANSPORT,\n"
             "else tls with TLS, else shm: TCP to other hosts,\n"
             "shared memory to agents of this host)"},
    {"plugin", "FILE.so", AXI_CLI_FN, .fn = load_plugin,
     .help = "load a plugin: its models, object kinds and\n"
             "functions are served here (repeatable;\n"
             "runtime/autograd/plugin.h)"},
    {"stay", NULL, AXI_CLI_FLAG, F(stay),
     .help = "keep serving when the master goes away"},
    AXI_CLI_END};

static const axi_cli_opt *const g_tables[] = {g_opts, NULL};
static const axi_cli_cmd g_cmd = {
    NULL, "--name NAME --master HOST:PORT [options]", NULL, g_tables};
static const axi_cli_cmd *const g_cmds[] = {&g_cmd};
static const axi_cli_prog g_prog = {P, g_cmds, 1, 23, ""};

/* The command line, then what the environment (srun, mpirun, the systemd
 * unit's file) fills where the flags left it open: --master and --rank
 * win over it. -1, or the exit status. */
static int parse(int argc, char **argv, agent_cli *c) {
  ax_node_opts_init(&c->o);
  c->metrics_port = -1;
  c->join_ms = 60000;
  int rc = axi_cli_parse(&g_prog, &g_cmd, 1, argc, argv, c);
  if (rc >= 0)
    return rc;
  ax_node_opts *o = &c->o;
  const char *cli_master = o->master;
  if (ax_node_opts_from_env(o) != AX_OK) {
    fprintf(stderr, "axon-agent: %s\n", ax_errmsg());
    return 2;
  }
  if (cli_master)
    o->master = cli_master;
  if (!o->name) {
    axi_cli_help(&g_prog, &g_cmd, stderr);
    return 2;
  }
  if (!axi_cli_hostport(P, "--listen", o->listen, 0) ||
      (o->master && !axi_cli_hostport(P, "--master", o->master, 1)))
    return 2;
  if (ax_device_map_parse(c->device_map, &o->device_map) != AX_OK) {
    fprintf(stderr, "axon-agent: bad --device-map: %s\n", ax_errmsg());
    return 2;
  }
  return -1;
}

/* The node with the built-in functions, RRefs, remote stages, distributed
 * autograd and optimizer, and the plugins' kinds and functions. AX_OK, or
 * the error (reported; nothing left). */
static int start_node(const ax_node_opts *o, agent *a) {
  int rc = ax_node_create(o, &a->node);
  if (rc == AX_OK)
    rc = ax_agent_register_builtins(a->node);
  int dist = 0;
  if (rc == AX_OK)
    dist = (rc = ax_pipe_init(a->node)) == AX_OK;
  if (rc == AX_OK)
    rc = ax_plugin_attach(a->node);
  if (rc == AX_OK)
    return AX_OK;
  fprintf(stderr, "axon-agent %s: %s: %s\n", o->name, ax_strerror(rc),
          ax_errmsg());
  if (dist) {
    ax_node_shutdown(a->node, 1000);
    ax_dist_fini(a->node);
  }
  ax_node_destroy(a->node);
  return rc;
}

/* Serves /healthz and /metrics on the node's host at port (reported when
 * it cannot). */
static void start_http(agent *a, const char *name, int port) {
  char host[128];
  snprintf(host, sizeof host, "%s", ax_node_address(a->node));
  char *colon = strrchr(host, ':');
  if (colon)
    *colon = 0;
  if (ax_agent_http_start(a->base, a->node, host, port) != AX_OK)
    fprintf(stderr, "axon-agent %s: %s\n", name, ax_errmsg());
}

/* Joins and serves until a signal, the end of the world or the master's
 * loss, then ends the node. The exit status. */
static int serve(agent *a, const agent_cli *c) {
  const char *name = c->o.name;
  /* Signals are caught from here on: one that arrives while joining is
   * handled (a clean shutdown) as soon as the join returns. */
  a->base = event_base_new();
  /* libevent puts back, when a signal event is freed, the disposition it
   * found when the event was added: ignoring, so that a second SIGTERM
   * during the shutdown below cannot kill the process between that and
   * our own SIG_IGN (seen once in CI: an agent sent two SIGTERMs ended by
   * the signal instead of exiting 0). */
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  struct event *sint = evsignal_new(a->base, SIGINT, on_signal, a);
  struct event *sterm = evsignal_new(a->base, SIGTERM, on_signal, a);
  struct event *tick = event_new(a->base, -1, EV_PERSIST, on_tick, a);
  struct timeval tv = {0, 200000};
  event_add(sint, NULL);
  event_add(sterm, NULL);
  event_add(tick, &tv);
  int rc = ax_node_join(a->node, c->join_ms), joined = rc == AX_OK;
  if (!joined) {
    fprintf(stderr, "axon-agent %s: join failed: %s: %s\n", name,
            ax_strerror(rc), ax_errmsg());
  } else {
    fprintf(stderr, "axon-agent %s: rank %d of %d\n", name,
            ax_node_rank(a->node), ax_node_world_size(a->node));
    if (c->metrics_port >= 0)
      start_http(a, name, c->metrics_port);
    event_base_dispatch(a->base);
    ax_agent_http_stop();
  }
  event_free(sint);
  event_free(sterm);
  event_free(tick);
  event_base_free(a->base);
  if (!joined) {
    ax_node_destroy(a->node);
    return 1;
  }
  /* Further signals must not kill the clean shutdown under way: libevent
   * restored the disposition set above (ignore) when freeing the events. */
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  ax_node_shutdown(a->node, 5000);
  ax_dist_fini(a->node);
  ax_node_destroy(a->node);
  fprintf(stderr, "axon-agent %s: exited\n", name);
  return a->exit_code;
}

int main(int argc, char **argv) {
  static agent_cli c;
  int rc = parse(argc, argv, &c);
  if (rc >= 0)
    return rc;
  ax_node_opts *o = &c.o;
  signal(SIGPIPE, SIG_IGN);
  if (!o->master)
    o->master = o->listen; /* no master given: this agent is the master */
  agent a = {.stay = c.stay};
  if (start_node(o, &a) != AX_OK)
    return 1;
  char ds[16], dm[512];
  fprintf(stderr, "axon-agent %s: serving on %s, joining %s, device %s%s%s\n",
          o->name, ax_node_address(a.node), o->master,
          ax_device_str(o->device, ds, sizeof ds),
          o->device_map.n ? ", device map " : "",
          ax_device_map_str(&o->device_map, dm, sizeof dm));
  return serve(&a, &c);
}
