/* Transformer layers (BERT and GPT-2 flavours) implementing the module
 * interface.
 *
 * Every constructor returns a new module owned by the caller (hand it to a
 * container or ax_net, or free it with ax_module_free), or NULL with
 * ax_errmsg set (AX_EINVAL on a bad configuration, AX_ENOMEM).
 *
 * All numeric work goes through the kernel vtable of the input's device, so
 * the layers run on any backend; they never read tensor data on the host.
 * Parameters are initialised as BERT does: weights N(0, 0.02^2), biases 0,
 * LayerNorm gamma 1 and beta 0. Projections are the Linear layer of
 * models/layers/basic.h built with ax_linear_new_std(in, out, 1,
 * AX_BERT_INIT_STD).
 *
 * Dropout masks come from the counter-based generator of the kernels,
 * seeded with ax_exec.seed mixed with a per-layer `salt`. Layers built with
 * different salts draw different masks; a replayed forward with the same
 * ax_exec.seed (recomputation, feature replay) draws the same mask. Models
 * derive salts from the block index and the layer's place in the block, so
 * a stage built alone uses the same masks as the whole model.
 *
 * Unless stated otherwise a layer takes and returns a list of one f32
 * tensor, and backward returns the input gradient only when
 * ax_exec.need_dx (an empty list otherwise). Shape or dtype errors in
 * forward give AX_ESHAPE / AX_EDTYPE naming the layer.
 *
 * Every layer implements the split backward (models/module.h). Between
 * the input half and the weight half a slot keeps: the embedding its ids
 * and output gradient; layer norm only its (2, dim) parameter-gradient
 * sums; GELU, tanh and dropout nothing; attention (either kind), the
 * encoder and the decoder layer what their projections (input and output
 * gradient each) and layer norms keep, nothing of their own. */
#ifndef AX_LAYERS_TRANSFORMER_H
#define AX_LAYERS_TRANSFORMER_H

#include <stdint.h>

#include "axon/models/module.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The LayerNorm epsilon of BERT. */
#define AX_BERT_LN_EPS 1e-12f
/* The standard deviation of BERT's weight initialisation. */
#define AX_BERT_INIT_STD 0.02f
/* The LayerNorm epsilon of GPT-2. */
#define AX_GPT_LN_EPS 1e-5f

/* Exact GELU, x * Phi(x), elementwise on any shape. */
ax_module *ax_gelu_new(void);
/* tanh, elementwise on any shape. */
ax_module *ax_tanh_new(void);

/* Inverted dropout with drop probability p in [0, 1) on any shape: kept
 * values are scaled by 1 / (1 - p). The identity when !ex->training or
 * p == 0; the output (and in backward the input gradient) is then a new
 * reference to the tensor passed in, not a copy. */
ax_module *ax_dropout_new(float p, uint64_t salt);

/* Embedding table (rows, dim) ~ N(0, 0.02^2). Input: i32 ids of any shape
 * (..., ), each in [0, rows) (AX_EINVAL otherwise); output f32 (..., dim).
 * Backward accumulates the table gradient; the ids get no gradient (a NULL
 * entry when ex->need_dx). */
ax_module *ax_embedding_new(int rows, int dim);

/* Token and learned position embeddings, BERT's and GPT-2's first block:
 * own parameters token (vocab, hidden), position (seq, hidden) and, with
 * types > 0, segment (types, hidden), in that order, all N(0, 0.02^2).
 * Input {ids i32 (B, S)} or, with types > 0, {ids, segments i32 (B, S),
 * mask f32 (B, S)}, S <= seq (AX_ESHAPE otherwise); output {x} or {x,
 * mask} (a new reference to the mask), x = Dropout(LN(token[ids] +
 * position[0 .. S-1] (+ segment[segments]))) f32 (B, S, hidden), with the
 * layer norm (eps ln_eps) only when ln_eps > 0. Children: the layer norm
 * (when there is one), then the dropout (p, salt). The inputs get no
 * gradient (NULL entries when ex->need_dx). Decoding (ax_exec.kv_decode)
 * adds the positions kv_pos .. kv_pos + S - 1; past seq it fails with
 * AX_EINVAL (the model holds seq positions). */
ax_module *ax_token_embed_new(int vocab, int seq, int types, int hidden,
                              float ln_eps, float dropout, uint64_t salt);

/* Layer normalisation over the last dimension of x (..., dim) with learned
 * gamma (1) and beta (0); eps > 0 (BERT uses AX_BERT_LN_EPS). */
ax_module *ax_layernorm_new(int dim, float eps);

/* Multi-head self-attention. Input {x f32 (B, S, hidden), mask f32 (B, S)
 * with 1 = token, 0 = padding}; output {y f32 (B, S, hidden)}. A fused
 * projection makes Q, K and V, scores are softmax(Q K^T / sqrt(hidden /
 * heads)) over the unpadded keys, attention probabilities get dropout p,
 * and an output projection maps the heads back to hidden. Backward returns
 * {dx, NULL}. heads must divide hidden. */
ax_module *ax_mhsa_new(int hidden, int heads, float dropout, uint64_t salt);

/* One BERT encoder layer (post-LN):
 *   x = LayerNorm(x + Dropout(Attention(x, mask)))
 *   x = LayerNorm(x + Dropout(Dense_ff->h(GELU(Dense_h->ff(x)))))
 * Input and output {hidden f32 (B, S, hidden), mask f32 (B, S)}; the mask
 * passes through (the output holds a new reference to it). Backward returns
 * {dhidden, NULL}. */
ax_module *ax_encoder_layer_new(int hidden, int heads, int ff, float dropout,
                                uint64_t salt);

/* Causal multi-head self-attention (GPT). Input {x f32 (B, S, hidden)};
 * output {y f32 (B, S, hidden)}. A fused projection makes Q, K and V;
 * position i attends to the positions j <= i with softmax(Q K^T /
 * sqrt(hidden / heads)), the probabilities get dropout p (in training);
 * an output projection maps the heads back to hidden. No dropout on the
 * output (the decoder layer applies it). The attention is one fused kernel
 * (attn_causal_fwd / attn_causal_bwd, kernels/backend-impl.h), so no
 * (S, S) matrix is formed or kept: between forward and backward the slot
 * holds the projection's output, the attention output and each row's
 * log-sum-exp (B, heads, S). A backend without that kernel gives
 * AX_EUNSUPPORTED. heads must divide hidden.
 * Decoding (ax_exec.kv_decode, models/module.h): x holds positions
 * kv_pos .. kv_pos + S - 1; the slot keeps the keys and values of every
 * position so far (B, positions, hidden) each, grown as needed, and the
 * new queries attend over all of them (the kernel's sq = S < sk). A slot
 * whose cache does not hold kv_pos positions of B sequences is refused
 * (AX_ESTATE). */
ax_module *ax_causal_attn_new(int hidden, int heads, float dropout,
                              uint64_t salt);

/* One GPT-2 decoder layer (pre-LN):
 *   x = x + Dropout(CausalAttention(LayerNorm(x)))
 *   x = x + Dropout(Dense_ff->h(GELU(Dense_h->ff(LayerNorm(x)))))
 * Input and output {x f32 (B, S, hidden)}; layer norms with eps
 * AX_GPT_LN_EPS. Weights N(0, 0.02^2), except the two projections that
 * write into the residual stream (the attention's output projection and
 * Dense_ff->h): N(0, proj_std^2), proj_std > 0. GPT-2 uses proj_std =
 * 0.02 / sqrt(2 * layers). */
ax_module *ax_decoder_layer_new(int hidden, int heads, int ff, float dropout,
                                uint64_t salt, float proj_std);

/* Mixes a salt with a sub-index, for composite layers handing distinct
 * salts to their parts. */
static inline uint64_t ax_salt_mix(uint64_t salt, uint64_t part) {
  uint64_t z = salt * 0x9e3779b97f4a7c15ull + part + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

#ifdef __cplusplus
}
#endif
#endif
