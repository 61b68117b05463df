/* axon-run: the ready-made coordinator CLI.
 *
 *   axon-run train --model mlp|resnet20|bert --dataset NAME [options]
 *
 * Trains in one process (the pipeline modes come with the coordinator). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/pipeline/train.h"
#include "runtime/error.h"

static void usage(FILE *f) {
  fprintf(f,
"usage: axon-run train [options]\n"
"\n"
"Trains a model in this process and reports test accuracy per epoch.\n"
"\n"
"  --model NAME          mlp | resnet20 | bert (default mlp)\n"
"  --model-config K=V,.. model settings, e.g. widths=784/256/10 or layers=3\n"
"  --dataset NAME        fashion-mnist | cifar10 | gcide | synthetic\n"
"                        (default fashion-mnist)\n"
"  --data-config K=V,..  data-set settings, e.g. pad=1, limit=N, dir=PATH\n"
"  --optim K=V,..        opt=sgd|adamw, lr, momentum, wd, nesterov, sched=\n"
"                        const|step|cosine, warmup, ... (default\n"
"                        opt=adamw,lr=2e-3,wd=0,sched=cosine)\n"
"  --epochs N            epochs (default 1)\n"
"  --steps N             stop after N steps (default: no limit)\n"
"  --batch N             mini-batch size (default 64)\n"
"  --eval-batch N        evaluation batch size (default 500)\n"
"  --eval-limit N        evaluate on at most N test examples (default all)\n"
"  --seed N              seed for initialisation, shuffling, dropout (1)\n"
"  --threads N           CPU threads (default: all cores)\n"
"  --device DEV          cpu | cuda:N (default cpu)\n"
"  --csv FILE            write the loss curve (step,epoch,loss,lr,samples_per_s)\n"
"  --quiet               no progress bar\n"
"  -h, --help            this text\n"
"\n"
"ResNet20 on Fashion-MNIST needs --data-config pad=1 (32x32 inputs); the\n"
"defaults set it when --model resnet20 --dataset fashion-mnist is given.\n");
}

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (strcmp(argv[1], "train") != 0) {
    fprintf(stderr, "axon-run: unknown command '%s' (try --help)\n", argv[1]);
    return 2;
  }
  ax_train_opts o = ax_train_defaults();
  o.progress = stderr;
  int threads = 0, quiet = 0;
  static const struct option opts[] = {
      {"model", 1, 0, 'm'},      {"model-config", 1, 0, 'M'},
      {"dataset", 1, 0, 'd'},    {"data-config", 1, 0, 'D'},
      {"optim", 1, 0, 'o'},      {"epochs", 1, 0, 'e'},
      {"steps", 1, 0, 's'},      {"batch", 1, 0, 'b'},
      {"eval-batch", 1, 0, 'E'}, {"eval-limit", 1, 0, 'L'},
      {"seed", 1, 0, 'S'},       {"threads", 1, 0, 't'},
      {"device", 1, 0, 'v'},     {"csv", 1, 0, 'c'},
      {"quiet", 0, 0, 'q'},      {"help", 0, 0, 'h'},
      {0, 0, 0, 0}};
  optind = 2;
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'm': o.model = optarg; break;
    case 'M': o.model_config = optarg; break;
    case 'd': o.dataset = optarg; break;
    case 'D': o.data_config = optarg; break;
    case 'o': o.optim_config = optarg; break;
    case 'e': o.epochs = atoi(optarg); break;
    case 's': o.max_steps = atol(optarg); break;
    case 'b': o.batch = atoi(optarg); break;
    case 'E': o.eval_batch = atoi(optarg); break;
    case 'L': o.eval_limit = atol(optarg); break;
    case 'S': o.seed = strtoull(optarg, NULL, 10); break;
    case 't': threads = atoi(optarg); break;
    case 'v':
      if (ax_device_parse(optarg, &o.device) != AX_OK) {
        fprintf(stderr, "axon-run: %s\n", ax_errmsg());
        return 2;
      }
      break;
    case 'c': o.csv_path = optarg; break;
    case 'q': quiet = 1; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
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
  ax_cpu_set_threads(threads);
  fprintf(stderr, "axon-run: training %s on %s, %d epoch(s), batch %d, %d "
          "thread(s)\n", o.model, o.dataset, o.epochs, o.batch,
          ax_cpu_threads());
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
