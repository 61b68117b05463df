/* The GEMM FLOPs of a training step (axon_bench_flops.h).
 *
 * GPT (models/gpt.c), B sequences of T tokens (N = B T tokens), L layers of
 * width H with feed-forward width F, vocabulary V. A multiply-add is 2
 * flops; only matrix products count (layer norms, GELU, softmax, dropout,
 * the embedding's gather, the loss and the optimizer are not GEMMs).
 *
 * Linear maps. A map of in -> out on N rows costs 2 N in out forward, and
 * as much again for each of its two backward products, the input gradient
 * dX = dY W^T and the weight gradient dW = X^T dY: 6 N in out per step.
 * Every map computes its input gradient (the first layer's feeds the token
 * embedding's gradient). Per layer the maps are QKV (H -> 3H), the
 * attention's output projection (H -> H) and the two feed-forward maps
 * (H -> F, F -> H): 4 H^2 + 2 H F weights; the head is one more map,
 * H -> V (the tied token table). So
 *
 *   linear = 6 N (L (4 H^2 + 2 H F) + H V),
 *
 * 6 N times the parameters that live in GEMMs (biases, layer norms and the
 * position table do not).
 *
 * Attention. Per sequence and head (dh = H / heads), query i meets keys
 * j <= i: P = T (T + 1) / 2 pairs. The forward costs 2 dh per pair for the
 * scores Q K^T and 2 dh for the weighted sum P V; the backward 2 dh each
 * for dP = dO V^T, dV = P^T dO, dQ = dS K and dK = dS^T Q. That is 12 dh
 * per pair, summed over the heads 12 H per pair and layer:
 *
 *   attention = 12 L B H P = 6 L B H T (T + 1).
 *
 * This counts the causal work, the pairs a causal kernel must compute:
 * axon's fused kernel (FlashAttention-2's tiles) skips the tiles above the
 * diagonal, while an explicit attention (PyTorch's reference script)
 * computes all T^2 scores and masks half of them; the convention of PaLM's
 * "model FLOPs" (6 N params + 12 L H T per token) counts all T^2 pairs, twice
 * this term. FlashAttention-2's backward also recomputes the scores (2 dh
 * per pair more); recomputation is not counted either. The same count is
 * the numerator of both sides' GFLOP/s, so they compare as time does. */
#include <string.h>

#include "agents/axon_bench_flops.h"
#include "axon/kernels/error.h"
#include "axon/models/gpt-impl.h"

double axi_bench_train_flops(const char *model, const ax_config *cfg,
                             int batch) {
  axi_gpt_sizes g;
  if (strcmp(model, "gpt") != 0 || axi_gpt_sizes_of(cfg, &g) != AX_OK)
    return 0.0;
  double L = g.layers, H = g.hidden, F = g.ff, V = g.vocab, T = g.seq;
  double B = batch, N = B * T;
  double linear = 6.0 * N * (L * (4.0 * H * H + 2.0 * H * F) + H * V);
  double attention = 6.0 * L * B * H * T * (T + 1.0);
  return linear + attention;
}
