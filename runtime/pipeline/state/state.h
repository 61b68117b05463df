/* The training state of a model, free of any layout, and the layouts that
 * hold it (docs/ARCHITECTURE.md, "State and layouts").
 *
 * A model is a list of blocks and lays its parameters (and buffers) out
 * block by block in one flat array (models/model.h), so the state of a
 * training run is, whatever the layout that trained it:
 *   - the whole model's flat parameters and buffers;
 *   - the optimizer's state buffers, shaped like the parameters (SGD
 *     momentum, or AdamW's two moments), its kind and step count;
 *   - the position of the last update (the mini-batch it ended);
 *   - the mode's extra weight version: 2bw's shadow (the weights before the
 *     last update, which the next batch's forwards use), also
 *     parameter-shaped;
 *   - the staleness correction's history (staleness.h): its average update
 *     and the weights it predicted for the next batch.
 * A layout says who holds which part of it:
 *   - K pipeline stages, stage s holding blocks [bounds[s], bounds[s+1]),
 *     chunks included (a chunked mode's K counts every chunk);
 *   - T tensor-parallel members per stage, each holding its slice of the
 *     split layers and a copy of the rest (models/layers/parallel.h);
 *   - R replicas of the whole, holding the same values;
 *   - ZeRO: the optimizer state of each stage sharded over its replicas;
 *   - an optimizer host holding the stages' optimizer state;
 *   - a frozen prefix, blocks [0, frozen) held by the coordinator, without
 *     optimizer state.
 *
 * One mover converts between the two (mover.c, mover_read.c,
 * mover_pipe.c): it gathers the state from the pieces a layout's holders
 * wrote (a checkpoint directory, a model file, or a live pipeline's stages
 * in memory) and cuts the piece any slot of any other layout holds.
 * Checkpoint restore, freezing (freeze.h), evaluation and export of a
 * checkpoint go through it.
 *
 * Thread-safety: the functions are reentrant; one object per thread. */
#ifndef AX_PIPELINE_STATE_H
#define AX_PIPELINE_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "axon/models/model.h"
#include "axon/runtime/pipeline/state/checkpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Who holds what (above). */
typedef struct ax_layout {
  int mode;   /* the pipeline mode (mode.h index) */
  int stages; /* K, chunks included */
  int bounds[AX_PIPE_MAX_STAGES + 1];
  int tensor_parallel; /* T >= 1 */
  int replicas;        /* R >= 1 */
  int zero;            /* 0, 1 or 2 */
  int optimizer_host;  /* 1: the optimizer state lives on another agent */
  int frozen;          /* blocks [0, frozen) on the coordinator */
} ax_layout;

/* The layout-free state (host memory). Arrays are NULL when empty: m and v
 * when the optimizer keeps none, shadow unless 2bw left one. */
typedef struct ax_train_state {
  char model[64], model_config[512];
  int n_blocks;
  size_t *param_at, *buffer_at; /* [n_blocks + 1]: where block b starts */
  size_t n_params, n_buffers;
  float *params, *buffers, *m, *v, *shadow;
  float *delta, *pred; /* the staleness correction's average update and
                          its prediction for mini-batch pred_for (-1: none),
                          parameter-shaped; NULL when none */
  long pred_for;
  int optim_kind;       /* -1: none saved (a model file) */
  long *optim_steps;    /* [n_blocks]: updates each block's optimizer made */
  long *last_step;      /* [n_blocks]: the mini-batch of its last update */
  long shadow_for;      /* -1: no shadow */
  ax_layout written_by; /* the layout of the checkpoint it came from */
} ax_train_state;

/* Reads the state of checkpoint `path` (as ax_ckpt_find resolves it: every
 * file read here, so they must be on this host's disk) or of an exported
 * model file, whatever layout wrote it: tensor-parallel members joined,
 * ZeRO shards put together, stages and the frozen prefix concatenated,
 * every size checked against the model. *info (may be NULL) gets the
 * coordinator's record. AX_EFORMAT naming the file when a piece is missing,
 * damaged or of another model. */
int ax_state_read(const char *path, ax_train_state *st, ax_ckpt_info *info);
void ax_state_free(ax_train_state *st);

/* Loads only st's weights (parameters and buffers) into every stage of p,
 * cut for p's layout (between ax_pipe_train calls), for using a model
 * rather than training it on: the stages' optimizer must keep no state
 * (SGD without momentum: "opt=sgd,momentum=0"), and start with no update
 * made. Works for a model file's state too (which has no optimizer
 * state). Errors name the stage and its agent. */
int ax_state_load_weights(ax_pipe *p, const ax_train_state *st);

/* The layout of checkpoint directory dir (its coordinator record). */
int ax_layout_read(const char *dir, ax_layout *l);

/* 1 when two layouts hold the state in the same files: a checkpoint of
 * `was` restores onto `now` with each stage loading its own file. */
int ax_layout_same_files(const ax_layout *was, const ax_layout *now);

#ifdef __cplusplus
}
#endif
#endif
