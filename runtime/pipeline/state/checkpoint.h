/* Checkpoints of a pipeline run, resuming from one, and using one without
 * the pipeline (the files: docs/CHECKPOINTS.md).
 *
 * What is saved. Each stage writes its own file on its own agent's disk,
 * under the same directory path: its parameters, buffers (batch-norm
 * statistics), optimizer state (momentum / Adam moments) and step count,
 * the batch of its last update and, for 2bw, the shadow weights the next
 * batch's forwards use. The coordinator writes the run's position (the
 * mini-batches done, which is also the data position and the learning-rate
 * schedule's position), its seed and configuration, and last the MANIFEST
 * with every file's size and SHA-256. No random-number state is saved
 * anywhere else: every random choice (shuffles, initialisation, dropout
 * masks) is counter-based from the seed and the batch index.
 *
 * Consistent cut. A checkpoint is taken between two ax_pipe_train calls,
 * when the pipeline is drained: no unit is in flight, so no stashed weight
 * version, activation or gradient needs saving. For the flushed modes
 * (sequential, gpipe, 1f1b, interleaved, zb-h1, zbv) that changes nothing:
 * a run cut into calls is bit-identical to one call. For the asynchronous
 * modes (ddg, fr, pipedream, 2bw) the drain changes the trajectory at the
 * cut (the first batches after it see fresher weights than they would
 * have): a resumed run equals an uninterrupted run that took the same cuts
 * (same checkpoint interval), not one that never drained.
 *
 * Atomicity. Every file goes to NAME.tmp, is fsynced and renamed; the
 * MANIFEST is written last and its own last line is its checksum, so a
 * crash at any point never leaves a directory that passes as a checkpoint.
 * Older checkpoints are removed only after the new one is complete (`keep`
 * complete checkpoints are kept, at least 2). Loading checks every byte
 * (sizes and SHA-256 against the manifest, and each file's own trailing
 * SHA-256) before any state changes, and refuses a damaged checkpoint with
 * AX_EFORMAT naming the file.
 *
 * Threads: the ax_pipe functions are called by the thread that trains
 * (never during ax_pipe_train). The others are reentrant. */
#ifndef AX_PIPELINE_CHECKPOINT_H
#define AX_PIPELINE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "axon/models/net.h"
#include "axon/runtime/pipeline/coord/coordinator.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the coordinator saves besides the stages' files. Strings are
 * NUL-terminated and truncated to their arrays. */
typedef struct ax_ckpt_info {
  long step;       /* mini-batches trained: the next one's global index */
  long data_epoch; /* the data position at `step`: epoch, and batches of */
  long data_batch; /* it already used */
  uint64_t seed;   /* the run's seed */
  char model[64], model_config[512];
  char dataset[64], data_config[512];
  char config[2048]; /* the whole run's configuration, compared on resume */
} ax_ckpt_info;

/* Flags of ax_pipe_checkpoint. */
#define AX_CKPT_TO_COORDINATOR                                                 \
  1 /* the stages send their files to the                                      \
       coordinator, which writes them under its                                \
       root (and sends them back on restore) */
/* The stages copy their state and answer; their files are written in the
 * background while training goes on, and the manifest (which makes the
 * checkpoint valid) follows once all are on disk. The call returns after
 * the copies; ax_pipe_checkpoint_wait (also called by the next checkpoint,
 * a restore and ax_pipe_free) returns the outcome. Ignored with
 * AX_CKPT_TO_COORDINATOR. */
#define AX_CKPT_ASYNC 2

/* Saves a checkpoint of p at info->step under root (root/ckpt-NNNNNNNN/:
 * stage-SS.axck on each stage's agent, or here with
 * AX_CKPT_TO_COORDINATOR; coordinator.axck and MANIFEST here), then
 * removes all but the newest `keep` (>= 2) complete ones. Between
 * ax_pipe_train calls only. Errors name the stage, agent and file; a
 * failed checkpoint leaves the previous ones as they were. */
int ax_pipe_checkpoint(ax_pipe *p, const char *root, const ax_ckpt_info *info,
                       int keep, int flags);
/* Waits for an AX_CKPT_ASYNC checkpoint of p still being written and
 * returns its outcome (AX_OK when none). */
int ax_pipe_checkpoint_wait(ax_pipe *p);

/* The checkpoint directory `path` names: path itself when it holds a
 * MANIFEST, else the newest root/ckpt-N with one. AX_ENOTFOUND when none. */
int ax_ckpt_find(const char *path, char *dir, size_t len);
/* Reads and checks dir's MANIFEST and coordinator file into *info. */
int ax_ckpt_read_info(const char *dir, ax_ckpt_info *info);
/* Loads checkpoint `path` (as ax_ckpt_find resolves it) into p's stages (p must
 * have the checkpoint's mode, stage count and split; each stage checks its
 * file) and makes p's next ax_pipe_train start at info->step. On error the
 * stages that loaded nothing keep their state; a stage's load is all or
 * nothing. */
int ax_pipe_restore(ax_pipe *p, const char *path, ax_ckpt_info *info);
/* "ckpt N is complete; the newest before it is DIR" help for error
 * messages: the newest complete checkpoint under dir's parent older than
 * dir, or "" (best effort). */
void ax_ckpt_previous(const char *dir, char *out, size_t len);

/* ---- in-memory checkpoints (Gemini-style) ---------------------------------
 * Every stage keeps its state (the bytes of its checkpoint file) in its
 * agent's memory and sends a copy to the agent of the next stage held by
 * another agent (the last stage's to the first's), under this
 * coordinator's name: one lost agent loses no stage's state, and a
 * rollback needs no disk (a spare on another host needs no shared
 * directory). The same consistent cut as ax_pipe_checkpoint. Of a front
 * (replicas, tensor-parallel members) every part's stages keep their own
 * copies the same way, the neighbour being the next stage's agent in the
 * part (with one agent per part: the same stage's agent in the next
 * part); the replicas of a stage hold the same state, so a stage whose two
 * copies are lost loads a replica's (the same member's; under ZeRO its
 * shard differs, and the load is refused). A stage's copy holds its ZeRO
 * shard or its optimizer host's state; a frozen prefix is copied by the
 * coordinator that runs it. Two generations alternate, so a
 * checkpoint that fails half way (an agent lost while saving) leaves the
 * previous one whole: an agent holds up to four copies of a stage's size
 * per stage it serves (its own two and its neighbour's two), under this
 * coordinator's name, until ax_pipe_memory_forget drops them. */
#define AX_MEM_CKPT_COPIES (AX_PIPE_MAX_REPLICAS * AX_PIPE_MAX_STAGES)
typedef struct ax_mem_ckpt {
  ax_ckpt_info info;  /* what the coordinator keeps */
  int mode, S, U;     /* S stages (per part) of U units; S = 0: none */
  int parts, members; /* parts (replicas x members; 1: one pipeline) and
                         tensor-parallel members per replica */
  int gen;            /* which of the two alternating copies this is */
  uint64_t tag;       /* this run's keys (set by the first checkpoint) */
  struct {
    char agent[64], peer[64];     /* the agents holding the copies ("":
                                     none) */
    uint64_t agent_inc, peer_inc; /* and their incarnations then */
    int64_t size;
    char sha[65];           /* SHA-256 of the copy, hex */
  } st[AX_MEM_CKPT_COPIES]; /* part i's stage s at st[i S + s] */
  /* A frozen prefix's blocks [0, prefix_blocks) (freeze.h), kept by the
   * coordinator that runs them: their parameters then buffers, malloc'd
   * (NULL: none; ax_pipe_memory_forget frees them). */
  int prefix_blocks;
  size_t prefix_np, prefix_nb;
  float *prefix;
} ax_mem_ckpt;

/* Takes an in-memory checkpoint of p at info->step into *out (zeroed
 * before the first; the copies of the one before *out are replaced).
 * Between ax_pipe_train calls. On error *out is unchanged and still
 * restorable. */
int ax_pipe_checkpoint_memory(ax_pipe *p, const ax_ckpt_info *info,
                              ax_mem_ckpt *out);
/* Loads m into p's stages (p: the same mode, stage count, split and
 * tensor-parallel members, on the same agents or others, e.g. a spare;
 * with as many replicas as m or not, since every replica of a stage
 * holds the same state): each stage's copy
 * from the agent that kept it if that is still the same process
 * (incarnation), else from its neighbour's copy, else (a front) from a
 * copy of the same stage of another replica's same member; each checked
 * (size, SHA-256, this stage's split, mode and optimizer) before it loads.
 * AX_ENOTFOUND naming the stage when every copy of it is lost. p's next
 * ax_pipe_train starts at m->info.step; *info (may be NULL) gets m->info. */
int ax_pipe_restore_memory(ax_pipe *p, const ax_mem_ckpt *m,
                           ax_ckpt_info *info);
/* Drops the in-memory copies of p's coordinator on every agent of m that
 * is up (best effort; the end of a run). */
void ax_pipe_memory_forget(ax_pipe *p, ax_mem_ckpt *m);

/* ---- using a checkpoint without the pipeline ----------------------------- */
/* The whole model of checkpoint dir (every stage file read here, so they
 * must be on this host's disk) or of an exported file, as one net on dev:
 * the stages' parameters and buffers concatenated in block order are the
 * unsplit model's flat buffers (models/model.h lays a model out block by
 * block), so split and unsplit layouts are interchangeable. *info gets the
 * model, data set and step. */
int ax_ckpt_load_net(const char *path, ax_device dev, ax_net **net,
                     ax_ckpt_info *info);
/* Writes the whole model's parameters and buffers of checkpoint (or
 * exported file) `path` to out as one file (docs/CHECKPOINTS.md, "model
 * file"), atomically. */
int ax_ckpt_export(const char *path, const char *out);

#ifdef __cplusplus
}
#endif
#endif
