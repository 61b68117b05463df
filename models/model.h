/* Models: ordered lists of blocks, the units at which a model is split into
 * pipeline stages.
 *
 * A model is registered by name ("mlp", "resnet20", "bert") with an
 * ax_model_def. Blocks are built from a configuration (models/config.h) and
 * a block index, so any process can build any stage on its own. Block i's
 * parameters are initialised from an rng seeded with (seed, i), so a stage
 * made of blocks [a, b) holds exactly the values those blocks have in the
 * whole model: split and unsplit training start from the same point.
 *
 * Every model maps its inputs tlist to an outputs tlist of logits; the loss
 * is the sum over i of the mean cross-entropy of outputs[i] against
 * labels[i] (models/loss.h). */
#ifndef AX_MODEL_H
#define AX_MODEL_H

#include "models/config.h"
#include "models/net.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AX_MODEL_MAX_BLOCKS 64

typedef struct ax_model_info {
  int n_blocks;
  char block_names[AX_MODEL_MAX_BLOCKS][24]; /* "stem", "block3", "head" */
  int n_outputs;    /* logits tensors the last block produces */
  int ignore_index; /* label value the loss skips (-100) */
} ax_model_info;

typedef struct ax_model_def {
  const char *name;
  const char *default_config; /* documented defaults, "k=v,..." */
  /* Fills info for a configuration; AX_EINVAL on a bad configuration. */
  int (*describe)(const ax_config *cfg, ax_model_info *info);
  /* Builds block `index`; AX_EINVAL/AX_ENOMEM with a message on failure. */
  int (*build_block)(const ax_config *cfg, int index, ax_module **out);
} ax_model_def;

/* Looks a model up by name; NULL (with ax_errmsg listing the known names)
 * when unknown. */
const ax_model_def *ax_model_find(const char *name);
/* The known model names, NULL-terminated. */
const char *const *ax_model_names(void);

/* The default configuration of the model merged with `overrides`. */
int ax_model_config(const ax_model_def *def, const char *overrides,
                    ax_config *out);

/* Builds blocks [first, last) into a sequential module, lays it out on
 * device dev and initialises it block by block from (seed, block index).
 * The whole model is first = 0, last = info.n_blocks. */
int ax_model_stage(const ax_model_def *def, const ax_config *cfg, int first,
                   int last, ax_device dev, uint64_t seed, ax_net **out);

/* Splits n_blocks into k contiguous stages of near-equal block counts:
 * bounds[0] = 0 < bounds[1] < ... < bounds[k] = n_blocks. */
int ax_split_uniform(int n_blocks, int k, int *bounds);

extern const ax_model_def ax_model_mlp;
extern const ax_model_def ax_model_resnet20;
extern const ax_model_def ax_model_bert;
/* Synthetic fixed-time blocks for overhead benchmarks (models/sleep.c). */
extern const ax_model_def ax_model_sleep;

#ifdef __cplusplus
}
#endif
#endif
