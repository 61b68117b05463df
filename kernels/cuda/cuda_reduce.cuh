/* Deterministic warp and block reductions for the row kernels of the CUDA
 * backend (cuda_norm.cu, cuda_softmax.cu, ...) and their launch helpers
 * (1-D grids: axi_cuda_grid in cuda_common.cuh).
 *
 * The warp reductions are xor butterflies: every lane ends with the same
 * bits (each step adds the same two values, in either order), and the order
 * of the additions depends only on the block size, so results do not vary
 * from run to run. Block reductions need blockDim.x to be a multiple of 32
 * (at most 1024) and every thread of the block to call them; they use 32
 * elements of shared memory passed by the caller and return the result to
 * every thread. */
#ifndef AX_CUDA_REDUCE_CUH
#define AX_CUDA_REDUCE_CUH

#include <math.h>

#include "axon/kernels/cuda/cuda_common.cuh"

#define AXI_GRID_STRIDE(i, n)                                                  \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);      \
       i += (size_t)gridDim.x * blockDim.x)

/* Threads per block for one row of `cols` elements: a power of two in
 * [32, 256], about four elements per thread for wide rows. */
static inline int axi_row_threads(int cols) {
  int t = 32;
  while (t < 256 && t * 4 < cols)
    t *= 2;
  return t;
}

template <typename T> __device__ static inline T axi_warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ static inline float axi_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ static inline int axi_warp_min(int v) {
  for (int o = 16; o > 0; o >>= 1)
    v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename T>
__device__ static inline T axi_block_sum(T v, T *sh /* [32] */) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5,
            nw = blockDim.x >> 5;
  v = axi_warp_sum(v);
  __syncthreads(); /* the previous call's readers are done with sh */
  if (lane == 0)
    sh[wid] = v;
  __syncthreads();
  return axi_warp_sum(lane < nw ? sh[lane] : (T)0);
}

__device__ static inline float axi_block_max(float v, float *sh /* [32] */) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5,
            nw = blockDim.x >> 5;
  v = axi_warp_max(v);
  __syncthreads();
  if (lane == 0)
    sh[wid] = v;
  __syncthreads();
  return axi_warp_max(lane < nw ? sh[lane] : -INFINITY);
}

__device__ static inline int axi_block_min(int v, int *sh /* [32] */) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5,
            nw = blockDim.x >> 5;
  v = axi_warp_min(v);
  __syncthreads();
  if (lane == 0)
    sh[wid] = v;
  __syncthreads();
  return axi_warp_min(lane < nw ? sh[lane] : 0x7fffffff);
}

#endif
