/* CUDA backend, dnn family: the per-backend cuDNN state (see
 * cuda_dnn.cuh) and the family's registration. The ops live in
 * cuda_dnn_conv.cu (convolutions), cuda_dnn_bn.cu (batch norm) and
 * cuda_dnn_pool.cu (pooling). */
#include <stdlib.h>

#include "axon/kernels/cuda/cuda_dnn.cuh"

/* ---- state ---- */

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;

static int state_create(axi_cuda_ctx *ctx, axi_dnn_state **out) {
  axi_dnn_state *s = (axi_dnn_state *)calloc(1, sizeof *s);
  if (!s)
    return AX_ENOMEM;
  cudnnStatus_t st = cudnnCreate(&s->handle);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnSetStream(s->handle, ctx->stream);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnCreateTensorDescriptor(&s->bn_x);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnCreateTensorDescriptor(&s->bn_p);
  if (st != CUDNN_STATUS_SUCCESS) {
    if (s->bn_x)
      cudnnDestroyTensorDescriptor(s->bn_x);
    if (s->handle)
      cudnnDestroy(s->handle);
    free(s);
    return ax_seterr(AX_ECUDNN, "cuda:%d: cuDNN initialisation: %s",
                     ctx->ordinal, cudnnGetErrorString(st));
  }
  pthread_mutex_init(&s->lock, NULL);
  *out = s;
  return AX_OK;
}

int axi_dnn_lock(ax_backend *be, axi_dnn_state **out) {
  axi_cuda_ctx *ctx = (axi_cuda_ctx *)be->ctx;
  AX_CUDA_ENTER(be);
  axi_dnn_state *s =
      (axi_dnn_state *)__atomic_load_n(&ctx->dnn, __ATOMIC_ACQUIRE);
  if (!s) {
    pthread_mutex_lock(&init_lock);
    s = (axi_dnn_state *)ctx->dnn;
    int rc = s ? AX_OK : state_create(ctx, &s);
    if (rc == AX_OK && !ctx->dnn) {
      ctx->cudnn = s->handle;
      __atomic_store_n(&ctx->dnn, (void *)s, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&init_lock);
    if (rc != AX_OK)
      return rc;
  }
  pthread_mutex_lock(&s->lock);
  *out = s;
  return AX_OK;
}

void axi_dnn_unlock(axi_dnn_state *s) { pthread_mutex_unlock(&s->lock); }

int axi_dnn_workspace(ax_backend *be, axi_dnn_state *s, size_t bytes,
                      void **out) {
  if (bytes > s->ws_bytes) {
    if (s->ws)
      be->iface.free(be, s->ws);
    s->ws = NULL;
    s->ws_bytes = 0;
    size_t want = (bytes + (1u << 20) - 1) & ~(size_t)((1u << 20) - 1);
    void *p = be->iface.alloc(be, want);
    if (!p)
      return ax_seterr(AX_ENOMEM, "cuDNN workspace of %zu bytes", want);
    s->ws = p;
    s->ws_bytes = want;
  }
  *out = s->ws;
  return AX_OK;
}

extern "C" int axi_cuda_dnn_stats(ax_backend *be, int64_t *selects,
                                  int64_t *hits) {
  axi_dnn_state *s;
  AX_TRY(axi_dnn_lock(be, &s));
  if (selects)
    *selects = s->selects;
  if (hits)
    *hits = s->hits;
  axi_dnn_unlock(s);
  return AX_OK;
}

void axi_cuda_ops_dnn(ax_backend_i *i) {
  axi_cuda_dnn_ops_conv(i);
  axi_cuda_dnn_ops_bn(i);
  axi_cuda_dnn_ops_pool(i);
}
