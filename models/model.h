/* Models: ordered lists of blocks, the units at which a model is split into
 * pipeline stages.
 *
 * A model is known by name ("mlp", "resnet20", "bert", "gpt", or one a program
 * registered with ax_model_register) through its ax_model_def. Blocks are built
 * from a configuration (models/config.h) and a block index, so any process can
 * build any stage on its own. Block i's parameters are initialised from an rng
 * seeded with (seed, i), so a stage made of blocks [a, b) holds exactly the
 * values those blocks have in the whole model: split and unsplit training start
 * from the same point.
 *
 * Every model maps its inputs tlist to an outputs tlist of logits; the loss
 * is the sum over i of the mean cross-entropy of outputs[i] against
 * labels[i] (models/loss.h).
 *
 * Tied parameters. A model may say that a range of one block's parameters
 * IS a range of an earlier block's (ax_model_tie): one parameter held by
 * two blocks, as a language model's output layer that multiplies by the
 * token embedding table (Megatron's shared embedding, GPT-2). Both blocks
 * keep their copy as ordinary parameters (a stage, a checkpoint, the
 * mover see nothing special), and whoever trains the model keeps the two
 * copies bit-identical:
 *  - at initialisation ax_model_stage gives the copy in block b the values
 *    block a draws from its own rng stream (seed, a), whichever stage
 *    holds block a;
 *  - before every optimizer step both copies' gradients become their SUM
 *    g_a + g_b (the gradient of the one parameter), so the copies'
 *    optimizers, their state included, take identical steps. A program
 *    that holds both blocks sums them with ax_model_tie_grads; the
 *    pipeline's stage hosts exchange them when the blocks sit on two
 *    stages (runtime/pipeline/stage/stage_host.h).
 * A block frozen without its tied partner would split the parameter in
 * two: the pipeline refuses such a frozen prefix. */
#ifndef AX_MODEL_H
#define AX_MODEL_H

#include "axon/models/config.h"
#include "axon/models/net.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AX_MODEL_MAX_BLOCKS 64
#define AX_MODEL_MAX_TIES 8

/* Parameters [off_b, off_b + len) of block b are the same parameter as
 * [off_a, off_a + len) of block a, a < b. Offsets count floats within each
 * block's own flat parameters (the block laid out alone, as
 * ax_module_layout does: its own parameters first, then its children's,
 * depth first). */
typedef struct ax_model_tie {
  int a, b;
  size_t off_a, off_b, len;
} ax_model_tie;

typedef struct ax_model_info {
  int n_blocks;
  char block_names[AX_MODEL_MAX_BLOCKS][24]; /* "stem", "block3", "head" */
  int n_outputs;    /* logits tensors the last block produces */
  int ignore_index; /* label value the loss skips (-100) */
  /* Tied parameters (above); describe leaves n_ties 0 for none. The
   * ranges of all ties are pairwise disjoint: a parameter has at most two
   * copies. */
  int n_ties;
  ax_model_tie ties[AX_MODEL_MAX_TIES];
} ax_model_info;

/* A model. Both functions may be called from several threads at once (an
 * agent builds stages on its worker threads), so they must not keep state
 * between calls. */
typedef struct ax_model_def {
  const char *name;
  const char *default_config; /* documented defaults, "k=v,..." */
  /* Fills info for a configuration; AX_EINVAL on a bad configuration.
   * info arrives zeroed through ax_model_describe, which every caller
   * should use (a describe that knows nothing of ties then declares
   * none). */
  int (*describe)(const ax_config *cfg, ax_model_info *info);
  /* Builds block `index`; AX_EINVAL/AX_ENOMEM with a message on failure. */
  int (*build_block)(const ax_config *cfg, int index, ax_module **out);
} ax_model_def;

/* ---- the registry -------------------------------------------------------
 * Holds the built-in models (mlp, resnet20, bert, gpt, sleep) and the models a
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

/* def->describe on a zeroed info, then the ties checked: 0 <= a < b <
 * n_blocks, len > 0, at most AX_MODEL_MAX_TIES, ranges pairwise disjoint
 * (AX_EINVAL naming the tie otherwise). That the ranges lie inside their
 * blocks is checked where the blocks are built (ax_model_stage). */
int ax_model_describe(const ax_model_def *def, const ax_config *cfg,
                      ax_model_info *info);

/* Builds blocks [first, last) into a model's sequential of blocks
 * (ax_blocks_new, models/module.h: in bf16 it rounds at their
 * boundaries, except after the model's last block), lays it out on
 * device dev and initialises it block by block from (seed, block index);
 * the copy of a tie in block b then gets block a's initial values (block
 * a built alone and initialised from (seed, a) when it lies outside the
 * stage). AX_EINVAL when a tie's range of a block it builds lies outside
 * that block's parameters. The whole model is first = 0, last =
 * info.n_blocks. */
int ax_model_stage(const ax_model_def *def, const ax_config *cfg, int first,
                   int last, ax_device dev, uint64_t seed, ax_net **out);

/* Where block `block` starts in the flat parameters of a net that
 * ax_model_stage built from blocks [first, ...) (its child block - first). */
size_t ax_model_block_offset(const ax_net *net, int first, int block);

/* The floats that blocks [first, last) store twice: the length of every
 * tie both of whose blocks lie there. So a net of those blocks has
 * n_params - this many distinct parameters (a tied one counted once, as
 * PyTorch counts a shared tensor). */
size_t ax_model_tied_floats(const ax_model_info *info, int first, int last);

/* Sums the gradients of every tie both of whose blocks lie in the stages
 * given: each copy's range becomes g_a + g_b (the same bits in both:
 * addition commutes). Stage k holds blocks [bounds[k], bounds[k + 1]) laid
 * out as nets[k] (ax_model_stage), and grads[k] is a flat gradient of
 * nets[k]->n_params floats on its device (grads NULL: the nets' own).
 * Ties with a block outside [bounds[0], bounds[n]) are left alone: their
 * other copy is summed elsewhere. n = 1, bounds {first, last}: one net.
 * Every program that steps a model holding both copies of a tie calls it
 * between the backward and the optimizer step. */
int ax_model_tie_grads(const ax_model_info *info, int n, const int *bounds,
                       ax_net *const *nets, ax_tensor *const *grads);

/* Splits n_blocks into k contiguous stages of near-equal block counts:
 * bounds[0] = 0 < bounds[1] < ... < bounds[k] = n_blocks. */
int ax_split_uniform(int n_blocks, int k, int *bounds);

extern const ax_model_def ax_model_mlp;
extern const ax_model_def ax_model_resnet20;
extern const ax_model_def ax_model_bert;
/* GPT-2 (models/gpt.c): its output layer tied to its token embedding. */
extern const ax_model_def ax_model_gpt;
/* Synthetic fixed-time blocks for overhead benchmarks (models/sleep.c). */
extern const ax_model_def ax_model_sleep;

#ifdef __cplusplus
}
#endif
#endif
