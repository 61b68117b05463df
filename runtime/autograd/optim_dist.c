/* Parameter-set objects of stages ("stage.params") with their local
 * optimizer, the distributed optimizer over them, and the remote-module
 * wrappers of stage.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/autograd/autograd-impl.h"
#include "axon/runtime/autograd/stage-impl.h"

/* ---- the parameter-set object -------------------------------------------- */
static int params_create(ax_node *n, const char *cfg, ax_device dev,
                         void **obj) {
  return ax_seterr(AX_EUNSUPPORTED, "stage.params: made by stage.parameters");
}

static void params_destroy(void *obj) { axi_ag_stage_release(obj); }

/* "optim_init" [config, (i64 check_only)]: creates (or replaces) the local
 * optimizer; with check_only = 1 only checks the configuration and answers
 * [the stage's key] (two parameter-set objects of one stage share it). */
static int p_optim_init(ax_call_ctx *cc, void *obj, const ax_values *args,
                        ax_values *out) {
  axi_ag_stage *s = obj;
  const char *cfg_s;
  int64_t check_only = 0;
  AX_TRY(ax_values_get_str(args, 0, &cfg_s));
  if (ax_values_count(args) > 1)
    AX_TRY(ax_values_get_i64(args, 1, &check_only));
  ax_config c;
  ax_optim_cfg oc;
  AX_TRY(ax_config_parse(&c, cfg_s));
  AX_TRY(ax_optim_cfg_parse(&c, &oc));
  if (check_only)
    return ax_values_add_i64(out, (int64_t)s->key);
  ax_optim *o = ax_optim_new(&oc, s->net->n_params, s->dev);
  if (!o)
    return AX_ENOMEM;
  pthread_mutex_lock(&s->mu);
  ax_optim_free(s->opt);
  s->opt = o;
  pthread_mutex_unlock(&s->mu);
  return AX_OK;
}

/* The stage's tied copies (models/model.h) in its gradient g: summed when
 * both lie in the stage. A tie whose other copy is on another stage is
 * refused: the distributed optimizer steps every stage alone, with no
 * exchange between them (the pipeline's stage hosts have one). */
static int tie_grads(axi_ag_stage *s, ax_tensor *g) {
  for (int i = 0; i < s->info.n_ties; i++) {
    const ax_model_tie *t = &s->info.ties[i];
    int in_a = t->a >= s->first && t->a < s->last,
        in_b = t->b >= s->first && t->b < s->last;
    if (in_a != in_b)
      return ax_seterr(AX_EUNSUPPORTED,
                       "stage.params: %s ties block %d to block %d, which "
                       "is on another stage, and the distributed optimizer "
                       "steps each stage alone",
                       s->def->name, in_a ? t->a : t->b, in_a ? t->b : t->a);
  }
  int bounds[2] = {s->first, s->last};
  return ax_model_tie_grads(&s->info, 1, bounds, &s->net, &g);
}

/* "step" under the call's context: one update with its gradients; none
 * when no gradient reached this parameter set in the context (parameters,
 * momentum, Adam moments and the step count stay as they are). Returns
 * [1] when it stepped, [0] when it did not. */
static int p_step(ax_call_ctx *cc, void *obj, const ax_values *args,
                  ax_values *out) {
  axi_ag_stage *s = obj;
  uint64_t ctx = ax_autograd_ctx_current();
  ax_tensor *g = NULL;
  int err = ax_dist_get_gradients(s->node, ctx, s->key, &g);
  if (err == AX_ENOTFOUND) {
    ax_clearerr();
    pthread_mutex_lock(&s->mu);
    err = s->opt ? AX_OK
                 : ax_seterr(AX_ESTATE, "stage.params: no optimizer "
                                        "(optim_init)");
    pthread_mutex_unlock(&s->mu);
    return err == AX_OK ? ax_values_add_i64(out, 0) : err;
  }
  pthread_mutex_lock(&s->mu);
  if (err == AX_OK && !s->opt)
    err = ax_seterr(AX_ESTATE, "stage.params: no optimizer (optim_init)");
  if (err == AX_OK)
    err = tie_grads(s, g);
  if (err == AX_OK)
    err = ax_optim_step(s->opt, s->net->params, g);
  pthread_mutex_unlock(&s->mu);
  ax_tensor_release(g);
  return err == AX_OK ? ax_values_add_i64(out, 1) : err;
}

static const ax_robj_method_def g_params_methods[] = {
    {"optim_init", p_optim_init},
    {"step", p_step},
    {NULL, NULL},
};

const ax_robj_kind axi_ag_params_kind = {"stage.params", params_create,
                                         params_destroy, g_params_methods};

int axi_ag_optim_register(ax_node *n) { return AX_OK; }

/* ---- the distributed optimizer ------------------------------------------- */
struct ax_dist_optim {
  ax_node *node;
  int n;
  ax_rref **params;
};

/* Calls `method` on every parameter set in parallel (all issued, then all
 * awaited); returns the first error, naming the entry. reply (may be NULL)
 * receives the first i64 of each answer (-1 when none). */
static int call_all(ax_node *n, ax_rref *const *params, int np,
                    const char *method, const ax_values *args, uint64_t ctx,
                    int64_t timeout_ms, int64_t *reply) {
  ax_future **f = calloc(np ? (size_t)np : 1, sizeof *f);
  if (!f)
    return ax_seterr(AX_ENOMEM, "dist optim: no memory for %d calls", np);
  int nf = 0, err = AX_OK;
  for (int i = 0; err == AX_OK && i < np; i++) {
    ax_call_opts co = {.timeout_ms = timeout_ms, .autograd_ctx = ctx};
    err = ax_rref_rpc_async(n, params[i], method, args, &co, &f[nf]);
    if (err == AX_OK)
      nf++;
  }
  for (int i = 0; i < nf; i++) {
    int e = ax_future_wait(f[i], timeout_ms + 2000);
    if (e != AX_OK && err == AX_OK)
      err = ax_seterr(e, "dist optim: %s of parameter set %d (on %s): %s",
                      method, i, ax_rref_owner(params[i]),
                      ax_future_is_done(f[i]) ? ax_future_errmsg(f[i])
                                              : "timed out");
    const ax_values *v = e == AX_OK ? ax_future_values(f[i]) : NULL;
    if (reply && (!v || ax_values_get_i64(v, 0, &reply[i]) != AX_OK))
      reply[i] = -1;
    ax_future_release(f[i]);
  }
  free(f);
  return err;
}

/* AX_EINVAL when an entry is NULL or a value RRef. */
static int check_entries(ax_rref *const *params, int np) {
  for (int i = 0; i < np; i++) {
    if (!params[i])
      return ax_seterr(AX_EINVAL, "dist optim: parameter set %d is NULL", i);
    if (ax_rref_type_of(params[i]) != AX_RREF_OBJECT)
      return ax_seterr(AX_EINVAL,
                       "dist optim: parameter set %d is a value, not a "
                       "parameter-set object",
                       i);
  }
  return AX_OK;
}

/* AX_EINVAL when two entries are parameter sets of the same stage (same
 * owner and key): it would be stepped twice. */
static int check_distinct(ax_rref *const *params, int np, const int64_t *key) {
  for (int i = 0; i < np; i++)
    for (int j = 0; j < i; j++)
      if (key[i] == key[j] &&
          !strcmp(ax_rref_owner(params[i]), ax_rref_owner(params[j])))
        return ax_seterr(AX_EINVAL,
                         "dist optim: parameter sets %d and %d are the same "
                         "stage's (on %s)",
                         j, i, ax_rref_owner(params[i]));
  return AX_OK;
}

int ax_dist_optim_new(ax_node *n, ax_rref *const *params, int nparams,
                      const char *optim_config, ax_dist_optim **out) {
  if (!n || (!params && nparams) || nparams < 0 || !out)
    return ax_seterr(AX_EINVAL, "dist optim: bad arguments");
  AX_TRY(check_entries(params, nparams));
  ax_config cfg;
  ax_optim_cfg oc;
  const char *cs = optim_config ? optim_config : "";
  if (ax_config_parse(&cfg, cs) != AX_OK ||
      ax_optim_cfg_parse(&cfg, &oc) != AX_OK) {
    char why[256];
    snprintf(why, sizeof why, "%s", ax_errmsg());
    return ax_seterr(AX_EINVAL, "dist optim: bad configuration '%s': %s", cs,
                     why);
  }
  ax_dist_optim *o = calloc(1, sizeof *o);
  if (!o || !(o->params = calloc((size_t)nparams + 1, sizeof *o->params))) {
    free(o);
    return ax_seterr(AX_ENOMEM, "dist optim: no memory");
  }
  o->node = n;
  for (int i = 0; i < nparams; i++)
    o->params[o->n++] = ax_rref_retain(params[i]);
  /* Every entry is checked before any optimizer is replaced, so a bad
   * entry loses no owner its optimizer state. */
  ax_values *check = ax_values_new(), *a = ax_values_new();
  int err = check && a ? AX_OK : AX_ENOMEM;
  if (err == AX_OK)
    err = ax_values_add_str(a, cs);
  if (err == AX_OK)
    err = ax_values_add_str(check, cs);
  if (err == AX_OK)
    err = ax_values_add_i64(check, 1);
  int64_t *key = calloc((size_t)nparams + 1, sizeof *key);
  if (err == AX_OK && !key)
    err = ax_seterr(AX_ENOMEM, "dist optim: no memory");
  if (err == AX_OK)
    err = call_all(n, o->params, o->n, "optim_init", check, 0, 60000, key);
  if (err == AX_OK)
    err = check_distinct(o->params, o->n, key);
  if (err == AX_OK)
    err = call_all(n, o->params, o->n, "optim_init", a, 0, 60000, NULL);
  free(key);
  ax_values_free(check);
  ax_values_free(a);
  if (err != AX_OK) {
    ax_dist_optim_free(o);
    return err;
  }
  *out = o;
  return AX_OK;
}

int ax_dist_optim_step_count(ax_dist_optim *o, uint64_t ctx, int64_t timeout_ms,
                             int *stepped) {
  if (!o)
    return ax_seterr(AX_EINVAL, "dist optim: NULL");
  if (!ctx)
    ctx = ax_autograd_ctx_current();
  if (!ctx)
    return ax_seterr(AX_EINVAL, "dist optim: step outside a context");
  if (timeout_ms < 0)
    return ax_seterr(AX_ETIMEOUT, "dist optim: step with no time left");
  int64_t *r = calloc((size_t)o->n + 1, sizeof *r);
  if (!r)
    return ax_seterr(AX_ENOMEM, "dist optim: no memory");
  int err = call_all(o->node, o->params, o->n, "step", NULL, ctx,
                     timeout_ms > 0 ? timeout_ms : 60000, r);
  int k = 0;
  for (int i = 0; i < o->n; i++)
    k += r[i] == 1;
  free(r);
  if (stepped)
    *stepped = k;
  return err;
}

int ax_dist_optim_step(ax_dist_optim *o, uint64_t ctx, int64_t timeout_ms) {
  return ax_dist_optim_step_count(o, ctx, timeout_ms, NULL);
}

void ax_dist_optim_free(ax_dist_optim *o) {
  if (!o)
    return;
  for (int i = 0; i < o->n; i++)
    ax_rref_release(o->params[i]);
  free(o->params);
  free(o);
}

/* ---- remote-module wrappers ---------------------------------------------- */
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
