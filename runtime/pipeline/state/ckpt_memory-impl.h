/* In-memory checkpoints of a pipeline or a front, the coordinator's side
 * (ckpt_memory.c), as recovery (recover.c) uses them beyond
 * ax_pipe_checkpoint_memory. Internal to runtime/pipeline/. */
#ifndef AX_PIPELINE_CKPT_MEMORY_IMPL_H
#define AX_PIPELINE_CKPT_MEMORY_IMPL_H

#include "axon/runtime/pipeline/state/checkpoint.h"

/* The generation of the copies taken at a failure (recover.c): apart from
 * the two that alternate, so neither checkpoint is replaced. */
#define AXI_MEM_GEN_LIVE 2

/* Takes a copy of every stage of every part of p (st[i S + s]) at
 * info->step into *out, as ax_pipe_checkpoint_memory does, with these
 * differences: generation gen; each copy on its own agent only unless
 * peers; the stages of part i whose skip[i S + s] is set (may be NULL)
 * keep none (their entry's agent is ""). The tag is prev's when prev has
 * one (prev->S > 0), else a new one. On error *out is unchanged. */
int axi_pipe_mem_take(ax_pipe *p, const ax_ckpt_info *info,
                      const ax_mem_ckpt *prev, int gen, int peers,
                      const unsigned char *skip, ax_mem_ckpt *out);

#endif
