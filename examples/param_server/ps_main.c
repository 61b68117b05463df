/* Parameter-server example: command line, the --local launcher and the
 * pieces the server, the trainers and the single-process reference share.
 *
 *   param_server --local N [--mode sync|async|hogwild] [--steps S] ...
 *   param_server --rank R --world-size N+1 --master HOST:PORT ...
 *   param_server --mode single --shards N ...   (one-process reference) */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ps.h"
#include <axon/kernels/device.h>
#include <axon/models/loss.h>
#include <axon/rpc/launch.h>
#include <axon/runtime/pipeline/coord/train.h>

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: param_server --local N [options]\n"
      "       param_server --rank R --world-size N+1 --master HOST:PORT "
      "[options]\n"
      "                    (--listen HOST:PORT: a trainer's own address, for\n"
      "                    a server on another host; the server listens on\n"
      "                    --master)\n"
      "       param_server --mode single --shards N [options]\n"
      "options:\n"
      "  --mode sync|async|hogwild|single  (default sync)\n"
      "  --steps S          steps per trainer (default 300)\n"
      "  --batch B          examples per trainer and step (default 64)\n"
      "  --optim CFG        e.g. opt=sgd,lr=0.05,momentum=0.9 (the default)\n"
      "  --model-config CFG MLP settings (default widths=784/256/128/10)\n"
      "  --data-config CFG  Fashion-MNIST settings (dir=...)\n"
      "  --seed S           (default 1)\n"
      "  --eval-limit K     test examples evaluated (default all 10000)\n"
      "  --save FILE        write the final flat parameters (f32, raw)\n"
      "  --kill R:STEP      failure drill: trainer R SIGKILLs itself at STEP\n"
      "  --timeout SEC      bound on the whole run (default 600)\n");
}

static int parse_mode(const char *s) {
  if (!strcmp(s, "sync"))
    return PS_SYNC;
  if (!strcmp(s, "async"))
    return PS_ASYNC;
  if (!strcmp(s, "hogwild") || !strcmp(s, "lock-free"))
    return PS_HOGWILD;
  if (!strcmp(s, "single"))
    return PS_SINGLE;
  return -1;
}

/* A local child (ax_local_fork): its own copy of the options, its rank. */
static int run_child(int rank, void *user) {
  ps_opts *o = user;
  o->rank = rank;
  return ps_trainer_main(o);
}

static int run_server(int rank, void *user) {
  ps_opts *o = user;
  o->rank = rank;
  return ps_server_main(o);
}

int main(int argc, char **argv) {
  ps_opts o = {.mode = PS_SYNC,
               .rank = -1,
               .steps = 300,
               .batch = 64,
               .seed = 1,
               .timeout_ms = 600000};
  int local = 0, world = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    }
    if (!v) {
      fprintf(stderr, "param_server: %s needs a value\n", a);
      usage(stderr);
      return 2;
    }
    i++;
    if (!strcmp(a, "--local"))
      local = atoi(v);
    else if (!strcmp(a, "--shards"))
      o.trainers = atoi(v);
    else if (!strcmp(a, "--rank"))
      o.rank = atoi(v);
    else if (!strcmp(a, "--world-size"))
      world = atoi(v);
    else if (!strcmp(a, "--master"))
      o.master = v;
    else if (!strcmp(a, "--listen"))
      o.listen = v;
    else if (!strcmp(a, "--mode"))
      o.mode = parse_mode(v);
    else if (!strcmp(a, "--steps"))
      o.steps = atol(v);
    else if (!strcmp(a, "--batch"))
      o.batch = atoi(v);
    else if (!strcmp(a, "--optim"))
      o.optim_config = v;
    else if (!strcmp(a, "--model-config"))
      o.model_config = v;
    else if (!strcmp(a, "--data-config"))
      o.data_config = v;
    else if (!strcmp(a, "--seed"))
      o.seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--eval-limit"))
      o.eval_limit = atol(v);
    else if (!strcmp(a, "--save"))
      o.save = v;
    else if (!strcmp(a, "--timeout"))
      o.timeout_ms = atol(v) * 1000;
    else if (!strcmp(a, "--kill")) {
      if (sscanf(v, "%d:%ld", &o.kill_rank, &o.kill_step) != 2) {
        fprintf(stderr, "param_server: --kill wants RANK:STEP, got '%s'\n", v);
        return 2;
      }
    } else {
      fprintf(stderr, "param_server: unknown option %s\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (o.mode < 0 || o.steps <= 0 || o.batch <= 0 || o.timeout_ms <= 0) {
    fprintf(stderr,
            "param_server: bad --mode, --steps, --batch or --timeout\n");
    return 2;
  }
  if (o.mode == PS_SINGLE) {
    if (o.trainers <= 0)
      o.trainers = local > 0 ? local : 1;
    return ps_single_main(&o);
  }
  if (local > 0) {
    if (local > PS_MAX_TRAINERS) {
      fprintf(stderr, "param_server: at most %d trainers\n", PS_MAX_TRAINERS);
      return 2;
    }
    /* One compute thread per process (inherited by the children):
     * N + 1 processes share the machine. */
    ax_cpu_set_threads(1);
    static char master[64];
    o.master = master;
    o.trainers = local;
    /* Children first: nothing here has initialised gRPC yet. */
    return ax_local_world(local, master, sizeof master, run_child, run_server,
                          &o, "server", "trainer", o.kill_rank);
  }
  if (o.rank < 0 || world < 2 || !o.master) {
    fprintf(stderr, "param_server: give --local N, or --rank, --world-size "
                    "and --master\n");
    usage(stderr);
    return 2;
  }
  o.trainers = world - 1;
  if (o.trainers > PS_MAX_TRAINERS || o.rank >= world) {
    fprintf(stderr, "param_server: bad --rank/--world-size\n");
    return 2;
  }
  return o.rank == 0 ? ps_server_main(&o) : ps_trainer_main(&o);
}

/* ---- shared pieces ------------------------------------------------------ */
void ps_batch_indices(int64_t size, int nshards, int shard, uint64_t seed,
                      long step, int batch, int64_t *idx) {
  int64_t n = (size - shard + nshards - 1) / nshards; /* shard size */
  long per_pass = (long)(n / batch);
  if (per_pass < 1)
    per_pass = 1;
  long pass = step / per_pass, first = (step % per_pass) * batch;
  int32_t *perm = malloc(sizeof *perm * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    perm[i] = (int32_t)i;
  ax_rng r;
  ax_rng_seed2(&r, seed, ((uint64_t)shard << 32) | (uint64_t)pass);
  ax_rng_shuffle_i32(&r, perm, n);
  for (int b = 0; b < batch; b++)
    idx[b] = (int64_t)perm[(first + b) % n] * nshards + shard;
  free(perm);
}

int ps_build_net(const ps_opts *o, ax_net **out) {
  const ax_model_def *def = ax_model_find("mlp");
  if (!def)
    return AX_ENOTFOUND;
  ax_config cfg;
  AX_TRY(ax_model_config(def, o->model_config, &cfg));
  ax_model_info info;
  AX_TRY(def->describe(&cfg, &info));
  return ax_model_stage(def, &cfg, 0, info.n_blocks, AX_CPU, o->seed, out);
}

int ps_optim_cfg(const ps_opts *o, ax_optim_cfg *out) {
  ax_config c;
  AX_TRY(ax_config_parse(&c, "opt=sgd,lr=0.05,momentum=0.9"));
  ax_config user;
  AX_TRY(ax_config_parse(&user, o->optim_config));
  AX_TRY(ax_config_merge(&c, &user));
  return ax_optim_cfg_parse(&c, out);
}

int ps_grad(ax_net *net, const ax_dataset *ds, const int64_t *idx, int n,
            double *loss) {
  ax_tlist in = {0}, lab = {0}, out = {0}, dl = {0}, din = {0};
  ax_slot *slot = ax_slot_new();
  int rc = slot ? ax_dataset_batch(ds, idx, n, &in, &lab) : AX_ENOMEM;
  if (rc == AX_OK)
    rc = ax_net_zero_grad(net);
  if (rc == AX_OK)
    rc = ax_net_forward(net, slot, 1, 0, &in, &out);
  ax_loss_result res;
  if (rc == AX_OK)
    rc = ax_loss_xent(&out, &lab, -100, NULL, 1.0f, &res, &dl);
  if (rc == AX_OK)
    rc = ax_net_backward(net, slot, 0, 0, &dl, &din);
  if (rc == AX_OK)
    *loss = res.loss;
  ax_tlist_clear(&in);
  ax_tlist_clear(&lab);
  ax_tlist_clear(&out);
  ax_tlist_clear(&dl);
  ax_tlist_clear(&din);
  ax_slot_free(slot);
  return rc;
}

int ps_finish(const ps_opts *o, ax_net *net) {
  ax_config dc;
  AX_TRY(ax_config_parse(&dc, o->data_config));
  ax_dataset *test = NULL;
  AX_TRY(ax_dataset_open("fashion-mnist", &dc, AX_SPLIT_TEST, &test));
  double acc = 0, loss = 0;
  int rc = ax_evaluate(net, test, 500, o->eval_limit, -100, &acc, &loss);
  ax_dataset_close(test);
  AX_TRY(rc);
  printf("test accuracy %.4f (loss %.4f)\n", acc, loss);
  if (o->save) {
    FILE *f = fopen(o->save, "wb");
    if (!f)
      return ax_seterr(AX_EIO, "cannot write %s", o->save);
    size_t k = fwrite(ax_f32(net->params), sizeof(float), net->n_params, f);
    fclose(f);
    if (k != net->n_params)
      return ax_seterr(AX_EIO, "short write to %s", o->save);
  }
  return AX_OK;
}

int ps_check_leaks(ax_node *n, const char *who) {
  long owned = -1, users = -1;
  for (int i = 0; i < 500; i++) { /* up to 10 s */
    ax_rref_live(n, &owned, &users);
    if (owned == 0 && users == 0 && ax_rpc_live_calls() == 0 &&
        ax_future_live_count() == 0)
      break;
    nanosleep(&(struct timespec){0, 20000000}, NULL);
  }
  long calls = ax_rpc_live_calls(), futs = ax_future_live_count();
  printf("%s: live at exit: rrefs owned %ld, user forks %ld, calls %ld, "
         "futures %ld\n",
         who, owned, users, calls, futs);
  return (owned || users || calls || futs) ? 1 : 0;
}
