/* The model registry and stage construction. */
#include <stdlib.h>
#include <string.h>

#include "models/model.h"

static const ax_model_def *const models[] = {&ax_model_mlp, &ax_model_resnet20,
                                             &ax_model_bert, &ax_model_sleep};
static const char *const model_names[] = {"mlp", "resnet20", "bert", "sleep",
                                          NULL};

const ax_model_def *ax_model_find(const char *name) {
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
    if (name && strcmp(models[i]->name, name) == 0)
      return models[i];
  ax_seterr(AX_ENOTFOUND,
            "unknown model '%s' (known: mlp, resnet20, bert, sleep)",
            name ? name : "");
  return NULL;
}

const char *const *ax_model_names(void) { return model_names; }

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
  ax_module *root = ax_sequential_new();
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
  return *out ? AX_OK : ax_seterr(AX_ENOMEM, "%s: cannot allocate stage: %s",
                                  def->name, ax_errmsg());
}

int ax_split_uniform(int n_blocks, int k, int *bounds) {
  if (k < 1 || k > n_blocks)
    return ax_seterr(AX_EINVAL, "cannot split %d blocks into %d stages",
                     n_blocks, k);
  for (int s = 0; s <= k; s++)
    bounds[s] = (int)(((long)n_blocks * s) / k);
  return AX_OK;
}
