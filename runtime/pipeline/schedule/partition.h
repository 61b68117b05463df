/* Splitting a model's blocks into K contiguous pipeline stages.
 *
 * `--partition uniform` cuts n blocks into K runs of near-equal length.
 * `--partition balanced` first profiles every block on the target device
 * (ax_profile_blocks: forward and backward time, output size, parameter and
 * saved-activation bytes), then picks the split points that minimise the
 * slowest stage's time, by an exact dynamic programme over (block, stage),
 * among the splits whose every stage fits a memory cap given how many
 * activation sets and weight versions the mode makes that stage keep
 * (ax_pipe_stash).
 *
 * Bounds. A split is an int array bounds[K + 1] with bounds[0] = 0 <
 * bounds[1] < ... < bounds[K] = n: stage s (0-based) holds blocks
 * [bounds[s], bounds[s + 1]). ax_partition_format writes it as
 * "0/3/7/11", the `splits=` value of the remote stage kinds
 * (runtime/autograd/stage.h).
 *
 * Stage numbering: the 0-based s everywhere except ax_pipe_stash, which
 * follows the table and takes the 1-based k = s + 1.
 *
 * Thread safety: every function is reentrant; none keeps global state. */
#ifndef AX_PIPELINE_PARTITION_H
#define AX_PIPELINE_PARTITION_H

#include <stddef.h>
#include <stdint.h>

#include "axon/models/model.h"
#include "axon/runtime/pipeline/schedule/formula.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AX_PARTITION_MAX_STAGES AX_MODEL_MAX_BLOCKS

/* ---- what a stage keeps, per mode ---------------------------------------
 * For stage k (1-based) of K with M micro-batches, d_k = K - k:
 *   mode        sets              holds          weight versions
 *   sequential  1                 activations    1
 *   gpipe       M                 activations    1   (recompute NEVER)
 *   gpipe       M                 inputs only    1   (recompute ALWAYS)
 *   gpipe       M (1 activations, M-1 inputs)    1   (recompute EXCEPT_LAST)
 *   1f1b        min(K - k + 1, M) activations    1
 *   ddg         d_k + 1           activations    d_k + 1
 *   fr          d_k + 1           inputs only    1
 *   pipedream   d_k + 1           activations    d_k + 1
 * "activations" means the saved state of a forward (ax_slot_bytes); a set
 * that keeps only its inputs is replayed before its backward, which needs
 * one full activation set transiently (replay = 1). Weight versions count
 * the current weights: 1 means no stashed copy. */
typedef struct ax_stash_count {
  int sets;            /* micro/mini-batch states kept at the peak */
  int activation_sets; /* of which hold saved activations (the rest inputs) */
  int weight_versions; /* parameter copies, the live one included */
  int replay;          /* 1 when a backward first recomputes its forward */
} ax_stash_count;

/* Fills *out for `mode` (ax_pipe_mode_list()), K >= 1, 1 <= k <= K, M >= 1 and
 * the gpipe recompute option (ignored by the other modes). AX_EINVAL with a
 * message on a bad argument. */
int ax_pipe_stash(const char *mode, int K, int k, int M, int recompute,
                  ax_stash_count *out);
/* The same for a stage that keeps at most `sets` units and `versions`
 * weight versions at once: the table's bounds (ax_pipe_stash), or the
 * counts a plan makes (ax_pipe_verify, verify.h). `mode` is an index
 * (mode.h), M and recompute as above. AX_EINVAL on a bad argument. */
int ax_pipe_stash_of(int mode, int M, int recompute, int sets, int versions,
                     ax_stash_count *out);

/* ---- profiling ----------------------------------------------------------- */
typedef struct ax_block_profile {
  double fwd_s, bwd_s; /* median seconds of forward / backward (training) */
  size_t in_bytes;     /* bytes of the block's inputs (what a stage starting
                          here receives and, in fr/recompute, keeps) */
  size_t out_bytes;    /* bytes of its outputs (sent to the next stage; the
                          gradient sent back has the f32 part's size) */
  size_t param_bytes;  /* trainable parameters, f32 */
  size_t buffer_bytes; /* non-trainable buffers (running statistics) */
  size_t saved_bytes;  /* ax_slot_bytes after its forward */
} ax_block_profile;

typedef struct ax_profile_opts {
  int warmup;    /* untimed runs first (default 1) */
  int reps;      /* timed runs; the median is kept (default 3, max 64) */
  uint64_t seed; /* parameter init and dropout seed (default 1) */
  int precision; /* ax_precision of the blocks (models/module.h; default
                    fp32): their times and bytes in it */
} ax_profile_opts;

/* Profiles every block of model `def` with configuration cfg on device dev.
 * `input` (borrowed, any device; copied to dev) is one unit of work as a
 * stage would see it: a micro-batch for gpipe/1f1b, a mini-batch otherwise.
 * Each repetition runs the blocks' forwards in order (block i's outputs feed
 * block i + 1), then feeds random gradients for the last block's f32
 * outputs and runs the backwards in reverse order (block i's input
 * gradients are block i - 1's output gradients); block 0 is run with
 * need_dx = 0 like a first stage. Times synchronise the device. o may be
 * NULL for the defaults. out must have room for AX_MODEL_MAX_BLOCKS entries;
 * *n_blocks receives the model's block count. Errors: AX_EINVAL on bad
 * arguments, and whatever building or running a block returns (with its
 * message). */
int ax_profile_blocks(const ax_model_def *def, const ax_config *cfg,
                      ax_device dev, const ax_tlist *input,
                      const ax_profile_opts *o, ax_block_profile *out,
                      int *n_blocks);

/* ---- choosing split points ---------------------------------------------- */
typedef struct ax_partition_opts {
  int K;                /* stages, 1 <= K <= n */
  const char *mode;     /* a mode name (mode.h); NULL = "sequential" */
  int M;                /* micro-batches (gpipe, 1f1b); < 1 means 1 */
  int recompute;        /* gpipe recompute option (formula.h) */
  double bandwidth_Bps; /* stage-to-stage bytes/s; <= 0 ignores transfers */
  size_t mem_cap;       /* bytes per stage; 0 = no cap */
  int optim_copies;     /* extra parameter-sized optimizer buffers (0 SGD,
                           1 momentum, 2 Adam); < 0 means 0 */
  /* The links between neighbouring stages, when known (axon-run probe):
   * link_lat_s[b] seconds one way and link_Bps[b] bytes/s between stage b
   * and b + 1 (K - 1 entries each; both directions alike). They replace
   * bandwidth_Bps at that boundary. NULL: bandwidth_Bps everywhere. */
  const double *link_lat_s, *link_Bps;
  /* What each stage keeps (K entries), counted from a plan's lists
   * (ax_pipe_verify, verify.h) instead of the mode table's bounds; NULL:
   * the table's (ax_pipe_stash). The memory model is the same. */
  const ax_stash_count *stash;
} ax_partition_opts;

/* The cost model, exposed so callers can report it:
 *   time(s)   = sum over its blocks of (fwd + bwd, + fwd again when the mode
 *               replays) + (bytes received + bytes sent) / bandwidth, where
 *               a stage sends its last block's outputs forward and its
 *               first block's input gradient backward (out_bytes of the
 *               block before it); with links, each boundary's bytes go at
 *               its link's rate and each of the stage's boundaries adds
 *               its link's one-way latency once (ax_stage_time_at with the
 *               stage's index; ax_stage_time ignores links);
 *   memory(s) = params * (1 + weight_versions + optim_copies) + buffers +
 *               saved * activation_sets + in_bytes(first block) * (sets -
 *               activation_sets) + saved * replay. */
double ax_stage_time(const ax_block_profile *p, int n, int first, int last,
                     const ax_partition_opts *o);
double ax_stage_time_at(const ax_block_profile *p, int n, int first, int last,
                        int stage, const ax_partition_opts *o);
size_t ax_stage_memory(const ax_block_profile *p, int n, int first, int last,
                       int stage, const ax_partition_opts *o);

typedef struct ax_partition_report {
  int K;
  double stage_time[AX_PARTITION_MAX_STAGES]; /* seconds, ax_stage_time */
  size_t stage_mem[AX_PARTITION_MAX_STAGES];  /* bytes, ax_stage_memory */
  double max_time;                            /* the objective */
} ax_partition_report;

/* Exact minimum over contiguous splits of the slowest stage's time, subject
 * to ax_stage_memory <= mem_cap for every stage. Writes bounds[K + 1] and,
 * when rep is not NULL, the per-stage costs. Ties go to the split found
 * first (earliest cut points). Errors: AX_EINVAL when K < 1, K > n, the
 * mode is unknown, or no split fits the cap (the message gives the cap and
 * the smallest peak stage memory any split reaches). */
int ax_partition_balanced(const ax_block_profile *p, int n,
                          const ax_partition_opts *o, int *bounds,
                          ax_partition_report *rep);

/* bounds of the near-equal split (ax_split_uniform); AX_EINVAL when
 * K < 1 or K > n. */
int ax_partition_uniform(int n, int K, int *bounds);

/* Profiles (when `how` is "balanced") and splits: the one call the
 * coordinator needs for `--partition uniform|balanced`. `input` and prof
 * as in ax_profile_blocks (prof may be NULL; input is unused for uniform).
 * Writes bounds[K + 1]; AX_EINVAL for an unknown `how`. */
int ax_partition_model(const char *how, const ax_model_def *def,
                       const ax_config *cfg, ax_device dev,
                       const ax_tlist *input, const ax_profile_opts *prof,
                       const ax_partition_opts *o, int *bounds,
                       ax_partition_report *rep);

/* "0/3/7/11" into buf; returns buf ("" when len is too small). */
char *ax_partition_format(const int *bounds, int K, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
