/* Text generation from a causal language model: picking the next token
 * from the logits (greedy, temperature, top-k), the decoding loop, and the
 * decoder of one process (a net and its key/value cache).
 *
 * The loop is written once over a decoder, a function that runs new tokens
 * of one sequence and gives the logits of the last one: a net in this
 * process (ax_net_decoder, below), or a pipeline whose stages keep their
 * layers' caches on their agents (ax_pipe_decode,
 * runtime/pipeline/coord/coordinator.h). The same logits, seed, temperature
 * and top-k give the same tokens on every machine: the draws come from
 * axon's rng (kernels/rng.h), one uniform per sampled token,
 * and the candidates are visited in a fixed order.
 *
 * Threads: an ax_sampler or an ax_net_decoder is used by one thread at a
 * time. */
#ifndef AX_MODELS_GENERATE_H
#define AX_MODELS_GENERATE_H

#include <stdint.h>

#include "axon/kernels/rng.h"
#include "axon/models/net.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How the next token is picked. */
typedef struct ax_sampler {
  double temperature; /* 0: greedy (argmax, the lowest index on a tie) */
  int top_k;          /* > 0: only the k largest logits; 0: all */
  ax_rng rng;         /* one uniform draw per sampled token */
} ax_sampler;

/* Sets s up: temperature finite and >= 0, top_k >= 0 (AX_EINVAL
 * otherwise), the draws from seed. */
int ax_sampler_init(ax_sampler *s, double temperature, int top_k,
                    uint64_t seed);

/* Picks a token from logits[0 .. vocab) (host memory) into *token. Greedy:
 * the argmax, no draw. Else the candidates (the top_k largest, ties to the
 * lower index, in that order; all in index order when top_k is 0 or >=
 * vocab) get softmax(logit / temperature) probabilities, computed in double,
 * and one uniform draw picks among them by their cumulative sum. AX_EINVAL
 * when vocab < 1 or a candidate's logit is not finite. */
int ax_sample(ax_sampler *s, const float *logits, int vocab, int32_t *token);

/* A decoder: runs tokens ids[0 .. n) at positions pos .. pos + n - 1 of one
 * sequence whose positions 0 .. pos - 1 it ran before (pos 0 starts a new
 * one), and gives the logits of the last of them: *logits a new f32 CPU
 * tensor of vocab values. */
typedef int (*ax_decode_fn)(void *user, int64_t pos, const int32_t *ids, int n,
                            ax_tensor **logits);
/* Called with each new token as soon as it is picked (may be NULL). */
typedef void (*ax_token_fn)(void *user, int32_t token);

/* Generates n_new tokens after prompt[0 .. n_prompt) (n_prompt >= 1): the
 * prompt in one decoder call, then one call per picked token, each picked
 * with s from the last logits. out (n_new entries, may be NULL) gets the
 * tokens, emit each as it comes. Stops at the first error. */
int ax_generate(ax_decode_fn decode, void *user, const int32_t *prompt,
                int n_prompt, int n_new, ax_sampler *s, int32_t *out,
                ax_token_fn emit, void *emit_user);

/* The decoder of one process: a net whose whole model maps ids (B, T) to
 * logits (B * T, vocab), run in inference with the key/value cache
 * (ax_exec.kv_decode) in a slot of its own. */
typedef struct ax_net_decoder {
  ax_net *net;   /* borrowed; outlives the decoder */
  ax_slot *slot; /* the cache */
} ax_net_decoder;

int ax_net_decoder_init(ax_net_decoder *d, ax_net *net);
/* The ax_decode_fn of a net decoder (user: the ax_net_decoder). */
int ax_net_decode(void *user, int64_t pos, const int32_t *ids, int n,
                  ax_tensor **logits);
/* Frees the cache (NULL-safe; the net is the caller's). */
void ax_net_decoder_free(ax_net_decoder *d);

#ifdef __cplusplus
}
#endif
#endif
