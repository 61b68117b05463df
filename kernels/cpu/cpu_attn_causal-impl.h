/* What the CPU fused causal attention's forward (cpu_attn_causal.c, which
 * describes the algorithm) and backward (cpu_attn_causal_bwd.c) share: the
 * block sizes, one (b, head)'s places in the operands, the dropout counter,
 * the tile GEMM and the task runner. Internal to
 * kernels/cpu/. */
#ifndef AX_CPU_ATTN_CAUSAL_IMPL_H
#define AX_CPU_ATTN_CAUSAL_IMPL_H

#include <stdint.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/cpu/cpu_math-impl.h"

/* Query rows and keys per block; every (query, key) tile is stored with
 * row stride AXI_ATTN_BK, every transposed key block (dh, AXI_ATTN_BK). */
enum { AXI_ATTN_BQ = 64, AXI_ATTN_BK = 64 };

/* The elementwise loops over tiles are cloned for x86-64-v4 (AVX-512),
 * picked at load time where the CPU has it. */
#define AXI_ATTN_CLONES AXI_CPU_CLONES

/* One call's operands. The backward reads o and lse and writes dq, dk, dv,
 * whose layouts are q's, k's and v's (do_ has o's). */
typedef struct axi_attn_job {
  const ax_attn_desc *d;
  const float *q, *k, *v, *o, *lse, *do_;
  float *o_out, *lse_out, *dq, *dk, *dv;
  int nqb, nkb; /* query and key blocks per (b, head) */
} axi_attn_job;

/* One (b, h): the offsets of its row 0 in q, k, v and o (and in their
 * gradients) and in lse, and its dropout counter at (position 0, key 0). */
typedef struct axi_attn_head {
  const ax_attn_desc *d;
  long qo, ko, vo, oo, lo;
  uint64_t ctr;
  float keep_scale; /* 1 / (1 - p) */
} axi_attn_head;

/* (b, h) number bh = b * heads + h of the job. */
axi_attn_head axi_attn_head_of(const axi_attn_job *J, long bh);

static inline int axi_attn_min(int a, int b) { return a < b ? a : b; }

/* The keys of block j0 (width nk) that query row i sees: [0, result). */
static inline int axi_attn_visible(const ax_attn_desc *d, int i, int j0,
                                   int nk) {
  int v = d->sk - d->sq + i + 1 - j0;
  return v < 0 ? 0 : v > nk ? nk : v;
}

/* The dropout counter of query row i, key 0 (the contract's counter). */
static inline uint64_t axi_attn_row_ctr(const axi_attn_head *H, int i) {
  const ax_attn_desc *d = H->d;
  return H->ctr + (uint64_t)(d->sk - d->sq + i) * (uint64_t)d->sk;
}

/* The dropout factor of counter c: ks = 1 / (1 - p) if kept, else 0. */
static inline float axi_attn_keep(uint64_t seed, uint64_t c, float p,
                                  float ks) {
  return ax_dropout_uniform(seed, c) >= p ? ks : 0.0f;
}

/* The tile GEMM: C (m, n) = beta C + A B with A (i, p) at a[i * sam + p *
 * sak] (so A may be read transposed), row p of B at b + p * ldb, beta 0 or
 * 1: the AVX-512 kernel of cpu_gemm512.c where the CPU has it, else plain
 * loops. Each element of C is summed over p in order. */
void axi_attn_tile_nn(int m, int n, int k, const float *a, long sam, long sak,
                      const float *b, long ldb, float beta, float *c, long ldc);

/* xt (dh, AXI_ATTN_BK) = the transpose of the n rows (dh) of x, row stride
 * ss. */
void axi_attn_transpose(int n, int dh, const float *x, long ss, float *xt);

/* Runs fn(J, task, ws) for every task in [0, n) on the CPU threads, each
 * thread with its own ws_floats of scratch in ws. Tasks write disjoint
 * outputs, so the order in which threads take them (dynamically: their
 * costs differ) changes nothing. AX_ENOMEM without scratch. */
typedef void (*axi_attn_task)(const axi_attn_job *J, long task, float *ws);
int axi_attn_run(const axi_attn_job *J, long n, size_t ws_floats,
                 axi_attn_task fn);

#endif
