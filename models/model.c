/* The model registry and stage construction. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/models/model.h"

#include "axon/kernels/backend-impl.h"

#define MAX_REGISTERED 64

static const ax_model_def *const builtins[] = {
    &ax_model_mlp, &ax_model_resnet20, &ax_model_bert, &ax_model_gpt,
    &ax_model_sleep};
#define N_BUILTIN (int)(sizeof builtins / sizeof builtins[0])

/* Registered models in registration order, guarded by g_mu. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static const ax_model_def *g_reg[MAX_REGISTERED];
static int g_nreg;

static const ax_model_def *builtin_find(const char *name) {
  for (int i = 0; i < N_BUILTIN; i++)
    if (!strcmp(builtins[i]->name, name))
      return builtins[i];
  return NULL;
}

/* The index of a registered model (g_mu held), or -1. */
static int reg_index(const char *name) {
  for (int i = 0; i < g_nreg; i++)
    if (!strcmp(g_reg[i]->name, name))
      return i;
  return -1;
}

static int check_def(const ax_model_def *def) {
  if (!def || !def->name)
    return ax_seterr(AX_EINVAL, "model register: no def or no name");
  size_t len = strlen(def->name);
  if (len == 0 || len >= AX_MODEL_NAME_MAX ||
      strspn(def->name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                        "0123456789_-") != len)
    return ax_seterr(AX_EINVAL,
                     "model register: bad name '%s' (1..%d "
                     "characters of A-Z a-z 0-9 _ -)",
                     def->name, AX_MODEL_NAME_MAX - 1);
  if (!def->describe || !def->build_block)
    return ax_seterr(AX_EINVAL,
                     "model register: %s: describe and "
                     "build_block are required",
                     def->name);
  ax_config c;
  if (ax_config_parse(&c, def->default_config) != AX_OK)
    return ax_seterr(AX_EINVAL,
                     "model register: %s: bad default_config "
                     "'%s'",
                     def->name, def->default_config);
  return AX_OK;
}

int ax_model_register(const ax_model_def *def) {
  AX_TRY(check_def(def));
  int err = AX_OK;
  pthread_mutex_lock(&g_mu);
  if (builtin_find(def->name))
    err = ax_seterr(AX_ESTATE, "model register: %s is a built-in model",
                    def->name);
  else if (reg_index(def->name) >= 0)
    err = ax_seterr(AX_ESTATE, "model register: %s is already registered",
                    def->name);
  else if (g_nreg == MAX_REGISTERED)
    err = ax_seterr(AX_ENOMEM,
                    "model register: %s: registry full (%d "
                    "models)",
                    def->name, MAX_REGISTERED);
  else
    g_reg[g_nreg++] = def;
  pthread_mutex_unlock(&g_mu);
  return err;
}

int ax_model_unregister(const char *name) {
  if (!name)
    return ax_seterr(AX_EINVAL, "model unregister: no name");
  if (builtin_find(name))
    return ax_seterr(AX_EINVAL, "model unregister: %s is a built-in model",
                     name);
  pthread_mutex_lock(&g_mu);
  int i = reg_index(name);
  if (i >= 0) {
    memmove(&g_reg[i], &g_reg[i + 1],
            sizeof g_reg[0] * (size_t)(g_nreg - i - 1));
    g_nreg--;
  }
  pthread_mutex_unlock(&g_mu);
  return i >= 0 ? AX_OK
                : ax_seterr(AX_ENOTFOUND,
                            "model unregister: %s is not "
                            "registered",
                            name);
}

int ax_model_names(const char **names, int cap) {
  int n = 0;
  for (int i = 0; i < N_BUILTIN; i++, n++)
    if (names && n < cap)
      names[n] = builtins[i]->name;
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < g_nreg; i++, n++)
    if (names && n < cap)
      names[n] = g_reg[i]->name;
  pthread_mutex_unlock(&g_mu);
  return n;
}

const ax_model_def *ax_model_find(const char *name) {
  const ax_model_def *def = name ? builtin_find(name) : NULL;
  if (def)
    return def;
  pthread_mutex_lock(&g_mu);
  int i = name ? reg_index(name) : -1;
  def = i >= 0 ? g_reg[i] : NULL;
  pthread_mutex_unlock(&g_mu);
  if (def)
    return def;
  const char *all[N_BUILTIN + MAX_REGISTERED];
  int n = ax_model_names(all, N_BUILTIN + MAX_REGISTERED);
  char known[1024] = "";
  size_t len = 0;
  for (int k = 0; k < n && k < N_BUILTIN + MAX_REGISTERED; k++) {
    int w = snprintf(known + len, sizeof known - len, "%s%s", k ? ", " : "",
                     all[k]);
    if (w < 0 || (size_t)w >= sizeof known - len)
      break;
    len += (size_t)w;
  }
  ax_seterr(AX_ENOTFOUND, "unknown model '%s' (known: %s)", name ? name : "",
            known);
  return NULL;
}

int ax_model_config(const ax_model_def *def, const char *overrides,
                    ax_config *out) {
  ax_config over;
  AX_TRY(ax_config_parse(out, def->default_config));
  AX_TRY(ax_config_parse(&over, overrides));
  return ax_config_merge(out, &over);
}

/* The two ranges of a tie overlap when they are in one block and their
 * floats intersect. */
static int overlap(int ba, size_t oa, int bb, size_t ob, size_t len_a,
                   size_t len_b) {
  return ba == bb && oa < ob + len_b && ob < oa + len_a;
}

int ax_model_describe(const ax_model_def *def, const ax_config *cfg,
                      ax_model_info *info) {
  memset(info, 0, sizeof *info);
  AX_TRY(def->describe(cfg, info));
  if (info->n_ties < 0 || info->n_ties > AX_MODEL_MAX_TIES)
    return ax_seterr(AX_EINVAL, "%s: %d ties (at most %d)", def->name,
                     info->n_ties, AX_MODEL_MAX_TIES);
  for (int i = 0; i < info->n_ties; i++) {
    const ax_model_tie *t = &info->ties[i];
    if (t->a < 0 || t->b <= t->a || t->b >= info->n_blocks || !t->len)
      return ax_seterr(AX_EINVAL,
                       "%s: tie %d (block %d [%zu, +%zu) = block %d "
                       "[%zu, +%zu)) needs 0 <= a < b < %d and a length",
                       def->name, i, t->b, t->off_b, t->len, t->a, t->off_a,
                       t->len, info->n_blocks);
    for (int j = 0; j < i; j++) {
      const ax_model_tie *u = &info->ties[j];
      int bad = overlap(t->a, t->off_a, u->a, u->off_a, t->len, u->len) ||
                overlap(t->a, t->off_a, u->b, u->off_b, t->len, u->len) ||
                overlap(t->b, t->off_b, u->a, u->off_a, t->len, u->len) ||
                overlap(t->b, t->off_b, u->b, u->off_b, t->len, u->len);
      if (bad)
        return ax_seterr(AX_EINVAL,
                         "%s: ties %d and %d share parameters (a parameter "
                         "has at most two copies)",
                         def->name, j, i);
    }
  }
  return AX_OK;
}

size_t ax_model_block_offset(const ax_net *net, int first, int block) {
  return net->root->children[block - first]->param_off;
}

/* Floats of child i of a laid-out stage root of n_params floats. */
static size_t child_params(const ax_module *root, size_t n_params, int i) {
  size_t end =
      i + 1 < root->n_children ? root->children[i + 1]->param_off : n_params;
  return end - root->children[i]->param_off;
}

typedef struct stage_init {
  ax_module *root;
  int first, last;
  uint64_t seed;
  const ax_model_info *info;
  float *src[AX_MODEL_MAX_TIES]; /* block a's initial values of tie i when
                                    block a is not in the stage */
} stage_init;

/* Block i of the stage is child i - first; its stream is the model index.
 * Then each tie's copy in block b takes block a's values. */
static void init_blocks(void *arg, float *params, float *buffers) {
  stage_init *si = arg;
  for (int i = 0; i < si->root->n_children; i++) {
    ax_rng rng;
    ax_rng_seed2(&rng, si->seed, (uint64_t)(si->first + i));
    ax_module_init(si->root->children[i], params, buffers, &rng);
  }
  for (int i = 0; i < si->info->n_ties; i++) {
    const ax_model_tie *t = &si->info->ties[i];
    if (t->b < si->first || t->b >= si->last)
      continue;
    const float *from =
        si->src[i] ? si->src[i]
                   : params + si->root->children[t->a - si->first]->param_off +
                         t->off_a;
    memcpy(params + si->root->children[t->b - si->first]->param_off + t->off_b,
           from, t->len * sizeof(float));
  }
}

/* Block a of tie i built alone and initialised from (seed, a): its tied
 * range into a new array *out. */
static int tie_source(const ax_model_def *def, const ax_config *cfg,
                      uint64_t seed, int i, const ax_model_tie *t,
                      float **out) {
  ax_module *m = NULL;
  AX_TRY(def->build_block(cfg, t->a, &m));
  size_t np = 0, nb = 0;
  ax_module_layout(m, 0, 0, &np, &nb);
  int err = AX_OK;
  if (t->off_a + t->len > np)
    err = ax_seterr(AX_EINVAL,
                    "%s: tie %d: [%zu, +%zu) outside the %zu parameters of "
                    "block %d",
                    def->name, i, t->off_a, t->len, np, t->a);
  float *p = err == AX_OK ? calloc(np + 1, sizeof(float)) : NULL;
  float *b = err == AX_OK ? calloc(nb + 1, sizeof(float)) : NULL;
  *out = err == AX_OK ? malloc(t->len * sizeof(float)) : NULL;
  if (err == AX_OK && (!p || !b || !*out))
    err = AX_ENOMEM;
  if (err == AX_OK) {
    ax_rng rng;
    ax_rng_seed2(&rng, seed, (uint64_t)t->a);
    ax_module_init(m, p, b, &rng);
    memcpy(*out, p + t->off_a, t->len * sizeof(float));
  } else {
    free(*out);
    *out = NULL;
  }
  free(p);
  free(b);
  ax_module_free(m);
  return err;
}

/* Checks the ties' ranges in the stage's blocks and draws the sources of
 * the copies whose block a lies outside it. */
static int tie_prepare(const ax_model_def *def, const ax_config *cfg,
                       ax_module *root, stage_init *si) {
  size_t np = 0, nb = 0;
  ax_module_layout(root, 0, 0, &np, &nb);
  for (int i = 0; i < si->info->n_ties; i++) {
    const ax_model_tie *t = &si->info->ties[i];
    int blk[2] = {t->a, t->b};
    size_t off[2] = {t->off_a, t->off_b};
    for (int k = 0; k < 2; k++) {
      int c = blk[k] - si->first;
      if (blk[k] < si->first || blk[k] >= si->last ||
          off[k] + t->len <= child_params(root, np, c))
        continue;
      return ax_seterr(AX_EINVAL,
                       "%s: tie %d: [%zu, +%zu) outside the %zu parameters "
                       "of block %d",
                       def->name, i, off[k], t->len, child_params(root, np, c),
                       blk[k]);
    }
    if (t->b >= si->first && t->b < si->last && t->a < si->first)
      AX_TRY(tie_source(def, cfg, si->seed, i, t, &si->src[i]));
  }
  return AX_OK;
}

int ax_model_stage(const ax_model_def *def, const ax_config *cfg, int first,
                   int last, ax_device dev, uint64_t seed, ax_net **out) {
  ax_model_info info;
  *out = NULL;
  AX_TRY(ax_model_describe(def, cfg, &info));
  if (first < 0 || last > info.n_blocks || first >= last)
    return ax_seterr(AX_EINVAL, "%s: blocks [%d, %d) outside [0, %d)",
                     def->name, first, last, info.n_blocks);
  ax_module *root = ax_blocks_new(last == info.n_blocks);
  if (!root)
    return AX_ENOMEM;
  for (int i = first; i < last; i++) {
    ax_module *b = NULL;
    int rc = def->build_block(cfg, i, &b);
    if (rc == AX_OK)
      rc = ax_module_add(root, b);
    if (rc != AX_OK) {
      ax_module_free(root);
      return rc;
    }
  }
  stage_init si = {root, first, last, seed, &info, {NULL}};
  int err = tie_prepare(def, cfg, root, &si);
  if (err == AX_OK) {
    *out = ax_net_new_with_init(root, dev, init_blocks, &si);
    if (!*out)
      err = ax_seterr(AX_ENOMEM, "%s: cannot allocate stage: %s", def->name,
                      ax_errmsg());
  } else {
    ax_module_free(root);
  }
  for (int i = 0; i < AX_MODEL_MAX_TIES; i++)
    free(si.src[i]);
  return err;
}

size_t ax_model_tied_floats(const ax_model_info *info, int first, int last) {
  size_t n = 0;
  for (int i = 0; i < info->n_ties; i++) {
    const ax_model_tie *t = &info->ties[i];
    if (t->a >= first && t->b < last)
      n += t->len;
  }
  return n;
}

/* The stage of n holding block i, or -1. */
static int stage_of(int n, const int *bounds, int i) {
  for (int k = 0; k < n; k++)
    if (i >= bounds[k] && i < bounds[k + 1])
      return k;
  return -1;
}

int ax_model_tie_grads(const ax_model_info *info, int n, const int *bounds,
                       ax_net *const *nets, ax_tensor *const *grads) {
  for (int i = 0; i < info->n_ties; i++) {
    const ax_model_tie *t = &info->ties[i];
    int ka = stage_of(n, bounds, t->a), kb = stage_of(n, bounds, t->b);
    if (ka < 0 || kb < 0)
      continue;
    ax_tensor *ga = grads ? grads[ka] : nets[ka]->grads,
              *gb = grads ? grads[kb] : nets[kb]->grads;
    size_t oa = ax_model_block_offset(nets[ka], bounds[ka], t->a) + t->off_a,
           ob = ax_model_block_offset(nets[kb], bounds[kb], t->b) + t->off_b;
    if (oa + t->len > ax_tensor_numel(ga) || ob + t->len > ax_tensor_numel(gb))
      return ax_seterr(AX_EINVAL, "tie %d: outside the gradients given", i);
    int64_t len = (int64_t)t->len;
    ax_tensor *va = ax_tensor_view(ga, oa, 1, &len),
              *vb = ax_tensor_view(gb, ob, 1, &len);
    ax_tensor *xb = va && vb ? ax_tensor_to(vb, va->device) : NULL;
    int err = xb ? AX_OK : AX_ENOMEM;
    if (err == AX_OK) /* g_a + g_b into the first copy, then the second */
      err = AX_K(ax_backend_of(va->device), axpby, t->len, 1.0f, ax_f32(xb),
                 1.0f, ax_f32(va));
    if (err == AX_OK)
      err = ax_tensor_copy(vb, va);
    ax_tensor_release(xb);
    ax_tensor_release(va);
    ax_tensor_release(vb);
    AX_TRY(err);
  }
  return AX_OK;
}

int ax_split_uniform(int n_blocks, int k, int *bounds) {
  if (k < 1 || k > n_blocks)
    return ax_seterr(AX_EINVAL, "cannot split %d blocks into %d stages",
                     n_blocks, k);
  for (int s = 0; s <= k; s++)
    bounds[s] = (int)(((long)n_blocks * s) / k);
  return AX_OK;
}
