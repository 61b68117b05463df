/* The pipeline stage host ("pipe.stage"): per-unit states, weight stashing,
 * recompute and replay, per-context gradients and the update rule of each
 * mode. Contract in stage_host.h. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend-impl.h"
#include "models/loss.h"
#include "runtime/dist/autograd.h"
#include "runtime/dist/stage-impl.h"
#include "runtime/pipeline/schedule.h"
#include "runtime/pipeline/stage_host.h"
#include "runtime/pipeline/stage_outbox.h"

typedef struct pstate { /* one unit between its forward and its backward */
  long batch;
  int micro;
  uint64_t seed;
  ax_slot *slot;     /* saved activations; NULL when replayed */
  ax_tlist input;    /* kept inputs (replay) */
  ax_tlist dlogits;  /* last stage: d loss / d logits */
  ax_tensor *ver;    /* weights the forward used (ddg, pipedream) */
  struct pstate *next;
} pstate;

typedef struct phost {
  axd_stage *s;
  int mode, recompute, is_last;
  ax_rref *prev, *next;
  axp_outbox out; /* its own lock; everything else under s->mu */
  pstate *states;
} phost;

static int64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void state_free(pstate *st) {
  if (!st)
    return;
  ax_slot_free(st->slot);
  ax_tlist_clear(&st->input);
  ax_tlist_clear(&st->dlogits);
  ax_tensor_release(st->ver);
  free(st);
}

static void host_clear(phost *h) {
  ax_rref_release(h->prev);
  ax_rref_release(h->next);
  h->prev = h->next = NULL;
  for (pstate *st = h->states, *nx; st; st = nx) {
    nx = st->next;
    state_free(st);
  }
  h->states = NULL;
  axp_outbox_clear(&h->out);
}

static int host_create(ax_node *n, const char *config, ax_device dev,
                       void **obj) {
  char model[32];
  const char *rest = config ? config : "";
  if (strncmp(rest, "model=", 6) != 0)
    return ax_seterr(AX_EINVAL, "pipe.stage: config must start with "
                     "model=NAME, got '%s'", rest);
  rest += 6;
  size_t len = strcspn(rest, ",");
  if (len == 0 || len >= sizeof model)
    return ax_seterr(AX_EINVAL, "pipe.stage: bad model name in '%s'", config);
  memcpy(model, rest, len);
  model[len] = 0;
  rest += len + (rest[len] == ',');
  phost *h = calloc(1, sizeof *h);
  if (!h)
    return AX_ENOMEM;
  void *s = NULL;
  int err = axd_stage_create(n, model, rest, dev, &s);
  if (err != AX_OK) {
    free(h);
    return err;
  }
  h->s = s;
  h->mode = AX_MODE_SEQUENTIAL;
  axp_outbox_init(&h->out);
  *obj = h;
  return AX_OK;
}

static void host_destroy(void *obj) {
  phost *h = obj;
  host_clear(h);
  axp_outbox_destroy(&h->out);
  axd_stage_release(h->s);
  free(h);
}

static int m_setup(ax_call_ctx *cc, void *obj, const ax_values *args,
                   ax_values *out) {
  phost *h = obj;
  axd_stage *s = h->s;
  int64_t mode, rc;
  const char *ocfg;
  AX_TRY(ax_values_get_i64(args, 0, &mode));
  AX_TRY(ax_values_get_i64(args, 1, &rc));
  AX_TRY(ax_values_get_str(args, 2, &ocfg));
  if (mode < 0 || mode > AX_MODE_PIPEDREAM)
    return ax_seterr(AX_EINVAL, "pipe.stage: bad mode %lld", (long long)mode);
  ax_rref *nb[2] = {NULL, NULL};
  for (int i = 0; i < 2; i++)
    if (ax_values_type(args, 3 + (size_t)i) == AX_VAL_EXT)
      AX_TRY(ax_values_get_rref(args, 3 + (size_t)i, &nb[i]));
  ax_config c;
  ax_optim_cfg oc;
  AX_TRY(ax_config_parse(&c, ocfg));
  AX_TRY(ax_optim_cfg_parse(&c, &oc));
  ax_optim *o = ax_optim_new(&oc, s->net->n_params, s->dev);
  if (!o)
    return AX_ENOMEM;
  pthread_mutex_lock(&s->mu);
  host_clear(h);
  h->mode = (int)mode;
  h->recompute = (int)rc;
  h->prev = ax_rref_retain(nb[0]);
  h->next = ax_rref_retain(nb[1]);
  h->is_last = nb[1] == NULL;
  ax_optim_free(s->opt);
  s->opt = o;
  int err = ax_net_zero_grad(s->net);
  pthread_mutex_unlock(&s->mu);
  return err;
}

static int m_take(ax_call_ctx *cc, void *obj, const ax_values *args,
                  ax_values *out) {
  phost *h = obj;
  return axp_outbox_take(&h->out, h->s->index, args, out);
}

/* ---- statistics reported with every operation ------------------------------ */
static int report(phost *h, int64_t t0, ax_values *out) {
  long live = 0, vers = 1;
  size_t bytes = 0;
  for (pstate *st = h->states; st; st = st->next) {
    live++;
    bytes += ax_slot_bytes(st->slot);
    for (int i = 0; i < st->input.n; i++)
      bytes += st->input.t[i] ? ax_tensor_nbytes(st->input.t[i]) : 0;
    int seen = st->ver == NULL || st->ver == h->s->net->params;
    for (pstate *o = h->states; !seen && o != st; o = o->next)
      seen = o->ver == st->ver;
    if (!seen) {
      vers++;
      bytes += ax_tensor_nbytes(st->ver);
    }
  }
  AX_TRY(ax_values_add_i64(out, now_us() - t0));
  AX_TRY(ax_values_add_i64(out, live));
  AX_TRY(ax_values_add_i64(out, vers));
  return ax_values_add_i64(out, (int64_t)bytes);
}

/* ---- forward ------------------------------------------------------------------ */
static int run_loss(phost *h, const ax_values *args, size_t at,
                    const ax_tlist *y, pstate *st, ax_loss_result *r) {
  int64_t nlab;
  AX_TRY(ax_values_get_i64(args, at, &nlab));
  if (nlab < 1 || nlab > AX_TLIST_MAX ||
      ax_values_count(args) < at + 1 + 2 * (size_t)nlab)
    return ax_seterr(AX_EBADARG, "pipe.stage: last stage needs labels");
  ax_tlist lab = {0};
  int64_t norm[AX_TLIST_MAX] = {0};
  for (int i = 0; i < nlab; i++) {
    AX_TRY(ax_values_get_tensor(args, at + 1 + (size_t)i, &lab.t[i]));
    AX_TRY(ax_values_get_i64(args, at + 1 + (size_t)(nlab + i), &norm[i]));
  }
  lab.n = (int)nlab;
  return ax_loss_xent(y, &lab, h->s->ignore_index, norm, 1.0f, r,
                      st ? &st->dlogits : NULL);
}

static int m_fwd(ax_call_ctx *cc, void *obj, const ax_values *args,
                 ax_values *out) {
  phost *h = obj;
  axd_stage *s = h->s;
  int64_t t0 = now_us(), batch, micro, seed, flags, nin;
  AX_TRY(ax_values_get_i64(args, 0, &batch));
  AX_TRY(ax_values_get_i64(args, 1, &micro));
  AX_TRY(ax_values_get_i64(args, 2, &seed));
  AX_TRY(ax_values_get_i64(args, 3, &flags));
  AX_TRY(ax_values_get_i64(args, 4, &nin));
  if (nin < 0 || nin > AX_TLIST_MAX)
    return ax_seterr(AX_EBADARG, "pipe.stage: %lld inputs", (long long)nin);
  int train = (flags & AX_PIPE_FLAG_TRAIN) != 0;
  ax_tlist in = {0}, y = {0};
  int err = AX_OK;
  if (nin == 0) {
    err = axp_outbox_fetch(s->node, s->index, h->prev, 0, batch, (int)micro,
                           s->dev, &in);
  } else {
    for (int i = 0; err == AX_OK && i < nin; i++) {
      ax_tensor *x;
      err = ax_values_get_tensor(args, 5 + (size_t)i, &x);
      if (err == AX_OK && !(in.t[in.n++] = ax_tensor_to(x, s->dev)))
        err = AX_ENOMEM;
    }
  }
  pstate *st = NULL;
  if (err == AX_OK && train) {
    if (!(st = calloc(1, sizeof *st)) || !(st->slot = ax_slot_new()))
      err = AX_ENOMEM;
    else {
      st->batch = batch;
      st->micro = (int)micro;
      st->seed = (uint64_t)seed;
    }
  }
  ax_loss_result r;
  memset(&r, 0, sizeof r);
  pthread_mutex_lock(&s->mu);
  if (err == AX_OK) {
    ax_exec ex = ax_net_exec(s->net, train);
    ex.seed = (uint64_t)seed;
    ex.update_stats = train;
    err = ax_forward(s->net->root, &ex, st ? st->slot : NULL, &in, &y);
  }
  if (err == AX_OK && st) {
    if (h->mode == AX_MODE_DDG || h->mode == AX_MODE_PIPEDREAM)
      st->ver = ax_tensor_retain(s->net->params); /* copied on update */
    if (h->mode == AX_MODE_FR || (flags & AX_PIPE_FLAG_RECOMPUTE)) {
      ax_slot_free(st->slot); /* keep only the inputs */
      st->slot = NULL;
      st->input.n = in.n;
      for (int i = 0; i < in.n; i++)
        st->input.t[i] = ax_tensor_retain(in.t[i]);
    }
  }
  if (err == AX_OK && h->is_last)
    err = run_loss(h, args, 5 + (size_t)nin, &y, st, &r);
  if (err == AX_OK && st) {
    st->next = h->states;
    h->states = st;
    st = NULL;
  }
  if (err == AX_OK)
    err = report(h, t0, out);
  pthread_mutex_unlock(&s->mu);
  if (err == AX_OK && h->is_last) {
    ax_values_add_f64(out, r.loss);
    ax_values_add_i64(out, r.correct[0]);
    err = ax_values_add_i64(out, r.count[0]);
  } else if (err == AX_OK) {
    err = axp_outbox_put(&h->out, 0, batch, (int)micro, &y);
  }
  state_free(st);
  ax_tlist_clear(&in);
  ax_tlist_clear(&y);
  return err;
}

/* ---- backward and update ------------------------------------------------------- */
static pstate *state_take(phost *h, long batch, int micro) {
  for (pstate **pp = &h->states; *pp; pp = &(*pp)->next)
    if ((*pp)->batch == batch && (*pp)->micro == micro) {
      pstate *st = *pp;
      *pp = st->next;
      return st;
    }
  return NULL;
}

/* Before the live weights change, states whose forward used them move to
 * one separate copy (the stashed version). s->mu held. */
static int stash_live(phost *h) {
  ax_tensor *live = h->s->net->params, *copy = NULL;
  for (pstate *st = h->states; st; st = st->next) {
    if (st->ver != live)
      continue;
    if (!copy) {
      if (!(copy = ax_tensor_like(live)))
        return AX_ENOMEM;
      AX_TRY(ax_tensor_copy(copy, live));
    }
    ax_tensor_release(st->ver);
    st->ver = ax_tensor_retain(copy);
  }
  ax_tensor_release(copy);
  return AX_OK;
}

static int backward_locked(phost *h, pstate *st, const ax_tlist *dy,
                           ax_tensor *g, int step, ax_tlist *din) {
  axd_stage *s = h->s;
  ax_net *net = s->net;
  ax_exec ex = ax_net_exec(net, 1);
  ex.params = st->ver ? st->ver : net->params;
  ex.seed = st->seed;
  int err = AX_OK;
  if (!st->slot) { /* replay: recompute the forward without new statistics */
    ax_tlist y = {0};
    if (!(st->slot = ax_slot_new()))
      return AX_ENOMEM;
    ex.update_stats = 0;
    err = ax_forward(net->root, &ex, st->slot, &st->input, &y);
    ax_tlist_clear(&y);
  }
  ex.grads = g;
  ex.need_dx = !s->is_first;
  if (err == AX_OK)
    err = ax_backward(net->root, &ex, st->slot, dy, din);
  ax_backend *be = ax_backend_of(s->dev);
  int async = ax_pipe_async_update(h->mode);
  if (err == AX_OK && !async && g != net->grads)
    err = AX_K(be, axpby, net->n_params, 1.0f, ax_f32(g), 1.0f,
               ax_f32(net->grads));
  if (err == AX_OK && step) {
    if (!s->opt)
      return ax_seterr(AX_ESTATE, "pipe.stage: no optimizer (setup)");
    err = stash_live(h);
    if (err == AX_OK)
      err = ax_optim_step(s->opt, net->params, async ? g : net->grads);
    if (err == AX_OK && (!async || g == net->grads))
      err = ax_net_zero_grad(net);
  }
  return err;
}

static int m_bwd(ax_call_ctx *cc, void *obj, const ax_values *args,
                 ax_values *out) {
  phost *h = obj;
  axd_stage *s = h->s;
  int64_t t0 = now_us(), batch, micro, step;
  AX_TRY(ax_values_get_i64(args, 0, &batch));
  AX_TRY(ax_values_get_i64(args, 1, &micro));
  AX_TRY(ax_values_get_i64(args, 2, &step));
  pthread_mutex_lock(&s->mu);
  pstate *st = state_take(h, batch, (int)micro);
  pthread_mutex_unlock(&s->mu);
  if (!st)
    return ax_seterr(AX_ENOTFOUND, "pipe.stage %d: backward of batch %lld/%lld "
                     "without its forward", s->index, (long long)batch,
                     (long long)micro);
  ax_tlist dy = {0}, din = {0};
  int err = AX_OK;
  if (h->is_last) {
    dy.n = st->dlogits.n;
    for (int i = 0; i < dy.n; i++)
      dy.t[i] = ax_tensor_retain(st->dlogits.t[i]);
  } else {
    err = axp_outbox_fetch(s->node, s->index, h->next, 1, batch, (int)micro,
                           s->dev, &dy);
  }
  uint64_t ctx = ax_autograd_ctx_current();
  ax_tensor *g = NULL;
  if (err == AX_OK && ctx)
    err = ax_dist_grads(s->node, ctx, s->key, s->net->n_params, s->dev, &g);
  else if (err == AX_OK)
    g = ax_tensor_retain(s->net->grads);
  pthread_mutex_lock(&s->mu);
  if (err == AX_OK)
    err = backward_locked(h, st, &dy, g, step != 0, &din);
  state_free(st);
  if (err == AX_OK)
    err = report(h, t0, out);
  pthread_mutex_unlock(&s->mu);
  if (err == AX_OK && !s->is_first)
    err = axp_outbox_put(&h->out, 1, batch, (int)micro, &din);
  ax_tensor_release(g);
  ax_tlist_clear(&dy);
  ax_tlist_clear(&din);
  return err;
}

/* ---- state and teardown -------------------------------------------------------- */
static int m_state_save(ax_call_ctx *cc, void *obj, const ax_values *args,
                        ax_values *out) {
  return axd_stage_state_save(((phost *)obj)->s, out);
}

static int m_teardown(ax_call_ctx *cc, void *obj, const ax_values *args,
                      ax_values *out) {
  phost *h = obj;
  pthread_mutex_lock(&h->s->mu);
  host_clear(h);
  pthread_mutex_unlock(&h->s->mu);
  return AX_OK;
}

static const ax_robj_method_def g_methods[] = {
    {"setup", m_setup}, {"fwd", m_fwd},
    {"bwd", m_bwd},     {"take", m_take},
    {"state_save", m_state_save}, {"teardown", m_teardown},
    {NULL, NULL},
};

static const ax_robj_kind g_kind = {"pipe.stage", host_create, host_destroy,
                                    g_methods};

int axi_pipe_host_register(ax_node *n) { return ax_robj_register(n, &g_kind); }
