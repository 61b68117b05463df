/* "axon.pipe.optim": a pipeline stage's optimizer kept on another agent
 * (ax_pipe_opts.optimizer_host; ZeRO-Offload adapted to this runtime). The
 * coordinator creates one per stage on the optimizer host, gives it the
 * stage's parameters and optimizer configuration ("init"), and hands its
 * RRef to the stage ("offload", stage_host.c); from then on every STEP of
 * the stage sends its gradient there ("step") and takes the updated
 * parameters back. The optimizer state never lives on the stage's agent.
 *
 * Methods (their messages in stage_msg-impl.h):
 *  - "init" [optim config (str), params (P f32)]: keeps a copy of the
 *    parameters on this agent and makes the optimizer (models/optim.h).
 *  - "step" [grads (P f32), lr scale]: one update of that copy, its
 *    learning rate scaled as the stage's correction asks (staleness.h);
 *    answers [params].
 *  - "state_get" []: answers its state [m, v, steps] (a checkpoint of the
 *    stage holds it as its own optimizer's).
 *  - "state_set" [m, v, steps, (params)]: replaces it (and its copy of the
 *    parameters when given); refused unchanged unless every size matches.
 * AX_ESTATE before "init", AX_EINVAL for a gradient or state of another
 * size. Calls on one object are serialised by its lock. */
#include <pthread.h>
#include <stdlib.h>

#include "axon/models/optim.h"
#include "axon/runtime/pipeline/stage/stage_host-impl.h"

typedef struct poptim {
  pthread_mutex_t mu;
  ax_device dev;
  ax_optim *opt;
  ax_tensor *params;
} poptim;

static int optim_create(ax_node *n, const char *config, ax_device dev,
                        void **obj) {
  (void)n, (void)config;
  poptim *o = calloc(1, sizeof *o);
  if (!o)
    return AX_ENOMEM;
  pthread_mutex_init(&o->mu, NULL);
  o->dev = dev;
  *obj = o;
  return AX_OK;
}

static void optim_destroy(void *obj) {
  poptim *o = obj;
  ax_optim_free(o->opt);
  ax_tensor_release(o->params);
  pthread_mutex_destroy(&o->mu);
  free(o);
}

static int m_init(ax_call_ctx *cc, void *obj, const ax_values *args,
                  ax_values *out) {
  poptim *o = obj;
  axi_pipe_optim_init_msg m;
  AX_TRY(axi_pipe_optim_init_decode(args, &m));
  ax_tensor *p = m.params;
  if (p->dtype != AX_F32 || ax_tensor_numel(p) == 0)
    return ax_seterr(AX_EINVAL, "axon.pipe.optim: parameters must be f32");
  ax_config c;
  ax_optim_cfg oc;
  AX_TRY(ax_config_parse(&c, m.config));
  AX_TRY(ax_optim_cfg_parse(&c, &oc));
  int64_t n = (int64_t)ax_tensor_numel(p);
  ax_tensor *copy = ax_tensor_new(AX_F32, 1, &n, o->dev);
  ax_optim *opt = ax_optim_new(&oc, (size_t)n, o->dev);
  int err = copy && opt ? ax_tensor_copy(copy, p) : AX_ENOMEM;
  if (err != AX_OK) {
    ax_tensor_release(copy);
    ax_optim_free(opt);
    return err;
  }
  pthread_mutex_lock(&o->mu);
  ax_optim_free(o->opt);
  ax_tensor_release(o->params);
  o->opt = opt;
  o->params = copy;
  pthread_mutex_unlock(&o->mu);
  return AX_OK;
}

static int m_step(ax_call_ctx *cc, void *obj, const ax_values *args,
                  ax_values *out) {
  poptim *o = obj;
  axi_pipe_optim_step_msg m;
  AX_TRY(axi_pipe_optim_step_decode(args, &m));
  ax_tensor *g = m.grads;
  pthread_mutex_lock(&o->mu);
  int err = AX_OK;
  if (!o->opt)
    err = ax_seterr(AX_ESTATE, "axon.pipe.optim: step before init");
  else if (g->dtype != AX_F32 ||
           ax_tensor_numel(g) != ax_tensor_numel(o->params))
    err = ax_seterr(AX_EINVAL,
                    "axon.pipe.optim: a gradient of %zu values for "
                    "%zu parameters",
                    ax_tensor_numel(g), ax_tensor_numel(o->params));
  ax_tensor *gd = NULL;
  if (err == AX_OK && !(gd = ax_tensor_to(g, o->dev)))
    err = AX_ENOMEM;
  if (err == AX_OK)
    err = ax_optim_set_lr_scale(o->opt, (float)m.lr_scale);
  if (err == AX_OK)
    err = ax_optim_step(o->opt, o->params, gd);
  axi_pipe_optim_reply_msg r = {o->params};
  if (err == AX_OK)
    err = axi_pipe_optim_reply_encode(&r, out);
  pthread_mutex_unlock(&o->mu);
  ax_tensor_release(gd);
  return err;
}

/* State buffer i of the optimizer, or an empty tensor when it has none
 * (a new reference). */
static ax_tensor *state_or_empty(poptim *o, int i) {
  ax_tensor *t = ax_optim_state(o->opt, i);
  int64_t zero = 0;
  return t ? ax_tensor_retain(t) : ax_tensor_new(AX_F32, 1, &zero, o->dev);
}

static int m_state_get(ax_call_ctx *cc, void *obj, const ax_values *args,
                       ax_values *out) {
  poptim *o = obj;
  if (ax_values_count(args))
    return ax_seterr(AX_EBADARG, "axon.pipe.optim state_get: no arguments");
  pthread_mutex_lock(&o->mu);
  axi_pipe_optim_state_msg r = {NULL, NULL, 0, 0, NULL};
  int err = o->opt ? AX_OK
                   : ax_seterr(AX_ESTATE, "axon.pipe.optim: state before init");
  if (err == AX_OK) {
    r.m = state_or_empty(o, 0);
    r.v = state_or_empty(o, 1);
    r.steps = ax_optim_steps(o->opt);
    err = r.m && r.v ? axi_pipe_optim_state_encode(&r, out) : AX_ENOMEM;
  }
  pthread_mutex_unlock(&o->mu);
  ax_tensor_release(r.m);
  ax_tensor_release(r.v);
  return err;
}

/* AX_EINVAL unless `got` has as many values as `have` (NULL: none). */
static int same_size(const char *what, const ax_tensor *got,
                     const ax_tensor *have) {
  size_t n = have ? ax_tensor_numel(have) : 0;
  if (got->dtype == AX_F32 && ax_tensor_numel(got) == n)
    return AX_OK;
  return ax_seterr(AX_EINVAL,
                   "axon.pipe.optim state_set: %s has %zu values, "
                   "this optimizer %zu",
                   what, ax_tensor_numel(got), n);
}

static int m_state_set(ax_call_ctx *cc, void *obj, const ax_values *args,
                       ax_values *out) {
  poptim *o = obj;
  axi_pipe_optim_state_msg m;
  AX_TRY(axi_pipe_optim_state_decode(args, &m));
  pthread_mutex_lock(&o->mu);
  ax_tensor *sm = o->opt ? ax_optim_state(o->opt, 0) : NULL,
            *sv = o->opt ? ax_optim_state(o->opt, 1) : NULL;
  int err = o->opt ? AX_OK
                   : ax_seterr(AX_ESTATE, "axon.pipe.optim: state before init");
  if (err == AX_OK)
    err = same_size("m", m.m, sm);
  if (err == AX_OK)
    err = same_size("v", m.v, sv);
  if (err == AX_OK && m.has_params)
    err = same_size("params", m.params, o->params);
  if (err == AX_OK && sm)
    err = ax_tensor_copy(sm, m.m);
  if (err == AX_OK && sv)
    err = ax_tensor_copy(sv, m.v);
  if (err == AX_OK && m.has_params)
    err = ax_tensor_copy(o->params, m.params);
  if (err == AX_OK)
    ax_optim_set_steps(o->opt, (long)m.steps);
  pthread_mutex_unlock(&o->mu);
  return err;
}

static const ax_robj_method_def g_methods[] = {{"init", m_init},
                                               {"step", m_step},
                                               {"state_get", m_state_get},
                                               {"state_set", m_state_set},
                                               {NULL, NULL}};
static const ax_robj_kind g_kind = {"axon.pipe.optim", optim_create,
                                    optim_destroy, g_methods};

int axi_pipe_optim_register(ax_node *n) { return ax_robj_register(n, &g_kind); }

#define OFFLOAD_TIMEOUT_MS 120000

/* Sends the gradient (h->acc, which the message keeps alive: the caller
 * releases its reference and does not recycle it) and returns; the
 * parameters come back in axi_pipe_offload_settle. */
int axi_pipe_offload_step(phost *h) {
  axi_ag_stage *s = h->s;
  AX_TRY(axi_pipe_offload_settle(h));
  ax_values *a = ax_values_new();
  axi_pipe_optim_step_msg m = {h->acc, h->stale.lr_scale};
  int err = a ? axi_pipe_optim_step_encode(&m, a) : AX_ENOMEM;
  ax_call_opts co = {.timeout_ms = OFFLOAD_TIMEOUT_MS};
  /* Outside the unit's autograd context: the update outlives the call
   * whose context it would inherit (released before the update runs). */
  uint64_t ctx = ax_autograd_ctx_current();
  ax_autograd_ctx_set_current(0);
  if (err == AX_OK)
    err = ax_rref_rpc_async(s->node, h->offload, "step", a, &co,
                            &h->offload_pending);
  ax_autograd_ctx_set_current(ctx);
  ax_values_free(a);
  return err;
}

int axi_pipe_offload_settle(phost *h) {
  axi_ag_stage *s = h->s;
  ax_future *f = h->offload_pending;
  if (!f)
    return h->offload_err ? ax_seterr(h->offload_err,
                                      "axon.pipe.stage %d: an earlier update "
                                      "on the optimizer host failed",
                                      s->index)
                          : AX_OK;
  h->offload_pending = NULL;
  int err = ax_future_wait(f, OFFLOAD_TIMEOUT_MS + 1000);
  if (err == AX_OK)
    err = ax_future_err(f);
  if (err != AX_OK)
    err = ax_seterr(err,
                    "axon.pipe.stage %d: the update on the optimizer host: "
                    "%s",
                    s->index,
                    ax_future_is_done(f) ? ax_future_errmsg(f) : "no answer");
  axi_pipe_optim_reply_msg r = {NULL};
  if (err == AX_OK)
    err = axi_pipe_optim_reply_decode(ax_future_values(f), &r);
  ax_tensor *np = r.params;
  if (err == AX_OK && ax_tensor_numel(np) != s->net->n_params)
    err = ax_seterr(AX_EMALFORMED,
                    "axon.pipe.stage %d: the optimizer host sent "
                    "%zu parameters for %zu",
                    s->index, ax_tensor_numel(np), s->net->n_params);
  if (err == AX_OK)
    err = ax_tensor_copy(s->net->params, np);
  if (err == AX_OK) /* the update of the STEP that sent it, last_step */
    h->offload_steps++;
  if (err == AX_OK)
    err = axi_stale_after_step(&h->stale, s->net->params, h->last_step);
  ax_future_release(f);
  h->offload_err = err;
  return err;
}

void axi_pipe_offload_drop(phost *h) {
  if (h->offload_pending) /* bounded: a dead host fails it at once */
    ax_future_wait(h->offload_pending, 5000);
  ax_future_release(h->offload_pending);
  h->offload_pending = NULL;
  h->offload_err = AX_OK;
}

int axi_pipe_offload_state_get(phost *h, ax_values **reply,
                               axi_pipe_optim_state_msg *m) {
  ax_call_opts co = {.timeout_ms = OFFLOAD_TIMEOUT_MS};
  *reply = NULL;
  int err =
      ax_rref_rpc_sync(h->s->node, h->offload, "state_get", NULL, &co, reply);
  if (err == AX_OK)
    err = axi_pipe_optim_state_decode(*reply, m);
  if (err != AX_OK)
    return ax_seterr(err,
                     "axon.pipe.stage %d: the state of its optimizer host: "
                     "%s",
                     h->s->index, ax_errmsg());
  return AX_OK;
}

int axi_pipe_offload_state_set(phost *h, const axi_pipe_optim_state_msg *m) {
  ax_values *a = ax_values_new();
  int err = a ? axi_pipe_optim_state_encode(m, a) : AX_ENOMEM;
  ax_call_opts co = {.timeout_ms = OFFLOAD_TIMEOUT_MS};
  if (err == AX_OK)
    err = ax_rref_rpc_sync(h->s->node, h->offload, "state_set", a, &co, NULL);
  ax_values_free(a);
  if (err != AX_OK)
    return ax_seterr(err,
                     "axon.pipe.stage %d: setting the state of its optimizer "
                     "host: %s",
                     h->s->index, ax_errmsg());
  return AX_OK;
}
