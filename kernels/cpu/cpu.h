/* The CPU backend's kernels (OpenBLAS + OpenMP). Each is the reference
 * implementation of the vtable entry of the same name in
 * kernels/backend-impl.h, which documents its contract. */
#ifndef AX_CPU_H
#define AX_CPU_H

#include "axon/kernels/backend-impl.h"

/* Elementwise loops that should vectorise wider than the build's baseline
 * are cloned for x86-64-v4 (AVX-512), picked at load time where the CPU
 * has it. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define AXI_CPU_CLONES                                                         \
  __attribute__((target_clones("arch=x86-64-v4", "default")))
#else
#define AXI_CPU_CLONES
#endif

/* cpu_blas.c */
int axi_cpu_gemm(ax_backend *be, int ta, int tb, int m, int n, int k,
                 float alpha, const float *a, int lda, long sa, const float *b,
                 int ldb, long sb, float beta, float *c, int ldc, long sc,
                 int batch);
int axi_cpu_fill(ax_backend *be, float *x, size_t n, float v);
int axi_cpu_axpby(ax_backend *be, size_t n, float a, const float *x, float b,
                  float *y);
int axi_cpu_sum(ax_backend *be, size_t n, const float *x, double *out);
int axi_cpu_bias_add(ax_backend *be, float *y, const float *bias, int outer,
                     int c, int inner);
int axi_cpu_bias_grad(ax_backend *be, const float *dy, float *db, int outer,
                      int c, int inner);

/* cpu_act.c */
int axi_cpu_relu_fwd(ax_backend *be, size_t n, const float *x, float *y);
int axi_cpu_relu_bwd(ax_backend *be, size_t n, const float *y, const float *dy,
                     float *dx);
int axi_cpu_add_relu_fwd(ax_backend *be, size_t n, const float *x, float *y);
int axi_cpu_tanh_fwd(ax_backend *be, size_t n, const float *x, float *y);
int axi_cpu_tanh_bwd(ax_backend *be, size_t n, const float *y, const float *dy,
                     float *dx);
int axi_cpu_gelu_fwd(ax_backend *be, size_t n, const float *x, float *y);
int axi_cpu_gelu_bwd(ax_backend *be, size_t n, const float *x, const float *dy,
                     float *dx);
int axi_cpu_dropout_fwd(ax_backend *be, size_t n, const float *x, float *y,
                        float p, uint64_t seed, uint64_t first);
int axi_cpu_dropout_bwd(ax_backend *be, size_t n, const float *dy, float *dx,
                        float p, uint64_t seed, uint64_t first);

/* cpu_conv.c */
int axi_cpu_conv2d_fwd(ax_backend *be, const ax_conv_desc *d, const float *x,
                       const float *w, float *y);
int axi_cpu_conv2d_bwd_data(ax_backend *be, const ax_conv_desc *d,
                            const float *dy, const float *w, float *dx);
int axi_cpu_conv2d_bwd_filter(ax_backend *be, const ax_conv_desc *d,
                              const float *x, const float *dy, float *dw);

/* cpu_gemm512.c: unpacked AVX-512 GEMMs for the convolutions, usable only
 * when axi_gemm512_available() is true. nn: C (m, n) = beta * C + A * B with
 * A (i, p) at a[i * sam + p * sak] and row p of B (k, n) at b + p * ldb, or
 * at b + boff[p] when boff is not NULL; beta is 0 or 1.
 * nt: C (m, n) += A (m, k) * B (n, k)^T, row i of A at a + i * lda, row j of
 * B at b + j * ldb or b + boff[j]. */
int axi_gemm512_available(void);
void axi_gemm512_nn(int m, int n, int k, const float *a, long sam, long sak,
                    const float *b, long ldb, const long *boff, float beta,
                    float *c, long ldc);
/* nn with row i of A (m, k) at a + aoff[i] and B (k, n) row-major. */
void axi_gemm512_nn_arows(int m, int n, int k, const float *a, const long *aoff,
                          const float *b, long ldb, float beta, float *c,
                          long ldc);
void axi_gemm512_nt(int m, int n, int k, const float *a, long lda,
                    const float *b, long ldb, const long *boff, float *c,
                    long ldc);

/* cpu_conv_implicit.c: square convolutions on the AVX-512 GEMMs without
 * im2col, for descriptors where axi_conv_implicit_ok(d, data) is true (data:
 * for the data gradient, which supports fewer shapes). Same contracts as the
 * conv2d kernels. */
int axi_conv_implicit_ok(const ax_conv_desc *d, int data);
int axi_conv_implicit_fwd(const ax_conv_desc *d, const float *x, const float *w,
                          float *y);
int axi_conv_implicit_bwd_data(const ax_conv_desc *d, const float *dy,
                               const float *w, float *dx);
int axi_conv_implicit_bwd_filter(const ax_conv_desc *d, const float *x,
                                 const float *dy, float *dw);

/* cpu_norm.c (batch norm) */
int axi_cpu_bn_fwd_train(ax_backend *be, int n, int c, int hw, const float *x,
                         const float *gamma, const float *beta, float *y,
                         float *save_mean, float *save_invstd, float *run_mean,
                         float *run_var, float momentum, float eps);
int axi_cpu_bn_fwd_eval(ax_backend *be, int n, int c, int hw, const float *x,
                        const float *gamma, const float *beta,
                        const float *run_mean, const float *run_var, float eps,
                        float *y);
int axi_cpu_bn_bwd(ax_backend *be, int n, int c, int hw, const float *x,
                   const float *dy, const float *gamma, const float *save_mean,
                   const float *save_invstd, float *dx, float *dgamma,
                   float *dbeta);
int axi_cpu_bn_relu_fwd_train(ax_backend *be, int n, int c, int hw,
                              const float *x, const float *gamma,
                              const float *beta, float *y, float *save_mean,
                              float *save_invstd, float *run_mean,
                              float *run_var, float momentum, float eps);
int axi_cpu_bn_relu_bwd(ax_backend *be, int n, int c, int hw, const float *x,
                        const float *y, const float *dy, const float *gamma,
                        const float *save_mean, const float *save_invstd,
                        float *dx, float *dgamma, float *dbeta);
/* cpu_layernorm.c */
int axi_cpu_layernorm_fwd(ax_backend *be, int rows, int d, const float *x,
                          const float *gamma, const float *beta, float eps,
                          float *y, float *mean, float *rstd);
int axi_cpu_layernorm_bwd(ax_backend *be, int rows, int d, const float *x,
                          const float *dy, const float *gamma,
                          const float *mean, const float *rstd, float *dx,
                          float *dgamma, float *dbeta);

/* cpu_pool.c */
int axi_cpu_maxpool_fwd(ax_backend *be, const ax_pool_desc *d, const float *x,
                        float *y, int32_t *argmax);
int axi_cpu_maxpool_bwd(ax_backend *be, const ax_pool_desc *d, const float *dy,
                        const int32_t *argmax, float *dx);
int axi_cpu_avgpool_fwd(ax_backend *be, const ax_pool_desc *d, const float *x,
                        float *y);
int axi_cpu_avgpool_bwd(ax_backend *be, const ax_pool_desc *d, const float *dy,
                        float *dx);

/* cpu_loss.c */
int axi_cpu_xent_fwd(ax_backend *be, int rows, int classes, const float *logits,
                     const int32_t *labels, int ignore_index, float *probs,
                     double *loss_sum, int64_t *count, int64_t *correct);
int axi_cpu_xent_bwd(ax_backend *be, int rows, int classes, const float *probs,
                     const int32_t *labels, int ignore_index, float scale,
                     float *dlogits);
/* cpu_attn.c */
int axi_cpu_softmax_mask_fwd(ax_backend *be, int b, int heads, int sq, int sk,
                             const float *scores, const float *mask,
                             float scale, float *probs);
int axi_cpu_softmax_bwd(ax_backend *be, int rows, int cols, const float *probs,
                        const float *dprobs, float scale, float *dscores);
int axi_cpu_permute0213(ax_backend *be, int d0, int d1, int d2, int d3,
                        const float *x, float *y);
int axi_cpu_embedding_fwd(ax_backend *be, int n_idx, int dim, int rows,
                          const int32_t *idx, const float *table, float *y);
int axi_cpu_embedding_bwd(ax_backend *be, int n_idx, int dim,
                          const int32_t *idx, const float *dy, float *dtable);

/* cpu_bf16.c: the casts and gemm_bf16, which runs axi_bf16_gemm_avx512
 * when axi_bf16_gemm_available() is true and AXON_BF16_GEMM is not
 * "fallback", else OpenBLAS sgemm on operands converted to f32. */
int axi_cpu_cast_f32_bf16(ax_backend *be, size_t n, const float *x,
                          uint16_t *y);
int axi_cpu_cast_bf16_f32(ax_backend *be, size_t n, const uint16_t *x,
                          float *y);
int axi_cpu_gemm_bf16(ax_backend *be, int ta, int tb, int m, int n, int k,
                      float alpha, const void *a, ax_dtype at, int lda, long sa,
                      const void *b, ax_dtype bt, int ldb, long sb, float beta,
                      float *c, int ldc, long sc, int batch);
/* cpu_bf16_gemm.c: the AVX512-BF16 (vdpbf16ps) GEMM, multi-threaded, for
 * m, n, k, batch >= 1, alpha != 0 and operands AX_F32 or AX_BF16 (the
 * gemm_bf16 contract otherwise; an f32 operand is rounded while packed);
 * AX_OK or AX_ENOMEM. Only when axi_bf16_gemm_available() is true (the CPU
 * has AVX512-BF16; never off x86-64). */
int axi_bf16_gemm_available(void);
int axi_bf16_gemm_avx512(int ta, int tb, int m, int n, int k, float alpha,
                         const void *a, ax_dtype at, int lda, long sa,
                         const void *b, ax_dtype bt, int ldb, long sb,
                         float beta, float *c, int ldc, long sc, int batch);

/* cpu_attn_causal.c */
int axi_cpu_attn_causal_fwd(ax_backend *be, const ax_attn_desc *d,
                            const float *q, const float *k, const float *v,
                            float *o, float *lse);
int axi_cpu_attn_causal_bwd(ax_backend *be, const ax_attn_desc *d,
                            const float *q, const float *k, const float *v,
                            const float *o, const float *do_, const float *lse,
                            float *dq, float *dk, float *dv);

/* cpu_optim.c */
int axi_cpu_sgd_step(ax_backend *be, size_t n, float *w, const float *g,
                     float *mom, float lr, float momentum, float dampening,
                     float wd, int nesterov, int first);
int axi_cpu_adamw_step(ax_backend *be, size_t n, float *w, const float *g,
                       float *m, float *v, float lr, float beta1, float beta2,
                       float eps, float wd, int step);

#endif
