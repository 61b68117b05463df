/* The coordinator's set-up of one pipeline and state access (evaluation
 * through the stages is in coord_eval.c). ax_pipe_new is in coord_front.c,
 * the driver threads of training in coord_run.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "axon/kernels/clock.h"
#include "axon/models/model.h"
#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/pipeline/coord/coordinator-impl.h"
#include "axon/runtime/pipeline/schedule/verify.h"
#include "axon/runtime/pipeline/stage/stage_host.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"
#include "axon/runtime/pipeline/stage/staleness.h"
#include "axon/runtime/pipeline/state/checkpoint.h"

int ax_pipe_recompute_parse(const char *s, int *out) {
  if (s && !strcmp(s, "always"))
    *out = AX_RECOMPUTE_ALWAYS;
  else if (s && !strcmp(s, "except-last"))
    *out = AX_RECOMPUTE_EXCEPT_LAST;
  else if (s && !strcmp(s, "never"))
    *out = AX_RECOMPUTE_NEVER;
  else
    return ax_seterr(AX_EINVAL,
                     "recompute '%s': expected always, "
                     "except-last or never",
                     s ? s : "(null)");
  return AX_OK;
}

/* Tensor parallelism needs a model with split layers: one whose default
 * configuration names `tp` (models/layers/parallel.h); the coordinator
 * sets tp and tp_rank itself. */
static int check_tensor_parallel(const ax_pipe_opts *o,
                                 const ax_model_def *def) {
  ax_config user, dflt;
  AX_TRY(ax_config_parse(&user, o->model_config ? o->model_config : ""));
  if (ax_config_has(&user, "tp") || ax_config_has(&user, "tp_rank"))
    return ax_seterr(AX_EINVAL,
                     "pipeline: tp and tp_rank are set by the "
                     "coordinator (tensor_parallel, --tensor-parallel), not "
                     "in the model configuration");
  if (o->tensor_parallel < 0 || o->tensor_parallel > AX_PIPE_MAX_REPLICAS)
    return ax_seterr(AX_EINVAL, "pipeline: tensor_parallel %d outside 0..%d",
                     o->tensor_parallel, AX_PIPE_MAX_REPLICAS);
  if (o->tensor_parallel < 2)
    return AX_OK;
  AX_TRY(
      ax_config_parse(&dflt, def->default_config ? def->default_config : ""));
  if (!ax_config_has(&dflt, "tp"))
    return ax_seterr(AX_EUNSUPPORTED,
                     "pipeline: model %s has no "
                     "tensor-parallel layers (its default configuration has "
                     "no tp key; bert has)",
                     def->name);
  return AX_OK;
}

static int check_opts(const ax_pipe_opts *o, ax_model_info *info,
                      const ax_model_def **def) {
  if (!o || !o->model || !o->agents || o->K < 1 || o->K > AX_PIPE_MAX_STAGES)
    return ax_seterr(AX_EINVAL,
                     "pipeline: need a model, 1..%d stages and "
                     "their agents",
                     AX_PIPE_MAX_STAGES);
  if (!ax_pipe_mode_get(o->mode))
    return AX_EINVAL;
  if (o->optimizer_host &&
      (!*o->optimizer_host || strlen(o->optimizer_host) >= AXP_NAME))
    return ax_seterr(AX_EINVAL, "pipeline: an optimizer host needs a name");
  if (o->optimizer_host && o->zero)
    return ax_seterr(AX_EINVAL,
                     "pipeline: an optimizer host keeps each stage's whole "
                     "optimizer state on one agent, and zero shards it over "
                     "the replicas: one or the other");
  AX_TRY(axi_pipe_check_schedule(o));
  int S = ax_pipe_opts_stages(o);
  if (o->chunks < 0 || S > AX_PIPE_MAX_STAGES)
    return ax_seterr(AX_EINVAL,
                     "pipeline: %d agents holding %d stages: at most "
                     "%d stages",
                     o->K, S, AX_PIPE_MAX_STAGES);
  if (o->M < 1 || o->M > 1024)
    return ax_seterr(AX_EINVAL, "pipeline: %d micro-batches", o->M);
  if (!ax_sum_order_name(o->sum_order))
    return ax_seterr(AX_EINVAL, "pipeline: sum order %d", o->sum_order);
  if (!ax_precision_name(o->precision))
    return ax_seterr(AX_EINVAL, "pipeline: precision %d", o->precision);
  int U = ax_pipe_units(o->mode, o->M);
  if (U < ax_pipe_min_units(o->mode, o->K))
    return ax_seterr(AX_EINVAL,
                     "pipeline: %s with %d stages needs at least "
                     "%d micro-batches (got %d)",
                     ax_pipe_mode_name(o->mode), o->K,
                     ax_pipe_min_units(o->mode, o->K), o->M);
  if (!o->schedule && ax_pipe_mode_get(o->mode)->chunked &&
      ax_pipe_mode_get(o->mode)->placement == AX_PLACE_LOOP && U % o->K)
    return ax_seterr(AX_EINVAL,
                     "pipeline: %s needs a multiple of its %d "
                     "agents as micro-batches (got %d)",
                     ax_pipe_mode_name(o->mode), o->K, o->M);
  /* The run's schedule (the mode's, or the one given) for two mini-batches
   * (a flush and a steady state), verified before any agent is contacted
   * (verify.h): complete, free of deadlock. */
  AX_TRY(o->schedule ? ax_pipe_sched_verify(o->schedule, NULL)
                     : ax_pipe_verify_mode(o->mode, o->K, o->chunks, o->M, 2));
  AX_TRY(ax_staleness_check(o->mode, o->staleness,
                            o->stale_gamma ? o->stale_gamma : AX_PIPEMARE_GAMMA,
                            o->stale_warmup));
  if (!(*def = ax_model_find(o->model)))
    return AX_ENOTFOUND;
  ax_config cfg;
  AX_TRY(ax_model_config(*def, o->model_config, &cfg));
  AX_TRY(ax_model_describe(*def, &cfg, info));
  if (S > info->n_blocks)
    return ax_seterr(AX_EINVAL, "pipeline: %d stages for %d blocks of %s", S,
                     info->n_blocks, o->model);
  for (int s = 0; s < o->K; s++)
    if (!o->agents[s] || strlen(o->agents[s]) >= AXP_NAME)
      return ax_seterr(AX_EINVAL, "pipeline: bad agent name for stage %d", s);
  return check_tensor_parallel(o, *def);
}

/* Setup's groups for stage s (stage_msg-impl.h): the replicas [R, this
 * replica, tag, the agent of stage s in every replica (this member's),
 * zero], then with T > 1 the tensor-parallel members [T, this member, tag,
 * the agent of stage s of every member of this replica]. The tags live in
 * tags[2]. */
static void add_replicas(ax_pipe *p, int s, const axi_pipe_replica_of *rep,
                         axi_pipe_setup_msg *m, char tags[2][48]) {
  int rank = ax_pipe_opts_stage_rank(&p->o, s);
  snprintf(tags[0], 48, "pp%016llx.%d.t%d", (unsigned long long)rep->id, s,
           rep->t);
  m->has_replicas = m->has_zero = 1;
  m->replicas.n = rep->R;
  m->replicas.rank = rep->r;
  m->replicas.tag = tags[0];
  for (int r = 0; r < rep->R; r++)
    m->replicas.names[r] = rep->agents[(r * rep->T + rep->t) * p->R + rank];
  m->zero = p->o.zero;
  if (rep->T < 2)
    return;
  snprintf(tags[1], 48, "tp%016llx.%d.r%d", (unsigned long long)rep->id, s,
           rep->r);
  m->has_tp = 1;
  m->tp.n = rep->T;
  m->tp.rank = rep->t;
  m->tp.tag = tags[1];
  for (int t = 0; t < rep->T; t++)
    m->tp.names[t] = rep->agents[(rep->r * rep->T + t) * p->R + rank];
}

/* Moves every stage's optimizer to o.optimizer_host: a "axon.pipe.optim" object
 * there per stage, given the stage's parameters and the optimizer
 * configuration, and handed to the stage (stage_offload.c). */
static int offload_optimizers(ax_pipe *p) {
  ax_call_opts co = {.timeout_ms = axi_pipe_timeout(p)};
  for (int s = 0; s < p->K; s++) {
    ax_tensor *params = NULL, *bufs = NULL;
    AX_TRY(axi_pipe_stage_err(p, s,
                              ax_remote_object(p->node, p->optim_host,
                                               "axon.pipe.optim", "", AX_CPU,
                                               &co, &p->optim[s])));
    AX_TRY(ax_pipe_stage_state(p, s, &params, &bufs));
    ax_values *a = ax_values_new(), *r = NULL;
    axi_pipe_optim_init_msg im = {
        p->o.optim_config ? p->o.optim_config : "opt=sgd,lr=0.1", params};
    int err = a ? axi_pipe_optim_init_encode(&im, a) : AX_ENOMEM;
    ax_tensor_release(params);
    ax_tensor_release(bufs);
    if (err == AX_OK)
      err = ax_rref_rpc_sync(p->node, p->optim[s], "init", a, &co, &r);
    ax_values_free(a);
    ax_values_free(r);
    r = NULL;
    a = err == AX_OK ? ax_values_new() : NULL;
    axi_pipe_offload_msg om = {p->optim[s]};
    if (err == AX_OK)
      err = a ? axi_pipe_offload_encode(&om, a) : AX_ENOMEM;
    if (err == AX_OK)
      err = ax_rref_rpc_sync(p->node, p->host[s], "offload", a, &co, &r);
    ax_values_free(a);
    ax_values_free(r);
    AX_TRY(axi_pipe_stage_err(p, s, err));
  }
  return AX_OK;
}

static int create_hosts(ax_pipe *p, const int *bounds,
                        const axi_pipe_replica_of *rep,
                        const ax_model_info *info) {
  char splits[512] = "";
  size_t len = 0;
  for (int s = 0; s <= p->K; s++)
    len += (size_t)snprintf(splits + len, sizeof splits - len, "%s%d",
                            s ? "/" : "", bounds[s]);
  ax_call_opts co = {.timeout_ms = axi_pipe_timeout(p)};
  char tp[48] = ""; /* this member's part of the split layers */
  uint64_t tie_id = rep ? rep->id : 0; /* the tie groups' tags */
  if (!rep && getrandom(&tie_id, sizeof tie_id, 0) != (ssize_t)sizeof tie_id)
    tie_id = (uint64_t)(uintptr_t)p ^ (uint64_t)(ax_clock_s() * 1e9);
  if (rep && rep->T > 1)
    snprintf(tp, sizeof tp, ",tp=%d,tp_rank=%d", rep->T, rep->t);
  for (int s = 0; s < p->K; s++) {
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "model=%s,stage=%d,splits=%s,seed=%llu%s%s%s",
             p->model, s, splits, (unsigned long long)p->o.seed,
             p->o.model_config ? "," : "",
             p->o.model_config ? p->o.model_config : "", tp);
    AX_TRY(axi_pipe_stage_err(
        p, s,
        ax_remote_object(p->node, p->agents[s], "axon.pipe.stage", cfg,
                         p->o.devices ? p->o.devices[s] : p->o.device, &co,
                         &p->host[s])));
  }
  for (int s = 0; s < p->K; s++) {
    axi_pipe_setup_msg m;
    memset(&m, 0, sizeof m);
    m.mode = p->o.mode;
    m.recompute = p->o.recompute;
    m.optim = p->o.optim_config ? p->o.optim_config : "opt=sgd,lr=0.1";
    m.prev = s > 0 ? p->host[s - 1] : NULL;
    m.next = s < p->K - 1 ? p->host[s + 1] : NULL;
    m.self_id = (int64_t)ax_rref_id(p->host[s]); /* its key */
    m.order = p->o.sum_order;
    m.has_stale = p->o.staleness != AX_STALE_NONE;
    m.stale = p->o.staleness; /* staleness.h */
    m.delay = p->o.staleness != AX_STALE_NONE
                  ? ax_pipe_delay(p->o.mode, p->K, s, p->o.M)
                  : 0;
    m.gamma = p->o.stale_gamma ? p->o.stale_gamma : -1.0;
    m.warmup = p->o.stale_warmup;
    char tags[2][48], tie_tags[AX_MODEL_MAX_TIES][48];
    if (rep)
      add_replicas(p, s, rep, &m, tags);
    axi_pipe_ties_setup(p, s, info, tie_id, rep, &m, tie_tags);
    m.has_precision = p->o.precision != AX_PREC_FP32;
    m.precision = p->o.precision;
    ax_values *a = ax_values_new(), *r = NULL;
    int err = a ? axi_pipe_setup_encode(&m, a) : AX_ENOMEM;
    if (err == AX_OK)
      err = ax_rref_rpc_sync(p->node, p->host[s], "setup", a, &co, &r);
    ax_values_free(a);
    ax_values_free(r);
    AX_TRY(axi_pipe_stage_err(p, s, err));
  }
  return AX_OK;
}

int axi_pipe_create(ax_node *n, const ax_pipe_opts *o,
                    const axi_pipe_replica_of *rep, ax_pipe **out) {
  ax_model_info info;
  const ax_model_def *def;
  *out = NULL;
  AX_TRY(check_opts(o, &info, &def));
  int S = ax_pipe_opts_stages(o), v = (S + o->K - 1) / o->K;
  int bounds[AX_PIPE_MAX_STAGES + 1];
  if (o->bounds) {
    for (int s = 0; s <= S; s++)
      bounds[s] = o->bounds[s];
    for (int s = 0; s < S; s++) /* from 0, or a frozen prefix's end */
      if (bounds[s] >= bounds[s + 1] || bounds[0] < 0 ||
          bounds[S] != info.n_blocks)
        return ax_seterr(AX_EINVAL, "pipeline: bounds must rise to %d",
                         info.n_blocks);
  } else {
    AX_TRY(ax_split_uniform(info.n_blocks, S, bounds));
  }
  ax_pipe *p = axi_pipe_alloc(n, o);
  if (!p)
    return AX_ENOMEM;
  p->o.devices = o->devices; /* read by create_hosts only, cleared below */
  p->R = o->K;
  p->v = v;
  if (p->o.ahead < 0 || p->o.ahead > AX_PIPE_AHEAD_MAX) {
    ax_pipe_sched_free(p->sched);
    free(p);
    return ax_seterr(AX_EINVAL, "pipeline: ahead %d outside 0..%d", o->ahead,
                     AX_PIPE_AHEAD_MAX);
  }
  if (p->o.ahead == 0)
    p->o.ahead = AX_PIPE_AHEAD;
  if (getrandom(p->line, sizeof p->line, 0) != (ssize_t)sizeof p->line)
    for (int r = 0; r < AX_PIPE_MAX_STAGES; r++) /* no entropy: unlikely */
      p->line[r] = ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)p ^
                   (uint64_t)(ax_clock_s() * 1e9) ^ (uint64_t)r;
  p->K = S;
  memcpy(p->bounds, bounds, sizeof p->bounds);
  p->U = ax_pipe_units(o->mode, o->M);
  p->ignore_index = info.ignore_index;
  snprintf(p->model, sizeof p->model, "%s", o->model);
  snprintf(p->model_config, sizeof p->model_config, "%s",
           o->model_config ? o->model_config : "");
  for (int s = 0; s < S; s++) /* the mode's or the schedule's placement */
    snprintf(p->agents[s], AXP_NAME, "%s",
             o->agents[ax_pipe_opts_stage_rank(o, s)]);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  if (o->optimizer_host)
    snprintf(p->optim_host, sizeof p->optim_host, "%s", o->optimizer_host);
  p->member = rep ? rep->t : 0;
  p->replica = rep ? rep->r : 0;
  p->members = rep && rep->T > 1 ? rep->T : 1;
  int err = axi_pipe_ties_check(o->model, &info, bounds, S, o->mode);
  if (err == AX_OK)
    err = create_hosts(p, bounds, rep, &info);
  if (err == AX_OK && p->optim_host[0])
    err = offload_optimizers(p);
  p->o.devices = NULL; /* the caller's array */
  if (err != AX_OK) {
    char m[512];
    snprintf(m, sizeof m, "%s", ax_errmsg());
    ax_pipe_free(p);
    return ax_seterr(err, "%s", m);
  }
  *out = p;
  return AX_OK;
}

ax_pipe *axi_pipe_alloc(ax_node *n, const ax_pipe_opts *o) {
  ax_pipe *p = calloc(1, sizeof *p);
  if (!p)
    return NULL;
  p->node = n;
  p->o = *o;
  p->o.agents = NULL; /* the caller's arrays and strings */
  p->o.bounds = NULL;
  p->o.devices = NULL;
  p->o.optimizer_host = NULL;
  p->o.schedule = NULL;
  if (o->schedule && ax_pipe_sched_copy(o->schedule, &p->sched) != AX_OK) {
    free(p);
    return NULL;
  }
  p->o.schedule = p->sched;
  return p;
}

int ax_pipe_stages(const ax_pipe *p) { return p->K; }

const char *ax_pipe_stage_agent(const ax_pipe *p, int s) {
  const ax_pipe *one = p->nrep ? p->rep[0] : p;
  return s >= 0 && s < one->K ? one->agents[s] : NULL;
}

ax_pipe *ax_pipe_replica(ax_pipe *p, int r) {
  /* part r: member r % T of replica r / T */
  if (!p || r < 0 || r >= (p->nrep ? p->nrep : 1))
    return NULL;
  return p->nrep ? p->rep[r] : p;
}

void ax_pipe_free(ax_pipe *p) {
  if (!p)
    return;
  ax_pipe_checkpoint_wait(p); /* its files outlive nothing they need */
  axi_pipe_frozen_free(p->frozen);
  free(p->pool);
  ax_pipe_sched_free(p->sched);
  if (p->nrep) {
    for (int r = 0; r < p->nrep; r++)
      ax_pipe_free(p->rep[r]);
    free(p);
    return;
  }
  ax_call_opts co = {.timeout_ms = 5000};
  for (int s = 0; s < p->K; s++) {
    ax_values *r = NULL;
    if (p->host[s] && !ax_node_peer_is_down(p->node, p->agents[s]))
      ax_rref_rpc_sync(p->node, p->host[s], "teardown", NULL, &co, &r);
    ax_values_free(r);
  }
  for (int s = 0; s < p->K; s++) {
    ax_rref_release(p->host[s]);
    ax_rref_release(p->optim[s]);
  }
  free(p->ev);
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

int ax_pipe_stage_state(ax_pipe *p, int s, ax_tensor **params,
                        ax_tensor **buffers) {
  if (p->nrep)
    return ax_pipe_stage_state(p->rep[0], s, params, buffers);
  if (s < 0 || s >= p->K)
    return ax_seterr(AX_EINVAL, "pipeline: no stage %d", s);
  ax_values *r = NULL;
  ax_call_opts co = {.timeout_ms = axi_pipe_timeout(p)};
  AX_TRY(axi_pipe_stage_err(
      p, s,
      ax_rref_rpc_sync(p->node, p->host[s], "state_save", NULL, &co, &r)));
  axi_pipe_state_msg m;
  int err = axi_pipe_state_decode(r, &m);
  if (err == AX_OK) {
    *params = ax_tensor_retain(m.params);
    *buffers = ax_tensor_numel(m.buffers) ? ax_tensor_retain(m.buffers) : NULL;
  }
  ax_values_free(r);
  return err;
}

int ax_pipe_trace(ax_pipe *p, ax_trace *dst) {
  if (p->nrep)
    return ax_pipe_trace(p->rep[0], dst);
  ax_call_opts co = {.timeout_ms = axi_pipe_timeout(p)};
  for (int s = 0; s < p->K; s++) {
    ax_values *r = NULL;
    axi_pipe_trace_msg m;
    AX_TRY(axi_pipe_stage_err(
        p, s, ax_rref_rpc_sync(p->node, p->host[s], "trace", NULL, &co, &r)));
    int err = axi_pipe_trace_decode(r, &m);
    if (err == AX_OK && m.events.n)
      err = ax_trace_merge(dst, m.events.p, m.events.n, 0);
    ax_values_free(r);
    if (err != AX_OK)
      return axi_pipe_stage_err(p, s, err);
  }
  return AX_OK;
}

const ax_pipe_event *ax_pipe_events(const ax_pipe *p, long *n) {
  if (p->nrep)
    return ax_pipe_events(p->rep[0], n);
  *n = p->nev;
  return p->ev;
}

void ax_pipe_get_stats(const ax_pipe *p, ax_pipe_stats *out) {
  if (p->nrep) {
    ax_pipe_get_stats(p->rep[0], out);
    return;
  }
  *out = p->stats;
}
