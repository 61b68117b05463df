/* Models: ordered lists of blocks, the units at which a model is split into
 * pipeline stages.
 *
 * A model is known by name ("mlp", "resnet20", "bert", or one a program
 * registered with ax_model_register) through its ax_model_def. Blocks are built
 * from a configuration (models/config.h) and a block index, so any process can
 * build any stage on its own. Block i's parameters are initialised from an rng
 * seeded with (seed, i), so a stage made of blocks [a, b) holds exactly the
 * values those blocks have in the whole model: split and unsplit training start
 * from the same point.
 *
 * Every model maps its inputs tlist to an outputs tlist of logits; the loss
 * is the sum over i of the mean cross-entropy of outputs[i] against
 * labels[i] (models/loss.h). */
#ifndef AX_MODEL_H
#define AX_MODEL_H

#include "axon/models/config.h"
#include "axon/models/net.h"

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

/* A model. Both functions may be called from several threads at once (an
 * agent builds stages on its worker threads), so they must not keep state
 * between calls. */
typedef struct ax_model_def {
  const char *name;
  const char *default_config; /* documented defaults, "k=v,..." */
  /* Fills info for a configuration; AX_EINVAL on a bad configuration. */
  int (*describe)(const ax_config *cfg, ax_model_info *info);
  /* Builds block `index`; AX_EINVAL/AX_ENOMEM with a message on failure. */
  int (*build_block)(const ax_config *cfg, int index, ax_module **out);
} ax_model_def;

/* ---- the registry -------------------------------------------------------
 * Holds the built-in models (mlp, resnet20, bert, sleep) and the models a
 * program or a plugin (runtime/autograd/plugin.h) registers. Every function
 * here is thread-safe.
 *
 * Ownership: the registry stores the def pointer, not a copy. The def, its
 * strings and the code its functions point to must stay valid and unchanged
 * while the model is registered and while any net or stage built from it
 * lives (ax_model_find hands the pointer out). A static def in the program or
 * in a plugin (plugins are never unloaded) satisfies this. */

/* Longest model name, including the terminating NUL. */
#define AX_MODEL_NAME_MAX 32

/* Registers def under def->name. The name is 1..31 characters of
 * [A-Za-z0-9_-] (it becomes the remote kind "NAME.stage" and the value of
 * "model=NAME"), describe and build_block are required and default_config
 * (NULL: none) must parse. Errors, with a message naming the model:
 * AX_EINVAL for a bad def, AX_ESTATE when the name is taken (built-in or
 * registered; registering the same def again is also AX_ESTATE), AX_ENOMEM
 * when the registry is full (64 models). Nothing changes on error. Nodes
 * that ran ax_dist_init before or after this call serve "NAME.stage" for it
 * (runtime/autograd/stage.h). */
int ax_model_register(const ax_model_def *def);
/* Removes a registered model: AX_ENOTFOUND if no model of that name was
 * registered, AX_EINVAL for a built-in. Stages built from it are not
 * affected (they keep using the def, which must stay valid); new stages of
 * it can no longer be created. */
int ax_model_unregister(const char *name);

/* Looks a model up by name, built-ins first; NULL (with ax_errmsg listing
 * the known names) when unknown. */
const ax_model_def *ax_model_find(const char *name);
/* Writes up to cap known model names (built-ins first, then registered ones
 * in registration order) into names and returns how many are known (may
 * exceed cap). The strings are borrowed from the defs. */
int ax_model_names(const char **names, int cap);

/* The default configuration of the model merged with `overrides`. */
int ax_model_config(const ax_model_def *def, const char *overrides,
                    ax_config *out);

/* Builds blocks [first, last) into a model's sequential of blocks
 * (ax_blocks_new, models/module.h: in bf16 it rounds at their
 * boundaries, except after the model's last block), lays it out on
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
