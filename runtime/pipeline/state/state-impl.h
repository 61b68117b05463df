/* The mover's cutting side (mover.c, state.h): the piece of a layout-free
 * state that one slot of a layout holds, as that slot's stage file.
 * Internal to the checkpoint code. */
#ifndef AX_PIPELINE_STATE_IMPL_H
#define AX_PIPELINE_STATE_IMPL_H

#include "axon/runtime/pipeline/state/ckpt_file-impl.h"
#include "axon/runtime/pipeline/state/state.h"

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
 * optimizer's kind and steps and the last update's step. A shadow is kept
 * only when the slot's mode keeps one (2bw); a mode without one starts
 * from the live weights, as after a drain. AX_EINVAL naming the blocks
 * when they are outside the model or disagree on the optimizer's steps. */
int axi_state_slot_file(const ax_train_state *st, const axi_state_slot *slot,
                        uint8_t **buf, size_t *len,
                        char sha[2 * AX_SHA256_LEN + 1]);

/* The nets of blocks [first, last) of st's model, whole and as member
 * `member` of `members` (part is NULL when members is 1). */
int axi_state_nets(const ax_train_state *st, int first, int last, int members,
                   int member, ax_net **whole, ax_net **part);

/* l as the manifest's layout line (state.h). */
int axi_layout_format(const ax_layout *l, char *out, size_t cap);

#endif
