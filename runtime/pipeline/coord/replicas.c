/* Pipeline x data parallel x tensor parallel (ax_pipe_opts.replicas and
 * .tensor_parallel, coordinator.h): the front object holds R T ordinary
 * pipelines, the parts, part r T + t being member t of replica r. The
 * stage hosts of a stage's members sum their split layers' partial results
 * (setup's tensor-parallel group), and those of a stage's replicas average
 * their gradients at every STEP (setup's replica group). A train call runs
 * every part's train call at once, one thread each; they share every
 * mini-batch (loaded once, each replica taking its rows, every member of a
 * replica the same rows) and report each mini-batch once, when every part
 * finished it. Every part on one node (an emulation, emulate.h) runs the
 * same code: the groups' members are told apart by their ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "axon/kernels/clock.h"
#include "axon/runtime/pipeline/coord/coordinator-impl.h"
#include "axon/runtime/pipeline/stage/stage_host.h"

int axi_pipe_replicas_new(ax_node *n, const ax_pipe_opts *o, ax_pipe **out) {
  int R = o->replicas > 1 ? o->replicas : 1, K = o->K;
  int T = o->tensor_parallel > 1 ? o->tensor_parallel : 1;
  *out = NULL;
  if (o->replicas > AX_PIPE_MAX_REPLICAS ||
      o->tensor_parallel > AX_PIPE_MAX_REPLICAS || K < 1 || !o->agents ||
      R * T > AX_PIPE_MAX_REPLICAS || (long)R * T * K > 4L * AX_PIPE_MAX_STAGES)
    return ax_seterr(AX_EINVAL,
                     "pipeline: %d replicas x %d tensor-parallel "
                     "members of %d agents (at most %d parts)",
                     o->replicas, o->tensor_parallel, K, AX_PIPE_MAX_REPLICAS);
  if (o->zero < 0 || o->zero > 2 || (o->zero && R < 2))
    return ax_seterr(AX_EINVAL,
                     "pipeline: zero %d (0, 1 or 2, over at "
                     "least 2 replicas)",
                     o->zero);
  int N = R * T, one = 1; /* one node hosts every part (an emulation) */
  for (int i = 0; i < N * K && one; i++)
    one = o->agents[i] && !strcmp(o->agents[i], o->agents[0]);
  for (int i = 0; i < N * K && !one; i++)
    for (int j = 0; j < i; j++)
      if (!o->agents[i] || !strcmp(o->agents[i], o->agents[j]))
        return ax_seterr(AX_EINVAL,
                         "pipeline: the %d agents of %d replicas "
                         "x %d tensor-parallel members must be %d distinct "
                         "names, or one name for all (%s twice)",
                         N * K, R, T, N * K,
                         o->agents[i] ? o->agents[i] : "none");
  ax_pipe *f = axi_pipe_alloc(n, o); /* the front */
  if (!f)
    return AX_ENOMEM;
  uint64_t id = 0;
  if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id)
    id = (uint64_t)(uintptr_t)f ^ (uint64_t)(ax_clock_s() * 1e9);
  int err = AX_OK;
  for (int i = 0; i < N && err == AX_OK; i++) {
    ax_pipe_opts ro = *o;
    ro.replicas = 0;
    ro.agents = o->agents + (size_t)i * K;
    axi_pipe_replica_of of = {R, i / T, id, o->agents, T, i % T};
    err = axi_pipe_create(n, &ro, &of, &f->rep[i]);
    if (err == AX_OK)
      f->nrep = i + 1;
    else if (T > 1) /* ax_seterr may quote its own message */
      err =
          ax_seterr(err, "replica %d member %d: %s", i / T, i % T, ax_errmsg());
    else
      err = ax_seterr(err, "replica %d: %s", i, ax_errmsg());
  }
  if (err != AX_OK) {
    char m[512];
    snprintf(m, sizeof m, "%s", ax_errmsg());
    if (!f->nrep) {
      ax_pipe_sched_free(f->sched);
      free(f);
    } else
      ax_pipe_free(f);
    return ax_seterr(err, "%s", m);
  }
  f->K = f->rep[0]->K;
  f->R = f->rep[0]->R;
  f->v = f->rep[0]->v;
  f->U = f->rep[0]->U;
  *out = f;
  return AX_OK;
}

/* ---- one train call ------------------------------------------------------ */
typedef struct shared_batch { /* mini-batch t while replicas take it */
  int loaded, taken, err;
  ax_tlist in, lab;
  int64_t norm[AX_TLIST_MAX]; /* the whole mini-batch's label counts */
} shared_batch;

typedef struct shared_step { /* replica r's report of a mini-batch */
  double loss;
  int64_t correct, count;
} shared_step;

typedef struct share {
  int R, T, N;         /* replicas, members of each, parts (R T) */
  ax_pipe *const *rep; /* the parts */
  int failed;          /* a replica's call failed (atomic) */
  int weighted;        /* ax_pipe_opts.weighted */
  long base;           /* global id of the call's first mini-batch */
  ax_pipe_batch_fn batch;
  ax_pipe_step_fn step;
  void *user;
  pthread_mutex_t mu;
  shared_batch *b; /* [n] */
  int *reported;   /* [n]: the parts that reported mini-batch t */
  shared_step *st; /* [n R]: replica r's of mini-batch t at t R + r */
  int whole;       /* the sum tree: every loss divided by the whole mini-batch's
                     label counts (ax_pipe_opts.sum_order) */
} share;

typedef struct replica_run {
  share *sh;
  ax_pipe *p;
  int r, t, err; /* replica, member */
  long n;
  char msg[512];
} replica_run;

/* Rows r B / R .. (r + 1) B / R - 1 of every tensor of src (B: the first
 * input's rows; a tensor of k B rows gives k rows per example). */
static int take_rows(const ax_tlist *src, int64_t B, int r, int R,
                     ax_tlist *dst) {
  int64_t lo = B * r / R, hi = B * (r + 1) / R;
  memset(dst, 0, sizeof *dst);
  for (int i = 0; i < src->n; i++) {
    const ax_tensor *x = src->t[i];
    int64_t f = x->shape[0] / B;
    if (f < 1 || x->shape[0] % B)
      return ax_seterr(AX_ESHAPE,
                       "replicas: a batch tensor of %lld rows for "
                       "%lld examples",
                       (long long)x->shape[0], (long long)B);
    if (!(dst->t[dst->n++] = ax_tensor_slice0(x, lo * f, (hi - lo) * f)))
      return AX_ENOMEM;
  }
  return AX_OK;
}

static int shard_batch(void *user, long gid, ax_tlist *in, ax_tlist *lab) {
  replica_run *rr = user;
  share *sh = rr->sh;
  long t = gid - sh->base;
  if (t < 0 || t >= rr->n)
    return ax_seterr(AX_EINVAL, "replicas: mini-batch %ld outside the call",
                     gid);
  if (__atomic_load_n(&sh->failed, __ATOMIC_ACQUIRE))
    return ax_seterr(AX_ECANCELLED, "replicas: another replica failed");
  shared_batch *b = &sh->b[t];
  pthread_mutex_lock(&sh->mu);
  if (!b->loaded) {
    b->err = sh->batch(sh->user, gid, &b->in, &b->lab);
    b->loaded = 1;
    if (b->err == AX_OK && (b->in.n < 1 || b->in.t[0]->shape[0] < sh->R))
      b->err = ax_seterr(AX_EINVAL,
                         "replicas: mini-batch %ld has fewer "
                         "examples than %d replicas",
                         gid, sh->R);
    if (b->err == AX_OK)
      axi_pipe_label_counts(&b->lab, rr->p->ignore_index, b->norm);
  }
  int err = b->err;
  if (err == AX_OK) {
    int64_t B = b->in.t[0]->shape[0];
    err = take_rows(&b->in, B, rr->r, sh->R, in);
    if (err == AX_OK)
      err = take_rows(&b->lab, B, rr->r, sh->R, lab);
    int64_t n = B * (rr->r + 1) / sh->R - B * rr->r / sh->R; /* its rows */
    /* Its share's weight, in the chain's per-replica means (the sum tree
     * divides every loss by the whole mini-batch's counts already). */
    if (err == AX_OK && sh->weighted && !sh->whole && B % sh->R)
      rr->p->b[t].scale = (double)n * sh->R / (double)B;
  }
  if (err != AX_OK) {
    ax_tlist_clear(in);
    ax_tlist_clear(lab);
  }
  if (++b->taken == sh->N) { /* the shards keep their rows alive */
    ax_tlist_clear(&b->in);
    ax_tlist_clear(&b->lab);
  }
  pthread_mutex_unlock(&sh->mu);
  return err;
}

/* The whole mini-batch's label counts, for a part's losses (its norm_fn
 * in the sum tree): shard_batch counted them as it loaded the batch. */
static int shard_norm(void *user, long gid, int64_t *norm) {
  replica_run *rr = user;
  share *sh = rr->sh;
  long t = gid - sh->base;
  if (t < 0 || t >= rr->n)
    return ax_seterr(AX_EINVAL, "replicas: mini-batch %ld outside the call",
                     gid);
  pthread_mutex_lock(&sh->mu);
  memcpy(norm, sh->b[t].norm, sizeof sh->b[t].norm);
  pthread_mutex_unlock(&sh->mu);
  return AX_OK;
}

/* Reports mini-batch t once every part did: in the sum tree the tree sum
 * of the replicas' losses (each a part of the whole mini-batch's mean, as
 * their gradients), else their mean weighted by their label counts (their
 * plain mean when nothing was counted), summed in replica order whatever
 * order they finished in, so the bits do not depend on timing. A replica's
 * members report the same loss: member 0's counts. */
static void shard_step(void *user, const ax_pipe_step_info *si) {
  replica_run *rr = user;
  share *sh = rr->sh;
  long t = si->batch - sh->base;
  if (t < 0 || t >= rr->n)
    return;
  pthread_mutex_lock(&sh->mu);
  shared_step *st = &sh->st[t * sh->R];
  if (rr->t == 0)
    st[rr->r] = (shared_step){si->loss, si->correct, si->count};
  if (++sh->reported[t] == sh->N && sh->step) {
    ax_pipe_step_info g = *si;
    double loss_w = 0, loss = 0; /* count-weighted loss sum; plain sum */
    g.correct = g.count = 0;
    for (int r = 0; r < sh->R; r++) {
      loss_w += st[r].loss * (double)st[r].count;
      loss += st[r].loss;
      g.correct += st[r].correct;
      g.count += st[r].count;
    }
    double part[AX_PIPE_MAX_REPLICAS];
    for (int r = 0; r < sh->R; r++)
      part[r] = st[r].loss;
    g.loss = sh->whole ? axi_pipe_sum_losses(AX_SUM_TREE, part, sh->R)
             : g.count ? loss_w / (double)g.count
                       : loss / sh->R;
    sh->step(sh->user, &g);
  }
  pthread_mutex_unlock(&sh->mu);
}

/* Runs one replica's train call. The first replica to fail ends the
 * others' calls at once (their drivers stop waiting, and their next batch
 * load is refused), instead of leaving them in an all-reduce that waits
 * for it until the timeout. */
static void *replica_main(void *arg) {
  replica_run *rr = arg;
  share *sh = rr->sh;
  /* A part is one pipeline, without a frozen prefix (the front has it). */
  rr->err = axi_pipe_train_one(rr->p, rr->n, shard_batch, shard_step, rr);
  if (rr->err == AX_OK)
    return NULL;
  snprintf(rr->msg, sizeof rr->msg, "%s", ax_errmsg());
  __atomic_store_n(&sh->failed, 1, __ATOMIC_RELEASE);
  for (int q = 0; q < sh->N; q++) {
    ax_pipe *o = sh->rep[q];
    if (o == rr->p)
      continue;
    pthread_mutex_lock(&o->mu); /* before or after its call: harmless */
    axi_pipe_fail(o, 0, AX_ECANCELLED, "another replica failed");
    pthread_mutex_unlock(&o->mu);
  }
  return NULL;
}

int axi_pipe_replicas_train(ax_pipe *p, long n, ax_pipe_batch_fn batch,
                            ax_pipe_step_fn step, void *user) {
  int R = p->nrep;
  int T = axi_pipe_members(p);
  share sh = {R / T,           T,     R,    p->rep, 0, p->o.weighted,
              p->rep[0]->base, batch, step, user};
  sh.whole = p->o.sum_order == AX_SUM_TREE;
  pthread_mutex_init(&sh.mu, NULL);
  sh.b = calloc((size_t)n + 1, sizeof *sh.b);
  sh.reported = calloc((size_t)n + 1, sizeof *sh.reported);
  sh.st = calloc(((size_t)n + 1) * (size_t)sh.R, sizeof *sh.st);
  replica_run rr[AX_PIPE_MAX_REPLICAS];
  pthread_t th[AX_PIPE_MAX_REPLICAS];
  int started = 0, err = sh.b && sh.reported && sh.st ? AX_OK : AX_ENOMEM;
  for (int r = 0; r < R && err == AX_OK; r++) {
    rr[r] = (replica_run){&sh, p->rep[r], r / sh.T, r % sh.T, AX_OK, n, ""};
    p->rep[r]->norm_fn = sh.whole ? shard_norm : NULL;
    if (p->rep[r]->base != sh.base)
      err = ax_seterr(AX_ESTATE,
                      "replicas: replica %d is at mini-batch %ld, "
                      "replica 0 at %ld",
                      r, p->rep[r]->base, sh.base);
    else if (pthread_create(&th[r], NULL, replica_main, &rr[r]) != 0)
      err = ax_seterr(AX_ENOMEM, "replicas: cannot start a thread");
    else
      started++;
  }
  for (int r = 0; r < started; r++)
    pthread_join(th[r], NULL);
  /* The error to report: a replica that lost one of its own agents (the
   * others then fail in their all-reduce, naming a peer), else the first. */
  int pick = -1;
  for (int r = 0; r < started && pick < 0; r++)
    if (rr[r].err == AX_EPEERDOWN && axi_pipe_down_stage(p->rep[r]) >= 0)
      pick = r;
  for (int r = 0; r < started && pick < 0; r++) /* not the cancelled ones */
    if (rr[r].err != AX_OK && rr[r].err != AX_ECANCELLED)
      pick = r;
  for (int r = 0; r < started && pick < 0; r++)
    if (rr[r].err != AX_OK)
      pick = r;
  if (err == AX_OK && pick >= 0 && sh.T > 1)
    err = ax_seterr(rr[pick].err, "replica %d member %d: %s", pick / sh.T,
                    pick % sh.T, rr[pick].msg);
  else if (err == AX_OK && pick >= 0)
    err = ax_seterr(rr[pick].err, "replica %d: %s", pick, rr[pick].msg);
  for (long t = 0; sh.b && t < n; t++) {
    ax_tlist_clear(&sh.b[t].in);
    ax_tlist_clear(&sh.b[t].lab);
  }
  free(sh.b);
  free(sh.reported);
  free(sh.st);
  pthread_mutex_destroy(&sh.mu);
  return err;
}
