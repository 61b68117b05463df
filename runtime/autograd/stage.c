/* Model stages as remote module kinds ("NAME.stage" for every built-in or
 * registered model) and their parameter-set objects. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "axon/models/loss.h"
#include "axon/models/model.h"
#include "axon/runtime/autograd/autograd-impl.h"
#include "axon/runtime/autograd/stage-impl.h"

static uint64_t g_stage_keys;

void axi_ag_stage_release(axi_ag_stage *s) {
  if (!s || __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL))
    return;
  ax_optim_free(s->opt);
  ax_net_free(s->net);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

int axi_ag_stage_create(ax_node *n, const char *model, const char *config,
                        ax_device dev, void **obj) {
  ax_config all, mover;
  AX_TRY(ax_config_parse(&all, config));
  const ax_model_def *def = ax_model_find(model);
  if (!def)
    return AX_ENOTFOUND;
  memset(&mover, 0, sizeof mover);
  int err = AX_OK, idx = 0, nst = 1;
  int64_t seed = 1, b[AX_MODEL_MAX_BLOCKS + 1];
  int nb = 0;
  for (int i = 0; i < all.n; i++) {
    const char *k = all.key[i];
    if (!strcmp(k, "stage"))
      idx = (int)ax_config_int(&all, k, 0, &err);
    else if (!strcmp(k, "nstages"))
      nst = (int)ax_config_int(&all, k, 1, &err);
    else if (!strcmp(k, "seed"))
      seed = ax_config_int(&all, k, 1, &err);
    else if (!strcmp(k, "splits"))
      nb = ax_config_ints(&all, k, b, AX_MODEL_MAX_BLOCKS + 1, &err);
    else
      ax_config_set(&mover, k, all.val[i]);
  }
  if (err != AX_OK)
    return ax_seterr(AX_EINVAL, "stage: bad configuration %s", config);
  axi_ag_stage *s = calloc(1, sizeof *s);
  if (!s)
    return AX_ENOMEM;
  s->refs = 1;
  s->node = n;
  s->dev = dev;
  s->def = def;
  s->key = __atomic_add_fetch(&g_stage_keys, 1, __ATOMIC_RELAXED);
  pthread_mutex_init(&s->mu, NULL);
  ax_config base;
  err = ax_model_config(def, NULL, &base);
  if (err == AX_OK)
    err = ax_config_merge(&base, &mover);
  ax_model_info info;
  if (err == AX_OK)
    err = ax_model_describe(def, &base, &info);
  if (err == AX_OK)
    s->info = info;
  if (err == AX_OK && nb == 0) {
    int bi[AX_MODEL_MAX_BLOCKS + 1];
    err = ax_split_uniform(info.n_blocks, nst, bi);
    for (int i = 0; err == AX_OK && i <= nst; i++)
      b[i] = bi[i];
    nb = nst + 1;
  }
  if (err == AX_OK && (idx < 0 || idx + 1 >= nb || b[nb - 1] != info.n_blocks))
    err = ax_seterr(AX_EINVAL, "stage: stage %d outside splits of %d blocks",
                    idx, info.n_blocks);
  if (err == AX_OK) {
    s->index = idx;
    s->first = (int)b[idx];
    s->last = (int)b[idx + 1];
    s->is_first = idx == 0; /* no input gradient: the pipeline's inputs
                               (or a frozen prefix's outputs) */
    s->ignore_index = info.ignore_index;
    err = ax_model_stage(def, &base, s->first, s->last, dev, (uint64_t)seed,
                         &s->net);
  }
  if (err != AX_OK) {
    axi_ag_stage_release(s);
    return err;
  }
  *obj = s;
  return AX_OK;
}

static void stage_destroy(void *obj) { axi_ag_stage_release(obj); }

/* ---- forward / backward -------------------------------------------------- */
typedef struct fwd_state {
  axi_ag_stage *s;
  ax_slot *slot;
  ax_tlist dlogits; /* loss stages: d loss / d logits */
  int loss;
  uint64_t seed;
} fwd_state;

static void fwd_release(void *p) {
  fwd_state *st = p;
  if (!st)
    return;
  ax_slot_free(st->slot);
  ax_tlist_clear(&st->dlogits);
  axi_ag_stage_release(st->s);
  free(st);
}

static int fwd_backward(void *p, uint64_t ctx, const ax_tlist *dout,
                        ax_tlist *din) {
  fwd_state *st = p;
  axi_ag_stage *s = st->s;
  ax_tensor *g = NULL;
  AX_TRY(ax_dist_grads(s->node, ctx, s->key, s->net->n_params, s->dev, &g));
  ax_tlist dy = {0};
  int err = AX_OK;
  if (st->loss) { /* scale the saved dlogits by the incoming d loss */
    float scale = 0.0f;
    if (dout->n > 0 && dout->t[0])
      err = ax_tensor_read(dout->t[0], &scale, sizeof scale);
    dy.n = st->dlogits.n;
    for (int i = 0; err == AX_OK && i < dy.n; i++) {
      dy.t[i] = ax_tensor_retain(st->dlogits.t[i]);
      if (scale != 1.0f)
        err = AX_K(ax_backend_of(dy.t[i]->device), axpby,
                   ax_tensor_numel(dy.t[i]), 0.0f, ax_f32(dy.t[i]), scale,
                   ax_f32(dy.t[i]));
    }
  } else { /* gradients arrive on the receiving node's (mapped) device */
    dy.n = dout->n;
    for (int i = 0; err == AX_OK && i < dy.n; i++)
      if (dout->t[i] && !(dy.t[i] = ax_tensor_to(dout->t[i], s->dev)))
        err = AX_ENOMEM;
  }
  pthread_mutex_lock(&s->mu);
  ax_exec ex = ax_net_exec(s->net, 1);
  ex.grads = g;
  ex.need_dx = !s->is_first;
  ex.seed = st->seed;
  if (err == AX_OK)
    err = ax_backward(s->net->root, &ex, st->slot, &dy, din);
  pthread_mutex_unlock(&s->mu);
  ax_tlist_clear(&dy);
  ax_tensor_release(g);
  return err;
}

static const ax_dist_fn_ops g_fwd_ops = {
    /* .backward = */ fwd_backward,
    /* .release = */ fwd_release,
};

/* Collects the input tensors: tensors at [2, 2 + n_in) or one RRef there. */
static int gather_inputs(axi_ag_stage *s, const ax_values *args, size_t end,
                         uint64_t ctx, ax_values **held, ax_tlist *in) {
  memset(in, 0, sizeof *in);
  *held = NULL;
  if (end > 2 && ax_values_type(args, 2) == AX_VAL_EXT) {
    ax_rref *r;
    AX_TRY(ax_values_get_rref(args, 2, &r));
    AX_TRY(ax_rref_to_here(s->node, r, 0, ctx, held));
    args = *held;
    end = ax_values_count(args);
    for (size_t i = 0; i < end && in->n < AX_TLIST_MAX; i++)
      AX_TRY(ax_values_get_tensor(args, i, &in->t[in->n++]));
    return AX_OK;
  }
  for (size_t i = 2; i < end && in->n < AX_TLIST_MAX; i++)
    AX_TRY(ax_values_get_tensor(args, i, &in->t[in->n++]));
  return AX_OK;
}

static int m_forward(ax_call_ctx *cc, void *obj, const ax_values *args,
                     ax_values *out) {
  axi_ag_stage *s = obj;
  int64_t seed, nlab;
  AX_TRY(ax_values_get_i64(args, 0, &seed));
  AX_TRY(ax_values_get_i64(args, 1, &nlab));
  size_t cnt = ax_values_count(args);
  if (nlab < 0 || (size_t)nlab + 2 > cnt || nlab > AX_TLIST_MAX)
    return ax_seterr(AX_EBADARG, "stage forward: bad label count %lld",
                     (long long)nlab);
  uint64_t ctx = ax_autograd_ctx_current();
  ax_values *held = NULL;
  ax_tlist in, lab = {0}, dev_in = {0}, y = {0};
  int err = gather_inputs(s, args, cnt - (size_t)nlab, ctx, &held, &in);
  for (size_t i = cnt - (size_t)nlab; err == AX_OK && i < cnt; i++)
    err = ax_values_get_tensor(args, i, &lab.t[lab.n++]);
  dev_in.n = in.n;
  for (int i = 0; err == AX_OK && i < in.n; i++)
    if (!(dev_in.t[i] = ax_tensor_to(in.t[i], s->dev)))
      err = AX_ENOMEM;
  fwd_state *st = NULL;
  if (err == AX_OK && ctx) {
    st = calloc(1, sizeof *st);
    if (!st || !(st->slot = ax_slot_new()))
      err = AX_ENOMEM;
    else {
      st->s = s;
      __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
      st->seed = (uint64_t)seed;
      st->loss = nlab > 0;
    }
  }
  if (err == AX_OK) {
    pthread_mutex_lock(&s->mu);
    err = ax_net_forward(s->net, st ? st->slot : NULL, ctx != 0, (uint64_t)seed,
                         &dev_in, &y);
    pthread_mutex_unlock(&s->mu);
  }
  ax_tlist res = {0};
  if (err == AX_OK && nlab > 0) {
    ax_loss_result r;
    err = ax_loss_xent(&y, &lab, s->ignore_index, NULL, 1.0f, &r,
                       st ? &st->dlogits : NULL);
    int64_t one = 1;
    ax_tensor *l = err == AX_OK ? ax_tensor_new(AX_F32, 1, &one, AX_CPU) : NULL;
    if (err == AX_OK && !l)
      err = AX_ENOMEM;
    if (l)
      ax_f32(l)[0] = (float)r.loss;
    res = ax_tlist1(l);
  } else if (err == AX_OK) {
    res = y;
    memset(&y, 0, sizeof y);
  }
  if (err == AX_OK && st)
    err = ax_dist_record(s->node, ctx, &g_fwd_ops, st, &in, &res);
  if (err == AX_OK)
    st = NULL; /* the context owns it now */
  for (int i = 0; err == AX_OK && i < res.n; i++)
    err = ax_values_add_tensor(out, res.t[i]);
  fwd_release(st);
  ax_tlist_clear(&res);
  ax_tlist_clear(&y);
  ax_tlist_clear(&dev_in);
  ax_values_free(held);
  return err;
}

/* ---- state --------------------------------------------------------------- */
static ax_tensor *copy_of(const ax_tensor *t) {
  ax_tensor *c = ax_tensor_new(t->dtype, t->ndim, t->shape, AX_CPU);
  if (c && ax_tensor_copy(c, t) != AX_OK) {
    ax_tensor_release(c);
    c = NULL;
  }
  return c;
}

int axi_ag_stage_state_copy(axi_ag_stage *s, ax_tensor **params,
                            ax_tensor **buffers) {
  int64_t zero = 0;
  pthread_mutex_lock(&s->mu);
  ax_tensor *p = copy_of(s->net->params);
  ax_tensor *b = s->net->buffers ? copy_of(s->net->buffers)
                                 : ax_tensor_new(AX_F32, 1, &zero, AX_CPU);
  pthread_mutex_unlock(&s->mu);
  if (!p || !b) {
    ax_tensor_release(p);
    ax_tensor_release(b);
    return AX_ENOMEM;
  }
  *params = p;
  *buffers = b;
  return AX_OK;
}

int axi_ag_stage_state_save(axi_ag_stage *s, ax_values *out) {
  ax_tensor *p = NULL, *b = NULL;
  int err = axi_ag_stage_state_copy(s, &p, &b);
  if (err == AX_OK)
    err = ax_values_add_tensor(out, p);
  if (err == AX_OK)
    err = ax_values_add_tensor(out, b);
  ax_tensor_release(p);
  ax_tensor_release(b);
  return err;
}

static int m_state_save(ax_call_ctx *cc, void *obj, const ax_values *args,
                        ax_values *out) {
  return axi_ag_stage_state_save(obj, out);
}

static int m_state_load(ax_call_ctx *cc, void *obj, const ax_values *args,
                        ax_values *out) {
  axi_ag_stage *s = obj;
  ax_tensor *p, *b;
  AX_TRY(ax_values_get_tensor(args, 0, &p));
  AX_TRY(ax_values_get_tensor(args, 1, &b));
  if (ax_tensor_numel(p) != s->net->n_params ||
      ax_tensor_numel(b) != s->net->n_buffers)
    return ax_seterr(AX_ESHAPE,
                     "stage: state of %zu/%zu floats, expected "
                     "%zu/%zu",
                     ax_tensor_numel(p), ax_tensor_numel(b), s->net->n_params,
                     s->net->n_buffers);
  pthread_mutex_lock(&s->mu);
  int err = ax_tensor_copy(s->net->params, p);
  if (err == AX_OK && s->net->buffers)
    err = ax_tensor_copy(s->net->buffers, b);
  pthread_mutex_unlock(&s->mu);
  return err;
}

static int m_gradients(ax_call_ctx *cc, void *obj, const ax_values *args,
                       ax_values *out) {
  axi_ag_stage *s = obj;
  ax_tensor *g;
  AX_TRY(ax_dist_get_gradients(s->node, ax_autograd_ctx_current(), s->key, &g));
  int err = ax_values_add_tensor(out, g);
  ax_tensor_release(g);
  return err;
}

static int m_parameters(ax_call_ctx *cc, void *obj, const ax_values *args,
                        ax_values *out) {
  axi_ag_stage *s = obj;
  __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
  ax_rref *r;
  int err = ax_rref_own_object(s->node, &axi_ag_params_kind, s, &r);
  if (err != AX_OK) {
    axi_ag_stage_release(s);
    return err;
  }
  err = ax_values_add_rref(out, r);
  ax_rref_release(r);
  return err;
}

static const ax_robj_method_def g_stage_methods[] = {
    {"forward", m_forward},       {"state_save", m_state_save},
    {"state_load", m_state_load}, {"gradients", m_gradients},
    {"parameters", m_parameters}, {NULL, NULL},
};

/* ---- kinds --------------------------------------------------------------- */
/* One "NAME.stage" kind per model, made on first use by the RRef layer's
 * resolver, so models registered before or after ax_dist_init are served
 * alike. Kinds are process-wide and never freed (they must outlive every
 * node; there is at most one per known model). */
typedef struct stage_kind {
  ax_robj_kind kind; /* first: create_kind gets &kind */
  char name[AX_MODEL_NAME_MAX + 8];
  char model[AX_MODEL_NAME_MAX];
  struct stage_kind *next;
} stage_kind;

static pthread_mutex_t g_kinds_mu = PTHREAD_MUTEX_INITIALIZER;
static stage_kind *g_kinds;

static int stage_kind_create(const ax_robj_kind *kind, ax_node *n,
                             const char *cfg, ax_device dev, void **obj) {
  return axi_ag_stage_create(n, ((const stage_kind *)kind)->model, cfg, dev,
                             obj);
}

static const ax_robj_kind *resolve_stage_kind(ax_node *n, const char *kind,
                                              void *user) {
  static const char suffix[] = ".stage";
  size_t len = strlen(kind), sl = sizeof suffix - 1;
  if (len <= sl || len - sl >= AX_MODEL_NAME_MAX ||
      strcmp(kind + len - sl, suffix))
    return NULL;
  char model[AX_MODEL_NAME_MAX];
  memcpy(model, kind, len - sl);
  model[len - sl] = 0;
  if (!ax_model_find(model))
    return NULL;
  pthread_mutex_lock(&g_kinds_mu);
  stage_kind *k = g_kinds;
  while (k && strcmp(k->model, model))
    k = k->next;
  if (!k && (k = calloc(1, sizeof *k))) {
    snprintf(k->model, sizeof k->model, "%s", model);
    snprintf(k->name, sizeof k->name, "%s", kind);
    k->kind = (ax_robj_kind){.name = k->name,
                             .destroy = stage_destroy,
                             .methods = g_stage_methods,
                             .create_kind = stage_kind_create};
    k->next = g_kinds;
    g_kinds = k;
  }
  pthread_mutex_unlock(&g_kinds_mu);
  return k ? &k->kind : NULL;
}

int axi_ag_stages_register(ax_node *n) {
  ax_robj_set_resolver(n, resolve_stage_kind, NULL);
  return ax_robj_register(n, &axi_ag_params_kind);
}
