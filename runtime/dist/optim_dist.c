/* Parameter-set objects of stages ("stage.params") with their local
 * optimizer, the distributed optimizer over them, and the remote-module
 * wrappers of stage.h. */
#include <stdlib.h>
#include <string.h>

#include "runtime/dist/autograd-impl.h"
#include "runtime/dist/stage-impl.h"

/* ---- the parameter-set object -------------------------------------------- */
static int params_create(ax_node *n, const char *cfg, ax_device dev,
                         void **obj) {
  return ax_seterr(AX_EUNSUPPORTED, "stage.params: made by stage.parameters");
}

static void params_destroy(void *obj) { axd_stage_release(obj); }

/* "optim_init" [config]: creates (or replaces) the local optimizer. */
static int p_optim_init(ax_call_ctx *cc, void *obj, const ax_values *args,
                        ax_values *out) {
  axd_stage *s = obj;
  const char *cfg_s;
  AX_TRY(ax_values_get_str(args, 0, &cfg_s));
  ax_config c;
  ax_optim_cfg oc;
  AX_TRY(ax_config_parse(&c, cfg_s));
  AX_TRY(ax_optim_cfg_parse(&c, &oc));
  ax_optim *o = ax_optim_new(&oc, s->net->n_params, s->dev);
  if (!o)
    return AX_ENOMEM;
  pthread_mutex_lock(&s->mu);
  ax_optim_free(s->opt);
  s->opt = o;
  pthread_mutex_unlock(&s->mu);
  return AX_OK;
}

/* "step" under the call's context: one update with its gradients. */
static int p_step(ax_call_ctx *cc, void *obj, const ax_values *args,
                  ax_values *out) {
  axd_stage *s = obj;
  uint64_t ctx = ax_autograd_ctx_current();
  ax_tensor *g = NULL;
  int err = ax_dist_get_gradients(s->node, ctx, s->key, &g);
  if (err == AX_ENOTFOUND) { /* no gradient reached this stage: zero */
    ax_clearerr();
    int64_t np = (int64_t)s->net->n_params;
    g = ax_tensor_zeros(AX_F32, 1, &np, s->dev);
    err = g ? AX_OK : AX_ENOMEM;
  }
  pthread_mutex_lock(&s->mu);
  if (err == AX_OK && !s->opt)
    err = ax_seterr(AX_ESTATE, "stage.params: no optimizer (optim_init)");
  if (err == AX_OK)
    err = ax_optim_step(s->opt, s->net->params, g);
  pthread_mutex_unlock(&s->mu);
  ax_tensor_release(g);
  return err;
}

static const ax_robj_method_def g_params_methods[] = {
    {"optim_init", p_optim_init},
    {"step", p_step},
    {NULL, NULL},
};

const ax_robj_kind axd_params_kind = {"stage.params", params_create,
                                      params_destroy, g_params_methods};

int axd_optim_register(ax_node *n) { return AX_OK; }

/* ---- the distributed optimizer ------------------------------------------- */
struct ax_dist_optim {
  ax_node *node;
  int n;
  ax_rref **params;
};

int ax_dist_optim_new(ax_node *n, ax_rref *const *params, int nparams,
                      const char *optim_config, ax_dist_optim **out) {
  if (!n || (!params && nparams) || nparams < 0 || !out)
    return ax_seterr(AX_EINVAL, "dist optim: bad arguments");
  ax_dist_optim *o = calloc(1, sizeof *o);
  if (!o || !(o->params = calloc((size_t)nparams + 1, sizeof *o->params))) {
    free(o);
    return AX_ENOMEM;
  }
  o->node = n;
  ax_values *a = ax_values_new();
  int err = a ? ax_values_add_str(a, optim_config ? optim_config : "")
              : AX_ENOMEM;
  ax_future *f[64];
  int nf = 0;
  for (int i = 0; i < nparams; i++)
    o->params[o->n++] = ax_rref_retain(params[i]);
  for (int i = 0; err == AX_OK && i < nparams && i < 64; i++) {
    ax_call_opts co = {.timeout_ms = 60000, .autograd_ctx = 0};
    err = ax_rref_rpc_async(n, params[i], "optim_init", a, &co, &f[nf]);
    if (err == AX_OK)
      nf++;
  }
  for (int i = 0; i < nf; i++) {
    int e = ax_future_wait(f[i], 62000);
    if (e != AX_OK && err == AX_OK)
      err = ax_seterr(e, "%s", ax_future_errmsg(f[i]));
    ax_future_release(f[i]);
  }
  ax_values_free(a);
  if (err != AX_OK) {
    ax_dist_optim_free(o);
    return err;
  }
  *out = o;
  return AX_OK;
}

int ax_dist_optim_step(ax_dist_optim *o, uint64_t ctx, int64_t timeout_ms) {
  if (!o)
    return ax_seterr(AX_EINVAL, "dist optim: NULL");
  if (timeout_ms <= 0)
    timeout_ms = 60000;
  ax_future *f[64];
  int nf = 0, err = AX_OK;
  for (int i = 0; err == AX_OK && i < o->n && i < 64; i++) {
    ax_call_opts co = {.timeout_ms = timeout_ms, .autograd_ctx = ctx};
    err = ax_rref_rpc_async(o->node, o->params[i], "step", NULL, &co, &f[nf]);
    if (err == AX_OK)
      nf++;
  }
  for (int i = 0; i < nf; i++) {
    int e = ax_future_wait(f[i], timeout_ms + 2000);
    if (e != AX_OK && err == AX_OK)
      err = ax_seterr(e, "%s", ax_future_is_done(f[i]) ? ax_future_errmsg(f[i])
                                                       : "step timed out");
    ax_future_release(f[i]);
  }
  return err;
}

void ax_dist_optim_free(ax_dist_optim *o) {
  if (!o)
    return;
  for (int i = 0; i < o->n; i++)
    ax_rref_release(o->params[i]);
  free(o->params);
  free(o);
}

/* ---- remote-module wrappers ------------------------------------------------ */
int ax_remote_module(ax_node *n, const char *to, const char *kind,
                     const char *config, ax_device dev, ax_rref **out) {
  return ax_remote_object(n, to, kind, config, dev, NULL, out);
}

int ax_rmod_forward(ax_node *n, ax_rref *mod, const ax_values *args,
                    ax_values **out) {
  return ax_rref_rpc_sync(n, mod, "forward", args, NULL, out);
}

int ax_rmod_forward_async(ax_node *n, ax_rref *mod, const ax_values *args,
                          ax_future **out) {
  return ax_rref_rpc_async(n, mod, "forward", args, NULL, out);
}

int ax_rmod_forward_remote(ax_node *n, ax_rref *mod, const ax_values *args,
                           ax_rref **out) {
  return ax_rref_remote(n, mod, "forward", args, NULL, out);
}

int ax_rmod_parameters(ax_node *n, ax_rref *mod, ax_rref **out) {
  ax_values *v = NULL;
  AX_TRY(ax_rref_rpc_sync(n, mod, "parameters", NULL, NULL, &v));
  ax_rref *r;
  int err = ax_values_get_rref(v, 0, &r);
  if (err == AX_OK)
    *out = ax_rref_retain(r);
  ax_values_free(v);
  return err;
}

int ax_rmod_state_save(ax_node *n, ax_rref *mod, ax_tensor **params,
                       ax_tensor **buffers) {
  ax_values *v = NULL;
  ax_call_opts co = {.timeout_ms = 60000, .autograd_ctx = 0};
  AX_TRY(ax_rref_rpc_sync(n, mod, "state_save", NULL, &co, &v));
  ax_tensor *p, *b;
  int err = ax_values_get_tensor(v, 0, &p);
  if (err == AX_OK)
    err = ax_values_get_tensor(v, 1, &b);
  if (err == AX_OK) {
    *params = ax_tensor_retain(p);
    *buffers = ax_tensor_numel(b) ? ax_tensor_retain(b) : NULL;
  }
  ax_values_free(v);
  return err;
}

int ax_rmod_state_load(ax_node *n, ax_rref *mod, ax_tensor *params,
                       ax_tensor *buffers) {
  ax_values *v = ax_values_new();
  int64_t zero = 0;
  ax_tensor *empty = buffers ? NULL : ax_tensor_new(AX_F32, 1, &zero, AX_CPU);
  int err = v ? ax_values_add_tensor(v, params) : AX_ENOMEM;
  if (err == AX_OK)
    err = ax_values_add_tensor(v, buffers ? buffers : empty);
  ax_tensor_release(empty);
  if (err == AX_OK)
    err = ax_rref_rpc_sync(n, mod, "state_load", v, NULL, NULL);
  ax_values_free(v);
  return err;
}
