/* axon-run eval --checkpoint DIR|FILE and axon-run export --checkpoint DIR
 * --out FILE: a pipeline's checkpoint used without the pipeline, as one
 * net in this process (runtime/pipeline/state/checkpoint.h: the stages' flat
 * buffers joined in block order are the whole model's). */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "agents/axon_cli.h"
#include "agents/axon_run.h"
#include "axon/models/config.h"
#include "axon/models/data/dataset.h"
#include "axon/models/model.h"
#include "axon/runtime/pipeline/state/checkpoint.h"

#define P "axon-run"

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
    rc = def->describe(&mcfg, &mi);
  if (rc == AX_OK)
    rc = ax_config_parse(&dcfg, info.data_config);
  if (rc == AX_OK)
    rc = ax_dataset_open(info.dataset, &dcfg, AX_SPLIT_TEST, &test);
  double acc = 0, loss = 0;
  if (rc == AX_OK)
    rc = ax_evaluate(net, test, batch, limit, mi.ignore_index, &acc, &loss);
  ax_dataset_close(test);
  ax_net_free(net);
  if (rc != AX_OK)
    return fail(rc);
  printf("eval: model=%s dataset=%s step=%ld test_accuracy=%.2f%% "
         "test_loss=%.9g\n",
         info.model, info.dataset, info.step, 100.0 * acc, loss);
  return 0;
}

int axi_run_use_main(int argc, char **argv) {
  const char *cmd = argv[1], *ckpt = NULL, *out = NULL;
  int batch = 500, threads = 0, ok = 1, c;
  long limit = 0;
  int64_t v;
  ax_device dev = AX_CPU;
  static const struct option opts[] = {
      {"checkpoint", 1, 0, 'c'}, {"out", 1, 0, 'o'},
      {"eval-batch", 1, 0, 'E'}, {"eval-limit", 1, 0, 'L'},
      {"threads", 1, 0, 't'},    {"device", 1, 0, 'v'},
      {"help", 0, 0, 'h'},       {0, 0, 0, 0}};
  optind = 2;
  while (ok && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'c':
      ckpt = optarg;
      break;
    case 'o':
      out = optarg;
      break;
    case 'E':
      ok = axi_cli_i32(P, "--eval-batch", optarg, 1, 1 << 20, &batch);
      break;
    case 'L':
      ok = axi_cli_int(P, "--eval-limit", optarg, 1, LONG_MAX, 0, &v);
      limit = (long)v;
      break;
    case 't':
      ok = axi_cli_i32(P, "--threads", optarg, 1, 1024, &threads);
      break;
    case 'v':
      if (ax_device_parse(optarg, &dev) != AX_OK ||
          ax_device_check(dev) != AX_OK) {
        fprintf(stderr, "axon-run: --device %s: %s\n", optarg, ax_errmsg());
        return 2;
      }
      break;
    case 'h':
      printf("usage: axon-run eval --checkpoint DIR|FILE [--eval-batch N] "
             "[--eval-limit N] [--threads N] [--device DEV]\n"
             "       axon-run export --checkpoint DIR|FILE --out FILE\n");
      return 0;
    default:
      return 2;
    }
  }
  if (!ok)
    return 2;
  if (optind != argc || !ckpt || (!strcmp(cmd, "export") && !out)) {
    fprintf(stderr, "axon-run: %s needs --checkpoint DIR%s (try --help)\n", cmd,
            strcmp(cmd, "export") ? "" : " and --out FILE");
    return 2;
  }
  ax_cpu_set_threads(threads);
  if (!strcmp(cmd, "eval"))
    return eval(ckpt, batch, limit, dev);
  int rc = ax_ckpt_export(ckpt, out);
  if (rc != AX_OK)
    return fail(rc);
  printf("export: %s -> %s\n", ckpt, out);
  return 0;
}
