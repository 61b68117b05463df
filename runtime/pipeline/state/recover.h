/* Live recovery of a replicated pipeline (ax_pipe_opts.replicas >= 2): an
 * agent of one replica is lost, and its stages take their state from a
 * live replica of the same stage instead of rolling every stage back to a
 * checkpoint. No step is lost; the mini-batch that was interrupted runs
 * again from its inputs (docs/CHECKPOINTS.md, "Live recovery").
 *
 * Why it is exact. The replicas of a stage average their gradients before
 * every update, so at a step boundary they hold the same weights and
 * optimizer state, bit for bit. After a failure the stages may stand on
 * either side of the interrupted batch's update: a stage whose replicas'
 * all-reduce did not involve the lost agent may have finished it, the
 * others not (and a ring all-reduce may have completed on some replicas
 * of a stage and not on others). Every stage that keeps its last step
 * boundary (ax_pipe_keep_boundary) goes back to the boundary of the batch
 * that was interrupted, so every stage of every replica is at the same
 * boundary; the survivors' states are then copied in memory on their own
 * agents (the in-memory checkpoint's copies, ckpt_memory.c), the front is
 * rebuilt with the replacement and every stage loads: a survivor its own
 * copy, a replacement the copy of the same stage (and tensor-parallel
 * member) of another replica (ax_pipe_restore_memory). The replayed batch
 * then computes the same sums as the uninterrupted run.
 *
 * What it needs, and why the rest is refused (AX_EUNSUPPORTED, with the
 * reason): two replicas or more (with one no other agent holds the lost
 * stage's state); a flushed mode (without a flush the units in flight
 * used weight versions that no survivor keeps: there is no boundary to go
 * back to); the stages' whole optimizer state on their own agents (with
 * zero each replica's agent holds the only copy of its shard, with an
 * optimizer host the state is not the stage's); no frozen prefix. A stage
 * whose agents are lost in every replica has no live copy (AX_ENOTFOUND).
 * Buffers (batch-norm statistics) are per replica: the replacement takes
 * the donor replica's, which only evaluation reads.
 *
 * Threads: called by the thread that trains, between ax_pipe_train
 * calls. */
#ifndef AX_PIPELINE_RECOVER_H
#define AX_PIPELINE_RECOVER_H

#include "axon/runtime/pipeline/state/checkpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

/* AX_OK when p can recover live, else AX_EUNSUPPORTED with the reason. */
int ax_pipe_live_check(const ax_pipe *p);

/* Makes every stage of p keep its last step boundary (one copy of its
 * weights and optimizer state per update, two of its buffers). Call after
 * ax_pipe_new, before training. */
int ax_pipe_keep_boundary(ax_pipe *p);

/* After a failed ax_pipe_train of p that lost the agents lost[0 ..
 * nlost - 1]: stops every stage on the other agents, brings them to one
 * step boundary c (the first mini-batch not reported done, `done`, or
 * the one after the last update a stage applied) and copies their states
 * in memory on their own agents into *live (zeroed before the first use;
 * its keys are reused after). live->info.step is c; the caller fills the
 * data position, rebuilds the pipeline (ax_pipe_free, ax_pipe_new with the
 * replacements), calls ax_pipe_keep_boundary and ax_pipe_restore_memory
 * with *live, and trains on from c. p can only be freed afterwards.
 * AX_ENOTFOUND when a lost stage has no live replica; AX_ESTATE when the
 * stages cannot reach one boundary (they stand further apart than one
 * update, or one kept no copy): recover from a checkpoint then. */
int ax_pipe_live_snapshot(ax_pipe *p, const char *const *lost, int nlost,
                          long done, ax_mem_ckpt *live);

/* Between ax_pipe_train calls (a drained boundary, nothing to stop or
 * rewind): copies every stage's state in memory on its own agent into
 * *live at step `step`, as ax_pipe_live_snapshot does, for a pipeline
 * rebuilt with more or fewer replicas (an elastic run growing back) to
 * load with ax_pipe_restore_memory. Any pipeline. */
int ax_pipe_live_copy(ax_pipe *p, long step, ax_mem_ckpt *live);

#ifdef __cplusplus
}
#endif
#endif
