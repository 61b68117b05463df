/* axon-run train --stages K ...: pipeline training over remote stages.
 *
 * With --local K the K stage agents are started here as child processes
 * (fork/exec of the axon-agent next to this binary, BEFORE any gRPC
 * initialisation in this process) and this process is the master; with
 * --agents a,b,c --master HOST:PORT it joins running agents; with
 * --emulate this process is a world of one that hosts every stage itself
 * (runtime/pipeline/schedule/emulate.h). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agents/axon_run.h"
#include "axon/kernels/clock.h"
#include "axon/models/data/dataset.h"
#include "axon/rpc/launch.h"
#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/autograd/plugin.h"
#include "axon/runtime/pipeline/coord/coordinator.h"
#include "axon/runtime/pipeline/pipeline.h"
#include "axon/runtime/pipeline/schedule/emulate.h"
#include "axon/runtime/pipeline/schedule/partition.h"
#include "axon/runtime/pipeline/stage/staleness.h"
#include "axon/runtime/pipeline/state/recover.h"
#include "axon/runtime/pipeline/trace/metrics.h"

typedef struct feed { /* the training batches, epoch after epoch */
  ax_loader *ld;
  int epoch;
  long per_epoch, batch;
  ax_progress bar;
  double loss_sum;
  long steps;
  double *done_at; /* completion time per step */
  double *loss;
  /* after each training call (feed_segment) */
  const struct axi_run_pipe_args *a;
  ax_pipe *p;
  ax_dataset *test;
  ax_pipe_costs *costs;
  long total;           /* the run's last step */
  double train_s;       /* the calls' own seconds */
  uint64_t coord_bytes; /* the calls' coordinator bytes */
  long first;           /* the run's first step here (-1 until seeked) */
  int repacked;         /* a freeze replaced the pipeline: no timing model */
  axi_run_agents ag;    /* --spares, --restarts, --elastic */
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
  f->done_at[f->steps] = ax_clock_s();
  f->loss[f->steps] = s->loss;
  f->steps++;
  f->loss_sum += s->loss;
  double sps = s->seconds > 0 ? (double)(f->steps * f->batch) / s->seconds : 0;
  ax_progress_update(&f->bar, f->steps, sps, f->loss_sum / (double)f->steps,
                     "pipeline");
}

/* The data position of global step `step` and, with apply, the loader
 * moved there (the epoch's shuffle, then its first batches skipped). */
static int feed_seek(void *user, long step, int apply, long *epoch,
                     long *in_epoch) {
  feed *f = user;
  long per = (long)ax_loader_batches(f->ld);
  if (per < 1)
    return ax_seterr(AX_EINVAL, "the training set has no full batch");
  *epoch = step / per;
  *in_epoch = step % per;
  if (!apply)
    return AX_OK;
  /* A seek back (a lost stage rolled back to a checkpoint) forgets the
   * steps after it: they run again. */
  if (f->first < 0)
    f->first = step;
  f->steps = step - f->first > 0 ? step - f->first : 0;
  f->loss_sum = 0;
  for (long i = 0; i < f->steps; i++)
    f->loss_sum += f->loss[i];
  f->epoch = (int)*epoch;
  ax_loader_start(f->ld, f->epoch);
  for (long i = 0; i < *in_epoch; i++) {
    ax_tlist in = {0}, lab = {0};
    int rc = ax_loader_next(f->ld, &in, &lab);
    ax_tlist_clear(&in);
    ax_tlist_clear(&lab);
    AX_TRY(rc);
  }
  return AX_OK;
}

static int feed_lost(void *user, const char **names, int max) {
  return axi_run_agents_lost(&((feed *)user)->ag, names, max);
}

/* After a failed training call: every stage agent that is down (of any
 * replica or member), replaced by the next spare or by its restarted
 * self, or its replica dropped (--elastic), in a pipeline built anew. */
static int feed_rebuild(void *user, int failure, ax_pipe **p) {
  feed *f = user;
  int rc = axi_run_agents_rebuild(&f->ag, failure, p);
  f->p = *p;
  return rc;
}

static int feed_can_grow(void *user) {
  return axi_run_agents_can_grow(&((feed *)user)->ag);
}

static int feed_grow(void *user, ax_pipe **p) {
  feed *f = user;
  int rc = axi_run_agents_grow(&f->ag, p);
  f->p = *p;
  return rc;
}

static int eval_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  return ax_loader_next(user, in, lab);
}

/* Test accuracy and mean loss over --eval-limit examples (all without). */
static int evaluate(const axi_run_pipe_args *a, ax_pipe *p, ax_dataset *test,
                    double *acc, double *loss) {
  ax_loader *el = NULL;
  int rc = ax_loader_new(test, a->eval_batch, 0, 0, 0, &el);
  if (rc == AX_OK) {
    ax_loader_start(el, 0);
    long nb = a->eval_limit > 0
                  ? (a->eval_limit + a->eval_batch - 1) / a->eval_batch
                  : ax_loader_batches(el) + 1;
    rc = ax_pipe_evaluate(p, nb, eval_batch, el, acc, loss);
  }
  ax_loader_free(el);
  return rc;
}

static void feed_repacked(void *user, ax_pipe *p) {
  feed *f = user;
  f->p = p;
  f->repacked = 1;
}

/* The steps between two evaluations: --eval-every's, an epoch's with
 * --eval-every-epoch, or 0 for none. */
static long eval_period(const axi_run_pipe_args *a, long per_epoch) {
  return a->eval_every > 0 ? a->eval_every : a->epoch_eval ? per_epoch : 0;
}

/* After each training call (axi_run_train): sums its seconds and coordinator
 * bytes, feeds the timing model, and with --eval-every-epoch (--eval-every),
 * at an epoch's end (every N steps) and after the last step, evaluates and
 * prints an "epoch:" line (the epoch under way) with the modelled time so
 * far. */
static int feed_segment(void *user, long done) {
  feed *f = user;
  ax_pipe_stats st;
  ax_pipe_get_stats(f->p, &st);
  f->train_s += st.seconds;
  f->coord_bytes += st.coord_bytes;
  if (!f->repacked)
    ax_pipe_costs_add(f->costs, f->p);
  long period = eval_period(f->a, f->per_epoch);
  if (period <= 0 || f->per_epoch <= 0 || !f->steps ||
      (done % period && done != f->total))
    return AX_OK; /* not an evaluation's step (a checkpoint's cut) */
  double acc = 0, loss = 0, spb = 0;
  AX_TRY(evaluate(f->a, f->p, f->test, &acc, &loss));
  int m = ax_pipe_costs_model(f->costs, &spb) == AX_OK;
  printf("epoch: %ld steps=%ld train_loss=%.4f test_loss=%.4f "
         "test_accuracy=%.2f%% train_seconds=%.2f modelled_seconds=%.3f",
         (done + f->per_epoch - 1) / f->per_epoch, done, f->loss[f->steps - 1],
         loss, 100.0 * acc, f->train_s, m ? spb * (double)done : -1.0);
  const char *unit = ax_dataset_token_unit(f->test);
  axi_run_print_bits("train", f->loss[f->steps - 1], unit);
  axi_run_print_bits("test", loss, unit);
  printf("\n");
  fflush(stdout);
  return AX_OK;
}

/* Trains the pipeline *p of f (with f->ag.o its options) for the run's steps,
 * then writes the outputs, evaluates and prints the summary. */
static int train_and_report(const axi_run_pipe_args *a, feed *f, ax_pipe **p,
                            ax_dataset *test) {
  long total = a->steps > 0 ? a->steps : f->per_epoch * a->epochs;
  if (total <= 0)
    return ax_seterr(AX_EINVAL, "nothing to train");
  if (!(f->done_at = calloc((size_t)total, sizeof(double))) ||
      !(f->loss = calloc((size_t)total, sizeof(double))))
    return AX_ENOMEM;
  double t0 = ax_clock_s(), train_s = 0, ckpt_s = 0;
  long start = 0;
  ax_pipe_stats st = {0};
  ax_pipe_costs costs;
  ax_pipe_costs_init(&costs, f->ag.o);
  /* --local CPU agents share this host's cores: the model runs one
   * pipeline's K agents on its share of them (agents elsewhere: cores
   * unknown, each its own). */
  if (a->local > 0 && a->device.type == AX_DEV_CPU) {
    int cores = ax_local_cores(a->local) * a->K / a->local;
    costs.cores = cores > 0 ? cores : 1;
  }
  f->p = *p;
  f->test = test;
  f->costs = &costs;
  f->total = total;
  axi_run_feed fd = {feed_batch,   feed_step,
                     feed_seek,    f,
                     feed_segment, eval_period(a, f->per_epoch),
                     feed_rebuild, feed_repacked,
                     feed_lost,    feed_can_grow,
                     feed_grow};
  ax_progress_start(&f->bar, a->quiet ? NULL : stderr, total);
  int rc = axi_run_train(a, p, total, &fd, &start, &train_s, &ckpt_s);
  ax_progress_end(&f->bar);
  if (*p)
    ax_pipe_get_stats(*p, &st);
  st.seconds = train_s; /* every call's, not only the last one's */
  st.coord_bytes = f->coord_bytes;
  total -= start;
  if (ckpt_s > 0)
    fprintf(stderr,
            "axon-run: checkpoints took %.3f s, %.3f ms per step "
            "(%.2f%% of the training time)\n",
            ckpt_s, 1e3 * ckpt_s / (double)total, 100.0 * ckpt_s / train_s);
  double acc = 0, tl = 0, spb = 0;
  axi_run_steps steps = {f->steps, f->batch, f->loss, f->done_at};
  if (rc == AX_OK) {
    axi_run_write_outputs(a, *p, &steps, t0);
    rc = evaluate(a, *p, test, &acc, &tl);
  }
  /* The modelled time: the timing model fed with the measured costs (the
   * lists the run walked: its schedule's or its mode's). */
  int modelled =
      rc == AX_OK && !f->repacked && ax_pipe_costs_model(&costs, &spb) == AX_OK;
  if (rc == AX_OK)
    axi_run_summary(a, *p, &steps, &st, total, acc, tl, modelled ? spb : -1,
                    ax_dataset_token_unit(test));
  return rc;
}

static int run(const axi_run_pipe_args *a, ax_node *node) {
  const ax_model_def *def = ax_model_find(a->model);
  if (!def)
    return AX_ENOTFOUND;
  ax_config dcfg, mcfg;
  AX_TRY(ax_config_parse(&dcfg, a->data_config));
  AX_TRY(ax_model_config(def, a->model_config, &mcfg));
  ax_dataset *train = NULL, *test = NULL;
  AX_TRY(ax_dataset_open(a->dataset, &dcfg, AX_SPLIT_TRAIN, &train));
  int rc = ax_dataset_open(a->dataset, &dcfg, AX_SPLIT_TEST, &test);
  feed f = {0};
  f.batch = a->batch;
  if (rc == AX_OK)
    rc = ax_loader_new(train, a->batch, 1, 1, a->seed, &f.ld);
  int bounds[AX_PIPE_MAX_STAGES + 1];
  ax_model_info info;
  if (rc == AX_OK)
    rc = ax_model_describe(def, &mcfg, &info);
  if (rc == AX_OK && axi_run_stages(a) > info.n_blocks)
    rc = ax_seterr(AX_EINVAL, "%d stages for %d blocks", axi_run_stages(a),
                   info.n_blocks);
  if (rc == AX_OK)
    rc = axi_run_split(a, def, &mcfg, f.ld, info.n_blocks, bounds);
  if (rc == AX_OK)
    axi_run_announce(a, bounds);
  ax_pipe *p = NULL;
  const char *cur[2 * AX_PIPE_MAX_STAGES]; /* spares may replace lost
                                               ones; every replica's */
  int R = a->replicas > 1 ? a->replicas : 1;
  for (int k = 0; k < a->K * AXR_PARTS(a) && k < 2 * AX_PIPE_MAX_STAGES; k++)
    cur[k] = a->agents[k];
  ax_pipe_opts o = {a->model,
                    a->model_config,
                    a->K,
                    cur,
                    bounds,
                    a->mode,
                    a->M,
                    a->recompute,
                    a->optim,
                    a->seed,
                    a->device,
                    120000,
                    NULL,
                    a->chunks,
                    a->staleness,
                    a->stale_gamma,
                    a->stale_warmup,
                    a->ahead,
                    R,
                    a->zero,
                    a->optimizer_host,
                    a->tensor_parallel,
                    a->elastic, /* its replicas may shrink: weighed */
                    a->sum_order,
                    a->precision,
                    a->schedule};
  f.first = -1;
  f.a = a;
  axi_run_agents_init(&f.ag, a, node, &o, cur);
  f.per_epoch = f.ld ? ax_loader_batches(f.ld) : 0;
  if (rc == AX_OK)
    rc = ax_pipe_new(node, &o, &p);
  if (rc == AX_OK && axi_run_live(a)) /* recover.h */
    rc = ax_pipe_keep_boundary(p);
  if (rc == AX_OK) {
    axi_run_agents_built(&f.ag);
    rc = train_and_report(a, &f, &p, test);
  }
  ax_pipe_free(p);
  free(f.done_at);
  free(f.loss);
  ax_loader_free(f.ld);
  ax_dataset_close(train);
  ax_dataset_close(test);
  return rc;
}

/* What the world of a is for: training, probing its links or generating
 * text. */
static int use_world(axi_run_pipe_args *a, ax_node *node) {
  return a->probe ? axi_run_probe(a, node)
         : a->gen ? axi_run_gen_pipe(a, node)
                  : run(a, node);
}

int axi_run_pipe_main(axi_run_pipe_args *a) {
  pid_t pids[2 * AX_PIPE_MAX_STAGES] = {0};
  char names[AX_PIPE_MAX_STAGES][32];
  const char *agents[2 * AX_PIPE_MAX_STAGES];
  int port = 0, reserved = -1, nlocal = 0;
  char listen[64];
  if (a->local > 0)
    a->K = a->local / AXR_PARTS(a);  /* the agents of one replica's member */
  if (axi_run_fit_train(a) != AX_OK) /* --mem-cap, before any agent */
    return 2;
  if (a->local > 0) {
    if ((port = axi_run_reserve_port(&reserved)) < 0) {
      fprintf(stderr, "axon-run: no free port for the coordinator\n");
      return 1;
    }
    for (int s = 0; s < a->local; s++) { /* replica r: stage(r K + k) */
      snprintf(names[s], sizeof names[s], "stage%d", s);
      agents[s] = names[s];
    }
    for (int i = 0; i < a->nspares; i++) /* started too, after the stages */
      agents[a->local + i] = a->spares[i];
    nlocal = a->local + a->nspares;
    int known = 0; /* the optimizer host too, unless it holds a stage */
    for (int i = 0; a->optimizer_host && i < nlocal; i++)
      known |= !strcmp(agents[i], a->optimizer_host);
    if (a->optimizer_host && !known)
      agents[nlocal++] = a->optimizer_host;
    a->agents = agents;
    if (axi_run_spawn_local(nlocal, agents, port, a->agent_threads, a->plugins,
                            a->nplugins, pids) != 0) {
      close(reserved);
      return 1;
    }
  }
  ax_node_opts no;
  ax_node_opts_init(&no);
  no.name = "coordinator";
  no.threads = 4;
  no.peer_timeout_ms = 3000;
  if (a->local > 0) {
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    no.listen = listen;
    no.master = listen;
    no.world_size = nlocal + 1;
    no.rank = 0;
  } else {
    no.master = a->master;
    if (a->listen)
      no.listen = a->listen;
  }
  no.tls_ca = a->tls_ca;
  no.tls_cert = a->tls_cert;
  no.tls_key = a->tls_key;
  no.insecure = a->insecure;
  ax_node *node = NULL;
  int rc;
  if (a->emulate) { /* every stage on this node, the world's only member */
    /* Replicas or tensor parallelism: a worker per stage of every part
     * besides the default 4, since a stage's action run on a worker
     * (--ahead 1, evaluation) may wait there in a collective for the
     * other parts' (on agents, each has workers of its own). A freeze
     * re-packs the parts onto no more ranks than there were, with as
     * many chunks each. */
    int parts = AXR_PARTS(a), many = parts > 1 || a->freeze_schedule;
    rc = ax_pipe_emulator_new("emulator",
                              many ? 4 + parts * axi_run_stages(a) : 0, &node);
    for (int s = 0; s < a->K * AXR_PARTS(a) && rc == AX_OK; s++)
      agents[s] = ax_node_name(node); /* every part's */
    a->agents = agents;
    if (rc == AX_OK && a->optimizer_host) /* this node holds it too */
      a->optimizer_host = ax_node_name(node);
    if (rc == AX_OK)
      rc = use_world(a, node);
    if (rc != AX_OK)
      fprintf(stderr, "axon-run: %s: %s\n", ax_strerror(rc), ax_errmsg());
    ax_pipe_emulator_free(node);
    return rc == AX_OK ? 0 : 1;
  }
  rc = ax_node_create(&no, &node);
  if (reserved >= 0)
    close(reserved); /* the node listens on the port now (or failed) */
  if (rc == AX_OK)
    rc = ax_pipe_init(node);
  if (rc == AX_OK)
    rc = ax_plugin_attach(node);
  if (rc == AX_OK)
    rc = ax_node_join(node, 60000);
  if (rc == AX_OK)
    rc = use_world(a, node);
  if (rc != AX_OK)
    fprintf(stderr, "axon-run: %s: %s\n", ax_strerror(rc), ax_errmsg());
  if (node) {
    /* The agents leave when told to (signals only as the fallback). */
    if (a->local > 0)
      ax_local_end_world(node, nlocal, pids, 10000, NULL, "axon-run");
    ax_node_shutdown(node, 5000);
    ax_dist_fini(node);
    ax_node_destroy(node);
  }
  if (a->local > 0)
    ax_local_stop(nlocal, pids, 10000, NULL);
  return rc == AX_OK ? 0 : 1;
}
