/* CPU backend: host memory, memcpy copies, and the vtable of CPU kernels. */
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <cblas.h>

#include "axon/kernels/cpu/cpu.h"
#include "axon/kernels/error.h"

static int cpu_threads = 0;

/* Activations are large, short-lived allocations made by whichever thread
 * runs a layer (an agent's RPC workers). glibc gives each thread its own
 * arena, whose heaps are capped at 64 MiB and handed back to the kernel,
 * so multi-MiB tensors there come from fresh mmaps and pay page faults on
 * every step (measured, ResNet20 stage 0 at batch 64 on an agent worker:
 * forward 95 ms -> 36 ms with one arena). One arena, no mmap for tensors
 * and a high trim threshold keep freed tensor memory for reuse (and
 * ResNet20 single-process steps 550 -> 370 ms). Set at load, before any
 * thread exists; AXON_MALLOC_TUNE=0 keeps glibc's defaults. */
__attribute__((constructor)) static void tune_malloc(void) {
  const char *env = getenv("AXON_MALLOC_TUNE");
  if (env && !strcmp(env, "0"))
    return;
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

void ax_cpu_set_threads(int n) {
  if (n <= 0)
    n = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (n <= 0)
    n = 1;
  cpu_threads = n;
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
  openblas_set_num_threads(n);
}

int ax_cpu_threads(void) {
  if (cpu_threads <= 0)
    ax_cpu_set_threads(0);
  return cpu_threads;
}

static void *cpu_alloc(ax_backend *be, size_t bytes) {
  (void)be;
  void *p = NULL;
  /* 64-byte alignment for vector loads; round up as aligned_alloc needs. */
  if (posix_memalign(&p, 64, (bytes + 63) & ~(size_t)63) != 0)
    return NULL;
  return p;
}

static void cpu_free(ax_backend *be, void *ptr) {
  (void)be;
  free(ptr);
}

static int cpu_copy(ax_backend *be, void *dst, const void *src, size_t n) {
  (void)be;
  if (dst != src)
    memmove(dst, src, n);
  return AX_OK;
}

static int cpu_sync(ax_backend *be) {
  (void)be;
  return AX_OK;
}

static const ax_backend_i cpu_iface = {
    /* .name = */ "cpu",
    /* .alloc = */ cpu_alloc,
    /* .free = */ cpu_free,
    /* .copy_from_host = */ cpu_copy,
    /* .copy_to_host = */ cpu_copy,
    /* .copy = */ cpu_copy,
    /* .synchronize = */ cpu_sync,
    /* .gemm = */ axi_cpu_gemm,
    /* .fill = */ axi_cpu_fill,
    /* .axpby = */ axi_cpu_axpby,
    /* .sum = */ axi_cpu_sum,
    /* .bias_add = */ axi_cpu_bias_add,
    /* .bias_grad = */ axi_cpu_bias_grad,
    /* .relu_fwd = */ axi_cpu_relu_fwd,
    /* .relu_bwd = */ axi_cpu_relu_bwd,
    /* .tanh_fwd = */ axi_cpu_tanh_fwd,
    /* .tanh_bwd = */ axi_cpu_tanh_bwd,
    /* .gelu_fwd = */ axi_cpu_gelu_fwd,
    /* .gelu_bwd = */ axi_cpu_gelu_bwd,
    /* .dropout_fwd = */ axi_cpu_dropout_fwd,
    /* .dropout_bwd = */ axi_cpu_dropout_bwd,
    /* .conv2d_fwd = */ axi_cpu_conv2d_fwd,
    /* .conv2d_bwd_data = */ axi_cpu_conv2d_bwd_data,
    /* .conv2d_bwd_filter = */ axi_cpu_conv2d_bwd_filter,
    /* .bn_fwd_train = */ axi_cpu_bn_fwd_train,
    /* .bn_fwd_eval = */ axi_cpu_bn_fwd_eval,
    /* .bn_bwd = */ axi_cpu_bn_bwd,
    /* .maxpool_fwd = */ axi_cpu_maxpool_fwd,
    /* .maxpool_bwd = */ axi_cpu_maxpool_bwd,
    /* .avgpool_fwd = */ axi_cpu_avgpool_fwd,
    /* .avgpool_bwd = */ axi_cpu_avgpool_bwd,
    /* .layernorm_fwd = */ axi_cpu_layernorm_fwd,
    /* .layernorm_bwd = */ axi_cpu_layernorm_bwd,
    /* .xent_fwd = */ axi_cpu_xent_fwd,
    /* .xent_bwd = */ axi_cpu_xent_bwd,
    /* .softmax_mask_fwd = */ axi_cpu_softmax_mask_fwd,
    /* .softmax_bwd = */ axi_cpu_softmax_bwd,
    /* .permute0213 = */ axi_cpu_permute0213,
    /* .embedding_fwd = */ axi_cpu_embedding_fwd,
    /* .embedding_bwd = */ axi_cpu_embedding_bwd,
    /* .sgd_step = */ axi_cpu_sgd_step,
    /* .adamw_step = */ axi_cpu_adamw_step,
    /* .bn_relu_fwd_train = */ axi_cpu_bn_relu_fwd_train,
    /* .bn_relu_bwd = */ axi_cpu_bn_relu_bwd,
    /* .add_relu_fwd = */ axi_cpu_add_relu_fwd,
    /* .attn_causal_fwd = */ axi_cpu_attn_causal_fwd,
    /* .attn_causal_bwd = */ axi_cpu_attn_causal_bwd,
    /* .cast_f32_bf16 = */ axi_cpu_cast_f32_bf16,
    /* .cast_bf16_f32 = */ axi_cpu_cast_bf16_f32,
    /* .gemm_bf16 = */ axi_cpu_gemm_bf16,
};

int axi_cpu_backend_init(ax_backend *be) {
  be->iface = cpu_iface;
  be->device = AX_CPU;
  be->ctx = NULL;
  /* Probe the CPU once here, so that kernels running on several threads
   * only read the cached answer. */
  (void)axi_gemm512_available();
  (void)axi_bf16_gemm_available();
  if (cpu_threads <= 0) {
    const char *env = getenv("AXON_THREADS");
    ax_cpu_set_threads(env ? atoi(env) : 0);
  }
  return AX_OK;
}
