/* GPT's resolved sizes (models/gpt.c), for programs that reason about the
 * model's arithmetic (axon-bench train's FLOP count). Internal: not
 * installed. */
#ifndef AX_MODELS_GPT_IMPL_H
#define AX_MODELS_GPT_IMPL_H

#include "axon/models/config.h"

/* The whole model's sizes after its preset and explicit keys. */
typedef struct axi_gpt_sizes {
  int layers, hidden, heads, ff, seq, vocab;
} axi_gpt_sizes;

/* Reads and checks cfg as the model does (gpt.c); AX_OK, or AX_EINVAL with
 * the model's message. */
int axi_gpt_sizes_of(const ax_config *cfg, axi_gpt_sizes *out);

#endif
