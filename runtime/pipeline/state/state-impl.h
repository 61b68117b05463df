/* The mover's inside (mover.c, mover_read.c, mover_pipe.c; state.h): the
 * pieces a layout's holders write, read from any source; the piece of a
 * layout-free state that one slot of a layout holds, as that slot's stage
 * file; and both applied to a live pipeline. Internal to the checkpoint and
 * freezing code. */
#ifndef AX_PIPELINE_STATE_IMPL_H
#define AX_PIPELINE_STATE_IMPL_H

#include "axon/runtime/pipeline/state/ckpt_file-impl.h"
#include "axon/runtime/pipeline/state/state.h"

/* The frozen prefix's piece (written by the coordinator). */
#define AXI_CK_PREFIX_FILE "prefix.axck"

/* ---- pieces and their sources -------------------------------------------- */

/* The name of the piece of stage s that tensor-parallel member t of T
 * holds: "stage-SS.axck", "stage-SS-tT.axck" when T > 1, and under ZeRO
 * the optimizer shard of replica r > 0 "stage-SS[-tT]-rR.axck" (replica
 * 0's file holds the parameters and its own shard). */
void axi_state_file_name(int s, int T, int t, int r, char *out, size_t cap);

/* Where the gathering side reads a layout's pieces from. open(user, name,
 * r) opens piece `name` (a stage file or AXI_CK_PREFIX_FILE), checked as
 * a stage file (its own checksum, and the size and checksum the source
 * lists for it), into *r; AX_ENOTFOUND, with no message, when the source
 * holds no such piece. `what` names the source in messages. */
typedef struct axi_state_src {
  const char *what;
  int (*open)(const void *user, const char *name, axi_ckr *r);
  const void *user;
} axi_state_src;

/* ax_state_read's gathering from src: the pieces that layout l of model
 * `model` (with model_config, the whole model's: no tp keys) wrote. On
 * error *st is empty. */
int axi_state_read_src(const axi_state_src *src, const ax_layout *l,
                       const char *model, const char *model_config,
                       ax_train_state *st);

/* ---- cutting ------------------------------------------------------------- */

/* One holder of a layout: stage `stage` (blocks [first, last)) of
 * tensor-parallel member `member` of `members`, run in `mode`. */
typedef struct axi_state_slot {
  int stage, first, last;
  int members, member;
  int mode;
} axi_state_slot;

/* Slot's stage file cut from st, finished in memory (*buf malloc'd, the
 * caller frees; sha its SHA-256, hex): the slot's parameters, buffers and
 * the whole member's optimizer state (a ZeRO stage takes its shard), the
 * optimizer's kind and steps, the last update's step and the staleness
 * correction's average update. A shadow, and a correction's prediction for
 * the next batch, are kept only when the slot's mode keeps one (2bw); a
 * mode without one starts from the live weights, as after a drain. AX_EINVAL
 * naming the blocks when they are outside the model or disagree on the
 * optimizer's steps. */
int axi_state_slot_file(const ax_train_state *st, const axi_state_slot *slot,
                        uint8_t **buf, size_t *len,
                        char sha[2 * AX_SHA256_LEN + 1]);

/* The frozen prefix's piece into w (initialised here): blocks [0, f) of
 * net, the coordinator's, in the stage file format (stage -1, parameters
 * and buffers only). */
void axi_state_prefix_file(const ax_net *net, int f, axi_ckw *w);

/* The nets of blocks [first, last) of st's model, whole and as member
 * `member` of `members` (part is NULL when members is 1). */
int axi_state_nets(const ax_train_state *st, int first, int last, int members,
                   int member, ax_net **whole, ax_net **part);

/* l as the manifest's layout line (state.h). */
int axi_layout_format(const ax_layout *l, char *out, size_t cap);

/* ---- live pipelines (mover_pipe.c) --------------------------------------- */

struct ax_pipe;

/* The layout front (a pipeline, or the front of its parts) holds its state
 * in. */
void axi_state_layout_of(const struct ax_pipe *front, ax_layout *l);
/* How many of front's parts hold its state, from the first (parts are
 * replica-major): replica 0's tensor-parallel members, or under ZeRO every
 * part (each replica's optimizer shard). */
int axi_state_nparts(const struct ax_pipe *front);
/* The name of part p's piece of its stage s (axi_state_file_name of its
 * member and, under ZeRO, its replica). */
void axi_state_file_of(const struct ax_pipe *p, int s, char *out, size_t cap);

/* Reads the state of front (between two train calls: a consistent cut)
 * into *st: each stage of the parts that hold it sends its piece
 * ("ckpt_save" sent back, as a checkpoint's), the coordinator adds its
 * frozen prefix's, and the pieces are gathered in memory as a checkpoint
 * directory's would be. Errors name the stage and its agent. */
int axi_state_snapshot(struct ax_pipe *front, ax_train_state *st);
/* Every stage of every part of front loads the file cut for its slot from
 * st ("ckpt_load" with the file, which the stage checks before it loads:
 * its split, mode, member and optimizer); `where` is the directory the
 * files are named under (no ".."). Errors name the part, the stage and its
 * agent. */
int axi_state_load(struct ax_pipe *front, const ax_train_state *st,
                   const char *where);

/* The "ckpt_load" message of the stage file at path (size bytes, SHA-256
 * sha): with file (its bytes) the file itself travels, else the stage reads
 * path from its own disk. */
int axi_state_load_msg(const char *path, int64_t size, const char *sha,
                       const uint8_t *file, ax_values **out);

#endif
