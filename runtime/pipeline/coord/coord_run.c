/* A train call of one pipeline (axi_pipe_train_one, behind ax_pipe_train):
 * one driver thread per agent (rank) walks its action list (the mode
 * table's plan, mode.h; the actions of every stage it holds), issuing each
 * action once its dependencies completed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/pipeline/coord/coordinator-impl.h"
#include "axon/runtime/pipeline/stage/stage_host.h"
#include "axon/runtime/pipeline/stage/stage_line-impl.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"

#define POLL_MS 100

int axi_pipe_down_stage(const ax_pipe *p) {
  for (int j = 0; j < p->K; j++)
    if (ax_node_peer_is_down(p->node, p->agents[j]))
      return j;
  return -1;
}

void axi_pipe_fail(ax_pipe *p, int s, int err, const char *what) {
  if (p->err == AX_OK) {
    p->err = err;
    /* A lost agent is often noticed first by a neighbour waiting for its
     * tensors (stage-driven execution): name the agent that is down. */
    int down = err == AX_EPEERDOWN ? axi_pipe_down_stage(p) : -1;
    /* Not seen from here yet: the stage's message names it ("A is down",
     * from the autograd engine's takes). */
    for (int j = 0; err == AX_EPEERDOWN && down < 0 && j < p->K; j++) {
      char said[AXP_NAME + 16];
      snprintf(said, sizeof said, " %s is down", p->agents[j]);
      if (strstr(what, said))
        down = j;
    }
    if (down >= 0 && down != s)
      snprintf(p->msg, sizeof p->msg,
               "stage %d on agent %s: peer is down "
               "(seen by stage %d: %s)",
               down, p->agents[down], s, what);
    else
      snprintf(p->msg, sizeof p->msg, "stage %d on agent %s: %s", s,
               p->agents[s], what);
  }
  pthread_cond_broadcast(&p->cv);
}

static int64_t timeout_of(const ax_pipe *p) {
  return p->o.timeout_ms > 0 ? p->o.timeout_ms : 60000;
}

static unsigned char *done_at(ax_pipe *p, const ax_pipe_op *o) {
  long u = (long)o->batch * p->U + o->micro;
  return &p->done[((long)o->stage * AX_OP_KINDS + o->kind) * p->n * p->U + u];
}

/* Every unit has its own context: a micro-batch, or a mini-batch in the
 * modes whose unit is one (U = 1 there). */
static long ctx_index(const ax_pipe *p, const ax_pipe_op *o) {
  return (long)o->batch * p->U + o->micro;
}

static int deps_done(ax_pipe *p, const ax_pipe_op *deps, int nd) {
  for (int i = 0; i < nd; i++)
    if (!*done_at(p, &deps[i]))
      return 0;
  return 1;
}

static void event_add(ax_pipe *p, const ax_pipe_op *o, double t_issue,
                      const axi_pipe_report_msg *r) {
  if (p->nev == p->cap_ev) {
    long cap = p->cap_ev ? 2 * p->cap_ev : 256;
    ax_pipe_event *e = realloc(p->ev, (size_t)cap * sizeof *e);
    if (!e)
      return;
    p->ev = e;
    p->cap_ev = cap;
  }
  ax_pipe_event *e = &p->ev[p->nev++];
  e->op = *o;
  e->t_issue = t_issue;
  e->t_done = ax_clock_s();
  e->busy_s = (double)r->busy_us * 1e-6;
  e->cpu_s = (double)r->cpu_us * 1e-6;
  e->live = (int)r->live;
  e->versions = (int)r->versions;
  e->state_bytes = r->state_bytes;
  ax_pipe_stats *st = &p->stats;
  int s = o->stage;
  st->busy_frac[s] += e->busy_s; /* normalised at the end */
  if (e->live > st->peak_live[s])
    st->peak_live[s] = e->live;
  if (e->versions > st->peak_versions[s])
    st->peak_versions[s] = e->versions;
  if (e->state_bytes > st->peak_bytes[s])
    st->peak_bytes[s] = e->state_bytes;
}

/* Bookkeeping after op (and the STEP merged into it) completed (mu held).
 * A unit's context is finished once every stage ran its last backward
 * action of it (B, or W for split modes; each took its gradients out): it
 * goes to the background releaser; returns the context the caller must
 * release itself (0: none, or queued) and whether the mini-batch is
 * finished. */
static uint64_t op_finished(ax_pipe *p, const ax_pipe_op *o, int merged,
                            const axi_pipe_report_msg *r, double t_issue,
                            int *batch_done) {
  *done_at(p, o) = 1;
  if (merged) {
    ax_pipe_op st = {AX_OP_STEP, o->stage, o->batch, 0};
    *done_at(p, &st) = 1;
  }
  *batch_done = 0;
  if (o->kind == AX_OP_STEP) {
    pthread_cond_broadcast(&p->cv);
    return 0;
  }
  event_add(p, o, t_issue, r);
  axi_pipe_batch *b = &p->b[o->batch];
  if (o->kind == AX_OP_FWD && o->stage == p->K - 1) {
    p->losses[ctx_index(p, o)] = r->loss; /* 0 without a loss part */
    b->correct += r->correct;
    b->count += r->count;
  }
  uint64_t rel = 0;
  long ci = ctx_index(p, o);
  if ((o->kind == AX_OP_BWD || o->kind == AX_OP_WEIGHT_GRAD) &&
      --p->stages_left[ci] == 0) { /* every stage is done with the unit */
    b->units_left--;
    rel = p->ctx[ci];
    p->ctx[ci] = 0;
    if (axi_pipe_release_push(p, rel))
      rel = 0; /* the background releaser owns it now */
    *batch_done = b->units_left == 0;
  }
  pthread_cond_broadcast(&p->cv);
  return rel;
}

/* Waits for f, giving up early when another driver failed; the deadline
 * counts from `since` (when f became the driver's oldest unanswered
 * action: actions issued ahead wait for the ones before them). */
static int wait_future(ax_pipe *p, ax_future *f, double since) {
  int64_t end = (int64_t)(since * 1e3) + timeout_of(p) + 1000;
  for (;;) {
    int err = ax_future_wait(f, POLL_MS);
    if (err != AX_ETIMEOUT)
      return err;
    if (ax_future_is_done(f)) /* it completed as the poll ran out */
      return ax_future_err(f);
    if (__atomic_load_n(&p->err, __ATOMIC_ACQUIRE) != AX_OK)
      return AX_ECANCELLED;
    if ((int64_t)(ax_clock_s() * 1e3) > end)
      return ax_seterr(AX_ETIMEOUT, "no answer in %lld ms",
                       (long long)timeout_of(p));
  }
}

typedef struct inflight { /* an issued action not answered yet */
  ax_pipe_op op;
  int merged;
  ax_future *f;
  double t_issue;
} inflight;

typedef struct driver {
  ax_pipe *p;
  int s;       /* its rank (agent) */
  inflight *q; /* ring of o.ahead issued actions, oldest at head */
  int head, count;
  int64_t seq;   /* sequenced actions issued (stage_line-impl.h) */
  double t_last; /* when the last answer came (or the run began) */
} driver;

static const char *const g_methods[AX_OP_KINDS] = {"fwd", "bwd", "bwdi", "bwdw",
                                                   "step"};
static const char *const g_what[AX_OP_KINDS] = {
    "forward", "backward", "input gradient", "weight gradient", "step"};

/* Waits until the nd actions in deps completed, then issues op (and the
 * STEP merged into it) without waiting for its answer. Stage-driven, the
 * call carries the rank's line, the train call and its place in the
 * rank's order, and its deadline leaves room for the actions before it. */
static int issue(driver *d, const ax_pipe_op *o, int merged,
                 const ax_pipe_op *deps, int nd) {
  ax_pipe *p = d->p;
  double start = ax_clock_s(), lim = timeout_of(p) * 1e-3;
  pthread_mutex_lock(&p->mu);
  while (p->err == AX_OK && !deps_done(p, deps, nd)) {
    struct timespec ts = ax_clock_after_ms(CLOCK_REALTIME, POLL_MS);
    pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    if (ax_clock_s() - start > lim)
      axi_pipe_fail(p, o->stage, AX_ETIMEOUT,
                    "waited too long for a neighbour");
  }
  int err = p->err != AX_OK ? AX_ECANCELLED : AX_OK;
  ax_values *a = NULL;
  uint64_t ctx = 0;
  if (err == AX_OK && !g_methods[o->kind])
    err =
        ax_seterr(AX_EUNSUPPORTED, "pipeline: the stage host has no %s action",
                  g_what[o->kind]);
  if (err == AX_OK && o->kind != AX_OP_STEP) {
    long ci = ctx_index(p, o);
    if (!p->ctx[ci] &&
        (err = ax_dist_context_new(p->node, &p->ctx[ci])) == AX_OK)
      ax_autograd_ctx_set_current(0);
    ctx = p->ctx[ci];
  }
  if (err == AX_OK)
    err = axi_pipe_make_args(p, o, merged, &a);
  if (err != AX_OK && err != AX_ECANCELLED)
    axi_pipe_fail(p, o->stage, err, ax_errmsg());
  pthread_mutex_unlock(&p->mu);
  int ahead = p->o.ahead;
  const char *keys[3] = {AXP_META_LINE, AXP_META_GEN, AXP_META_SEQ};
  int64_t vals[3] = {(int64_t)p->line[d->s], p->gen, d->seq};
  int64_t tmo = timeout_of(p);
  ax_call_opts co = {.timeout_ms =
                         tmo > INT64_MAX / ahead ? INT64_MAX : tmo * ahead,
                     .autograd_ctx = ctx};
  if (ahead > 1) {
    co.nmeta = 3;
    co.meta_key = keys;
    co.meta_val = vals;
  }
  inflight *e = &d->q[(d->head + d->count) % ahead];
  *e = (inflight){*o, merged, NULL, ax_clock_s()};
  if (err == AX_OK)
    err = ax_rref_rpc_async(p->node, p->host[o->stage], g_methods[o->kind], a,
                            &co, &e->f);
  ax_values_free(a);
  if (err == AX_OK) {
    d->count++;
    d->seq++;
  } else if (err != AX_ECANCELLED) {
    char what[400];
    snprintf(what, sizeof what, "%s %s of batch %d/%d: %s", ax_strerror(err),
             g_what[o->kind], o->batch, o->micro, ax_errmsg());
    pthread_mutex_lock(&p->mu);
    axi_pipe_fail(p, o->stage, err, what);
    pthread_mutex_unlock(&p->mu);
  }
  return err;
}

/* Waits for the driver's oldest unanswered action and books its answer. */
static int reap(driver *d) {
  ax_pipe *p = d->p;
  inflight e = d->q[d->head];
  const ax_pipe_op *o = &e.op;
  d->head = (d->head + 1) % p->o.ahead;
  d->count--;
  ax_future *f = e.f;
  int err = wait_future(p, f, e.t_issue > d->t_last ? e.t_issue : d->t_last);
  d->t_last = ax_clock_s();
  axi_pipe_report_msg rep;
  if (err == AX_OK)
    err = axi_pipe_report_decode(ax_future_values(f), &rep);
  char what[400] = "";
  if (err != AX_OK && err != AX_ECANCELLED)
    snprintf(what, sizeof what, "%s %s of batch %d/%d: %s", ax_strerror(err),
             g_what[o->kind], o->batch, o->micro,
             ax_future_is_done(f) && ax_future_err(f) ? ax_future_errmsg(f)
                                                      : ax_errmsg());
  pthread_mutex_lock(&p->mu);
  uint64_t rel = 0;
  int batch_done = 0;
  if (err == AX_OK)
    rel = op_finished(p, o, e.merged, &rep, e.t_issue, &batch_done);
  else if (err != AX_ECANCELLED)
    axi_pipe_fail(p, o->stage, err, what);
  pthread_mutex_unlock(&p->mu);
  ax_future_release(f);
  if (rel)
    ax_dist_context_release(p->node, rel, 10000);
  if (batch_done) {
    axi_pipe_batch *b = &p->b[o->batch];
    double loss = axi_pipe_sum_losses(
        p->o.sum_order, p->losses + (size_t)o->batch * p->U, p->U);
    ax_pipe_step_info info = {p->base + o->batch, loss, ax_clock_s() - p->t0,
                              b->correct, b->count};
    if (p->step_fn)
      p->step_fn(p->user, &info);
    pthread_mutex_lock(&p->mu);
    ax_tlist_clear(&b->in);
    ax_tlist_clear(&b->lab);
    pthread_mutex_unlock(&p->mu);
  }
  return err;
}

/* Walks the rank's list. Coordinator-driven (o.ahead 1) every action waits
 * for the one before and for its dependencies; stage-driven it waits only
 * for room among o.ahead unanswered actions, and for the dependencies that
 * carry no data, after the rank's own earlier actions (which may be among
 * them). The first part of a composite (with_next) waits for the
 * dependencies of both parts either way: a stage waits only for its own
 * action's inputs, and the composite starts when both parts could
 * (mode.h); its second part is issued right after it, so the rank's line
 * runs the two back to back. */
static void *driver_main(void *arg) {
  driver *d = arg;
  ax_pipe *p = d->p;
  long n_ops = 0;
  const ax_pipe_op *ops = ax_pipe_plan_actions(p->plan, d->s, &n_ops);
  int err = AX_OK, ahead = p->o.ahead;
  d->t_last = ax_clock_s();
  for (long i = 0; err == AX_OK && i < n_ops; i++) {
    /* A STEP right after the same stage's backward (or weight half) of that
     * batch rides on that call. */
    int merged =
        (ops[i].kind == AX_OP_BWD || ops[i].kind == AX_OP_WEIGHT_GRAD) &&
        i + 1 < n_ops && ops[i + 1].kind == AX_OP_STEP &&
        ops[i + 1].stage == ops[i].stage && ops[i + 1].batch == ops[i].batch;
    ax_pipe_op deps[AX_PIPE_MAX_STAGES + 2];
    int nd = ahead > 1 && !ops[i].with_next
                 ? ax_pipe_plan_lock_deps(p->plan, &ops[i], deps)
                 : ax_pipe_plan_deps(p->plan, &ops[i], deps);
    while (err == AX_OK && d->count > 0 && (nd > 0 || d->count >= ahead))
      err = reap(d);
    if (err == AX_OK)
      err = issue(d, &ops[i], merged, deps, nd);
    i += merged;
  }
  while (err == AX_OK && d->count > 0)
    err = reap(d);
  for (; d->count > 0; d->count--) { /* after an error: left unanswered */
    ax_future_release(d->q[d->head].f);
    d->head = (d->head + 1) % ahead;
  }
  return NULL;
}

int axi_pipe_train_one(ax_pipe *p, long n, ax_pipe_batch_fn batch,
                       ax_pipe_step_fn step, void *user) {
  size_t units = (size_t)n * (size_t)p->U;
  p->n = n;
  int perr = axi_pipe_plan_of(p, n, &p->plan);
  if (perr != AX_OK)
    return perr;
  p->done = calloc((size_t)p->K * AX_OP_KINDS * units + 1, 1);
  p->ctx = calloc(units + 1, sizeof *p->ctx);
  p->stages_left = malloc((units + 1) * sizeof *p->stages_left);
  for (size_t i = 0; p->stages_left && i < units; i++)
    p->stages_left[i] = p->K;
  p->b = calloc((size_t)n + 1, sizeof *p->b);
  p->losses = calloc(units + 1, sizeof *p->losses);
  p->err = AX_OK;
  p->msg[0] = 0;
  p->batch_fn = batch;
  p->step_fn = step;
  p->user = user;
  p->nev = 0;
  memset(&p->stats, 0, sizeof p->stats);
  if (!p->done || !p->ctx || !p->b || !p->stages_left || !p->losses) {
    free(p->done), free(p->ctx), free(p->b), free(p->stages_left);
    free(p->losses);
    p->losses = NULL;
    ax_pipe_plan_free(p->plan);
    p->plan = NULL;
    return AX_ENOMEM;
  }
  /* Without the releaser (no thread), contexts are released synchronously
   * by the drivers, as before: slower, still correct. */
  axi_pipe_release_start(p, units);
  ax_node_stats ns0, ns1;
  ax_node_stats_get(p->node, &ns0);
  p->t0 = ax_clock_s();
  pthread_t th[AX_PIPE_MAX_STAGES];
  driver d[AX_PIPE_MAX_STAGES];
  int started = 0;
  p->gen++;
  for (int s = 0; s < p->R; s++) {
    d[s] = (driver){p, s, calloc((size_t)p->o.ahead, sizeof(inflight))};
    if (!d[s].q) {
      pthread_mutex_lock(&p->mu);
      axi_pipe_fail(p, s, AX_ENOMEM, "no memory for a driver");
      pthread_mutex_unlock(&p->mu);
      break;
    }
    if (pthread_create(&th[s], NULL, driver_main, &d[s]) != 0) {
      pthread_mutex_lock(&p->mu);
      axi_pipe_fail(p, s, AX_ENOMEM, "cannot start a driver thread");
      pthread_mutex_unlock(&p->mu);
      break;
    }
    started++;
  }
  for (int s = 0; s < started; s++)
    pthread_join(th[s], NULL);
  for (int s = 0; s < p->R && s <= started; s++)
    free(d[s].q);
  double wall = ax_clock_s() - p->t0;
  axi_pipe_release_stop(p); /* drains the queue: no context outlives the call */
  ax_node_stats_get(p->node, &ns1);
  p->stats.seconds = wall;
  p->stats.batches = n;
  p->stats.coord_bytes =
      (ns1.bytes_in - ns0.bytes_in) + (ns1.bytes_out - ns0.bytes_out);
  for (int s = 0; s < p->K; s++)
    p->stats.busy_frac[s] = wall > 0 ? p->stats.busy_frac[s] / wall : 0;
  /* Contexts of units that did not finish (after an error). */
  for (size_t i = 0; i < units; i++)
    if (p->ctx[i])
      ax_dist_context_release(p->node, p->ctx[i], 2000);
  for (long t = 0; t < n; t++) {
    ax_tlist_clear(&p->b[t].in);
    ax_tlist_clear(&p->b[t].lab);
  }
  free(p->done), free(p->ctx), free(p->b), free(p->stages_left);
  free(p->losses);
  p->done = NULL, p->ctx = NULL, p->b = NULL, p->stages_left = NULL;
  p->losses = NULL;
  ax_pipe_plan_free(p->plan);
  p->plan = NULL;
  p->base += n;
  if (p->err != AX_OK)
    return ax_seterr(p->err, "%s", p->msg);
  return axi_pipe_ties_settle(p); /* the last STEPs' tied updates */
}
