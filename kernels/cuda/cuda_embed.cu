/* CUDA backend, embed family: the embedding gather and its gradient,
 * contracts in kernels/backend-impl.h, arithmetic as the CPU reference
 * (kernels/cpu/cpu_attn.c).
 *
 * embedding_fwd: one thread per output element; an id outside [0, rows)
 * raises a device flag (the first bad position, by an integer atomicMax of
 * n_idx - position) that the call copies back and waits for: AX_EINVAL
 * naming the first bad position, as the CPU (its rows of y are zeroed).
 *
 * embedding_bwd: dtable[idx[i]] += dy[i] for every i, repeated ids adding
 * up, without float atomics: the ids are sorted with their positions by a
 * stable radix sort (CUB), so every id's positions form one run in
 * ascending order; the thread owning (run, column) adds the run's dy rows
 * to the table value in that order. That is the CPU's order of additions,
 * so the result is deterministic and equal to the CPU's bit for bit.
 * Negative ids (rejected by the forward) are skipped, as on the CPU.
 * Scratch memory comes from the backend allocator and is released right
 * after the kernels that use it are queued (ordered by the single stream). */
#include <cub/device/device_radix_sort.cuh>

#include "axon/kernels/cuda/cuda_reduce.cuh"

__global__ static void embed_fwd_kernel(int n_idx, int dim, int rows,
                                        const int32_t *idx, const float *table,
                                        float *y, int *bad, size_t total) {
  AXI_GRID_STRIDE(e, total) {
    size_t i = e / dim;
    int j = (int)(e - i * dim), id = idx[i];
    if (id < 0 || id >= rows) {
      if (j == 0)
        atomicMax(bad, n_idx - (int)i);
      y[e] = 0.0f;
    } else {
      y[e] = table[(size_t)id * dim + j];
    }
  }
}

static int cuda_embedding_fwd(ax_backend *be, int n_idx, int dim, int rows,
                              const int32_t *idx, const float *table,
                              float *y) {
  if (n_idx < 0 || dim <= 0 || rows < 0)
    return ax_seterr(AX_EINVAL, "embedding_fwd: bad shape (%d ids, dim %d)",
                     n_idx, dim);
  if (n_idx == 0)
    return AX_OK;
  AX_CUDA_ENTER(be);
  cudaStream_t st = axi_cuda_stream(be);
  int *flag = (int *)be->iface.alloc(be, sizeof(int));
  if (!flag)
    return ax_seterr(AX_ENOMEM, "embedding_fwd: flag");
  int bad = 0, id = 0;
  size_t total = (size_t)n_idx * dim;
  cudaError_t e = cudaMemsetAsync(flag, 0, sizeof(int), st);
  if (e == cudaSuccess) {
    embed_fwd_kernel<<<axi_cuda_grid(total), AXI_CUDA_THREADS, 0, st>>>(
        n_idx, dim, rows, idx, table, y, flag, total);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(&bad, flag, sizeof(int), cudaMemcpyDeviceToHost, st);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(st);
  if (e == cudaSuccess && bad > 0) {
    e = cudaMemcpyAsync(&id, idx + (n_idx - bad), sizeof(int32_t),
                        cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess)
      e = cudaStreamSynchronize(st);
  }
  be->iface.free(be, flag);
  if (e != cudaSuccess)
    return ax_seterr(AX_ECUDA, "embedding_fwd: %s", cudaGetErrorString(e));
  if (bad > 0)
    return ax_seterr(AX_EINVAL,
                     "embedding: id %d at position %d outside [0, %d)", id,
                     n_idx - bad, rows);
  return AX_OK;
}

__global__ static void iota_kernel(int32_t *v, int n) {
  AXI_GRID_STRIDE(i, (size_t)n) v[i] = (int32_t)i;
}

/* Block (p, c): sorted position p, columns [c * blockDim.x, +blockDim.x).
 * Only the first position of each run of equal ids does work. */
__global__ static void embed_bwd_kernel(int n, int dim, const int32_t *keys,
                                        const int32_t *pos, const float *dy,
                                        float *dtable) {
  const int p = blockIdx.x;
  const int32_t key = keys[p];
  if (key < 0 || (p > 0 && keys[p - 1] == key))
    return;
  const int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (j >= dim)
    return;
  float *t = dtable + (size_t)key * dim + j;
  float acc = *t;
  for (int q = p; q < n && keys[q] == key; q++)
    acc += dy[(size_t)pos[q] * dim + j];
  *t = acc;
}

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

static int cuda_embedding_bwd(ax_backend *be, int n_idx, int dim,
                              const int32_t *idx, const float *dy,
                              float *dtable) {
  if (n_idx < 0 || dim <= 0)
    return ax_seterr(AX_EINVAL, "embedding_bwd: bad shape (%d ids, dim %d)",
                     n_idx, dim);
  if (n_idx == 0)
    return AX_OK;
  if ((dim + 127) / 128 > 65535)
    return ax_seterr(AX_EINVAL, "embedding_bwd: dim %d too large", dim);
  AX_CUDA_ENTER(be);
  cudaStream_t st = axi_cuda_stream(be);
  size_t temp = 0;
  cudaError_t e = cub::DeviceRadixSort::SortPairs(
      NULL, temp, (const int32_t *)NULL, (int32_t *)NULL, (const int32_t *)NULL,
      (int32_t *)NULL, n_idx, 0, 32, st);
  if (e != cudaSuccess)
    return ax_seterr(AX_ECUDA, "embedding_bwd: sort size: %s",
                     cudaGetErrorString(e));
  const size_t vec = align256(sizeof(int32_t) * (size_t)n_idx);
  char *buf = (char *)be->iface.alloc(be, 3 * vec + temp);
  if (!buf)
    return ax_seterr(AX_ENOMEM, "embedding_bwd: scratch for %d ids", n_idx);
  int32_t *keys = (int32_t *)buf, *pos_in = (int32_t *)(buf + vec),
          *pos = (int32_t *)(buf + 2 * vec);
  void *tmp = buf + 3 * vec;
  iota_kernel<<<axi_cuda_grid((size_t)n_idx), AXI_CUDA_THREADS, 0, st>>>(pos_in,
                                                                         n_idx);
  e = cudaGetLastError();
  if (e == cudaSuccess)
    e = cub::DeviceRadixSort::SortPairs(tmp, temp, idx, keys, pos_in, pos,
                                        n_idx, 0, 32, st);
  if (e == cudaSuccess) {
    const int bx = dim < 128 ? 32 * ((dim + 31) / 32) : 128;
    dim3 grid((unsigned)n_idx, (unsigned)((dim + bx - 1) / bx));
    embed_bwd_kernel<<<grid, bx, 0, st>>>(n_idx, dim, keys, pos, dy, dtable);
    e = cudaGetLastError();
  }
  be->iface.free(be, buf);
  if (e != cudaSuccess)
    return ax_seterr(AX_ECUDA, "embedding_bwd: %s", cudaGetErrorString(e));
  return AX_OK;
}

void axi_cuda_ops_embed(ax_backend_i *i) {
  i->embedding_fwd = cuda_embedding_fwd;
  i->embedding_bwd = cuda_embedding_bwd;
}
