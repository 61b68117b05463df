/* custom_model: trains a model that is not in libaxon ("fmcnn", defined
 * with its own PReLU layer in the plugin custom_model.so, plugin/custom.h)
 * as a pipeline over stock axon-agent processes started with --plugin, in
 * one pipeline mode or in every mode one after the other.
 *
 *   custom_model --local K [options]      forks K agents here (stage0..)
 *   custom_model --agents a,b,c --master HOST:PORT [options]
 *                                         joins agents started with
 *                                         axon-agent --plugin custom_model.so
 *
 * The coordinator loads the same plugin (ax_plugin_load): ax_pipe_new looks
 * the model up to split its blocks. With --local it is the master and ends
 * the world when done (ax_local_end_world): the agents exit 0. */
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <axon/models/data/dataset.h>
#include <axon/rpc/launch.h>
#include <axon/runtime/autograd/plugin.h>
#include <axon/runtime/pipeline/coord/coordinator.h>
#include <axon/runtime/pipeline/coord/train.h>
#include <axon/runtime/pipeline/pipeline.h>

typedef struct opts {
  int local, M, steps, batch, eval_limit;
  const char *mode, *master, *agents, *plugin, *optim, *data_config,
      *model_config;
  uint64_t seed;
  char plugin_path[4096], agent_path[4096], master_buf[64];
} opts;

static void usage(FILE *f) {
  fprintf(f,
          "usage: custom_model --local K [options]\n"
          "       custom_model --agents A,B,... --master HOST:PORT [options]\n"
          "  --mode MODE|all        a pipeline mode (sequential, gpipe, 1f1b, "
          "ddg, fr,\n"
          "                         pipedream) or all of them in turn (default "
          "all)\n"
          "  --steps S              mini-batches per mode (default 50)\n"
          "  --batch B              mini-batch size (default 32)\n"
          "  --microbatches M       micro-batches per mini-batch (default 4)\n"
          "  --optim K=V,...        (default opt=adamw,lr=5e-3,wd=0)\n"
          "  --model-config K=V,... fmcnn settings, e.g. channels=8/16/32\n"
          "  --data-config K=V,...  Fashion-MNIST settings, e.g. dir=PATH, "
          "limit=N\n"
          "  --eval-limit N         test examples evaluated per mode (default "
          "1000)\n"
          "  --plugin FILE.so       the plugin (default: custom_model.so next "
          "to this\n"
          "                         program)\n"
          "  --seed S               (default 1)\n");
}

typedef struct feed {
  ax_loader *ld;
  int epoch;
  double first, last;
  long steps;
} feed;

static int feed_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  feed *f = user;
  int rc = ax_loader_next(f->ld, in, lab);
  if (rc == AX_ECLOSED) {
    ax_loader_start(f->ld, ++f->epoch);
    rc = ax_loader_next(f->ld, in, lab);
  }
  return rc;
}

static void feed_step(void *user, const ax_pipe_step_info *s) {
  feed *f = user;
  if (f->steps++ == 0)
    f->first = s->loss;
  f->last = s->loss;
}

static int eval_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  return ax_loader_next(user, in, lab);
}

/* Trains fmcnn for o->steps mini-batches in `mode` and evaluates it. */
static int run_mode(ax_node *n, const opts *o, int K, const char *const *ag,
                    int mode, const ax_dataset *train, const ax_dataset *test) {
  feed f = {0};
  ax_loader *el = NULL;
  ax_pipe *p = NULL;
  int M = o->M, chunks = 0;
  if (ax_pipe_mode_get(mode)->chunked) {
    /* Two stages per agent (fmcnn has 4 blocks), and whole rounds of
     * micro-batches over the agents. */
    chunks = 2;
    K = K < 2 ? K : 2;
    M = (M + K - 1) / K * K;
  }
  ax_pipe_opts po = {.model = "fmcnn",
                     .model_config = o->model_config,
                     .K = K,
                     .agents = ag,
                     .mode = mode,
                     .M = M,
                     .chunks = chunks,
                     .optim_config = o->optim,
                     .seed = o->seed,
                     .device = AX_CPU,
                     .timeout_ms = 120000};
  int rc = ax_loader_new(train, o->batch, 1, 1, o->seed, &f.ld);
  if (rc == AX_OK)
    rc = ax_pipe_new(n, &po, &p);
  if (rc == AX_OK) {
    ax_loader_start(f.ld, 0);
    rc = ax_pipe_train(p, o->steps, feed_batch, feed_step, &f);
  }
  double acc = 0, loss = 0;
  if (rc == AX_OK)
    rc = ax_loader_new(test, 250, 0, 0, 0, &el);
  if (rc == AX_OK) {
    ax_loader_start(el, 0);
    rc = ax_pipe_evaluate(p, (o->eval_limit + 249) / 250, eval_batch, el, &acc,
                          &loss);
  }
  if (rc == AX_OK && !(isfinite(f.first) && isfinite(f.last)))
    rc = ax_seterr(AX_EINTERNAL, "%s: loss is not finite",
                   ax_pipe_mode_name(mode));
  if (rc == AX_OK)
    printf("custom_model: mode=%s steps=%ld loss_first=%.4f loss_last=%.4f "
           "test_accuracy=%.4f test_loss=%.4f\n",
           ax_pipe_mode_name(mode), f.steps, f.first, f.last, acc, loss);
  fflush(stdout);
  ax_pipe_free(p);
  ax_loader_free(el);
  ax_loader_free(f.ld);
  return rc;
}

/* Every requested mode, on a joined node. */
static int train_all(ax_node *n, const opts *o, int K, const char *const *ag) {
  ax_config dc;
  AX_TRY(ax_config_parse(&dc, o->data_config));
  ax_dataset *train = NULL, *test = NULL;
  int rc = ax_dataset_open("fashion-mnist", &dc, AX_SPLIT_TRAIN, &train);
  if (rc == AX_OK)
    rc = ax_dataset_open("fashion-mnist", &dc, AX_SPLIT_TEST, &test);
  int all = !strcmp(o->mode, "all"), ran = 0;
  for (int m = 0; rc == AX_OK && strcmp(ax_pipe_mode_name(m), "?"); m++)
    if (all || !strcmp(o->mode, ax_pipe_mode_name(m))) {
      rc = run_mode(n, o, K, ag, m, train, test);
      ran++;
    }
  if (rc == AX_OK && !ran)
    rc = ax_seterr(AX_EINVAL, "unknown mode '%s'", o->mode);
  ax_dataset_close(train);
  ax_dataset_close(test);
  return rc;
}

/* A --local child: becomes an axon-agent that loads the plugin. */
static int exec_agent(int rank, void *user) {
  opts *o = user;
  char name[32];
  snprintf(name, sizeof name, "stage%d", rank - 1);
  setenv("AXON_THREADS", "1", 0); /* K agents share this machine */
  execl(o->agent_path, o->agent_path, "--name", name, "--master", o->master_buf,
        "--plugin", o->plugin_path, "--peer-timeout-ms", "5000", (char *)NULL);
  fprintf(stderr, "custom_model: exec %s: %s\n", o->agent_path,
          strerror(errno));
  return 127;
}

/* The programs and the plugin next to this one. */
static int find_files(opts *o) {
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[len > 0 ? len : 0] = 0;
  char *dir = dirname(exe);
  snprintf(o->agent_path, sizeof o->agent_path, "%s/axon-agent", dir);
  if (!o->plugin) {
    snprintf(o->plugin_path, sizeof o->plugin_path, "%s/custom_model.so", dir);
    return AX_OK;
  }
  if (!realpath(o->plugin, o->plugin_path))
    return ax_seterr(AX_ENOTFOUND, "plugin %s: %s", o->plugin, strerror(errno));
  return AX_OK;
}

int main(int argc, char **argv) {
  opts o = {.M = 4,
            .steps = 50,
            .batch = 32,
            .eval_limit = 1000,
            .mode = "all",
            .optim = "opt=adamw,lr=5e-3,wd=0",
            .seed = 1};
  static const struct option lo[] = {{"local", 1, 0, 'L'},
                                     {"agents", 1, 0, 'a'},
                                     {"master", 1, 0, 'm'},
                                     {"mode", 1, 0, 'o'},
                                     {"steps", 1, 0, 's'},
                                     {"batch", 1, 0, 'b'},
                                     {"microbatches", 1, 0, 'M'},
                                     {"optim", 1, 0, 'O'},
                                     {"model-config", 1, 0, 'C'},
                                     {"data-config", 1, 0, 'D'},
                                     {"eval-limit", 1, 0, 'e'},
                                     {"plugin", 1, 0, 'p'},
                                     {"seed", 1, 0, 'S'},
                                     {"help", 0, 0, 'h'},
                                     {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    switch (c) {
    case 'L':
      o.local = atoi(optarg);
      break;
    case 'a':
      o.agents = optarg;
      break;
    case 'm':
      o.master = optarg;
      break;
    case 'o':
      o.mode = optarg;
      break;
    case 's':
      o.steps = atoi(optarg);
      break;
    case 'b':
      o.batch = atoi(optarg);
      break;
    case 'M':
      o.M = atoi(optarg);
      break;
    case 'O':
      o.optim = optarg;
      break;
    case 'C':
      o.model_config = optarg;
      break;
    case 'D':
      o.data_config = optarg;
      break;
    case 'e':
      o.eval_limit = atoi(optarg);
      break;
    case 'p':
      o.plugin = optarg;
      break;
    case 'S':
      o.seed = strtoull(optarg, NULL, 10);
      break;
    case 'h':
      usage(stdout);
      return 0;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (optind != argc || o.steps < 1 || o.batch < 1 || o.M < 1 ||
      o.eval_limit < 1 || (o.local < 1 && (!o.agents || !o.master)) ||
      o.local > AX_PIPE_MAX_STAGES) {
    usage(stderr);
    return 2;
  }
  /* The model registers here too: ax_pipe_new looks it up. */
  if (find_files(&o) != AX_OK || ax_plugin_load(o.plugin_path) != AX_OK) {
    fprintf(stderr, "custom_model: %s\n", ax_errmsg());
    return 1;
  }
  char names[AX_PIPE_MAX_STAGES][32], list[1024];
  const char *ag[AX_PIPE_MAX_STAGES];
  int K = 0;
  pid_t pids[AX_PIPE_MAX_STAGES] = {0};
  ax_node_opts no;
  ax_node_opts_init(&no);
  no.name = "coordinator";
  no.peer_timeout_ms = 5000;
  if (o.local > 0) { /* children first: no gRPC in this process yet */
    K = o.local;
    snprintf(o.master_buf, sizeof o.master_buf, "127.0.0.1:%d",
             ax_local_free_port());
    for (int s = 0; s < K; s++) {
      snprintf(names[s], sizeof names[s], "stage%d", s);
      ag[s] = names[s];
    }
    if (ax_local_fork(K, 1, exec_agent, &o, pids) != 0)
      return 1;
    no.listen = no.master = o.master_buf;
    no.world_size = K + 1;
    no.rank = 0;
  } else {
    snprintf(list, sizeof list, "%s", o.agents);
    for (char *sv, *t = strtok_r(list, ",", &sv); t && K < AX_PIPE_MAX_STAGES;
         t = strtok_r(NULL, ",", &sv))
      ag[K++] = t;
    no.master = o.master;
  }
  ax_node *n = NULL;
  int rc = ax_node_create(&no, &n), dist = 0;
  if (rc == AX_OK)
    dist = (rc = ax_pipe_init(n)) == AX_OK;
  if (rc == AX_OK)
    rc = ax_plugin_attach(n);
  if (rc == AX_OK)
    rc = ax_node_join(n, 60000);
  if (rc == AX_OK) {
    printf("custom_model: fmcnn (plugin %s) over %d agent(s): %s\n",
           o.plugin_path, K, o.local ? "started here" : o.agents);
    fflush(stdout);
    rc = train_all(n, &o, K, ag);
  }
  if (rc != AX_OK)
    fprintf(stderr, "custom_model: %s: %s\n", ax_strerror(rc), ax_errmsg());
  int bad = 0;
  if (o.local > 0) { /* the agents leave when told to and exit 0 */
    int st[AX_PIPE_MAX_STAGES];
    for (int s = 0; s < K; s++)
      st[s] = -1;
    if (n)
      ax_local_end_world(n, K, pids, 15000, st, "custom_model");
    ax_local_stop(K, pids, 5000, NULL);
    for (int s = 0; s < K; s++)
      if (st[s] == -1 || !WIFEXITED(st[s]) || WEXITSTATUS(st[s])) {
        fprintf(stderr, "custom_model: agent %s did not exit with 0\n", ag[s]);
        bad = 1;
      }
    if (!bad)
      printf("custom_model: %d agent(s) left and exited with 0\n", K);
  }
  if (n && dist) { /* nothing of the runs may be left here */
    long owned = -1, users = -1, ctxs = -1, calls = -1, futs = -1;
    for (int i = 0; i < 250; i++) { /* releases may still be on the way */
      ax_rref_live(n, &owned, &users);
      ctxs = ax_dist_live_contexts(n);
      calls = ax_rpc_live_calls();
      futs = ax_future_live_count();
      if (owned + users + ctxs + calls + futs == 0)
        break;
      nanosleep(&(struct timespec){0, 20000000}, NULL);
    }
    printf("custom_model: live at exit: rrefs %ld, contexts %ld, calls %ld, "
           "futures %ld\n",
           owned + users, ctxs, calls, futs);
    bad |= owned + users + ctxs + calls + futs != 0;
  }
  if (n) {
    ax_node_shutdown(n, 5000);
    if (dist)
      ax_dist_fini(n);
    ax_node_destroy(n);
  }
  return rc != AX_OK || bad;
}
