/* GPT's resolved sizes (models/gpt.c), for programs that reason about the
 * model's arithmetic (axon-bench train's FLOP count). Internal: not
 * installed. */
#ifndef AX_MODELS_GPT_IMPL_H
#define AX_MODELS_GPT_IMPL_H

#include "axon/models/config.h"
#include "axon/models/module.h"

/* The whole model's sizes after its preset and explicit keys. */
typedef struct axi_gpt_sizes {
  int layers, hidden, heads, ff, seq, vocab;
} axi_gpt_sizes;

/* Reads and checks cfg as the model does (gpt.c); AX_OK, or AX_EINVAL with
 * the model's message. */
int axi_gpt_sizes_of(const ax_config *cfg, axi_gpt_sizes *out);

/* GPT's last block, "head" (models/gpt_head.c): the final layer norm, then
 * the logits (B T, vocab) = x W^T of the tied token table, or the fused
 * softmax cross-entropy a training forward asks for (ax_exec.xent,
 * models/module.h) over chunks of chunk_rows rows (0: the fewest chunks
 * of even rows whose logits fit 128 MiB). NULL on out-of-memory. */
ax_module *axi_gpt_head_new(int hidden, int vocab, int chunk_rows);

#endif
