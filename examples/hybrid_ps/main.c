/* RPC + data-parallel hybrid (seed 002; PyTorch's "Combining Distributed
 * DataParallel with the Distributed RPC Framework"), written against the
 * public headers only.
 *
 *   hybrid_ps --local N [--steps S] [--batch B] [--seed S] [--optim CFG]
 *
 * A parameter server ("server", rank 0) keeps the first block of an MLP
 * (784 pixels -> 128: a linear map of the pixels, the "embedding") as a
 * remote module ("mlp.stage", runtime/autograd/stage.h). N trainers
 * ("trainerR") each run the rest of the MLP locally on their own shard of
 * Fashion-MNIST. Per step, under one distributed autograd context:
 *  1. the remote forward on the server (the output comes back with its
 *     receive edge recorded in the context);
 *  2. the local forward, the loss and the local backward; the local
 *     gradients are all-reduced (averaged) among the trainers, which then
 *     step their local optimizers: data parallel, every trainer keeping the
 *     same local model;
 *  3. the input gradient of the local part goes back along the receive
 *     edge (a held function, autograd.h), and the server runs the remote
 *     module's backward into the context;
 *  4. the distributed optimizer steps the remote module with that
 *     context's gradient (each trainer's, as in the tutorial).
 * At the end every trainer checks that its local model equals trainer 1's
 * (broadcast), prints its first and last losses, and tells the server it
 * is done. Exit status 0 when every process succeeded. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <axon/kernels/clock.h>
#include <axon/kernels/device.h>
#include <axon/models/data/dataset.h>
#include <axon/models/loss.h>
#include <axon/models/model.h>
#include <axon/models/optim.h>
#include <axon/rpc/launch.h>
#include <axon/runtime/autograd/collective.h>
#include <axon/runtime/autograd/stage.h>
#include <axon/runtime/pipeline/pipeline.h>

#define MAXT 16
#define WIDTHS "widths=784/128/64/10"

typedef struct hopts {
  int trainers, rank, batch;
  long steps;
  uint64_t seed;
  const char *optim;
  char master[64];
} hopts;

/* Waits (up to 10 s) until this process holds no RRef, call or future,
 * and prints what is left: "WHO: live at exit: ...". 1 when anything is. */
static int check_leaks(ax_node *n, const char *who) {
  long owned = -1, users = -1;
  for (int i = 0; i < 500; i++) {
    ax_rref_live(n, &owned, &users);
    if (!owned && !users && !ax_rpc_live_calls() && !ax_future_live_count())
      break;
    nanosleep(&(struct timespec){0, 20000000}, NULL);
  }
  long calls = ax_rpc_live_calls(), futs = ax_future_live_count();
  printf("%s: live at exit: rrefs owned %ld, user forks %ld, calls %ld, "
         "futures %ld\n",
         who, owned, users, calls, futs);
  return owned || users || calls || futs;
}

/* ---- the server ---------------------------------------------------------- */
typedef struct server {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  ax_rref *emb;
  int done;
} server;

static int fn_embedding(ax_call_ctx *cc, const ax_values *args, ax_values *out,
                        void *user) {
  return ax_values_add_rref(out, ((server *)user)->emb);
}

static int fn_done(ax_call_ctx *cc, const ax_values *args, ax_values *out,
                   void *user) {
  server *s = user;
  pthread_mutex_lock(&s->mu);
  s->done++;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return AX_OK;
}

static int run_server(int rank, void *user) {
  hopts *o = user;
  server s = {.done = 0};
  pthread_mutex_init(&s.mu, NULL);
  pthread_cond_init(&s.cv, NULL);
  ax_node_opts no;
  ax_node_opts_init(&no);
  no.name = "server";
  no.listen = o->master;
  no.master = o->master;
  no.world_size = o->trainers + 1;
  no.rank = 0;
  no.threads = o->trainers + 2;
  ax_node *n = NULL;
  int rc = ax_node_create(&no, &n);
  if (rc == AX_OK)
    rc = ax_pipe_init(n);
  char cfg[128];
  snprintf(cfg, sizeof cfg, "stage=0,splits=0/1/3,seed=%llu," WIDTHS,
           (unsigned long long)o->seed);
  if (rc == AX_OK)
    rc = ax_remote_object(n, "server", "mlp.stage", cfg, AX_CPU, NULL, &s.emb);
  if (rc == AX_OK)
    rc = ax_rpc_register(n, "hps.embedding", fn_embedding, &s);
  if (rc == AX_OK)
    rc = ax_rpc_register(n, "hps.done", fn_done, &s);
  if (rc == AX_OK)
    rc = ax_node_join(n, 60000);
  if (rc == AX_OK) { /* until every trainer is done (bounded) */
    time_t end = time(NULL) + 600;
    pthread_mutex_lock(&s.mu);
    while (s.done < o->trainers && time(NULL) < end) {
      struct timespec ts = ax_clock_after_ms(CLOCK_REALTIME, 1000);
      pthread_cond_timedwait(&s.cv, &s.mu, &ts);
    }
    if (s.done < o->trainers)
      rc = ax_seterr(AX_ETIMEOUT, "%d of %d trainers finished", s.done,
                     o->trainers);
    pthread_mutex_unlock(&s.mu);
  }
  if (rc == AX_OK)
    printf("server: the embedding trained by %d trainers\n", o->trainers);
  else
    fprintf(stderr, "server: %s: %s\n", ax_strerror(rc), ax_errmsg());
  ax_rref_release(s.emb);
  if (n && rc == AX_OK && check_leaks(n, "server"))
    rc = AX_ESTATE;
  if (n) {
    ax_node_shutdown(n, 5000);
    ax_dist_fini(n);
    ax_node_destroy(n);
  }
  return rc == AX_OK ? 0 : 1;
}

/* ---- a trainer ----------------------------------------------------------- */
typedef struct trainer {
  const hopts *o;
  ax_node *n;
  ax_rref *emb;
  ax_dist_optim *dopt;
  ax_coll_group *g;
  ax_net *net;
  ax_optim *opt;
  ax_dataset *ds;
  long remote_steps; /* steps where the remote module had a gradient */
} trainer;

/* One step (module comment, 1-4); *loss gets the batch's mean loss. */
static int step(trainer *t, long s, double *loss) {
  const hopts *o = t->o;
  int64_t idx[256], size = ax_dataset_size(t->ds);
  for (int b = 0; b < o->batch; b++)
    idx[b] = ((s * o->trainers + (o->rank - 1)) * o->batch + b) % size;
  ax_tlist in = {0}, lab = {0}, y = {0}, out = {0}, dl = {0}, din = {0};
  ax_values *a = NULL, *r = NULL;
  ax_slot *slot = ax_slot_new();
  uint64_t ctx = 0, fn = 0;
  int rc = slot ? ax_dataset_batch(t->ds, idx, o->batch, &in, &lab) : AX_ENOMEM;
  if (rc == AX_OK)
    rc = ax_dist_context_new(t->n, &ctx); /* current on this thread */
  if (rc == AX_OK && !(a = ax_values_new()))
    rc = AX_ENOMEM;
  if (rc == AX_OK) {
    ax_values_add_i64(a, (int64_t)s);
    ax_values_add_i64(a, 0); /* no labels: the outputs come back */
    rc = ax_values_add_tensor(a, in.t[0]);
  }
  if (rc == AX_OK) /* 1 */
    rc = ax_rmod_forward(t->n, t->emb, a, &r);
  ax_tensor *e = NULL;
  if (rc == AX_OK)
    rc = ax_values_get_tensor(r, 0, &e);
  ax_tlist none = {0};
  if (rc == AX_OK) {
    y.t[0] = ax_tensor_retain(e);
    y.n = 1;
    rc = ax_dist_record_held(t->n, ctx, &y, &none, &fn);
  }
  ax_loss_result res;
  if (rc == AX_OK) /* 2 */
    rc = ax_net_zero_grad(t->net);
  if (rc == AX_OK)
    rc = ax_net_forward(t->net, slot, 1, (uint64_t)s, &y, &out);
  if (rc == AX_OK)
    rc = ax_loss_xent(&out, &lab, -100, NULL, 1.0f, &res, &dl);
  if (rc == AX_OK)
    rc = ax_net_backward(t->net, slot, (uint64_t)s, 1, &dl, &din);
  if (rc == AX_OK)
    rc = ax_coll_allreduce(t->g, t->net->grads, AX_COLL_AVG);
  if (rc == AX_OK)
    rc = ax_optim_step(t->opt, t->net->params, t->net->grads);
  ax_future *sent = NULL;
  if (rc == AX_OK) /* 3 */
    rc = ax_dist_pass_grads(t->n, ctx, fn, &din, &sent);
  if (rc == AX_OK && (rc = ax_future_wait(sent, 60000)) == AX_OK)
    rc = ax_future_err(sent);
  int stepped = 0;
  if (rc == AX_OK) /* 4 */
    rc = ax_dist_optim_step_count(t->dopt, ctx, 60000, &stepped);
  t->remote_steps += stepped;
  if (rc == AX_OK)
    *loss = res.loss;
  ax_future_release(sent);
  if (ctx)
    ax_dist_context_release(t->n, ctx, 10000);
  ax_values_free(a);
  ax_values_free(r);
  ax_slot_free(slot);
  ax_tlist_clear(&in), ax_tlist_clear(&lab), ax_tlist_clear(&y);
  ax_tlist_clear(&out), ax_tlist_clear(&dl), ax_tlist_clear(&din);
  return rc;
}

/* Every trainer's local model equals trainer 1's: its broadcast, bit by
 * bit (*same), as data parallelism promises. */
static int same_as_first(trainer *t, int *same) {
  ax_tensor *c = ax_tensor_like(t->net->params);
  int rc = c ? ax_tensor_copy(c, t->net->params) : AX_ENOMEM;
  if (rc == AX_OK)
    rc = ax_coll_broadcast(t->g, c, 0);
  if (rc == AX_OK)
    *same = !memcmp(c->data, t->net->params->data, ax_tensor_nbytes(c));
  ax_tensor_release(c);
  return rc;
}

static int trainer_setup(trainer *t, char *name) {
  const hopts *o = t->o;
  ax_node_opts no;
  ax_node_opts_init(&no);
  no.name = name;
  no.listen = "127.0.0.1:0";
  no.master = o->master;
  no.rank = o->rank;
  AX_TRY(ax_node_create(&no, &t->n));
  AX_TRY(ax_pipe_init(t->n));
  AX_TRY(ax_node_join(t->n, 60000));
  ax_call_opts co = {.timeout_ms = 60000};
  ax_values *v = NULL;
  AX_TRY(ax_rpc_sync(t->n, "server", "hps.embedding", NULL, &co, &v));
  ax_rref *emb = NULL;
  int rc = ax_values_get_rref(v, 0, &emb);
  t->emb = ax_rref_retain(emb);
  ax_values_free(v);
  AX_TRY(rc);
  ax_rref *par = NULL;
  AX_TRY(ax_rmod_parameters(t->n, t->emb, &par));
  rc = ax_dist_optim_new(t->n, &par, 1, o->optim, &t->dopt);
  ax_rref_release(par);
  AX_TRY(rc);
  const char *names[MAXT];
  char buf[MAXT][16];
  for (int r = 0; r < o->trainers; r++) {
    snprintf(buf[r], sizeof buf[r], "trainer%d", r + 1);
    names[r] = buf[r];
  }
  AX_TRY(ax_coll_group_new(t->n, "hps", o->trainers, names, 60000, &t->g));
  const ax_model_def *def = ax_model_find("mlp");
  ax_config cfg, oc_cfg, dc;
  ax_optim_cfg oc;
  AX_TRY(ax_model_config(def, WIDTHS, &cfg));
  ax_model_info info;
  AX_TRY(def->describe(&cfg, &info));
  /* Blocks 1.. of the MLP; block i starts from rng stream (seed, i), so
   * every trainer starts from the same local model. */
  AX_TRY(ax_model_stage(def, &cfg, 1, info.n_blocks, AX_CPU, o->seed, &t->net));
  AX_TRY(ax_config_parse(&oc_cfg, o->optim));
  AX_TRY(ax_optim_cfg_parse(&oc_cfg, &oc));
  if (!(t->opt = ax_optim_new(&oc, t->net->n_params, AX_CPU)))
    return AX_ENOMEM;
  AX_TRY(ax_config_parse(&dc, ""));
  return ax_dataset_open("fashion-mnist", &dc, AX_SPLIT_TRAIN, &t->ds);
}

static int run_trainer(int rank, void *user) {
  hopts *o = user;
  o->rank = rank;
  char name[16];
  snprintf(name, sizeof name, "trainer%d", rank);
  trainer t = {o};
  int rc = trainer_setup(&t, name), same = 0;
  double first = 0, last = 0, loss = 0;
  long w = o->steps < 40 ? o->steps / 2 : 20; /* losses averaged */
  for (long s = 0; rc == AX_OK && s < o->steps; s++) {
    rc = step(&t, s, &loss);
    first += s < w ? loss : 0;
    last += s >= o->steps - w ? loss : 0;
  }
  if (rc == AX_OK)
    rc = same_as_first(&t, &same);
  if (rc == AX_OK)
    printf("%s: loss %.4f -> %.4f (means of the first and last %ld steps), "
           "%ld of %ld remote steps, local model %s trainer1's\n",
           name, first / w, last / w, w, t.remote_steps, o->steps,
           same ? "equal to" : "DIFFERENT FROM");
  else
    fprintf(stderr, "%s: %s: %s\n", name, ax_strerror(rc), ax_errmsg());
  fflush(stdout);
  ax_dist_optim_free(t.dopt);
  ax_rref_release(t.emb);
  ax_coll_group_free(t.g);
  if (t.n) {
    ax_call_opts co = {.timeout_ms = 10000};
    ax_values *v = NULL;
    if (check_leaks(t.n, name) && rc == AX_OK)
      rc = AX_ESTATE;
    ax_rpc_sync(t.n, "server", "hps.done", NULL, &co, &v);
    ax_values_free(v);
    ax_node_shutdown(t.n, 5000);
    ax_dist_fini(t.n);
    ax_node_destroy(t.n);
  }
  ax_optim_free(t.opt);
  ax_net_free(t.net);
  ax_dataset_close(t.ds);
  return rc == AX_OK && same && t.remote_steps == o->steps ? 0 : 1;
}

int main(int argc, char **argv) {
  hopts o = {.trainers = 2,
             .batch = 32,
             .steps = 200,
             .seed = 1,
             .optim = "opt=sgd,lr=0.05,momentum=0.9"};
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *a = argv[i], *v = argv[i + 1];
    if (!strcmp(a, "--local"))
      o.trainers = atoi(v);
    else if (!strcmp(a, "--steps"))
      o.steps = atol(v);
    else if (!strcmp(a, "--batch"))
      o.batch = atoi(v);
    else if (!strcmp(a, "--seed"))
      o.seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--optim"))
      o.optim = v;
    else {
      fprintf(stderr, "usage: hybrid_ps --local N [--steps S] [--batch B] "
                      "[--seed S] [--optim CFG]\n");
      return 2;
    }
  }
  if ((argc - 1) % 2 || o.trainers < 1 || o.trainers > MAXT || o.steps < 2 ||
      o.batch < 1 || o.batch > 256) {
    fprintf(stderr,
            "hybrid_ps: --local 1..%d, --steps >= 2, --batch "
            "1..256\n",
            MAXT);
    return 2;
  }
  ax_cpu_set_threads(1); /* N + 1 processes share the machine */
  return ax_local_world(o.trainers, o.master, sizeof o.master, run_trainer,
                        run_server, &o, "hybrid_ps", "trainer", -1);
}
