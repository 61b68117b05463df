/* Incremental decoding through a pipeline's stages: every new token flows
 * through the stages, each of which keeps its layers' key/value caches on
 * its agent (the stage host's decoding sessions, stage_host.h), and the
 * coordinator gets the last stage's logits. A decoder is the ax_decode_fn
 * of models/generate.h, so ax_generate samples from it as from a net in
 * one process: the same state, prompt and sampler give the same tokens.
 *
 * The pipeline holds the model's weights (ax_state_load_weights,
 * state.h) and is one pipeline of any mode: no replicas, tensor-parallel
 * members or frozen prefix (AX_EUNSUPPORTED). Decoding runs between
 * ax_pipe_train calls, each call under a distributed autograd context of
 * its own that records nothing and is released after it.
 *
 * Threads: a decoder is used by one thread at a time, the pipeline's
 * (coordinator.h). */
#ifndef AX_PIPELINE_DECODE_H
#define AX_PIPELINE_DECODE_H

#include <stdint.h>

#include "axon/runtime/pipeline/coord/coordinator.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ax_pipe_decoder {
  ax_pipe *p;       /* borrowed; outlives the decoder */
  uint64_t session; /* the stages' key of its caches (random, >= 0) */
  int64_t pos;      /* positions the caches hold; -1 after a failed call */
  /* After each call: the decoding sessions the stages keep and the bytes
   * of their slots, summed over the stages (0 and 0 after a successful
   * ax_pipe_decoder_end, unless other decoders are open). */
  int64_t sessions, cache_bytes;
  double busy_s; /* the stages' compute time of its calls so far */
} ax_pipe_decoder;

/* A decoder of one sequence (batch 1) through p; nothing is sent yet. */
int ax_pipe_decoder_init(ax_pipe_decoder *d, ax_pipe *p);
/* The ax_decode_fn (models/generate.h) of a pipeline decoder (user: the
 * ax_pipe_decoder): ids (1, n) to stage 0, the logits of the last position
 * from the last stage. pos is 0 (the sequence starts anew) or d->pos
 * (AX_ESTATE otherwise, before any call). Errors name the stage and its
 * agent; a failed call leaves the session unusable until a call at
 * position 0. */
int ax_pipe_decode(void *user, int64_t pos, const int32_t *ids, int n,
                   ax_tensor **logits);
/* Drops the decoder's caches on every stage (also after a failed call). */
int ax_pipe_decoder_end(ax_pipe_decoder *d);

#ifdef __cplusplus
}
#endif
#endif
