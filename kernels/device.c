#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend-impl.h"
#include "runtime/error.h"

#define AX_MAX_CUDA_DEVICES 16

static pthread_mutex_t backends_lock = PTHREAD_MUTEX_INITIALIZER;
static ax_backend cpu_backend;
static int cpu_ready;
static ax_backend cuda_backends[AX_MAX_CUDA_DEVICES];
static int cuda_ready[AX_MAX_CUDA_DEVICES];

int ax_device_parse(const char *s, ax_device *out) {
  if (!s)
    return ax_seterr(AX_EINVAL, "device: missing name");
  if (strcmp(s, "cpu") == 0) {
    *out = AX_CPU;
    return AX_OK;
  }
  if (strcmp(s, "cuda") == 0) {
    *out = (ax_device){AX_DEV_CUDA, 0};
    return AX_OK;
  }
  if (strncmp(s, "cuda:", 5) == 0) {
    char *end;
    long i = strtol(s + 5, &end, 10);
    if (*end == '\0' && end != s + 5 && i >= 0 && i < AX_MAX_CUDA_DEVICES) {
      *out = (ax_device){AX_DEV_CUDA, (int)i};
      return AX_OK;
    }
  }
  return ax_seterr(AX_EINVAL, "device: '%s' is not cpu, cuda or cuda:N", s);
}

char *ax_device_str(ax_device d, char *buf, size_t len) {
  if (d.type == AX_DEV_CPU)
    snprintf(buf, len, "cpu");
  else
    snprintf(buf, len, "cuda:%d", d.index);
  return buf;
}

int ax_device_eq(ax_device a, ax_device b) {
  return a.type == b.type && (a.type == AX_DEV_CPU || a.index == b.index);
}

int ax_backend_get(ax_device d, ax_backend **out) {
  int rc = AX_OK;
  pthread_mutex_lock(&backends_lock);
  if (d.type == AX_DEV_CPU) {
    if (!cpu_ready && (rc = axi_cpu_backend_init(&cpu_backend)) == AX_OK)
      cpu_ready = 1;
    *out = &cpu_backend;
  } else if (d.type == AX_DEV_CUDA && d.index >= 0 &&
             d.index < AX_MAX_CUDA_DEVICES) {
    if (!cuda_ready[d.index] &&
        (rc = axi_cuda_backend_init(&cuda_backends[d.index], d.index)) ==
            AX_OK)
      cuda_ready[d.index] = 1;
    *out = &cuda_backends[d.index];
  } else {
    rc = ax_seterr(AX_ENODEV, "device: unknown device type %d", (int)d.type);
  }
  pthread_mutex_unlock(&backends_lock);
  if (rc != AX_OK)
    *out = NULL;
  return rc;
}

ax_backend *ax_backend_of(ax_device d) {
  ax_backend *be = NULL;
  ax_backend_get(d, &be);
  return be;
}

int ax_device_synchronize(ax_device d) {
  ax_backend *be;
  AX_TRY(ax_backend_get(d, &be));
  return AX_K(be, synchronize);
}

int ax_cuda_device_count(void) { return axi_cuda_device_count(); }

int ax_conv_desc_init(ax_conv_desc *d) {
  if (d->n <= 0 || d->c <= 0 || d->h <= 0 || d->w <= 0 || d->k <= 0 ||
      d->r <= 0 || d->s <= 0 || d->stride <= 0 || d->pad < 0)
    return ax_seterr(AX_EINVAL, "conv: bad geometry");
  int span_h = d->h + 2 * d->pad - d->r, span_w = d->w + 2 * d->pad - d->s;
  d->oh = span_h < 0 ? 0 : span_h / d->stride + 1;
  d->ow = span_w < 0 ? 0 : span_w / d->stride + 1;
  if (d->oh <= 0 || d->ow <= 0)
    return ax_seterr(AX_ESHAPE, "conv: %dx%d input too small for %dx%d filter",
                     d->h, d->w, d->r, d->s);
  return AX_OK;
}

int ax_pool_desc_init(ax_pool_desc *d) {
  if (d->n <= 0 || d->c <= 0 || d->h <= 0 || d->w <= 0 || d->kh <= 0 ||
      d->kw <= 0 || d->stride <= 0 || d->pad < 0 || 2 * d->pad > d->kh ||
      2 * d->pad > d->kw)
    return ax_seterr(AX_EINVAL, "pool: bad geometry");
  int span_h = d->h + 2 * d->pad - d->kh, span_w = d->w + 2 * d->pad - d->kw;
  d->oh = span_h < 0 ? 0 : span_h / d->stride + 1;
  d->ow = span_w < 0 ? 0 : span_w / d->stride + 1;
  if (d->oh <= 0 || d->ow <= 0)
    return ax_seterr(AX_ESHAPE, "pool: %dx%d input too small for %dx%d window",
                     d->h, d->w, d->kh, d->kw);
  return AX_OK;
}
