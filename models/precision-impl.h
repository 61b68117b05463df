/* The mixed-precision helpers of the layers and the blocks container
 * (models/precision.c; the rules are at the top of models/module.h). Not
 * a public header: nothing outside models/ and the tests includes it. */
#ifndef AX_MODELS_PRECISION_IMPL_H
#define AX_MODELS_PRECISION_IMPL_H

#include "axon/kernels/backend-impl.h"
#include "axon/models/module.h"

/* A GEMM operand: its first element and its element type (AX_F32 or
 * AX_BF16). */
typedef struct axi_mm {
  const void *p;
  ax_dtype dtype;
} axi_mm;

/* An f32 operand at p (a parameter, a temporary). */
static inline axi_mm axi_mm_f32(const float *p) {
  axi_mm o = {p, AX_F32};
  return o;
}

/* The operand starting at element off of t (f32 or bf16), e.g. a saved
 * activation as ax_slot_get gives it. */
static inline axi_mm axi_mm_at(const ax_tensor *t, size_t off) {
  axi_mm o = {(const char *)t->data + off * ax_dtype_size(t->dtype), t->dtype};
  return o;
}

/* The backend's gemm (layouts and contract in kernels/backend-impl.h) in
 * ex's precision. fp32: gemm itself on two f32 operands (AX_EDTYPE for a
 * bf16 one). bf16: gemm_bf16 on the operands as they are (an f32 one is
 * rounded to bf16 by the kernel as it reads it, no copy; a bf16 one used
 * as it is): f32 sums, C f32. */
int axi_prec_gemm(const ax_exec *ex, ax_backend *be, int trans_a, int trans_b,
                  int m, int n, int k, float alpha, axi_mm a, int lda,
                  long stride_a, axi_mm b, int ldb, long stride_b, float beta,
                  float *c, int ldc, long stride_c, int batch);

/* t as type `to` (AX_F32 or AX_BF16; t f32 or bf16) in *out: a new
 * reference to t when it has that type already, else a new tensor of the
 * same shape on the same device (f32 -> bf16 rounds to nearest even,
 * bf16 -> f32 is exact). */
int axi_prec_cast(const ax_tensor *t, ax_dtype to, ax_tensor **out);

/* t (f32 or bf16) as a GEMM operand in ex's precision, in *out: a new
 * reference to t in fp32 or when t is bf16 already, its bf16 rounding
 * (axi_prec_cast) when t is f32 in bf16. For an operand that several GEMMs
 * of one call share, so that it is rounded once. */
int axi_prec_operand(const ax_exec *ex, const ax_tensor *t, ax_tensor **out);

/* A block's calls at the model's block boundaries in bf16 (ax_blocks_new,
 * models/module.c). fwd: ax_forward of block b on `in` with its bf16
 * entries widened to f32, then (round_out) every f32 output rounded to a
 * bf16 tensor. bwd: ax_backward_part of b on `dout` widened likewise, then
 * every f32 input gradient rounded (the weight half: as it is). On error
 * out / din are empty. */
int axi_prec_block_fwd(ax_module *b, const ax_exec *ex, ax_slot *slot,
                       const ax_tlist *in, ax_tlist *out, int round_out);
int axi_prec_block_bwd(ax_bwd_part part, ax_module *b, const ax_exec *ex,
                       ax_slot *slot, const ax_tlist *dout, ax_tlist *din);

#endif
