/* CUDA backend: a caching device allocator and pinned host staging.
 *
 * Allocator contract:
 *  - Requests are rounded to size classes: multiples of 512 B up to 1 MiB,
 *    multiples of 2 MiB above (0 bytes counts as 1). A freed block goes to
 *    its class's free list and is handed out again only for a request of
 *    the same class (no splitting, no merging); cudaMalloc runs only when
 *    that list is empty.
 *  - When cudaMalloc fails for lack of memory, every cached block is
 *    cudaFree'd (after synchronising the backend's stream) and the
 *    cudaMalloc retried once; if it fails again the request returns NULL
 *    and the CUDA error state is cleared, so later launches do not report
 *    the failed allocation as their own error.
 *  - Stream-ordered reuse: every kernel and copy of a backend runs on its
 *    one stream (ctx->stream). A block freed while kernels that use it are
 *    still queued can therefore be handed to a new owner at once: whatever
 *    the new owner queues runs after them. This holds only for work on
 *    ctx->stream; code that touches a block from another stream or from
 *    the host asynchronously must synchronise before freeing it.
 *  - One mutex per backend guards the lists, so alloc/free may come from
 *    any thread. A pointer that was not handed out here is ignored by free.
 *  - Stats count class sizes: in_use (handed out), cached (on free lists),
 *    mallocs (successful cudaMalloc calls).
 *
 * Host staging: copies of at least 256 KiB to or from pageable host memory
 * go through two pinned buffers of 4 MiB (allocated on first use, per
 * backend), double-buffered so that the host memcpy of one chunk overlaps
 * the DMA of the other. Smaller copies and pinned host memory take one
 * cudaMemcpyAsync. Every host copy is complete when it returns. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/cuda/cuda_common.cuh"

#define SMALL_LIMIT ((size_t)1 << 20)
#define SMALL_ROUND ((size_t)512)
#define N_SMALL ((int)(SMALL_LIMIT / SMALL_ROUND)) /* class i: (i+1)*512 B */
#define LARGE_ROUND ((size_t)2 << 20)
#define STAGE_MIN ((size_t)256 << 10)
#define STAGE_CHUNK ((size_t)4 << 20)

typedef struct blk {
  void *ptr;
  size_t size;      /* class size */
  struct blk *next; /* free list, or hash chain while in use */
} blk;

typedef struct alloc_state {
  pthread_mutex_t lock;
  blk *small[N_SMALL]; /* free lists of the classes up to 1 MiB */
  blk *large;          /* free blocks above 1 MiB, any size */
  blk **bucket;        /* in-use blocks by pointer */
  size_t nbucket, nused;
  size_t in_use, cached;
  long mallocs;
  /* pinned staging, guarded by stage_lock */
  pthread_mutex_t stage_lock;
  int stage; /* 0 not tried, 1 ready, -1 unavailable */
  void *pin[2];
  cudaEvent_t ev[2];
} alloc_state;

static size_t class_size(size_t b) {
  if (b == 0)
    b = 1;
  if (b <= SMALL_LIMIT)
    return (b + SMALL_ROUND - 1) & ~(SMALL_ROUND - 1);
  if (b > SIZE_MAX - LARGE_ROUND)
    return 0;
  return (b + LARGE_ROUND - 1) / LARGE_ROUND * LARGE_ROUND;
}

static size_t hash_ptr(const void *p, size_t nbucket) {
  uint64_t h = ((uint64_t)(uintptr_t)p >> 9) * 0x9e3779b97f4a7c15ull;
  return (size_t)(h >> 32) & (nbucket - 1);
}

/* Doubles the table when it is twice as full as it has buckets; on
 * malloc failure the table stays as it is (chains just get longer). */
static void hash_grow(alloc_state *a) {
  if (a->nused < 2 * a->nbucket)
    return;
  size_t nb = 2 * a->nbucket;
  blk **nt = (blk **)calloc(nb, sizeof *nt);
  if (!nt)
    return;
  for (size_t i = 0; i < a->nbucket; i++)
    for (blk *b = a->bucket[i], *nx; b; b = nx) {
      nx = b->next;
      size_t h = hash_ptr(b->ptr, nb);
      b->next = nt[h];
      nt[h] = b;
    }
  free(a->bucket);
  a->bucket = nt;
  a->nbucket = nb;
}

static void hash_put(alloc_state *a, blk *b) {
  hash_grow(a);
  size_t h = hash_ptr(b->ptr, a->nbucket);
  b->next = a->bucket[h];
  a->bucket[h] = b;
  a->nused++;
}

static blk *hash_take(alloc_state *a, const void *p) {
  for (blk **pp = &a->bucket[hash_ptr(p, a->nbucket)]; *pp; pp = &(*pp)->next)
    if ((*pp)->ptr == p) {
      blk *b = *pp;
      *pp = b->next;
      a->nused--;
      return b;
    }
  return NULL;
}

static blk *free_pop(alloc_state *a, size_t size) {
  blk **pp =
      size <= SMALL_LIMIT ? &a->small[size / SMALL_ROUND - 1] : &a->large;
  for (; *pp; pp = &(*pp)->next)
    if ((*pp)->size == size) {
      blk *b = *pp;
      *pp = b->next;
      a->cached -= size;
      return b;
    }
  return NULL;
}

static void free_push(alloc_state *a, blk *b) {
  blk **head =
      b->size <= SMALL_LIMIT ? &a->small[b->size / SMALL_ROUND - 1] : &a->large;
  b->next = *head;
  *head = b;
  a->cached += b->size;
}

static void free_list_release(blk **head) {
  for (blk *b = *head, *nx; b; b = nx) {
    nx = b->next;
    cudaFree(b->ptr);
    free(b);
  }
  *head = NULL;
}

/* cudaFree's every cached block. Blocks on the free lists may still be
 * used by queued kernels (stream-ordered reuse), so the stream drains
 * first. Called with a->lock held. */
static void release_cached(axi_cuda_ctx *ctx, alloc_state *a) {
  (void)cudaStreamSynchronize(ctx->stream);
  for (int i = 0; i < N_SMALL; i++)
    free_list_release(&a->small[i]);
  free_list_release(&a->large);
  a->cached = 0;
  (void)cudaGetLastError();
}

int axi_cuda_alloc_init(axi_cuda_ctx *ctx) {
  alloc_state *a = (alloc_state *)calloc(1, sizeof *a);
  if (!a)
    return ax_seterr(AX_ENOMEM, "cuda allocator: no host memory");
  a->nbucket = 1024;
  a->bucket = (blk **)calloc(a->nbucket, sizeof *a->bucket);
  if (!a->bucket) {
    free(a);
    return ax_seterr(AX_ENOMEM, "cuda allocator: no host memory");
  }
  pthread_mutex_init(&a->lock, NULL);
  pthread_mutex_init(&a->stage_lock, NULL);
  ctx->alloc = a;
  return AX_OK;
}

/* The caller has made ctx's device current. */
void *axi_cuda_malloc(axi_cuda_ctx *ctx, size_t bytes) {
  alloc_state *a = (alloc_state *)ctx->alloc;
  size_t size = class_size(bytes);
  if (size == 0)
    return NULL;
  pthread_mutex_lock(&a->lock);
  blk *b = free_pop(a, size);
  if (!b && (b = (blk *)malloc(sizeof *b)) != NULL) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached(ctx, a);
      e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError(); /* not this caller's next launch's error */
      free(b);
      b = NULL;
    } else {
      a->mallocs++;
      b->ptr = p;
      b->size = size;
    }
  }
  if (b) {
    hash_put(a, b);
    a->in_use += size;
  }
  pthread_mutex_unlock(&a->lock);
  return b ? b->ptr : NULL;
}

void axi_cuda_mfree(axi_cuda_ctx *ctx, void *ptr) {
  alloc_state *a = (alloc_state *)ctx->alloc;
  if (!ptr)
    return;
  pthread_mutex_lock(&a->lock);
  blk *b = hash_take(a, ptr);
  if (b) {
    a->in_use -= b->size;
    free_push(a, b);
  }
  pthread_mutex_unlock(&a->lock);
}

extern "C" void axi_cuda_alloc_stats(ax_backend *be, size_t *in_use,
                                     size_t *cached, long *mallocs) {
  alloc_state *a = (alloc_state *)((axi_cuda_ctx *)be->ctx)->alloc;
  pthread_mutex_lock(&a->lock);
  if (in_use)
    *in_use = a->in_use;
  if (cached)
    *cached = a->cached;
  if (mallocs)
    *mallocs = a->mallocs;
  pthread_mutex_unlock(&a->lock);
}

/* ---- host copies --------------------------------------------------------- */

static int copy_direct(axi_cuda_ctx *ctx, void *dst, const void *src,
                       size_t bytes, cudaMemcpyKind kind) {
  AX_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, ctx->stream));
  AX_CUDA_TRY(cudaStreamSynchronize(ctx->stream));
  return AX_OK;
}

/* Plain malloc'd (pageable) host memory: the only kind that is staged. */
static int is_pageable(const void *p) {
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return at.type == cudaMemoryTypeUnregistered;
}

/* Creates the pinned buffers and their events once; with stage_lock held.
 * Returns whether staging is available (it is not when pinned memory
 * cannot be had; the copies then go direct). */
static int stage_ready(alloc_state *a) {
  if (a->stage != 0)
    return a->stage > 0;
  a->stage = -1;
  void *p = NULL;
  if (cudaHostAlloc(&p, 2 * STAGE_CHUNK, cudaHostAllocDefault) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (cudaEventCreateWithFlags(&a->ev[0], cudaEventDisableTiming) !=
      cudaSuccess) {
    cudaFreeHost(p);
    (void)cudaGetLastError();
    return 0;
  }
  if (cudaEventCreateWithFlags(&a->ev[1], cudaEventDisableTiming) !=
      cudaSuccess) {
    cudaEventDestroy(a->ev[0]);
    cudaFreeHost(p);
    (void)cudaGetLastError();
    return 0;
  }
  a->pin[0] = p;
  a->pin[1] = (char *)p + STAGE_CHUNK;
  a->stage = 1;
  return 1;
}

/* Chunk i goes through buffer i % 2: the host fills it once the DMA that
 * last read it (chunk i - 2, event ev[i % 2]) has finished, so the fill of
 * one buffer overlaps the DMA out of the other. */
static int h2d_staged(axi_cuda_ctx *ctx, alloc_state *a, char *dst,
                      const char *src, size_t bytes) {
  int k = 0, last = 0;
  for (size_t off = 0; off < bytes; off += STAGE_CHUNK) {
    size_t len = bytes - off < STAGE_CHUNK ? bytes - off : STAGE_CHUNK;
    AX_CUDA_TRY(cudaEventSynchronize(a->ev[k]));
    memcpy(a->pin[k], src + off, len);
    AX_CUDA_TRY(cudaMemcpyAsync(dst + off, a->pin[k], len,
                                cudaMemcpyHostToDevice, ctx->stream));
    AX_CUDA_TRY(cudaEventRecord(a->ev[k], ctx->stream));
    last = k;
    k ^= 1;
  }
  AX_CUDA_TRY(cudaEventSynchronize(a->ev[last]));
  return AX_OK;
}

/* Chunk i's DMA into buffer i % 2 is queued before the host drains chunk
 * i - 1 out of the other buffer, so the two overlap. A buffer is refilled
 * only after the host drained it (synchronously, one iteration earlier). */
static int d2h_staged(axi_cuda_ctx *ctx, alloc_state *a, char *dst,
                      const char *src, size_t bytes) {
  int k = 0;
  size_t prev_off = 0, prev_len = 0;
  for (size_t off = 0; off < bytes; off += STAGE_CHUNK) {
    size_t len = bytes - off < STAGE_CHUNK ? bytes - off : STAGE_CHUNK;
    AX_CUDA_TRY(cudaMemcpyAsync(a->pin[k], src + off, len,
                                cudaMemcpyDeviceToHost, ctx->stream));
    AX_CUDA_TRY(cudaEventRecord(a->ev[k], ctx->stream));
    if (off > 0) {
      AX_CUDA_TRY(cudaEventSynchronize(a->ev[k ^ 1]));
      memcpy(dst + prev_off, a->pin[k ^ 1], prev_len);
    }
    prev_off = off;
    prev_len = len;
    k ^= 1;
  }
  AX_CUDA_TRY(cudaEventSynchronize(a->ev[k ^ 1]));
  memcpy(dst + prev_off, a->pin[k ^ 1], prev_len);
  return AX_OK;
}

static int copy_host(axi_cuda_ctx *ctx, void *dst, const void *src,
                     size_t bytes, int to_device) {
  cudaMemcpyKind kind =
      to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  if (bytes == 0)
    return AX_OK;
  alloc_state *a = (alloc_state *)ctx->alloc;
  if (bytes < STAGE_MIN || !is_pageable(to_device ? src : dst))
    return copy_direct(ctx, dst, src, bytes, kind);
  pthread_mutex_lock(&a->stage_lock);
  int rc;
  if (!stage_ready(a))
    rc = copy_direct(ctx, dst, src, bytes, kind);
  else if (to_device)
    rc = h2d_staged(ctx, a, (char *)dst, (const char *)src, bytes);
  else
    rc = d2h_staged(ctx, a, (char *)dst, (const char *)src, bytes);
  /* After a failure some DMA may still be queued on the buffers: drain it
   * before the next copy may refill them. */
  if (rc != AX_OK)
    (void)cudaStreamSynchronize(ctx->stream);
  pthread_mutex_unlock(&a->stage_lock);
  return rc;
}

int axi_cuda_copy_h2d(axi_cuda_ctx *ctx, void *dst, const void *src,
                      size_t bytes) {
  return copy_host(ctx, dst, src, bytes, 1);
}

int axi_cuda_copy_d2h(axi_cuda_ctx *ctx, void *dst, const void *src,
                      size_t bytes) {
  return copy_host(ctx, dst, src, bytes, 0);
}
