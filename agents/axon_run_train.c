/* axon-run train: trains a model in this process (ax_train_local), or with
 * --local/--stages/--emulate as a pipeline over remote stages
 * (axon_run_pipe.c; those options and their checks in
 * axon_run_train_pipe.c). The parse and checks here serve probe and plan
 * too, which take train's options. */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agents/axon_run.h"
#include "axon/kernels/error.h"

#define F(field) offsetof(axi_run_cli, field)

/* --plugin: loaded now (its models are looked up below); --local agents
 * get the absolute path. */
static int add_plugin(void *dst, const char *s) {
  axi_run_cli *r = dst;
  if (ax_plugin_load(s) != AX_OK) {
    fprintf(stderr, "axon-run: %s\n", ax_errmsg());
    return 1;
  }
  int n = r->pa.nplugins;
  if (n < AX_PLUGIN_MAX && realpath(s, r->plugin_path[n])) {
    r->plugins[n] = r->plugin_path[n];
    r->pa.plugins = r->plugins;
    r->pa.nplugins++;
  }
  return 0;
}

static const axi_cli_opt g_train_opts[] = {
    {"model", "NAME", AXI_CLI_STR, F(o.model),
     .help = "mlp | resnet20 | bert, or a plugin's model\n(default mlp)"},
    {"model-config", "K=V,..", AXI_CLI_STR, F(o.model_config),
     .help = "model settings, e.g. widths=784/256/10 or layers=3"},
    {"dataset", "NAME", AXI_CLI_STR, F(o.dataset),
     .help = "fashion-mnist | cifar10 | gcide | text | tokens |\n"
             "synthetic (default fashion-mnist)"},
    {"data-config", "K=V,..", AXI_CLI_STR, F(o.data_config),
     .help = "data-set settings, e.g. pad=1, limit=N, dir=PATH"},
    {"optim", "K=V,..", AXI_CLI_STR, F(o.optim_config),
     .help = "opt=sgd|adamw, lr, momentum, wd, nesterov, sched=\n"
             "const|step|cosine, warmup, ... (default\n"
             "opt=adamw,lr=2e-3,wd=0,sched=cosine)"},
    {"epochs", "N", AXI_CLI_INT, F(o.epochs), 1, 1000000,
     .help = "epochs (default 1)"},
    {"steps", "N", AXI_CLI_LONG, F(o.max_steps), 1, LONG_MAX,
     .help = "stop after N >= 1 steps (default: no limit)"},
    {"batch", "N", AXI_CLI_INT, F(o.batch), 1, 1 << 20,
     .help = "mini-batch size (default 64)"},
    {"eval-batch", "N", AXI_CLI_INT, F(o.eval_batch), 1, 1 << 20,
     .help = "evaluation batch size (default 500)"},
    {"eval-limit", "N", AXI_CLI_LONG, F(o.eval_limit), 1, LONG_MAX,
     .help = "evaluate on at most N test examples (default all)"},
    {"seed", "N", AXI_CLI_I64, F(o.seed), 0, INT64_MAX,
     .help = "seed for initialisation, shuffling, dropout (1)"},
    {"threads", "N", AXI_CLI_INT, F(threads), 1, 1024,
     .help = "CPU threads, 1..1024 (default: all cores)"},
    {"device", "DEV", AXI_CLI_DEVICE, F(o.device),
     .help = "cpu | cuda:N (default cpu)"},
    {"csv", "FILE", AXI_CLI_STR, F(o.csv_path),
     .help = "write the loss curve (step,epoch,loss,lr,samples_per_s)"},
    {"quiet", NULL, AXI_CLI_FLAG, F(quiet), .help = "no progress bar"},
    {"plugin", "FILE.so", AXI_CLI_FN, .fn = add_plugin,
     .help = "load a plugin (its models; repeatable); --local\n"
             "agents load it too (runtime/autograd/plugin.h)"},
    AXI_CLI_END};

static void defaults(axi_run_cli *r) {
  memset(r, 0, sizeof *r);
  r->o = ax_train_defaults();
  r->o.progress = stderr;
  r->pa.M = 4;
  r->pa.mode = AX_MODE_PIPEDREAM;
  r->pa.agent_threads = 4;
  r->pa.partition = "uniform";
}

int axi_run_cli_parse(const axi_cli_cmd *c, int argc, char **argv,
                      axi_run_cli *r) {
  defaults(r);
  int rc = axi_cli_parse(&axi_run_prog, c, 2, argc, argv, r);
  if (rc >= 0)
    return rc;
  ax_train_opts *o = &r->o;
  if (o->epochs < 1 || o->batch < 1 || o->eval_batch < 1) {
    fprintf(stderr, "axon-run: --epochs, --batch and --eval-batch must be "
                    "positive\n");
    return 2;
  }
  if (!o->data_config && strcmp(o->model, "resnet20") == 0 &&
      strcmp(o->dataset, "fashion-mnist") == 0)
    o->data_config = "pad=1";
  if (r->quiet)
    o->progress = NULL;
  if (axi_run_check_configs(o) != AX_OK) {
    fprintf(stderr, "axon-run: %s\n", ax_errmsg());
    return 2;
  }
  return -1;
}

int axi_run_cli_pipe(const axi_run_cli *r) {
  return r->pa.local > 0 || r->pa.K > 0 || r->pa.agents || r->pa.emulate;
}

void axi_run_cli_to_pipe(axi_run_cli *r) {
  const ax_train_opts *o = &r->o;
  axi_run_pipe_args *pa = &r->pa;
  pa->model = o->model, pa->model_config = o->model_config;
  pa->dataset = o->dataset, pa->data_config = o->data_config;
  pa->optim = o->optim_config, pa->epochs = o->epochs, pa->batch = o->batch;
  pa->eval_batch = o->eval_batch, pa->steps = o->max_steps;
  pa->eval_limit = o->eval_limit, pa->seed = o->seed, pa->device = o->device;
  pa->csv = o->csv_path, pa->quiet = r->quiet;
  ax_cpu_set_threads(r->threads ? r->threads : 1);
}

/* Training in this process. */
static int train_here(axi_run_cli *r) {
  const ax_train_opts *o = &r->o;
  ax_cpu_set_threads(r->threads);
  fprintf(stderr,
          "axon-run: training %s on %s, %d epoch(s), batch %d, %d "
          "thread(s)\n",
          o->model, o->dataset, o->epochs, o->batch, ax_cpu_threads());
  ax_train_report rep;
  int rc = ax_train_local(o, &rep);
  if (rc != AX_OK) {
    fprintf(stderr, "axon-run: %s: %s\n", ax_strerror(rc), ax_errmsg());
    free(rep.loss_curve);
    return 1;
  }
  printf("summary: model=%s dataset=%s steps=%ld final_loss=%.4f "
         "test_accuracy=%.2f%% samples_per_s=%.1f train_seconds=%.1f "
         "test_loss=%.9g",
         o->model, o->dataset, rep.steps, rep.final_loss,
         100.0 * rep.test_accuracy, rep.samples_per_s, rep.train_seconds,
         rep.test_loss);
  axi_run_print_bits("final", rep.final_loss, rep.token_unit);
  axi_run_print_bits("test", rep.test_loss, rep.token_unit);
  printf("\n");
  free(rep.loss_curve);
  return 0;
}

static int train_main(int argc, char **argv) {
  static axi_run_cli r;
  int rc = axi_run_cli_parse(&axi_run_train_cmd, argc, argv, &r);
  if (rc < 0)
    rc = axi_run_cli_check_pipe(&r);
  if (rc >= 0)
    return rc;
  if (!axi_run_cli_pipe(&r))
    return train_here(&r);
  axi_run_cli_to_pipe(&r);
  return axi_run_pipe_main(&r.pa);
}

static const axi_cli_opt *const g_train_tables[] = {
    g_train_opts, axi_run_pipe_opts, axi_run_ckpt_opts, NULL};

const axi_cli_cmd axi_run_train_cmd = {
    "train",
    "[options]",
    "Trains a model in this process, or split into pipeline stages over "
    "agents\n(--local / --stages), and reports test accuracy. ResNet20 on "
    "Fashion-MNIST\nneeds --data-config pad=1 (32x32 inputs); the defaults "
    "set it when\n--model resnet20 --dataset fashion-mnist is given.",
    g_train_tables,
    NULL,
    0,
    train_main};
