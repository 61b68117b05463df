/* axon-run eval --checkpoint DIR|FILE and axon-run export --checkpoint DIR
 * --out FILE: a pipeline's checkpoint used without the pipeline, as one
 * net in this process (runtime/pipeline/state/checkpoint.h: the stages' flat
 * buffers joined in block order are the whole model's). */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "agents/axon_run.h"
#include "axon/models/config.h"
#include "axon/models/data/dataset.h"
#include "axon/models/model.h"
#include "axon/runtime/pipeline/state/checkpoint.h"

static int fail(int rc) {
  fprintf(stderr, "axon-run: %s: %s\n", ax_strerror(rc), ax_errmsg());
  return 1;
}

static int eval(const char *path, int batch, long limit, ax_device dev) {
  ax_net *net = NULL;
  ax_ckpt_info info;
  int rc = ax_ckpt_load_net(path, dev, &net, &info);
  if (rc != AX_OK)
    return fail(rc);
  const ax_model_def *def = ax_model_find(info.model);
  ax_config mcfg, dcfg;
  ax_model_info mi;
  ax_dataset *test = NULL;
  rc = def ? ax_model_config(def, info.model_config, &mcfg) : AX_ENOTFOUND;
  if (rc == AX_OK)
    rc = ax_model_describe(def, &mcfg, &mi);
  if (rc == AX_OK)
    rc = ax_config_parse(&dcfg, info.data_config);
  if (rc == AX_OK)
    rc = ax_dataset_open(info.dataset, &dcfg, AX_SPLIT_TEST, &test);
  double acc = 0, loss = 0;
  if (rc == AX_OK)
    rc = ax_evaluate(net, test, batch, limit, mi.ignore_index, &acc, &loss);
  const char *unit = ax_dataset_token_unit(test);
  ax_dataset_close(test);
  ax_net_free(net);
  if (rc != AX_OK)
    return fail(rc);
  printf("eval: model=%s dataset=%s step=%ld test_accuracy=%.2f%% "
         "test_loss=%.9g",
         info.model, info.dataset, info.step, 100.0 * acc, loss);
  axi_run_print_bits("test", loss, unit);
  printf("\n");
  return 0;
}

/* What eval's and export's options fill. */
typedef struct use_cli {
  const char *ckpt, *out;
  int batch, threads;
  long limit;
  ax_device dev;
} use_cli;

/* eval and export share their options (export reads --checkpoint and
 * --out, eval the others). */
static int use_main(int argc, char **argv) {
  const axi_cli_cmd *c =
      strcmp(argv[1], "eval") ? &axi_run_export_cmd : &axi_run_eval_cmd;
  use_cli u = {.batch = 500, .dev = AX_CPU};
  int rc = axi_cli_parse(&axi_run_prog, c, 2, argc, argv, &u);
  if (rc >= 0)
    return rc;
  int exp = c == &axi_run_export_cmd;
  if (!u.ckpt || (exp && !u.out)) {
    fprintf(stderr, "axon-run: %s needs --checkpoint DIR%s (try --help)\n",
            c->name, exp ? " and --out FILE" : "");
    return 2;
  }
  ax_cpu_set_threads(u.threads);
  if (!exp)
    return eval(u.ckpt, u.batch, u.limit, u.dev);
  if ((rc = ax_ckpt_export(u.ckpt, u.out)) != AX_OK)
    return fail(rc);
  printf("export: %s -> %s\n", u.ckpt, u.out);
  return 0;
}

#define F(field) offsetof(use_cli, field)

static const axi_cli_opt g_use_opts[] = {
    {"checkpoint", "DIR|FILE", AXI_CLI_STR, F(ckpt),
     .help = "a checkpoint's directory, or an exported file"},
    {"out", "FILE", AXI_CLI_STR, F(out),
     .help = "export: the file written, the whole model"},
    {"eval-batch", "N", AXI_CLI_INT, F(batch), 1, 1 << 20,
     .help = "eval: evaluation batch size (default 500)"},
    {"eval-limit", "N", AXI_CLI_LONG, F(limit), 1, LONG_MAX,
     .help = "eval: at most N test examples (default all)"},
    {"threads", "N", AXI_CLI_INT, F(threads), 1, 1024,
     .help = "CPU threads, 1..1024 (default: all cores)"},
    {"device", "DEV", AXI_CLI_DEVICE, F(dev),
     .help = "cpu | cuda:N (default cpu)"},
    AXI_CLI_END};

static const axi_cli_opt *const g_use_tables[] = {g_use_opts, NULL};

const axi_cli_cmd axi_run_eval_cmd = {
    "eval",
    "--checkpoint DIR|FILE [--eval-batch N] [--eval-limit N]\n"
    "[--threads N] [--device DEV]",
    "Test accuracy of a checkpoint's model in one process.",
    g_use_tables,
    NULL,
    1,
    use_main};

const axi_cli_cmd axi_run_export_cmd = {
    "export",
    "--checkpoint DIR|FILE --out FILE",
    "A checkpoint's whole model in one file.",
    g_use_tables,
    NULL,
    1,
    use_main};
