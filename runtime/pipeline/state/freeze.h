/* Freezing and re-packing a pipeline as it trains (PipeTransformer, He et
 * al. 2021): the first blocks of the model stop training, the rest is
 * spread over fewer stages, and the agents that frees run more
 * data-parallel replicas.
 *
 * ax_pipe_freeze(&p, fo), between two ax_pipe_train calls, replaces p by a
 * pipeline over blocks [fo->blocks, n):
 * - The state of every trained block moves over exactly, through the
 *   mover (state.h): parameters, buffers, optimizer state and update
 *   count, the last step (for the stashing modes, the 2bw shadow), a
 *   staleness correction's history, as a checkpoint of the old pipeline
 *   resumed on the new one would, so training continues as if the pipeline
 *   had not changed, except that the frozen blocks no longer change.
 * - The frozen prefix, blocks [0, fo->blocks), runs on the coordinator's
 *   CPU in inference mode (batch-norm running statistics, no dropout): it
 *   maps each mini-batch's inputs to the inputs of the new first stage
 *   before the pipeline sees them, in ax_pipe_train and ax_pipe_evaluate.
 * - AutoCache: the prefix's output of every example is kept (up to
 *   fo->cache_bytes) under a SHA-256 of the example's inputs, so an
 *   example seen again (the next epoch, whatever the shuffle) skips the
 *   prefix.
 * - The rest is split uniformly over fo->K agents (0: the old count times
 *   the share of blocks left, rounded up to a divisor of the agents, at
 *   most the old count: with 2^k agents the pipeline halves once at most
 *   half the blocks are left, as in PipeTransformer), and the agents of
 *   the old pipeline (every replica's and member's, in order) host
 *   floor(agents / (K' T)) replicas of it, T the tensor-parallel members
 *   of a stage; the other agents are left alone. The new pipeline keeps
 *   the old one's mode, micro-batches, optimizer (and its host), ZeRO
 *   (over the new replicas, while there are two or more: the sharded
 *   state is the same), tensor parallelism, staleness correction, seed,
 *   device and timeout, and continues its mini-batch count (dropout seeds
 *   and data positions go on). The frozen prefix is whole on the
 *   coordinator (tensor-parallel members' slices joined).
 * - A staleness correction goes on with the new stages' delays (fewer
 *   stages: smaller delays), which are what it corrects from then on, and
 *   its history (the average update per parameter, whichever stage holds
 *   it).
 *
 * AX_EINVAL (p unchanged): fo->blocks not above the blocks frozen so far
 * or not below the model's, a stage count that does not fit the agents or
 * the blocks left (chunked modes: the old chunks per agent); AX_ESTATE
 * during a train call. A checkpoint still being written is waited for
 * first, and its failure returned.
 *
 * A checkpoint of a pipeline with a frozen prefix also holds the prefix
 * (prefix.axck, written by the coordinator) and the frozen block count; a
 * restore needs a pipeline frozen the same way (axon-run --resume applies
 * the schedule's points up to the checkpoint's step first), loads the
 * prefix and drops the cache. On any error after the new pipeline was
 * made the old one is kept and *p is unchanged. */
#ifndef AX_PIPELINE_FREEZE_H
#define AX_PIPELINE_FREEZE_H

#include <stdint.h>

#include "axon/runtime/pipeline/coord/coordinator.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ax_freeze_opts {
  int blocks;          /* blocks [0, blocks) frozen from now on */
  int K;               /* agents (ranks) of the new pipeline; 0: see above */
  int64_t cache_bytes; /* AutoCache budget; 0: 1 GiB, < 0: no cache */
} ax_freeze_opts;

int ax_pipe_freeze(ax_pipe **p, const ax_freeze_opts *fo);

typedef struct ax_freeze_stats {
  int blocks;          /* frozen blocks (0: none) */
  int K, replicas;     /* the pipeline's agents per replica, replicas */
  long hits, misses;   /* examples the cache answered / the prefix ran */
  int64_t cache_bytes; /* held by the cache */
} ax_freeze_stats;

void ax_pipe_freeze_stats(const ax_pipe *p, ax_freeze_stats *out);

/* A freezing schedule "STEP:BLOCKS[:K],...": at global mini-batch STEP,
 * freeze the first BLOCKS blocks (re-packing onto K agents per replica;
 * absent or 0: the default). Steps rising, blocks rising. Writes up to
 * cap points; AX_EINVAL naming the bad entry. */
typedef struct ax_freeze_point {
  long step;
  int blocks, K;
} ax_freeze_point;
int ax_freeze_schedule_parse(const char *s, ax_freeze_point *pts, int cap,
                             int *n);

#ifdef __cplusplus
}
#endif
#endif
