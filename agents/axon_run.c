/* axon-run: the ready-made coordinator CLI.
 *
 *   axon-run COMMAND [options]
 *
 * One file per command, each with its table of options (agents/axon_cli.h):
 * train (axon_run_train.c; with --stages/--local a pipeline over remote
 * stages, axon_run_pipe.c), eval and export (axon_run_use.c), probe
 * (axon_run_probe.c), plan (axon_run_plan.c), generate (axon_run_gen.c),
 * schedule (axon_run_schedule.c). */
#include "agents/axon_run.h"
#include "agents/axon_cli.h"

static const axi_cli_cmd *const g_cmds[] = {
    &axi_run_train_cmd,   &axi_run_eval_cmd, &axi_run_export_cmd,
    &axi_run_probe_cmd,   &axi_run_plan_cmd, &axi_run_gen_cmd,
    &axi_run_schedule_cmd};

const axi_cli_prog axi_run_prog = {"axon-run", g_cmds,
                                   sizeof g_cmds / sizeof g_cmds[0], 24, "h"};

int main(int argc, char **argv) {
  return axi_cli_dispatch(
      &axi_run_prog,
      "usage: axon-run COMMAND [options]\n"
      "\n"
      "  train    trains a model, in this process or as a pipeline over "
      "agents\n"
      "  eval     test accuracy of a checkpoint, in one process\n"
      "  export   a checkpoint's whole model in one file\n"
      "  probe    the links between every pair of agents\n"
      "  plan     every mode and split predicted over those links\n"
      "  generate text from a checkpoint, in one process or over agents\n"
      "  schedule a mode's action lists as text, or a schedule file checked\n"
      "\n"
      "axon-run COMMAND --help describes one command; every command's "
      "options:\n",
      argc, argv);
}
