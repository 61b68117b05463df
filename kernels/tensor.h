/* Tensors: dense, contiguous, row-major arrays on a device.
 *
 * A tensor handle is reference counted (ax_tensor_retain / ax_tensor_release)
 * and points into a reference-counted storage. Views along dimension 0
 * (ax_tensor_slice0) share the storage of their base, so a micro-batch is a
 * slice of its batch without a copy. Handles are immutable after creation
 * except for their data, so they may be shared between threads; writing the
 * same data from two threads is the caller's problem.
 *
 * Ownership: every function that returns a new ax_tensor* gives the caller one
 * reference. Functions taking `const ax_tensor *` borrow it. */
#ifndef AX_TENSOR_H
#define AX_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "axon/kernels/device.h"
#include "axon/kernels/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AX_MAX_DIMS 6

/* AX_BF16 elements are uint16_t bit patterns (kernels/bf16.h). */
typedef enum ax_dtype {
  AX_F32 = 0,
  AX_I32 = 1,
  AX_I64 = 2,
  AX_BF16 = 3
} ax_dtype;

typedef struct ax_storage ax_storage;

typedef struct ax_tensor {
  ax_dtype dtype;
  int ndim;
  int64_t shape[AX_MAX_DIMS];
  ax_device device;
  void *data;          /* first element (a device pointer off the CPU) */
  ax_storage *storage; /* owner of the bytes; shared by views */
  int refcount;        /* atomic; use retain/release */
} ax_tensor;

size_t ax_dtype_size(ax_dtype t);
const char *ax_dtype_name(ax_dtype t);

/* New uninitialised tensor. ndim in [0, AX_MAX_DIMS]; every dim >= 0.
 * Returns NULL (ax_errmsg set) on bad shape, unknown device or no memory. */
ax_tensor *ax_tensor_new(ax_dtype dtype, int ndim, const int64_t *shape,
                         ax_device dev);
/* A tensor over caller-provided memory `data` (at least
 * ax_tensor_nbytes bytes on dev). The tensor takes ownership of the memory:
 * when the last handle or view goes, release(ctx, data) is called (from
 * whichever thread drops it) instead of the backend's free. release may be
 * NULL for memory that outlives every handle. Counts as one live tensor and
 * one live storage like ax_tensor_new. On failure (bad shape, no memory)
 * returns NULL and release is NOT called: the caller keeps the memory. */
ax_tensor *ax_tensor_from_blob(ax_dtype dtype, int ndim, const int64_t *shape,
                               ax_device dev, void *data,
                               void (*release)(void *ctx, void *data),
                               void *ctx);
/* Same, zero-filled. */
ax_tensor *ax_tensor_zeros(ax_dtype dtype, int ndim, const int64_t *shape,
                           ax_device dev);
/* Convenience for literal shapes: ax_tensor_new_v(AX_F32, AX_CPU, 2, 3, 4). */
ax_tensor *ax_tensor_new_v(ax_dtype dtype, ax_device dev, int ndim, ...);
/* A new tensor with the dtype, shape and device of t. */
ax_tensor *ax_tensor_like(const ax_tensor *t);

ax_tensor *ax_tensor_retain(ax_tensor *t); /* returns t; NULL-safe */
void ax_tensor_release(ax_tensor *t);      /* NULL-safe */

/* Rows [start, start + len) along dimension 0, sharing storage. */
ax_tensor *ax_tensor_slice0(const ax_tensor *t, int64_t start, int64_t len);
/* The same storage seen with another shape of equal element count. */
ax_tensor *ax_tensor_reshape(const ax_tensor *t, int ndim,
                             const int64_t *shape);
/* A view of `numel` elements of a flat f32 buffer starting at element off,
 * with the given shape (used to carve parameters out of one buffer). */
ax_tensor *ax_tensor_view(const ax_tensor *base, size_t off, int ndim,
                          const int64_t *shape);

size_t ax_tensor_numel(const ax_tensor *t);
size_t ax_tensor_nbytes(const ax_tensor *t);
int ax_tensor_same_shape(const ax_tensor *a, const ax_tensor *b);
/* "(2, 3, 4)" into buf; returns buf. */
char *ax_tensor_shape_str(const ax_tensor *t, char *buf, size_t len);

/* Typed data pointers; valid only for the matching dtype. */
static inline float *ax_f32(const ax_tensor *t) { return (float *)t->data; }
static inline int32_t *ax_i32(const ax_tensor *t) { return (int32_t *)t->data; }
static inline uint16_t *ax_bf16(const ax_tensor *t) {
  return (uint16_t *)t->data;
}
static inline int64_t *ax_i64(const ax_tensor *t) { return (int64_t *)t->data; }

/* Copies between tensors of equal dtype and element count, on any devices. */
int ax_tensor_copy(ax_tensor *dst, const ax_tensor *src);
/* A copy of t on device dev (a new reference to t itself if already there). */
ax_tensor *ax_tensor_to(const ax_tensor *t, ax_device dev);
/* Host <-> tensor bytes; nbytes must equal ax_tensor_nbytes(t). */
int ax_tensor_write(ax_tensor *t, const void *host, size_t nbytes);
int ax_tensor_read(const ax_tensor *t, void *host, size_t nbytes);
int ax_tensor_fill(ax_tensor *t, float v); /* f32 only */
/* A new i32 tensor with the values of an i32 or i64 tensor (same device). */
ax_tensor *ax_tensor_to_i32(const ax_tensor *t);

/* Checks dtype/ndim/dims; dims entries < 0 match anything. Returns AX_OK or
 * AX_ESHAPE/AX_EDTYPE with a message naming `what`. */
int ax_tensor_check(const ax_tensor *t, const char *what, ax_dtype dtype,
                    int ndim, const int64_t *dims);

/* Number of live tensor handles and storages in the process (debug aid; the
 * tests assert both return to their starting values). */
long ax_tensor_live_count(void);
long ax_storage_live_count(void);

#ifdef __cplusplus
}
#endif
#endif
