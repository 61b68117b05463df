/* axon-run: the ready-made coordinator CLI.
 *
 *   axon-run train --model mlp|resnet20|bert --dataset NAME [options]
 *
 * Trains in one process, or (with --stages/--local) as a pipeline over
 * remote stages (axon_run_pipe.c). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <limits.h>

#include "agents/axon_cli.h"
#include "agents/axon_run.h"
#include "axon/runtime/autograd/plugin.h"
#include "axon/runtime/pipeline/state/freeze.h"

#define P "axon-run"
#include "axon/kernels/error.h"
#include "axon/runtime/pipeline/coord/coordinator.h"
#include "axon/runtime/pipeline/coord/train.h"
#include "axon/runtime/pipeline/stage/stage_host.h"
#include "axon/runtime/pipeline/stage/staleness.h"

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: axon-run train [options]\n"
      "       axon-run eval|export --checkpoint DIR ...\n"
      "       axon-run plan --stages K [--agents A,B,...] [--links FILE] "
      "[--modes all|M,..]\n"
      "                     [--mem-cap BYTES] [--action-us US] "
      "[--compute-scale X]\n"
      "                     [train's model options]\n"
      "         every mode and split (uniform, balanced) predicted with the "
      "timing\n"
      "         model over the links of FILE (axon-run probe --out): ms/step,\n"
      "         samples/s, peak memory per agent; picks the fastest under the "
      "cap\n"
      "       axon-run probe (--local K | --agents A,B,... --master "
      "HOST:PORT)\n"
      "                      [--iters N (200)] [--bytes N (16M)] [--out FILE]\n"
      "         every ordered pair of agents: the median round trip of a "
      "small\n"
      "         call and the best Gbit/s of a tensor of --bytes; --out writes\n"
      "         'FROM TO RTT_US GBIT_S' lines\n"
      "\n"
      "Trains a model in this process, or split into pipeline stages over "
      "agents\n"
      "(--local / --stages), and reports test accuracy.\n"
      "\n"
      "  --model NAME          mlp | resnet20 | bert, or a plugin's model\n"
      "                        (default mlp)\n"
      "  --model-config K=V,.. model settings, e.g. widths=784/256/10 or "
      "layers=3\n"
      "  --dataset NAME        fashion-mnist | cifar10 | gcide | synthetic\n"
      "                        (default fashion-mnist)\n"
      "  --data-config K=V,..  data-set settings, e.g. pad=1, limit=N, "
      "dir=PATH\n"
      "  --optim K=V,..        opt=sgd|adamw, lr, momentum, wd, nesterov, "
      "sched=\n"
      "                        const|step|cosine, warmup, ... (default\n"
      "                        opt=adamw,lr=2e-3,wd=0,sched=cosine)\n"
      "  --epochs N            epochs (default 1)\n"
      "  --steps N             stop after N >= 1 steps (default: no limit)\n"
      "  --batch N             mini-batch size (default 64)\n"
      "  --eval-batch N        evaluation batch size (default 500)\n"
      "  --eval-limit N        evaluate on at most N test examples (default "
      "all)\n"
      "  --seed N              seed for initialisation, shuffling, dropout "
      "(1)\n"
      "  --threads N           CPU threads, 1..1024 (default: all cores)\n"
      "  --device DEV          cpu | cuda:N (default cpu)\n"
      "  --csv FILE            write the loss curve "
      "(step,epoch,loss,lr,samples_per_s)\n"
      "  --quiet               no progress bar\n"
      "  --plugin FILE.so      load a plugin (its models; repeatable); "
      "--local\n"
      "                        agents load it too (runtime/autograd/plugin.h)\n"
      "\n"
      "Pipeline training over remote stages (one stage per agent):\n"
      "  --local K             start K axon-agent processes here (stage0..)\n"
      "  --stages K            stages, with --agents a,b,... and --master "
      "HOST:PORT\n"
      "  --agents A,B,...      running agents, stage s on the s-th\n"
      "  --master HOST:PORT    the agents' master (joining running agents)\n"
      "  --listen HOST:PORT    this coordinator's address, for agents on "
      "other\n"
      "                        hosts (default 127.0.0.1:0)\n"
      "  --tls-ca/--tls-cert/--tls-key FILE  mutual TLS (CN of the "
      "certificate:\n"
      "                        coordinator; AXON_TLS_CA/CERT/KEY); --insecure\n"
      "                        allows a non-loopback --listen without "
      "credentials\n"
      "  --mode MODE           %s (pipedream)\n"
      "  --microbatches M      micro-batches per mini-batch, gpipe/1f1b/2bw/\n"
      "                        interleaved (4)\n"
      "  --chunks V            interleaved: stages per agent (2)\n"
      "  --recompute R         gpipe: always|except-last|never (never)\n"
      "  --staleness S         ddg/fr/pipedream/2bw: none|predict|pipemare "
      "(none;\n"
      "                        runtime/pipeline/stage/staleness.h)\n"
      "  --pipemare-gamma G    pipemare: decay of the update average (0.9)\n"
      "  --pipemare-warmup N   pipemare: updates until the step size is lr "
      "(0:\n"
      "                        lr / delay throughout)\n"
      "  --replicas R          pipeline x data parallel: R copies of a "
      "pipeline of\n"
      "                        K = agents / R stages, each on its shard of "
      "every\n"
      "                        batch, averaging gradients at each update\n"
      "  --zero 1|2            with --replicas: shard the optimizer state and "
      "the\n"
      "                        averaged gradients over the replicas (ZeRO)\n"
      "  --tensor-parallel T   every stage on T agents, its split layers "
      "(bert's\n"
      "                        attention heads and feed-forward) shared among\n"
      "                        them (Megatron); agents = replicas x T x "
      "stages\n"
      "  --optimizer-host A    every stage's optimizer state and update on "
      "agent A\n"
      "                        (ZeRO-Offload; with --local, A is started too)\n"
      "  --freeze-schedule S   STEP:BLOCKS[:K],...: at global step STEP freeze "
      "the\n"
      "                        first BLOCKS blocks (run on this process, "
      "outputs\n"
      "                        cached) and re-pack the rest onto K agents per\n"
      "                        replica (default: fewer by the share frozen), "
      "the\n"
      "                        freed agents running more replicas "
      "(PipeTransformer)\n"
      "  --freeze-cache-mb N   the frozen blocks' output cache (1024; -1: "
      "none)\n"
      "  --ahead N             actions each agent gets before the first is\n"
      "                        answered: the stages wait for their inputs (8;\n"
      "                        1: coordinator-driven, a round trip per "
      "action)\n"
      "  --partition P         uniform|balanced (uniform)\n"
      "  --links FILE          with balanced: each stage boundary weighed by "
      "its\n"
      "                        link (axon-run probe --out)\n"
      "  --trace FILE          Chrome-trace JSON of every forward, backward, "
      "send\n"
      "                        and receive of every stage\n"
      "  --agent-threads N     handler threads of --local agents (4)\n"
      "  --emulate             with --stages K: no agents; this process hosts\n"
      "                        every stage and runs the mode's exact math "
      "(the\n"
      "                        same action lists and weight versions), and\n"
      "                        reports the modelled time (the timing model "
      "fed\n"
      "                        with the measured per-stage costs)\n"
      "  --eval-every-epoch    evaluate after every epoch (one train call per\n"
      "                        epoch: asynchronous modes drain at epoch ends)\n"
      "  With a pipeline, --csv writes the per-step metrics (busy, bubble, "
      "...).\n"
      "\n"
      "Checkpoints (pipeline training; docs/CHECKPOINTS.md):\n"
      "  --checkpoint-dir DIR  save checkpoints under DIR (each stage on its "
      "own\n"
      "                        agent's disk, same path); one after the last "
      "step\n"
      "  --checkpoint-every N  also every N steps (async modes drain there: "
      "the\n"
      "                        cut changes their trajectory at those steps)\n"
      "  --checkpoint-to W     stages (default: each on its agent's disk) or\n"
      "                        coordinator (streamed to this host's DIR)\n"
      "  --checkpoint-in-memory  each checkpoint also in memory: every "
      "stage's\n"
      "                        state on its agent and on the next stage's "
      "agent,\n"
      "                        so a lost stage rolls back without a disk (the\n"
      "                        only copy without --checkpoint-dir)\n"
      "  --resume DIR          continue from the newest checkpoint in DIR (or\n"
      "                        DIR/ckpt-N) with the same command line; "
      "--steps\n"
      "                        and --epochs count from the start of the run\n"
      "  --loss-log FILE       'step loss' per step, every bit (appends on "
      "resume)\n"
      "  --restarts N          up to N times, wait (60 s) for a lost stage "
      "agent to\n"
      "                        come back under its name (a restarted agent\n"
      "                        rejoins), then roll back as with --spares\n"
      "  --spares a,b          spare agents: a lost stage agent is replaced by "
      "the\n"
      "                        next spare, every stage rolls back to the "
      "newest\n"
      "                        checkpoint and training goes on (needs\n"
      "                        --checkpoint-dir; with --local the spares are\n"
      "                        started too)\n"
      "\n"
      "  axon-run eval --checkpoint DIR|FILE [--eval-batch N] [--eval-limit "
      "N]\n"
      "                [--threads N] [--device DEV]: test accuracy in one "
      "process\n"
      "  axon-run export --checkpoint DIR --out FILE: the whole model in one "
      "file\n"
      "  -h, --help            this text\n"
      "\n"
      "ResNet20 on Fashion-MNIST needs --data-config pad=1 (32x32 inputs); "
      "the\n"
      "defaults set it when --model resnet20 --dataset fashion-mnist is "
      "given.\n",
      ax_pipe_mode_list());
}

/* Splits a comma-separated list of agent names (flag's value s) into list,
 * backed by buf (1024 bytes): the count, or -1 with a message when there
 * are more than AX_PIPE_MAX_STAGES names or the list does not fit. */
static int name_list(const char *flag, const char *s, char *buf,
                     const char **list) {
  if (snprintf(buf, 1024, "%s", s) >= 1024) {
    fprintf(stderr, "axon-run: %s: the list is too long\n", flag);
    return -1;
  }
  int k = 0;
  for (char *sv, *tok = strtok_r(buf, ",", &sv); tok;
       tok = strtok_r(NULL, ",", &sv)) {
    if (k == AX_PIPE_MAX_STAGES) {
      fprintf(stderr, "axon-run: %s: at most %d names\n", flag,
              AX_PIPE_MAX_STAGES);
      return -1;
    }
    list[k++] = tok;
  }
  return k;
}

/* An option of command `cmd` only: 1 when given to it (yes), else says so. */
static int only_in(int yes, const char *cmd, const char *flag) {
  if (!yes)
    fprintf(stderr, "axon-run: %s is an option of axon-run %s\n", flag, cmd);
  return yes;
}

/* The pipeline paths (train, plan) take the training options from o. */
static void pipe_from_train(axi_run_pipe_args *pa, const ax_train_opts *o,
                            int quiet) {
  pa->model = o->model, pa->model_config = o->model_config;
  pa->dataset = o->dataset, pa->data_config = o->data_config;
  pa->optim = o->optim_config, pa->epochs = o->epochs, pa->batch = o->batch;
  pa->eval_batch = o->eval_batch, pa->steps = o->max_steps;
  pa->eval_limit = o->eval_limit, pa->seed = o->seed, pa->device = o->device;
  pa->csv = o->csv_path, pa->quiet = quiet;
}

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "-h") == 0 ||
      strcmp(argv[1], "--help") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "eval") || !strcmp(argv[1], "export"))
    return axi_run_use_main(argc, argv);
  int probe = !strcmp(argv[1], "probe"), plan = !strcmp(argv[1], "plan");
  if (strcmp(argv[1], "train") != 0 && !probe && !plan) {
    fprintf(stderr, "axon-run: unknown command '%s' (try --help)\n", argv[1]);
    return 2;
  }
  ax_train_opts o = ax_train_defaults();
  o.progress = stderr;
  int threads = 0, quiet = 0, pipe = 0;
  axi_run_pipe_args pa;
  memset(&pa, 0, sizeof pa);
  pa.M = 4;
  pa.mode = AX_MODE_PIPEDREAM;
  pa.agent_threads = 4;
  pa.partition = "uniform";
  static const char *agent_list[AX_PIPE_MAX_STAGES];
  static char agent_buf[1024];
  static const char *spare_list[AX_PIPE_MAX_STAGES];
  static char spare_buf[1024];
  static const struct option opts[] = {{"model", 1, 0, 'm'},
                                       {"model-config", 1, 0, 'M'},
                                       {"dataset", 1, 0, 'd'},
                                       {"data-config", 1, 0, 'D'},
                                       {"optim", 1, 0, 'o'},
                                       {"epochs", 1, 0, 'e'},
                                       {"steps", 1, 0, 's'},
                                       {"batch", 1, 0, 'b'},
                                       {"eval-batch", 1, 0, 'E'},
                                       {"eval-limit", 1, 0, 'L'},
                                       {"seed", 1, 0, 'S'},
                                       {"threads", 1, 0, 't'},
                                       {"device", 1, 0, 'v'},
                                       {"csv", 1, 0, 'c'},
                                       {"quiet", 0, 0, 'q'},
                                       {"help", 0, 0, 'h'},
                                       {"local", 1, 0, 1000},
                                       {"stages", 1, 0, 1001},
                                       {"agents", 1, 0, 1002},
                                       {"master", 1, 0, 1003},
                                       {"mode", 1, 0, 1004},
                                       {"microbatches", 1, 0, 1005},
                                       {"chunks", 1, 0, 1015},
                                       {"recompute", 1, 0, 1006},
                                       {"partition", 1, 0, 1007},
                                       {"trace", 1, 0, 1008},
                                       {"agent-threads", 1, 0, 1009},
                                       {"plugin", 1, 0, 1010},
                                       {"staleness", 1, 0, 1016},
                                       {"pipemare-gamma", 1, 0, 1017},
                                       {"pipemare-warmup", 1, 0, 1018},
                                       {"emulate", 0, 0, 1011},
                                       {"eval-every-epoch", 0, 0, 1012},
                                       {"checkpoint-dir", 1, 0, 1020},
                                       {"checkpoint-every", 1, 0, 1021},
                                       {"resume", 1, 0, 1022},
                                       {"loss-log", 1, 0, 1023},
                                       {"freeze-schedule", 1, 0, 1047},
                                       {"freeze-cache-mb", 1, 0, 1048},
                                       {"checkpoint-to", 1, 0, 1024},
                                       {"checkpoint-in-memory", 0, 0, 1058},
                                       {"spares", 1, 0, 1040},
                                       {"restarts", 1, 0, 1041},
                                       {"ahead", 1, 0, 1042},
                                       {"replicas", 1, 0, 1043},
                                       {"zero", 1, 0, 1044},
                                       {"optimizer-host", 1, 0, 1045},
                                       {"tensor-parallel", 1, 0, 1046},
                                       {"listen", 1, 0, 1030},
                                       {"tls-ca", 1, 0, 1031},
                                       {"tls-cert", 1, 0, 1032},
                                       {"tls-key", 1, 0, 1033},
                                       {"insecure", 0, 0, 1034},
                                       {"iters", 1, 0, 1049},
                                       {"bytes", 1, 0, 1050},
                                       {"out", 1, 0, 1051},
                                       {"links", 1, 0, 1052},
                                       {"modes", 1, 0, 1053},
                                       {"mem-cap", 1, 0, 1054},
                                       {"action-us", 1, 0, 1055},
                                       {"compute-scale", 1, 0, 1056},
                                       {0, 0, 0, 0}};
  static char plugin_path[AX_PLUGIN_MAX][4096];
  static const char *plugins[AX_PLUGIN_MAX];
  optind = 2;
  int c, ok = 1;
  int64_t v;
  while (ok && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'm':
      o.model = optarg;
      break;
    case 'M':
      o.model_config = optarg;
      break;
    case 'd':
      o.dataset = optarg;
      break;
    case 'D':
      o.data_config = optarg;
      break;
    case 'o':
      o.optim_config = optarg;
      break;
    case 'e':
      ok = axi_cli_i32(P, "--epochs", optarg, 1, 1000000, &o.epochs);
      break;
    case 's':
      ok = axi_cli_int(P, "--steps", optarg, 1, LONG_MAX, 0, &v);
      o.max_steps = (long)v;
      break;
    case 'b':
      ok = axi_cli_i32(P, "--batch", optarg, 1, 1 << 20, &o.batch);
      break;
    case 'E':
      ok = axi_cli_i32(P, "--eval-batch", optarg, 1, 1 << 20, &o.eval_batch);
      break;
    case 'L':
      ok = axi_cli_int(P, "--eval-limit", optarg, 1, LONG_MAX, 0, &v);
      o.eval_limit = (long)v;
      break;
    case 'S':
      ok = axi_cli_int(P, "--seed", optarg, 0, INT64_MAX, 0, &v);
      o.seed = (uint64_t)v;
      break;
    case 't':
      ok = axi_cli_i32(P, "--threads", optarg, 1, 1024, &threads);
      break;
    case 'v':
      if (ax_device_parse(optarg, &o.device) != AX_OK) {
        fprintf(stderr, "axon-run: %s\n", ax_errmsg());
        return 2;
      }
      if (ax_device_check(o.device) != AX_OK) {
        fprintf(stderr, "axon-run: --device %s does not exist here: %s\n",
                optarg, ax_errmsg());
        return 2;
      }
      break;
    case 'c':
      o.csv_path = optarg;
      break;
    case 'q':
      quiet = 1;
      break;
    case 'h':
      usage(stdout);
      return 0;
    case 1000:
      ok = axi_cli_i32(P, "--local", optarg, 1, AX_PIPE_MAX_STAGES, &pa.local);
      pipe = 1;
      break;
    case 1001:
      ok = axi_cli_i32(P, "--stages", optarg, 1, AX_PIPE_MAX_STAGES, &pa.K);
      pipe = 1;
      break;
    case 1002: {
      int k = name_list("--agents", optarg, agent_buf, agent_list);
      if (k < 0)
        return 2;
      pa.agents = agent_list;
      pa.nagents = k;
      if (!pa.K)
        pa.K = k;
      pipe = 1;
      break;
    }
    case 1003:
      pa.master = optarg;
      ok = axi_cli_hostport(P, "--master", optarg, 1);
      break;
    case 1030:
      pa.listen = optarg;
      ok = axi_cli_hostport(P, "--listen", optarg, 0);
      break;
    case 1049:
      ok = only_in(probe, "probe", "--iters") &&
           axi_cli_i32(P, "--iters", optarg, 1, 100000, &pa.probe_iters);
      break;
    case 1050:
      ok = only_in(probe, "probe", "--bytes") &&
           axi_cli_int(P, "--bytes", optarg, 4, (int64_t)1 << 31, 1,
                       &pa.probe_bytes);
      break;
    case 1051:
      ok = only_in(probe, "probe", "--out");
      pa.probe_out = optarg;
      break;
    case 1052:
      pa.plan_links = optarg;
      break;
    case 1053:
      ok = only_in(plan, "plan", "--modes");
      pa.plan_modes = optarg;
      break;
    case 1054:
      ok = only_in(plan, "plan", "--mem-cap") &&
           axi_cli_int(P, "--mem-cap", optarg, 1, INT64_MAX, 1,
                       &pa.plan_mem_cap);
      break;
    case 1055:
    case 1056: {
      char *end;
      double x = strtod(optarg, &end);
      const char *flag = c == 1055 ? "--action-us" : "--compute-scale";
      ok = only_in(plan, "plan", flag) && !*end && (c == 1055 ? x >= 0 : x > 0);
      if (!ok && plan)
        fprintf(stderr, "axon-run: %s wants a number %s\n", flag,
                c == 1055 ? ">= 0 (microseconds)" : "> 0");
      *(c == 1055 ? &pa.plan_action_us : &pa.plan_compute_scale) = x;
      break;
    }
    case 1031:
      pa.tls_ca = optarg;
      break;
    case 1032:
      pa.tls_cert = optarg;
      break;
    case 1033:
      pa.tls_key = optarg;
      break;
    case 1034:
      pa.insecure = 1;
      break;
    case 1004:
      if ((pa.mode = ax_pipe_mode_index(optarg)) < 0) {
        fprintf(stderr, "axon-run: %s\n", ax_errmsg());
        return 2;
      }
      break;
    case 1005:
      ok = axi_cli_i32(P, "--microbatches", optarg, 1, 1 << 16, &pa.M);
      break;
    case 1015:
      ok =
          axi_cli_i32(P, "--chunks", optarg, 0, AX_PIPE_MAX_STAGES, &pa.chunks);
      break;
    case 1006:
      if (ax_pipe_recompute_parse(optarg, &pa.recompute) != AX_OK) {
        fprintf(stderr, "axon-run: %s\n", ax_errmsg());
        return 2;
      }
      break;
    case 1016:
      if (ax_staleness_parse(optarg, &pa.staleness) != AX_OK) {
        fprintf(stderr, "axon-run: %s\n", ax_errmsg());
        return 2;
      }
      break;
    case 1017: {
      char *end;
      pa.stale_gamma = strtod(optarg, &end);
      if (*end || end == optarg ||
          !(pa.stale_gamma > 0 && pa.stale_gamma < 1)) {
        fprintf(stderr,
                "axon-run: --pipemare-gamma '%s': expected a number "
                "in (0, 1)\n",
                optarg);
        return 2;
      }
      break;
    }
    case 1018:
      ok = axi_cli_i32(P, "--pipemare-warmup", optarg, 0, 1 << 30,
                       &pa.stale_warmup);
      break;
    case 1007:
      pa.partition = optarg;
      break;
    case 1008:
      pa.trace = optarg;
      break;
    case 1009:
      ok =
          axi_cli_i32(P, "--agent-threads", optarg, 1, 1024, &pa.agent_threads);
      break;
    case 1010: /* --local agents get the absolute path */
      if (ax_plugin_load(optarg) != AX_OK) {
        fprintf(stderr, "axon-run: %s\n", ax_errmsg());
        return 1;
      }
      if (pa.nplugins < AX_PLUGIN_MAX &&
          realpath(optarg, plugin_path[pa.nplugins])) {
        plugins[pa.nplugins] = plugin_path[pa.nplugins];
        pa.plugins = plugins;
        pa.nplugins++;
      }
      break;
    case 1011:
      pa.emulate = 1;
      pipe = 1;
      break;
    case 1012:
      pa.epoch_eval = 1;
      break;
    case 1020:
      pa.ckpt_dir = optarg;
      break;
    case 1021:
      ok = axi_cli_int(P, "--checkpoint-every", optarg, 1, LONG_MAX, 0, &v);
      pa.ckpt_every = (long)v;
      break;
    case 1022:
      pa.resume = optarg;
      break;
    case 1023:
      pa.loss_log = optarg;
      break;
    case 1047:
      pa.freeze_schedule = optarg;
      break;
    case 1048: {
      int64_t v = 0;
      ok = axi_cli_int(P, "--freeze-cache-mb", optarg, -1, 1L << 20, 0, &v);
      pa.freeze_cache_mb = (long)v;
      break;
    }
    case 1024:
      if (strcmp(optarg, "stages") && strcmp(optarg, "coordinator")) {
        fprintf(stderr, "axon-run: --checkpoint-to stages|coordinator\n");
        return 2;
      }
      pa.ckpt_to_coord = !strcmp(optarg, "coordinator");
      break;
    case 1041:
      ok = axi_cli_i32(P, "--restarts", optarg, 0, 1000000, &pa.restarts);
      break;
    case 1058:
      pa.ckpt_memory = 1;
      break;
    case 1042:
      ok = axi_cli_i32(P, "--ahead", optarg, 1, AX_PIPE_AHEAD_MAX, &pa.ahead);
      break;
    case 1043:
      ok = axi_cli_i32(P, "--replicas", optarg, 1, AX_PIPE_MAX_REPLICAS,
                       &pa.replicas);
      break;
    case 1044:
      ok = axi_cli_i32(P, "--zero", optarg, 0, 2, &pa.zero);
      break;
    case 1045:
      pa.optimizer_host = optarg;
      break;
    case 1046:
      ok = axi_cli_i32(P, "--tensor-parallel", optarg, 1, AX_PIPE_MAX_REPLICAS,
                       &pa.tensor_parallel);
      break;
    case 1040: {
      int k = name_list("--spares", optarg, spare_buf, spare_list);
      if (k < 0)
        return 2;
      pa.spares = spare_list;
      pa.nspares = k;
      break;
    }
    default:
      usage(stderr);
      return 2;
    }
  }
  if (!ok)
    return 2;
  if (optind != argc) {
    fprintf(stderr, "axon-run: unexpected argument '%s' (try --help)\n",
            argv[optind]);
    return 2;
  }
  if (o.epochs < 1 || o.batch < 1 || o.eval_batch < 1) {
    fprintf(stderr, "axon-run: --epochs, --batch and --eval-batch must be "
                    "positive\n");
    return 2;
  }
  if (!o.data_config && strcmp(o.model, "resnet20") == 0 &&
      strcmp(o.dataset, "fashion-mnist") == 0)
    o.data_config = "pad=1";
  if (quiet)
    o.progress = NULL;
  if (axi_run_check_configs(&o) != AX_OK) {
    fprintf(stderr, "axon-run: %s\n", ax_errmsg());
    return 2;
  }
  if (probe && (!pipe || pa.emulate)) {
    fprintf(stderr, "axon-run probe: needs --local K, or --agents A,B,... "
                    "--master HOST:PORT\n");
    return 2;
  }
  pa.probe = probe;
  if (plan) {
    static const char *plan_names[AX_PIPE_MAX_STAGES];
    static char plan_buf[AX_PIPE_MAX_STAGES][16];
    if (pa.K < 1 || pa.local || pa.emulate) {
      fprintf(stderr, "axon-run plan: needs --stages K (and --agents A,B,... "
                      "to read their links)\n");
      return 2;
    }
    if (!pa.agents) { /* names only matter for the links file */
      for (int s = 0; s < pa.K; s++) {
        snprintf(plan_buf[s], sizeof plan_buf[s], "stage%d", s);
        plan_names[s] = plan_buf[s];
      }
      pa.agents = plan_names;
    }
    if (pa.nagents && pa.nagents != pa.K) {
      fprintf(stderr, "axon-run plan: --agents names one agent per stage\n");
      return 2;
    }
    pipe_from_train(&pa, &o, quiet);
    ax_cpu_set_threads(threads ? threads : 1);
    int rc = axi_run_plan(&pa);
    if (rc != AX_OK)
      fprintf(stderr, "axon-run plan: %s\n", ax_errmsg());
    return rc == AX_OK ? 0 : 1;
  }
  if (pipe && pa.emulate && (pa.local || pa.agents || pa.master || pa.K < 1)) {
    fprintf(stderr, "axon-run: --emulate needs --stages K and no --local, "
                    "--agents or --master (no agents take part)\n");
    return 2;
  }
  if ((pa.ckpt_dir || pa.resume || pa.ckpt_every || pa.ckpt_memory) && !pipe) {
    fprintf(stderr, "axon-run: checkpoints are for pipeline training "
                    "(--local K or --stages K)\n");
    return 2;
  }
  if (pa.ckpt_every && !pa.ckpt_dir && !pa.ckpt_memory) {
    fprintf(stderr, "axon-run: --checkpoint-every needs --checkpoint-dir or "
                    "--checkpoint-in-memory\n");
    return 2;
  }
  if (pa.ckpt_memory && (!pa.ckpt_every || pa.emulate)) {
    fprintf(stderr, "axon-run: --checkpoint-in-memory needs --checkpoint-every "
                    "N and agents (no --emulate)\n");
    return 2;
  }
  if ((pa.nspares || pa.restarts) &&
      (!(pa.ckpt_dir || pa.ckpt_memory) || !pipe || pa.emulate)) {
    fprintf(
        stderr,
        "axon-run: --spares and --restarts need pipeline training over agents "
        "with --checkpoint-dir or --checkpoint-in-memory (a lost stage "
        "rolls back to the newest checkpoint)\n");
    return 2;
  }
  if (pipe) {
    if (pa.local < 0 || pa.local > AX_PIPE_MAX_STAGES || pa.M < 1 ||
        pa.chunks < 0 || pa.chunks > AX_PIPE_MAX_STAGES ||
        (!pa.local && !pa.emulate &&
         (pa.K < 1 || pa.K > AX_PIPE_MAX_STAGES || !pa.agents || !pa.master))) {
      fprintf(stderr,
              "axon-run: a pipeline needs --local K (1..%d), or "
              "--stages K --agents a,b,... --master HOST:PORT; "
              "--microbatches >= 1; --chunks 0..%d\n",
              AX_PIPE_MAX_STAGES, AX_PIPE_MAX_STAGES);
      return 2;
    }
    if (pa.optimizer_host &&
        (pa.zero || pa.staleness || pa.emulate || pa.ckpt_dir || pa.resume ||
         pa.ckpt_memory || !*pa.optimizer_host)) {
      fprintf(stderr, "axon-run: --optimizer-host needs an agent name, and "
                      "no --zero, --staleness, --emulate or checkpoints\n");
      return 2;
    }
    if (pa.zero && (pa.replicas < 2 || pa.staleness)) {
      fprintf(stderr, "axon-run: --zero needs --replicas R >= 2 and no "
                      "--staleness correction\n");
      return 2;
    }
    if (AXR_PARTS(&pa) > 1) { /* K = the agents of one replica's member */
      int R = AXR_PARTS(&pa), total = pa.local ? pa.local : pa.nagents;
      if (pa.agents && pa.K == pa.nagents)
        pa.K = pa.nagents / R; /* --stages not given */
      if (pa.emulate || pa.nspares || pa.restarts || total % R ||
          (pa.agents && pa.K * R != total) ||
          ((pa.ckpt_dir || pa.resume) && (pa.zero || pa.optimizer_host)) ||
          pa.ckpt_memory) {
        fprintf(stderr,
                "axon-run: --replicas R and --tensor-parallel T need "
                "R * T * K agents (--local R*T*K, or --stages K --agents with "
                "R*T*K names) and, for now, no --emulate, --spares, "
                "--restarts or --checkpoint-in-memory, nor checkpoints "
                "with --zero or --optimizer-host\n");
        return 2;
      }
    }
    if (pa.freeze_schedule) {
      ax_freeze_point pts[16];
      int npts;
      if (ax_freeze_schedule_parse(pa.freeze_schedule, pts, 16, &npts) !=
          AX_OK) {
        fprintf(stderr, "axon-run: --freeze-schedule: %s\n", ax_errmsg());
        return 2;
      }
      if (pa.emulate || pa.nspares || pa.restarts || pa.tensor_parallel > 1 ||
          pa.zero || pa.optimizer_host || pa.staleness) {
        fprintf(stderr, "axon-run: --freeze-schedule: not yet with "
                        "--emulate, --spares, --restarts, --tensor-parallel, "
                        "--zero, --optimizer-host or --staleness\n");
        return 2;
      }
    }
    if (ax_staleness_check(pa.mode, pa.staleness,
                           pa.stale_gamma ? pa.stale_gamma : AX_PIPEMARE_GAMMA,
                           pa.stale_warmup) != AX_OK) {
      fprintf(stderr, "axon-run: %s\n", ax_errmsg());
      return 2;
    }
    if (strcmp(pa.partition, "uniform") && strcmp(pa.partition, "balanced")) {
      fprintf(stderr, "axon-run: --partition uniform|balanced\n");
      return 2;
    }
    pipe_from_train(&pa, &o, quiet);
    ax_cpu_set_threads(threads ? threads : 1);
    return axi_run_pipe_main(&pa);
  }
  ax_cpu_set_threads(threads);
  fprintf(stderr,
          "axon-run: training %s on %s, %d epoch(s), batch %d, %d "
          "thread(s)\n",
          o.model, o.dataset, o.epochs, o.batch, ax_cpu_threads());
  ax_train_report rep;
  int rc = ax_train_local(&o, &rep);
  if (rc != AX_OK) {
    fprintf(stderr, "axon-run: %s: %s\n", ax_strerror(rc), ax_errmsg());
    free(rep.loss_curve);
    return 1;
  }
  printf("summary: model=%s dataset=%s steps=%ld final_loss=%.4f "
         "test_accuracy=%.2f%% samples_per_s=%.1f train_seconds=%.1f\n",
         o.model, o.dataset, rep.steps, rep.final_loss,
         100.0 * rep.test_accuracy, rep.samples_per_s, rep.train_seconds);
  free(rep.loss_curve);
  return 0;
}
