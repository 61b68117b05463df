#include "axon/models/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"

struct ax_optim {
  ax_optim_cfg cfg;
  size_t n;
  ax_device dev;
  ax_tensor *m; /* momentum buffer (SGD) or first moment (AdamW) */
  ax_tensor *v; /* second moment (AdamW) */
  long step;
  float lr_scale; /* ax_optim_set_lr_scale; 1 by default */
};

ax_optim_cfg ax_optim_defaults(ax_optim_kind kind) {
  ax_optim_cfg c;
  memset(&c, 0, sizeof c);
  c.kind = kind;
  c.lr = kind == AX_OPT_SGD ? 0.1f : 1e-3f;
  c.beta1 = 0.9f;
  c.beta2 = 0.999f;
  c.eps = 1e-8f;
  c.gamma = 0.1f;
  c.step_size = 1;
  c.weight_decay = kind == AX_OPT_ADAMW ? 0.01f : 0.0f;
  return c;
}

int ax_optim_cfg_parse(const ax_config *c, ax_optim_cfg *out) {
  const char *opt = ax_config_str(c, "opt", "sgd");
  ax_optim_kind kind;
  if (strcmp(opt, "sgd") == 0)
    kind = AX_OPT_SGD;
  else if (strcmp(opt, "adamw") == 0)
    kind = AX_OPT_ADAMW;
  else
    return ax_seterr(AX_EINVAL, "optimizer '%s' is not sgd or adamw", opt);
  ax_optim_cfg o = ax_optim_defaults(kind);
  int err = AX_OK;
  o.lr = (float)ax_config_float(c, "lr", o.lr, &err);
  o.momentum = (float)ax_config_float(c, "momentum", o.momentum, &err);
  o.dampening = (float)ax_config_float(c, "dampening", o.dampening, &err);
  o.weight_decay = (float)ax_config_float(c, "wd", o.weight_decay, &err);
  o.nesterov = (int)ax_config_int(c, "nesterov", 0, &err);
  o.beta1 = (float)ax_config_float(c, "beta1", o.beta1, &err);
  o.beta2 = (float)ax_config_float(c, "beta2", o.beta2, &err);
  o.eps = (float)ax_config_float(c, "eps", o.eps, &err);
  o.warmup = (int)ax_config_int(c, "warmup", 0, &err);
  o.total = (int)ax_config_int(c, "total", 0, &err);
  o.step_size = (int)ax_config_int(c, "step_size", o.step_size, &err);
  o.gamma = (float)ax_config_float(c, "gamma", o.gamma, &err);
  o.min_lr = (float)ax_config_float(c, "min_lr", 0.0, &err);
  if (err != AX_OK)
    return err;
  const char *s = ax_config_str(c, "sched", "const");
  if (strcmp(s, "const") == 0)
    o.sched = AX_LR_CONST;
  else if (strcmp(s, "step") == 0)
    o.sched = AX_LR_STEP;
  else if (strcmp(s, "cosine") == 0)
    o.sched = AX_LR_COSINE;
  else
    return ax_seterr(AX_EINVAL, "schedule '%s' is not const, step or cosine",
                     s);
  if (o.lr <= 0 || o.step_size <= 0 || o.warmup < 0 || o.momentum < 0 ||
      (o.nesterov && o.momentum == 0))
    return ax_seterr(AX_EINVAL, "optimizer: bad lr/step_size/warmup/momentum "
                                "(Nesterov needs momentum)");
  *out = o;
  return AX_OK;
}

float ax_lr_at(const ax_optim_cfg *c, long step) {
  if (c->warmup > 0 && step < c->warmup)
    return c->lr * (float)(step + 1) / (float)c->warmup;
  long t = step - c->warmup;
  switch (c->sched) {
  case AX_LR_STEP:
    return c->lr * powf(c->gamma, (float)(t / c->step_size));
  case AX_LR_COSINE: {
    if (c->total <= 0)
      return c->lr;
    double f = t >= c->total ? 1.0 : (double)t / c->total;
    return c->min_lr +
           (c->lr - c->min_lr) * (float)(0.5 * (1.0 + cos(M_PI * f)));
  }
  default:
    return c->lr;
  }
}

ax_optim *ax_optim_new(const ax_optim_cfg *cfg, size_t n, ax_device dev) {
  ax_optim *o = calloc(1, sizeof *o);
  if (!o)
    return NULL;
  o->cfg = *cfg;
  o->n = n;
  o->dev = dev;
  o->lr_scale = 1.0f;
  int64_t shape = (int64_t)n;
  int need_m = cfg->kind == AX_OPT_ADAMW || cfg->momentum != 0.0f;
  if (need_m && !(o->m = ax_tensor_zeros(AX_F32, 1, &shape, dev)))
    goto fail;
  if (cfg->kind == AX_OPT_ADAMW &&
      !(o->v = ax_tensor_zeros(AX_F32, 1, &shape, dev)))
    goto fail;
  return o;
fail:
  ax_optim_free(o);
  return NULL;
}

void ax_optim_free(ax_optim *o) {
  if (!o)
    return;
  ax_tensor_release(o->m);
  ax_tensor_release(o->v);
  free(o);
}

int ax_optim_step(ax_optim *o, ax_tensor *params, const ax_tensor *grads) {
  if (params->dtype != AX_F32 || grads->dtype != AX_F32 ||
      ax_tensor_numel(params) != o->n || ax_tensor_numel(grads) != o->n)
    return ax_seterr(AX_ESHAPE,
                     "optimizer: built for %zu parameters, got "
                     "%zu and %zu gradients",
                     o->n, ax_tensor_numel(params), ax_tensor_numel(grads));
  if (!ax_device_eq(params->device, o->dev) ||
      !ax_device_eq(grads->device, o->dev)) {
    char a[16], b[16], d[16];
    return ax_seterr(AX_EDEVICE,
                     "optimizer on %s: parameters on %s, "
                     "gradients on %s",
                     ax_device_str(o->dev, d, sizeof d),
                     ax_device_str(params->device, a, sizeof a),
                     ax_device_str(grads->device, b, sizeof b));
  }
  ax_backend *be = ax_backend_of(o->dev);
  float lr = ax_lr_at(&o->cfg, o->step) * o->lr_scale;
  const ax_optim_cfg *c = &o->cfg;
  int rc;
  if (c->kind == AX_OPT_SGD)
    rc = AX_K(be, sgd_step, o->n, ax_f32(params), ax_f32(grads),
              o->m ? ax_f32(o->m) : NULL, lr, c->momentum, c->dampening,
              c->weight_decay, c->nesterov, o->step == 0);
  else
    rc = AX_K(be, adamw_step, o->n, ax_f32(params), ax_f32(grads), ax_f32(o->m),
              ax_f32(o->v), lr, c->beta1, c->beta2, c->eps, c->weight_decay,
              (int)o->step + 1);
  if (rc == AX_OK)
    o->step++;
  return rc;
}

long ax_optim_steps(const ax_optim *o) { return o->step; }

int ax_optim_set_lr_scale(ax_optim *o, float scale) {
  if (!(scale > 0.0f) || !isfinite(scale))
    return ax_seterr(AX_EINVAL,
                     "optimizer: learning-rate scale %g (must be "
                     "positive and finite)",
                     (double)scale);
  o->lr_scale = scale;
  return AX_OK;
}

ax_tensor *ax_optim_state(ax_optim *o, int i) {
  return i == 0 ? o->m : i == 1 ? o->v : NULL;
}

void ax_optim_set_steps(ax_optim *o, long steps) { o->step = steps; }

const ax_optim_cfg *ax_optim_config(const ax_optim *o) { return &o->cfg; }
