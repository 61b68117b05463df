/* The checks that a pipeline's decoder (runtime/pipeline/coord/decode.h)
 * and the same model's net decoder (models/generate.h) sample alike, and
 * that ending the pipeline's decoder frees every stage's caches, shared
 * by test_generate_pipe and test_generate_agents. Header-only. */
#ifndef AX_GEN_TESTUTIL_H
#define AX_GEN_TESTUTIL_H

#include "axon/models/generate.h"
#include "axon/runtime/pipeline/coord/decode.h"
#include "harness.h"

/* The most tokens gen_same_samples samples. */
#define GEN_MAX_TOKENS 64

/* Samples n new tokens after the prompt (np tokens) through both decoders
 * with samplers of the same temperature 1, top_k and seed; the tokens must
 * be the same. */
static inline void gen_same_samples(ax_pipe_decoder *d, ax_net_decoder *nd,
                                    const int32_t *prompt, int np, int n,
                                    int top_k, uint64_t seed) {
  int32_t a[GEN_MAX_TOKENS], b[GEN_MAX_TOKENS];
  assert_true(n <= GEN_MAX_TOKENS);
  ax_sampler sa, sb;
  AX_ASSERT_OK(ax_sampler_init(&sa, 1.0, top_k, seed));
  AX_ASSERT_OK(ax_sampler_init(&sb, 1.0, top_k, seed));
  AX_ASSERT_OK(
      ax_generate(ax_pipe_decode, d, prompt, np, n, &sa, a, NULL, NULL));
  AX_ASSERT_OK(
      ax_generate(ax_net_decode, nd, prompt, np, n, &sb, b, NULL, NULL));
  assert_memory_equal(a, b, sizeof a[0] * (size_t)n);
}

/* Ends the pipeline's decoder, which must leave no session and no cache
 * byte on any stage. */
static inline void gen_end_all(ax_pipe_decoder *d) {
  AX_ASSERT_OK(ax_pipe_decoder_end(d));
  assert_int_equal(d->sessions, 0);
  assert_int_equal(d->cache_bytes, 0);
}

#endif
