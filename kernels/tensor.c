#include "axon/kernels/tensor.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"

struct ax_storage {
  atomic_int refcount;
  ax_device device;
  void *ptr;
  size_t bytes;
  /* Set by ax_tensor_from_blob: called instead of the backend's free. */
  void (*release)(void *ctx, void *data);
  void *release_ctx;
};

static atomic_long live_tensors;
static atomic_long live_storages;

long ax_tensor_live_count(void) { return atomic_load(&live_tensors); }
long ax_storage_live_count(void) { return atomic_load(&live_storages); }

size_t ax_dtype_size(ax_dtype t) {
  switch (t) {
  case AX_F32:
  case AX_I32:
    return 4;
  case AX_I64:
    return 8;
  case AX_BF16:
    return 2;
  }
  return 0;
}

const char *ax_dtype_name(ax_dtype t) {
  switch (t) {
  case AX_F32:
    return "f32";
  case AX_I32:
    return "i32";
  case AX_I64:
    return "i64";
  case AX_BF16:
    return "bf16";
  }
  return "?";
}

static void storage_release(ax_storage *s) {
  if (!s || atomic_fetch_sub(&s->refcount, 1) != 1)
    return;
  if (s->release)
    s->release(s->release_ctx, s->ptr);
  else if (s->ptr && !s->release_ctx)
    ax_backend_of(s->device)->iface.free(ax_backend_of(s->device), s->ptr);
  free(s);
  atomic_fetch_sub(&live_storages, 1);
}

static ax_tensor *handle_new(ax_dtype dtype, int ndim, const int64_t *shape,
                             ax_device dev) {
  if (ndim < 0 || ndim > AX_MAX_DIMS || ax_dtype_size(dtype) == 0) {
    ax_seterr(AX_EINVAL, "tensor: bad ndim %d or dtype %d", ndim, (int)dtype);
    return NULL;
  }
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0) {
      ax_seterr(AX_EINVAL, "tensor: negative dimension %lld",
                (long long)shape[i]);
      return NULL;
    }
  ax_tensor *t = calloc(1, sizeof *t);
  if (!t)
    return NULL;
  t->dtype = dtype;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++)
    t->shape[i] = shape[i];
  t->device = dev;
  t->refcount = 1;
  atomic_fetch_add(&live_tensors, 1);
  return t;
}

ax_tensor *ax_tensor_new(ax_dtype dtype, int ndim, const int64_t *shape,
                         ax_device dev) {
  ax_backend *be;
  if (ax_backend_get(dev, &be) != AX_OK)
    return NULL;
  ax_tensor *t = handle_new(dtype, ndim, shape, dev);
  if (!t)
    return NULL;
  ax_storage *s = calloc(1, sizeof *s);
  size_t bytes = ax_tensor_nbytes(t);
  if (!s) {
    free(t);
    atomic_fetch_sub(&live_tensors, 1);
    return NULL;
  }
  s->ptr = be->iface.alloc(be, bytes ? bytes : 1);
  if (!s->ptr) {
    free(s);
    free(t);
    atomic_fetch_sub(&live_tensors, 1);
    ax_seterr(AX_ENOMEM, "tensor: cannot allocate %zu bytes on %s", bytes,
              be->iface.name);
    return NULL;
  }
  atomic_init(&s->refcount, 1);
  s->device = dev;
  s->bytes = bytes;
  atomic_fetch_add(&live_storages, 1);
  t->storage = s;
  t->data = s->ptr;
  return t;
}

/* A blob storage without a release function is marked by a non-NULL
 * release_ctx pointing at this sentinel, so that storage_release frees
 * nothing. */
static char g_borrowed;

ax_tensor *ax_tensor_from_blob(ax_dtype dtype, int ndim, const int64_t *shape,
                               ax_device dev, void *data,
                               void (*release)(void *ctx, void *data),
                               void *ctx) {
  ax_backend *be;
  if (ax_backend_get(dev, &be) != AX_OK)
    return NULL;
  if (!data) {
    ax_seterr(AX_EINVAL, "tensor: from_blob without data");
    return NULL;
  }
  ax_tensor *t = handle_new(dtype, ndim, shape, dev);
  if (!t)
    return NULL;
  ax_storage *s = calloc(1, sizeof *s);
  if (!s) {
    free(t);
    atomic_fetch_sub(&live_tensors, 1);
    ax_seterr(AX_ENOMEM, "tensor: no memory");
    return NULL;
  }
  atomic_init(&s->refcount, 1);
  s->device = dev;
  s->ptr = data;
  s->bytes = ax_tensor_nbytes(t);
  s->release = release;
  s->release_ctx = release ? ctx : &g_borrowed;
  atomic_fetch_add(&live_storages, 1);
  t->storage = s;
  t->data = data;
  return t;
}

ax_tensor *ax_tensor_zeros(ax_dtype dtype, int ndim, const int64_t *shape,
                           ax_device dev) {
  ax_tensor *t = ax_tensor_new(dtype, ndim, shape, dev);
  if (!t)
    return NULL;
  size_t bytes = ax_tensor_nbytes(t), n = bytes / 4;
  ax_backend *be = ax_backend_of(dev);
  int err = AX_K(be, fill, (float *)t->data, n, 0.0f);
  if (err == AX_OK && bytes % 4) { /* an odd count of 2-byte elements */
    static const uint16_t zero;
    err = ax_backend_of(dev)->iface.copy_from_host(
        be, (char *)t->data + bytes - 2, &zero, 2);
  }
  if (err != AX_OK) {
    ax_tensor_release(t);
    return NULL;
  }
  return t;
}

ax_tensor *ax_tensor_new_v(ax_dtype dtype, ax_device dev, int ndim, ...) {
  int64_t shape[AX_MAX_DIMS];
  if (ndim < 0 || ndim > AX_MAX_DIMS)
    return NULL;
  va_list ap;
  va_start(ap, ndim);
  for (int i = 0; i < ndim; i++)
    shape[i] = va_arg(ap, int64_t);
  va_end(ap);
  return ax_tensor_new(dtype, ndim, shape, dev);
}

ax_tensor *ax_tensor_like(const ax_tensor *t) {
  return ax_tensor_new(t->dtype, t->ndim, t->shape, t->device);
}

ax_tensor *ax_tensor_retain(ax_tensor *t) {
  if (t)
    atomic_fetch_add((atomic_int *)&t->refcount, 1);
  return t;
}

void ax_tensor_release(ax_tensor *t) {
  if (!t || atomic_fetch_sub((atomic_int *)&t->refcount, 1) != 1)
    return;
  storage_release(t->storage);
  free(t);
  atomic_fetch_sub(&live_tensors, 1);
}

static ax_tensor *view_of(const ax_tensor *base, size_t byte_off, int ndim,
                          const int64_t *shape, ax_dtype dtype) {
  ax_tensor *v = handle_new(dtype, ndim, shape, base->device);
  if (!v)
    return NULL;
  v->storage = base->storage;
  atomic_fetch_add(&base->storage->refcount, 1);
  v->data = (char *)base->data + byte_off;
  return v;
}

ax_tensor *ax_tensor_slice0(const ax_tensor *t, int64_t start, int64_t len) {
  if (t->ndim < 1 || start < 0 || len < 0 || start + len > t->shape[0]) {
    ax_seterr(AX_EINVAL, "slice0: rows [%lld, %lld) outside %lld",
              (long long)start, (long long)(start + len),
              (long long)(t->ndim ? t->shape[0] : 0));
    return NULL;
  }
  size_t row = ax_tensor_nbytes(t) / (t->shape[0] ? (size_t)t->shape[0] : 1);
  int64_t shape[AX_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  shape[0] = len;
  return view_of(t, row * (size_t)start, t->ndim, shape, t->dtype);
}

ax_tensor *ax_tensor_reshape(const ax_tensor *t, int ndim,
                             const int64_t *shape) {
  size_t n = 1;
  for (int i = 0; i < ndim; i++)
    n *= (size_t)shape[i];
  if (ndim > AX_MAX_DIMS || n != ax_tensor_numel(t)) {
    char b[64];
    ax_seterr(AX_ESHAPE, "reshape: %zu elements into a tensor %s", n,
              ax_tensor_shape_str(t, b, sizeof b));
    return NULL;
  }
  return view_of(t, 0, ndim, shape, t->dtype);
}

ax_tensor *ax_tensor_view(const ax_tensor *base, size_t off, int ndim,
                          const int64_t *shape) {
  size_t n = 1;
  for (int i = 0; i < ndim; i++)
    n *= (size_t)shape[i];
  if (base->dtype != AX_F32 || off + n > ax_tensor_numel(base)) {
    ax_seterr(AX_EINVAL, "view: [%zu, %zu) outside buffer of %zu", off, off + n,
              ax_tensor_numel(base));
    return NULL;
  }
  return view_of(base, off * sizeof(float), ndim, shape, AX_F32);
}

size_t ax_tensor_numel(const ax_tensor *t) {
  size_t n = 1;
  for (int i = 0; i < t->ndim; i++)
    n *= (size_t)t->shape[i];
  return n;
}

size_t ax_tensor_nbytes(const ax_tensor *t) {
  return ax_tensor_numel(t) * ax_dtype_size(t->dtype);
}

int ax_tensor_same_shape(const ax_tensor *a, const ax_tensor *b) {
  if (a->ndim != b->ndim)
    return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i])
      return 0;
  return 1;
}

char *ax_tensor_shape_str(const ax_tensor *t, char *buf, size_t len) {
  size_t o = 0;
  o += (size_t)snprintf(buf + o, len - o, "(");
  for (int i = 0; i < t->ndim && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, i ? ", %lld" : "%lld",
                          (long long)t->shape[i]);
  if (o < len)
    snprintf(buf + o, len - o, ")");
  return buf;
}

int ax_tensor_copy(ax_tensor *dst, const ax_tensor *src) {
  if (dst->dtype != src->dtype || ax_tensor_numel(dst) != ax_tensor_numel(src))
    return ax_seterr(AX_ESHAPE, "copy: %s[%zu] into %s[%zu]",
                     ax_dtype_name(src->dtype), ax_tensor_numel(src),
                     ax_dtype_name(dst->dtype), ax_tensor_numel(dst));
  size_t n = ax_tensor_nbytes(src);
  if (n == 0)
    return AX_OK;
  ax_backend *sb = ax_backend_of(src->device);
  ax_backend *db = ax_backend_of(dst->device);
  if (ax_device_eq(src->device, dst->device))
    return AX_K(sb, copy, dst->data, src->data, n);
  if (src->device.type == AX_DEV_CPU)
    return AX_K(db, copy_from_host, dst->data, src->data, n);
  if (dst->device.type == AX_DEV_CPU)
    return AX_K(sb, copy_to_host, dst->data, src->data, n);
  /* device to device across backends: stage through the host */
  void *tmp = malloc(n);
  if (!tmp)
    return AX_ENOMEM;
  int rc = AX_K(sb, copy_to_host, tmp, src->data, n);
  if (rc == AX_OK)
    rc = AX_K(db, copy_from_host, dst->data, tmp, n);
  free(tmp);
  return rc;
}

ax_tensor *ax_tensor_to(const ax_tensor *t, ax_device dev) {
  if (ax_device_eq(t->device, dev))
    return ax_tensor_retain((ax_tensor *)t);
  ax_tensor *o = ax_tensor_new(t->dtype, t->ndim, t->shape, dev);
  if (o && ax_tensor_copy(o, t) != AX_OK) {
    ax_tensor_release(o);
    return NULL;
  }
  return o;
}

int ax_tensor_write(ax_tensor *t, const void *host, size_t nbytes) {
  if (nbytes != ax_tensor_nbytes(t))
    return ax_seterr(AX_ESHAPE, "write: %zu bytes into a tensor of %zu", nbytes,
                     ax_tensor_nbytes(t));
  if (!nbytes)
    return AX_OK;
  ax_backend *be = ax_backend_of(t->device);
  return AX_K(be, copy_from_host, t->data, host, nbytes);
}

int ax_tensor_read(const ax_tensor *t, void *host, size_t nbytes) {
  if (nbytes != ax_tensor_nbytes(t))
    return ax_seterr(AX_ESHAPE, "read: %zu bytes from a tensor of %zu", nbytes,
                     ax_tensor_nbytes(t));
  if (!nbytes)
    return AX_OK;
  ax_backend *be = ax_backend_of(t->device);
  return AX_K(be, copy_to_host, host, t->data, nbytes);
}

int ax_tensor_fill(ax_tensor *t, float v) {
  if (t->dtype != AX_F32)
    return ax_seterr(AX_EDTYPE, "fill: tensor is %s", ax_dtype_name(t->dtype));
  ax_backend *be = ax_backend_of(t->device);
  return AX_K(be, fill, ax_f32(t), ax_tensor_numel(t), v);
}

ax_tensor *ax_tensor_to_i32(const ax_tensor *t) {
  if (t->dtype == AX_I32)
    return ax_tensor_retain((ax_tensor *)t);
  if (t->dtype != AX_I64) {
    ax_seterr(AX_EDTYPE, "to_i32: tensor is %s", ax_dtype_name(t->dtype));
    return NULL;
  }
  size_t n = ax_tensor_numel(t);
  int64_t *h64 = malloc(n * 8 + 1);
  int32_t *h32 = malloc(n * 4 + 1);
  ax_tensor *o = ax_tensor_new(AX_I32, t->ndim, t->shape, t->device);
  int ok = h64 && h32 && o && ax_tensor_read(t, h64, n * 8) == AX_OK;
  for (size_t i = 0; ok && i < n; i++)
    h32[i] = (int32_t)h64[i];
  if (ok)
    ok = ax_tensor_write(o, h32, n * 4) == AX_OK;
  free(h64);
  free(h32);
  if (!ok) {
    ax_tensor_release(o);
    return NULL;
  }
  return o;
}

int ax_tensor_check(const ax_tensor *t, const char *what, ax_dtype dtype,
                    int ndim, const int64_t *dims) {
  char b[96];
  if (!t)
    return ax_seterr(AX_EINVAL, "%s: missing tensor", what);
  if (t->dtype != dtype)
    return ax_seterr(AX_EDTYPE, "%s: expected %s, got %s", what,
                     ax_dtype_name(dtype), ax_dtype_name(t->dtype));
  if (t->ndim != ndim)
    return ax_seterr(AX_ESHAPE, "%s: expected %d dimensions, got %s", what,
                     ndim, ax_tensor_shape_str(t, b, sizeof b));
  for (int i = 0; dims && i < ndim; i++)
    if (dims[i] >= 0 && dims[i] != t->shape[i])
      return ax_seterr(AX_ESHAPE, "%s: dimension %d should be %lld, got %s",
                       what, i, (long long)dims[i],
                       ax_tensor_shape_str(t, b, sizeof b));
  return AX_OK;
}
