/* Tensor-parallel layers (Megatron-LM, Shoeybi et al. 2019): one layer's
 * weights split over the T members of a group, every member running the
 * same input through its part and the group summing partial results with
 * ax_exec.tp_allreduce (models/module.h).
 *
 * - A column part holds out / T of the outputs (rows of W and entries of
 *   b); with `segments` > 1 the outputs are that many equal blocks (a fused
 *   Q, K, V projection: 3) and the part holds its share of each. Its input
 *   is the whole input on every member; its output is its features only.
 *   Its input half sums the input gradient over the group (Megatron's f).
 * - A row part holds in / T of the inputs (columns of W) and, on member 0
 *   only, the bias. Its input is its features of the whole input; its
 *   forward sums the output over the group (Megatron's g), so every member
 *   ends with the whole output.
 * - Attention split by heads: each member runs heads / T heads with a
 *   column-part fused projection (segments 3) and a row-part output
 *   projection; the probabilities' dropout draws the whole layer's mask
 *   for its heads (ax_dropout_new_shard).
 *
 * A part is initialised with the whole layer's values (it draws the whole
 * layer from the rng and keeps its slice), so a model built in parts
 * starts from the values of the model built whole, and the group's
 * forward and backward equal the whole layer's up to the order of the
 * sums. With T = 1 each constructor builds the whole layer. Parameters that
 * are not split (layer norms, the column parts' inputs) get the same
 * gradient on every member, so the members' optimizers keep them equal
 * without any exchange. */
#ifndef AX_LAYERS_PARALLEL_H
#define AX_LAYERS_PARALLEL_H

#include <stdint.h>

#include "axon/models/module.h"

#ifdef __cplusplus
extern "C" {
#endif

/* This member's place in its tensor-parallel group: size T >= 1 and
 * 0 <= rank < T. */
typedef struct ax_tp {
  int size, rank;
} ax_tp;

/* The whole layer (no group). */
#define AX_TP_WHOLE ((ax_tp){1, 0})

/* Linear (in -> out) parts, initialised as ax_linear_new_std(in, out, bias,
 * init_std). AX_EINVAL unless T divides out / segments (column) or in
 * (row). */
ax_module *ax_linear_column_new(int in, int out, int bias, float init_std,
                                int segments, ax_tp tp);
ax_module *ax_linear_row_new(int in, int out, int bias, float init_std,
                             ax_tp tp);

/* Dropout on part `shard` of `shards` of a tensor split along dim 1: the
 * mask of the whole tensor at this part's elements. */
ax_module *ax_dropout_new_shard(float p, uint64_t salt, int shards, int shard);

/* ax_mhsa_new and ax_encoder_layer_new (models/layers/transformer.h) split
 * over a group: attention by heads (T divides heads), the feed-forward as
 * a column part then a row part (T divides ff). Input and output are the
 * whole layer's on every member. */
ax_module *ax_mhsa_new_tp(int hidden, int heads, float dropout, uint64_t salt,
                          ax_tp tp);
ax_module *ax_encoder_layer_new_tp(int hidden, int heads, int ff, float dropout,
                                   uint64_t salt, ax_tp tp);

/* ax_causal_attn_new and ax_decoder_layer_new (transformer.h) split over
 * a group the same way: attention by heads (T divides heads; the fused
 * kernel runs this member's heads as its share of the whole layer's and
 * draws the whole layer's dropout mask for them), the feed-forward as a
 * column part then a row part (T divides ff). Input and output are the
 * whole layer's on every member. */
ax_module *ax_causal_attn_new_tp(int hidden, int heads, float dropout,
                                 uint64_t salt, ax_tp tp);
ax_module *ax_decoder_layer_new_tp(int hidden, int heads, int ff, float dropout,
                                   uint64_t salt, float proj_std, ax_tp tp);

/* Member part's parameters from the whole model's: `part` and `whole` are
 * the same module tree built for a member and whole (e.g. a stage built
 * with tp=T,tp_rank=t and the same stage without), laid out, and
 * whole_params / part_params their flat host parameter arrays. Split
 * layers get their slice, every other module a copy. AX_EINVAL (naming
 * the modules) when the trees differ. For loading a whole model into
 * members, and for checking members against a whole reference. */
int ax_tp_slice_params(const ax_module *part, const ax_module *whole,
                       const float *whole_params, float *part_params);
/* The inverse: member part's slices written into the whole model's
 * parameters (every member's, in any order, give the whole; parameters
 * that are not split are written by each). */
int ax_tp_join_params(const ax_module *part, const ax_module *whole,
                      const float *part_params, float *whole_params);

#ifdef __cplusplus
}
#endif
#endif
