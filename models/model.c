/* The model registry and stage construction. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/models/model.h"

#define MAX_REGISTERED 64

static const ax_model_def *const builtins[] = {
    &ax_model_mlp, &ax_model_resnet20, &ax_model_bert, &ax_model_sleep};
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

typedef struct stage_init {
  ax_module *root;
  int first;
  uint64_t seed;
} stage_init;

/* Block i of the stage is child i - first; its stream is the model index. */
static void init_blocks(void *arg, float *params, float *buffers) {
  stage_init *si = arg;
  for (int i = 0; i < si->root->n_children; i++) {
    ax_rng rng;
    ax_rng_seed2(&rng, si->seed, (uint64_t)(si->first + i));
    ax_module_init(si->root->children[i], params, buffers, &rng);
  }
}

int ax_model_stage(const ax_model_def *def, const ax_config *cfg, int first,
                   int last, ax_device dev, uint64_t seed, ax_net **out) {
  ax_model_info info;
  *out = NULL;
  AX_TRY(def->describe(cfg, &info));
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
  stage_init si = {root, first, seed};
  *out = ax_net_new_with_init(root, dev, init_blocks, &si);
  return *out ? AX_OK
              : ax_seterr(AX_ENOMEM, "%s: cannot allocate stage: %s", def->name,
                          ax_errmsg());
}

int ax_split_uniform(int n_blocks, int k, int *bounds) {
  if (k < 1 || k > n_blocks)
    return ax_seterr(AX_EINVAL, "cannot split %d blocks into %d stages",
                     n_blocks, k);
  for (int s = 0; s <= k; s++)
    bounds[s] = (int)(((long)n_blocks * s) / k);
  return AX_OK;
}
