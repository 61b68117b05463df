/* The pipeline stage host ("axon.pipe.stage"): per-unit states, weight
 * stashing, recompute and replay, per-context gradients and the update rule of
 * each mode. Contract in stage_host.h. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/backend-impl.h"
#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/pipeline/coord/coordinator.h"
#include "axon/runtime/pipeline/schedule/mode.h"
#include "axon/runtime/pipeline/stage/stage_host-impl.h"
#include "axon/runtime/pipeline/stage/stage_host.h"
#include "axon/runtime/pipeline/trace/stage_events.h"

static void host_clear(phost *h) {
  ax_rref_release(h->prev);
  ax_rref_release(h->next);
  h->prev = h->next = NULL;
  for (pstate *st = h->states, *nx; st; st = nx) {
    nx = st->next;
    axi_pipe_state_free(st);
  }
  h->states = NULL;
  axi_pipe_grads_clear(h);
  axi_pipe_update_drop(h);
  ax_tensor_release(h->shadow);
  h->shadow = NULL;
  h->last_step = -1;
  axi_stale_clear(&h->stale);
  pthread_mutex_lock(&h->group_mu);
  ax_coll_group *g = h->replicas, *tp = h->tp;
  axi_pipe_xtie xt[AX_MODEL_MAX_TIES];
  int nxt = h->n_xties;
  memcpy(xt, h->xties, sizeof xt);
  h->replicas = h->tp = NULL;
  h->n_xties = 0;
  pthread_mutex_unlock(&h->group_mu);
  ax_coll_group_free(g);
  ax_coll_group_free(tp);
  axi_pipe_ties_free(xt, nxt);
  axi_pipe_offload_drop(h);
  ax_rref_release(h->offload);
  h->offload = NULL;
  axi_pipe_boundary_free(h);
  axi_pipe_sessions_clear(h);
  axi_pipe_xfer_close(h);
}

/* The groups of setup (stage_msg-impl.h): the replicas (*g; none or
 * R = 1: NULL) and the tensor-parallel members (*tp; none or T = 1: NULL).
 * This host is the member at each group's rank (a node hosting several
 * members, as an emulation does, tells them apart by it). */
static int replica_group(phost *h, const axi_pipe_setup_msg *m, int64_t tmo,
                         ax_coll_group **g, int *zero, ax_coll_group **tp) {
  *g = *tp = NULL;
  *zero = 0;
  int R = m->has_replicas ? (int)m->replicas.n : 1,
      T = m->has_tp ? (int)m->tp.n : 1;
  int64_t z = m->zero; /* 0 when absent */
  if ((z && R < 2) || (z && (size_t)R > h->s->net->n_params))
    return ax_seterr(AX_EINVAL,
                     "axon.pipe.stage %d: zero %lld with %d "
                     "replicas of %zu parameters",
                     h->s->index, (long long)z, R, h->s->net->n_params);
  *zero = (int)z;
  if (R > 1) { /* the replicas' sums combine in the setup's order */
    AX_TRY(ax_coll_group_new_rank(h->s->node, m->replicas.tag, R,
                                  m->replicas.names, (int)m->replicas.rank, tmo,
                                  g));
    ax_coll_group_set_order(*g, (ax_sum_order)m->order);
  }
  int err = T > 1
                ? ax_coll_group_new_rank(h->s->node, m->tp.tag, T, m->tp.names,
                                         (int)m->tp.rank, tmo, tp)
                : AX_OK;
  if (err != AX_OK) {
    ax_coll_group_free(*g);
    *g = NULL;
  }
  return err;
}

static int host_create(ax_node *n, const char *config, ax_device dev,
                       void **obj) {
  char model[32];
  const char *rest = config ? config : "";
  if (strncmp(rest, "model=", 6) != 0)
    return ax_seterr(AX_EINVAL,
                     "axon.pipe.stage: config must start with "
                     "model=NAME, got '%s'",
                     rest);
  rest += 6;
  size_t len = strcspn(rest, ",");
  if (len == 0 || len >= sizeof model)
    return ax_seterr(AX_EINVAL, "axon.pipe.stage: bad model name in '%s'",
                     config);
  memcpy(model, rest, len);
  model[len] = 0;
  rest += len + (rest[len] == ',');
  ax_config c; /* its tensor-parallel member, for its checkpoints */
  AX_TRY(ax_config_parse(&c, rest));
  int err = AX_OK;
  int64_t T = ax_config_int(&c, "tp", 1, &err),
          t = ax_config_int(&c, "tp_rank", 0, &err);
  if (err != AX_OK || T < 1 || t < 0 || t >= T)
    return ax_seterr(AX_EINVAL, "axon.pipe.stage: bad tp or tp_rank in '%s'",
                     config);
  phost *h = calloc(1, sizeof *h);
  if (!h)
    return AX_ENOMEM;
  void *s = NULL;
  err = axi_ag_stage_create(n, model, rest, dev, &s);
  if (err != AX_OK) {
    free(h);
    return err;
  }
  h->s = s;
  h->tp_members = (int)T;
  h->tp_member = (int)t;
  if ((err = axi_pipe_xfer_init(h)) != AX_OK) {
    axi_ag_stage_release(h->s);
    free(h);
    return err;
  }
  pthread_mutex_init(&h->group_mu, NULL);
  pthread_mutex_init(&h->ckpt_mu, NULL);
  pthread_cond_init(&h->ckpt_cv, NULL);
  h->def = ax_pipe_mode_get(AX_MODE_SEQUENTIAL);
  h->last_step = -1;
  axi_stale_clear(&h->stale);
  h->tr = ax_trace_new(AXP_STAGE_EVENTS_MAX); /* NULL: no events */
  *obj = h;
  return AX_OK;
}

/* Stops the host's actions: wakes the one waiting for activations, cancels
 * the queued ones and waits for the running one (s->mu not held). */
static void host_quiesce(phost *h) {
  axi_pipe_xfer_close(h);
  /* A STEP waiting in the replicas' all-reduce for a replica whose call
   * ended would wait out its timeout: the group fails it now. */
  pthread_mutex_lock(&h->group_mu);
  ax_coll_group_abort(h->replicas, "the stage was torn down");
  ax_coll_group_abort(h->tp, "the stage was torn down");
  axi_pipe_ties_abort(h->xties, h->n_xties, "the stage was torn down");
  pthread_mutex_unlock(&h->group_mu);
  axi_pipe_line_detach(&h->line, h);
}

static void host_destroy(void *obj) {
  phost *h = obj;
  host_quiesce(h);
  host_clear(h);
  axi_pipe_ckpt_writes_drain(h);
  pthread_mutex_destroy(&h->ckpt_mu);
  pthread_cond_destroy(&h->ckpt_cv);
  pthread_mutex_destroy(&h->group_mu);
  axi_pipe_xfer_free(h);
  axi_ag_stage_release(h->s);
  ax_trace_free(h->tr);
  free(h);
}

static int m_setup(ax_call_ctx *cc, void *obj, const ax_values *args,
                   ax_values *out) {
  phost *h = obj;
  axi_ag_stage *s = h->s;
  axi_pipe_setup_msg m;
  AX_TRY(axi_pipe_setup_decode(args, &m));
  const ax_pipe_mode_def *def = ax_pipe_mode_get((int)m.mode);
  if (!def)
    return ax_seterr(AX_EINVAL,
                     "axon.pipe.stage: bad mode %lld (valid: 0..%d, "
                     "%s)",
                     (long long)m.mode, AX_MODE_COUNT - 1, ax_pipe_mode_list());
  if (m.self_id == 0)
    return ax_seterr(AX_EBADARG, "axon.pipe.stage: setup needs the id of the "
                                 "host's own RRef (argument 5)");
  int64_t skind = m.has_stale ? m.stale : AX_STALE_NONE, sdelay = m.delay,
          swarm = m.warmup;
  double sgamma = m.has_stale ? m.gamma : -1;
  if (m.has_stale) { /* the staleness correction */
    if (skind < 0 || skind >= AX_STALE_COUNT || sdelay < 0 ||
        sdelay > 1 << 20 || swarm < 0 || swarm > 1 << 30)
      return ax_seterr(AX_EINVAL,
                       "axon.pipe.stage %d: bad staleness correction "
                       "%lld (delay %lld, warm-up %lld)",
                       s->index, (long long)skind, (long long)sdelay,
                       (long long)swarm);
    AX_TRY(ax_staleness_check((int)m.mode, (int)skind,
                              sgamma < 0 ? AX_PIPEMARE_GAMMA : sgamma,
                              (int)swarm));
  }
  axi_stale stale;
  memset(&stale, 0, sizeof stale);
  AX_TRY(axi_stale_init(&stale, (int)skind, (int)sdelay, sgamma, (int)swarm));
  ax_config c;
  ax_optim_cfg oc;
  AX_TRY(ax_config_parse(&c, m.optim));
  AX_TRY(ax_optim_cfg_parse(&c, &oc));
  if (def->split && !ax_module_can_split(s->net->root))
    return ax_seterr(AX_EUNSUPPORTED,
                     "axon.pipe.stage %d: %s splits the backward "
                     "but a layer of this stage has no split backward "
                     "(models/module.h)",
                     s->index, def->name);
  host_quiesce(h); /* a set-up again (recovery) ends what was in flight */
  pthread_mutex_lock(&s->mu);
  host_clear(h); /* frees the old replica group before a new one */
  pthread_mutex_unlock(&s->mu);
  ax_coll_group *g = NULL, *tp = NULL;
  int zero = 0, nxt = 0;
  axi_pipe_xtie xt[AX_MODEL_MAX_TIES];
  memset(xt, 0, sizeof xt);
  AX_TRY(replica_group(h, &m, axi_pipe_wait_ms(cc), &g, &zero, &tp));
  int err = axi_pipe_ties_new(h, &m, axi_pipe_wait_ms(cc), xt, &nxt);
  size_t zoff = 0, zlen = s->net->n_params;
  if (zero) /* the optimizer keeps this replica's shard only */
    ax_coll_shard(g, s->net->n_params, &zoff, &zlen);
  ax_optim *o = err == AX_OK ? ax_optim_new(&oc, zlen, s->dev) : NULL;
  if (!o) {
    axi_pipe_ties_free(xt, nxt);
    ax_coll_group_free(tp);
    ax_coll_group_free(g);
    return err == AX_OK ? AX_ENOMEM : err;
  }
  pthread_mutex_lock(&s->mu);
  pthread_mutex_lock(&h->group_mu);
  h->replicas = g;
  h->tp = tp;
  memcpy(h->xties, xt, sizeof xt);
  h->n_xties = nxt;
  pthread_mutex_unlock(&h->group_mu);
  h->tied = axi_pipe_ties_held(h);
  h->zero = zero;
  h->zero_off = zoff;
  h->zero_len = zlen;
  h->optim_kind = (int)oc.kind;
  h->sum_order = (int)m.order;
  s->net->precision = (int)m.precision; /* 0, fp32, when absent */
  h->def = def;
  /* m.recompute is informational: each forward's flags say what to keep. */
  h->prev = ax_rref_retain(m.prev);
  h->next = ax_rref_retain(m.next);
  h->is_last = m.next == NULL;
  h->stale = stale;
  ax_optim_free(s->opt);
  s->opt = o;
  err = axi_pipe_xfer_open(h, (uint64_t)m.self_id);
  pthread_mutex_unlock(&s->mu);
  return err;
}

/* ---- state and teardown -------------------------------------------------- */
static int m_state_save(ax_call_ctx *cc, void *obj, const ax_values *args,
                        ax_values *out) {
  phost *h = obj;
  pthread_mutex_lock(&h->s->mu);
  int err = axi_pipe_host_settle(h);
  pthread_mutex_unlock(&h->s->mu);
  axi_pipe_state_msg m = {NULL, NULL};
  if (err == AX_OK)
    err = axi_ag_stage_state_copy(h->s, &m.params, &m.buffers);
  if (err == AX_OK)
    err = axi_pipe_state_encode(&m, out);
  ax_tensor_release(m.params);
  ax_tensor_release(m.buffers);
  return err;
}

/* "boundary" (stage_host.h): stop ends the actions and drops the units in
 * flight, keeping the state; keep and rewind are stage_boundary.c's. */
static int m_boundary(ax_call_ctx *cc, void *obj, const ax_values *args,
                      ax_values *out) {
  phost *h = obj;
  axi_pipe_boundary_msg m;
  AX_TRY(axi_pipe_boundary_decode(args, &m));
  if (m.op == AXP_BOUNDARY_STOP)
    host_quiesce(h); /* before s->mu: it waits for the running action */
  pthread_mutex_lock(&h->s->mu);
  if (m.op == AXP_BOUNDARY_STOP) {
    for (pstate *st = h->states, *nx; st; st = nx) {
      nx = st->next;
      axi_pipe_state_free(st);
    }
    h->states = NULL;
    axi_pipe_grads_clear(h);
    axi_pipe_update_drop(h); /* its ties' groups are aborted */
  }
  axi_pipe_boundary_reply_msg r;
  int err = axi_pipe_boundary_op(h, &m, &r);
  pthread_mutex_unlock(&h->s->mu);
  return err == AX_OK ? axi_pipe_boundary_reply_encode(&r, out) : err;
}

static int m_teardown(ax_call_ctx *cc, void *obj, const ax_values *args,
                      ax_values *out) {
  phost *h = obj;
  host_quiesce(h);
  pthread_mutex_lock(&h->s->mu);
  host_clear(h);
  pthread_mutex_unlock(&h->s->mu);
  return AX_OK;
}

/* "offload" [optimizer RRef]: STEPs update through that "axon.pipe.optim"
 * object from now on; the local optimizer and its state are freed. */
static int m_offload(ax_call_ctx *cc, void *obj, const ax_values *args,
                     ax_values *out) {
  phost *h = obj;
  axi_pipe_offload_msg m;
  AX_TRY(axi_pipe_offload_decode(args, &m));
  ax_rref *r = m.optim;
  pthread_mutex_lock(&h->s->mu);
  int err = AX_OK;
  if (r && h->zero)
    err = ax_seterr(AX_EINVAL,
                    "axon.pipe.stage %d: an optimizer host keeps the whole "
                    "optimizer state on one agent, but under zero each "
                    "replica keeps its shard of it",
                    h->s->index);
  if (err == AX_OK && !r)
    err = ax_seterr(AX_EINVAL,
                    "axon.pipe.stage %d: offload needs the optimizer's "
                    "RRef (the local state is gone; set up again to get it "
                    "back)",
                    h->s->index);
  if (err == AX_OK) /* the old target's update first */
    err = axi_pipe_host_settle(h);
  if (err == AX_OK) {
    ax_rref_release(h->offload);
    h->offload = ax_rref_retain(r);
    h->offload_steps = 0;     /* fresh from its "init" */
    ax_optim_free(h->s->opt); /* its state lives on the other agent now */
    h->s->opt = NULL;
  }
  pthread_mutex_unlock(&h->s->mu);
  return err;
}

/* "settle" []: the last STEP's pending update is applied (its ties'
 * exchanges waited for; stage_update.c), as the coordinator asks at the
 * end of a train call. */
static int m_settle(ax_call_ctx *cc, void *obj, const ax_values *args,
                    ax_values *out) {
  phost *h = obj;
  AX_TRY(axi_pipe_settle_decode(args));
  pthread_mutex_lock(&h->s->mu);
  int err = axi_pipe_host_settle(h);
  pthread_mutex_unlock(&h->s->mu);
  return err;
}

static int m_trace(ax_call_ctx *cc, void *obj, const ax_values *args,
                   ax_values *out) {
  axi_pipe_trace_msg m = {{NULL, 0}};
  void *buf = NULL;
  AX_TRY(axi_pipe_events_take(((phost *)obj)->tr, &buf, &m.events.n));
  m.events.p = buf;
  int err = axi_pipe_trace_encode(&m, out);
  free(buf);
  return err;
}

/* The training actions run in their rank's order (stage_line-impl.h). */
#define IN_LINE(name, fn)                                                      \
  static int name(ax_call_ctx *cc, void *obj, const ax_values *args,           \
                  ax_values *out) {                                            \
    return axi_pipe_line_call(cc, &((phost *)obj)->line, obj, fn, args, out);  \
  }
IN_LINE(l_fwd, axi_pipe_host_fwd)
IN_LINE(l_bwd, axi_pipe_host_bwd)
IN_LINE(l_bwdi, axi_pipe_host_bwd_input)
IN_LINE(l_bwdw, axi_pipe_host_bwd_weight)
IN_LINE(l_step, axi_pipe_host_step)

static const ax_robj_method_def g_methods[] = {
    {"setup", m_setup},
    {"fwd", l_fwd},
    {"bwd", l_bwd},
    {"bwdi", l_bwdi},
    {"bwdw", l_bwdw},
    {"step", l_step},
    {"state_save", m_state_save},
    {"teardown", m_teardown},
    {"trace", m_trace},
    {"offload", m_offload},
    {"settle", m_settle},
    {"ckpt_save", axi_pipe_host_ckpt_save},
    {"ckpt_load", axi_pipe_host_ckpt_load},
    {"ckpt_drop", axi_pipe_host_ckpt_drop},
    {"ckpt_wait", axi_pipe_host_ckpt_wait},
    {"ckpt_mem_save", axi_pipe_host_ckpt_mem_save},
    {"ckpt_mem_load", axi_pipe_host_ckpt_mem_load},
    {"boundary", m_boundary},
    {"decode", axi_pipe_host_decode},
    {"decode_end", axi_pipe_host_decode_end},
    {NULL, NULL},
};

static const ax_robj_kind g_kind = {"axon.pipe.stage", host_create,
                                    host_destroy, g_methods};

int axi_pipe_host_register(ax_node *n) {
  AX_TRY(axi_pipe_fault_init()); /* a malformed AXON_FAULT stops the start */
  AX_TRY(axi_pipe_optim_register(n));
  AX_TRY(axi_pipe_mem_store_register(n));
  return ax_robj_register(n, &g_kind);
}
