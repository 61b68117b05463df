/* A stand-in for the CUDA backend on machines without a GPU, for the
 * test_cuda_* programs and the agents they start (LD_PRELOAD=libfake_cuda.so,
 * see tests/CMakeLists.txt). It replaces axi_cuda_device_count (one device,
 * or $AXON_FAKE_CUDA_DEVICES) and axi_cuda_backend_init, which libaxon calls
 * through the PLT.
 *
 * "Device" memory is host memory whose pointers carry a tag that makes them
 * non-canonical: any host dereference of a device pointer outside a kernel
 * faults at once, so device data that escapes ax_tensor_read/_write/_copy
 * or a kernel shows up as a crash. Kernels strip the tag and run the CPU
 * backend's kernel; only those the MLP needs are provided (the others stay
 * NULL: AX_EUNSUPPORTED). The numbers are the CPU's, so this checks the
 * device plumbing, not the CUDA kernels. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"

#define TAG ((uintptr_t)1 << 62)

static ax_backend g_cpu_backend, *g_cpu = &g_cpu_backend;

static void *dev(const void *p) {
  return p ? (void *)((uintptr_t)p + TAG) : NULL;
}
static void *host(const void *p) {
  return p ? (void *)((uintptr_t)p - TAG) : NULL;
}
#define H(p) ((__typeof__(p))host(p))

static void *f_alloc(ax_backend *be, size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  return p ? dev(p) : NULL;
}
static void f_free(ax_backend *be, void *p) { free(host(p)); }
static int f_from_host(ax_backend *be, void *d, const void *s, size_t n) {
  memcpy(host(d), s, n);
  return AX_OK;
}
static int f_to_host(ax_backend *be, void *d, const void *s, size_t n) {
  memcpy(d, host(s), n);
  return AX_OK;
}
static int f_copy(ax_backend *be, void *d, const void *s, size_t n) {
  memmove(host(d), host(s), n);
  return AX_OK;
}
static int f_sync(ax_backend *be) { return AX_OK; }

static int f_gemm(ax_backend *be, int ta, int tb, int m, int n, int k,
                  float alpha, const float *a, int lda, long sa, const float *b,
                  int ldb, long sb, float beta, float *c, int ldc, long sc,
                  int batch) {
  return AX_K(g_cpu, gemm, ta, tb, m, n, k, alpha, H(a), lda, sa, H(b), ldb, sb,
              beta, H(c), ldc, sc, batch);
}
static int f_fill(ax_backend *be, float *x, size_t n, float v) {
  return AX_K(g_cpu, fill, H(x), n, v);
}
static int f_axpby(ax_backend *be, size_t n, float a, const float *x, float b,
                   float *y) {
  return AX_K(g_cpu, axpby, n, a, H(x), b, H(y));
}
static int f_sum(ax_backend *be, size_t n, const float *x, double *out_host) {
  return AX_K(g_cpu, sum, n, H(x), out_host);
}
static int f_bias_add(ax_backend *be, float *y, const float *bias, int o, int c,
                      int i) {
  return AX_K(g_cpu, bias_add, H(y), H(bias), o, c, i);
}
static int f_bias_grad(ax_backend *be, const float *dy, float *db, int o, int c,
                       int i) {
  return AX_K(g_cpu, bias_grad, H(dy), H(db), o, c, i);
}
static int f_relu_fwd(ax_backend *be, size_t n, const float *x, float *y) {
  return AX_K(g_cpu, relu_fwd, n, H(x), H(y));
}
static int f_relu_bwd(ax_backend *be, size_t n, const float *y, const float *dy,
                      float *dx) {
  return AX_K(g_cpu, relu_bwd, n, H(y), H(dy), H(dx));
}
static int f_xent_fwd(ax_backend *be, int rows, int classes,
                      const float *logits, const int32_t *labels, int ignore,
                      float *probs, double *loss_host, int64_t *count_host,
                      int64_t *correct_host) {
  return AX_K(g_cpu, xent_fwd, rows, classes, H(logits), H(labels), ignore,
              H(probs), loss_host, count_host, correct_host);
}
static int f_xent_bwd(ax_backend *be, int rows, int classes, const float *probs,
                      const int32_t *labels, int ignore, float scale,
                      float *dlogits) {
  return AX_K(g_cpu, xent_bwd, rows, classes, H(probs), H(labels), ignore,
              scale, H(dlogits));
}
static int f_sgd(ax_backend *be, size_t n, float *w, const float *g, float *mom,
                 float lr, float momentum, float damp, float wd, int nesterov,
                 int first) {
  return AX_K(g_cpu, sgd_step, n, H(w), H(g), H(mom), lr, momentum, damp, wd,
              nesterov, first);
}
static int f_adamw(ax_backend *be, size_t n, float *w, const float *g, float *m,
                   float *v, float lr, float b1, float b2, float eps, float wd,
                   int step) {
  return AX_K(g_cpu, adamw_step, n, H(w), H(g), H(m), H(v), lr, b1, b2, eps, wd,
              step);
}

int axi_cuda_device_count(void) {
  const char *s = getenv("AXON_FAKE_CUDA_DEVICES");
  return s && *s ? atoi(s) : 1;
}

int axi_cuda_backend_init(ax_backend *be, int ordinal) {
  if (ordinal >= axi_cuda_device_count())
    return ax_seterr(AX_ENODEV, "cuda:%d: fake CUDA has %d device(s)", ordinal,
                     axi_cuda_device_count());
  AX_TRY(axi_cpu_backend_init(g_cpu)); /* ax_backend_get holds its lock */
  ax_backend_i i;
  memset(&i, 0, sizeof i);
  i.name = "fake-cuda";
  i.alloc = f_alloc;
  i.free = f_free;
  i.copy_from_host = f_from_host;
  i.copy_to_host = f_to_host;
  i.copy = f_copy;
  i.synchronize = f_sync;
  i.gemm = f_gemm;
  i.fill = f_fill;
  i.axpby = f_axpby;
  i.sum = f_sum;
  i.bias_add = f_bias_add;
  i.bias_grad = f_bias_grad;
  i.relu_fwd = f_relu_fwd;
  i.relu_bwd = f_relu_bwd;
  i.xent_fwd = f_xent_fwd;
  i.xent_bwd = f_xent_bwd;
  i.sgd_step = f_sgd;
  i.adamw_step = f_adamw;
  be->iface = i;
  be->device = (ax_device){AX_DEV_CUDA, ordinal};
  be->ctx = NULL;
  return AX_OK;
}
