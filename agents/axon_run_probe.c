/* axon-run probe: the links between the agents of a world, as a pipeline's
 * stages use them. Every agent measures its link to every other one (the
 * agents' built-in `axon.agent.probe`: the median round trip of a small
 * call, and the best Gbit/s of three tensors of --bytes sent one way), one
 * pair at a time so that measurements do not share the network. Prints the
 * matrix and, with --out, writes one line per ordered pair:
 *
 *   # axon-run probe: FROM TO RTT_US GBIT_S
 *   stage0 stage1 52.3 18.41
 *
 * (tests/netns/netbed.sh checks a test bed's shaping with it). */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "agents/axon_run.h"
#include "axon/rpc/value.h"

#define F(field) offsetof(axi_run_cli, field)

int axi_run_probe(const axi_run_pipe_args *a, ax_node *node) {
  int n = a->local ? a->local : a->nagents;
  int iters = a->probe_iters ? a->probe_iters : 200;
  int64_t bytes = a->probe_bytes ? a->probe_bytes : (int64_t)16 << 20;
  FILE *out = NULL;
  if (a->probe_out && !(out = fopen(a->probe_out, "w")))
    return ax_seterr(AX_EIO, "probe: cannot write %s", a->probe_out);
  if (out)
    fprintf(out,
            "# axon-run probe: FROM TO RTT_US GBIT_S (%d calls, %lld "
            "bytes)\n",
            iters, (long long)bytes);
  printf("axon-run probe: %d agents, median round trip of %d small calls "
         "(us) / best Gbit/s of %lld-byte tensors\n",
         n, iters, (long long)bytes);
  int rc = AX_OK;
  for (int i = 0; i < n && rc == AX_OK; i++)
    for (int j = 0; j < n && rc == AX_OK; j++) {
      if (i == j)
        continue;
      ax_values *args = ax_values_new(), *res = NULL;
      rc = args ? AX_OK : AX_ENOMEM;
      if (rc == AX_OK)
        rc = ax_values_add_str(args, a->agents[j]);
      if (rc == AX_OK)
        rc = ax_values_add_i64(args, iters);
      if (rc == AX_OK)
        rc = ax_values_add_i64(args, bytes);
      ax_call_opts o = {.timeout_ms = 300000};
      if (rc == AX_OK)
        rc =
            ax_rpc_sync(node, a->agents[i], "axon.agent.probe", args, &o, &res);
      double rtt = 0, gbit = 0;
      if (rc == AX_OK && (ax_values_get_f64(res, 0, &rtt) != AX_OK ||
                          ax_values_get_f64(res, 1, &gbit) != AX_OK))
        rc = ax_seterr(AX_EMALFORMED, "probe: %s answered without figures",
                       a->agents[i]);
      if (rc == AX_OK) {
        printf("  %-12s -> %-12s %10.1f us %9.2f Gbit/s\n", a->agents[i],
               a->agents[j], rtt, gbit);
        if (out)
          fprintf(out, "%s %s %.1f %.6g\n", a->agents[i], a->agents[j], rtt,
                  gbit);
      }
      ax_values_free(args);
      ax_values_free(res);
    }
  if (out && fclose(out) && rc == AX_OK)
    rc = ax_seterr(AX_EIO, "probe: cannot write %s", a->probe_out);
  fflush(stdout);
  return rc;
}

/* The world comes from train's options (--local, or --agents and
 * --master); the pipeline's checks hold for it as for training. */
static int probe_main(int argc, char **argv) {
  static axi_run_cli r;
  int rc = axi_run_cli_parse(&axi_run_probe_cmd, argc, argv, &r);
  if (rc >= 0)
    return rc;
  if (!axi_run_cli_pipe(&r) || r.pa.emulate) {
    fprintf(stderr, "axon-run probe: needs --local K, or --agents A,B,... "
                    "--master HOST:PORT\n");
    return 2;
  }
  r.pa.probe = 1;
  if ((rc = axi_run_cli_check_pipe(&r)) >= 0)
    return rc;
  axi_run_cli_to_pipe(&r);
  return axi_run_pipe_main(&r.pa);
}

static const axi_cli_opt g_probe_opts[] = {
    {"iters", "N", AXI_CLI_INT, F(pa.probe_iters), 1, 100000,
     .help = "small calls per pair (200)"},
    {"bytes", "N", AXI_CLI_I64, F(pa.probe_bytes), 4, (int64_t)1 << 31,
     AXI_CLI_UNITS, .help = "the tensor's size, K/M/G suffixes (16M)"},
    {"out", "FILE", AXI_CLI_STR, F(pa.probe_out),
     .help = "write 'FROM TO RTT_US GBIT_S' lines"},
    AXI_CLI_END};

static const axi_cli_opt *const g_probe_tables[] = {g_probe_opts, NULL};

const axi_cli_cmd axi_run_probe_cmd = {
    "probe",
    "(--local K | --agents A,B,... --master HOST:PORT)\n"
    "[--iters N (200)] [--bytes N (16M)] [--out FILE]",
    "Every ordered pair of agents: the median round trip of a small call and\n"
    "the best Gbit/s of a tensor of --bytes; --out writes 'FROM TO RTT_US\n"
    "GBIT_S' lines.",
    g_probe_tables,
    &axi_run_train_cmd,
    0,
    probe_main};
