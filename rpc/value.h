/* Typed value lists: the arguments and results of remote calls.
 *
 * A value list holds int64, double, string, bytes, tensor and extension
 * values in order. Lists are not thread-safe for concurrent mutation; a list
 * that is no longer modified may be read from several threads.
 *
 * Ownership: ax_values_add_str/bytes copy their input; ax_values_add_tensor
 * takes a new reference to the tensor (the caller keeps its own).
 * Getters return borrowed pointers valid until the list is freed.
 * Every getter returns AX_EBADARG (with a message naming the index and the
 * actual and expected types) on a type mismatch or an index out of range, so
 * a handler can write `AX_TRY(ax_values_get_i64(args, 0, &n));` and the
 * caller receives AX_EBADARG. */
#ifndef AX_RPC_VALUE_H
#define AX_RPC_VALUE_H

#include <stddef.h>
#include <stdint.h>

#include "axon/kernels/error.h"
#include "axon/kernels/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ax_value_type {
  AX_VAL_I64 = 1,
  AX_VAL_F64 = 2,
  AX_VAL_STR = 3,
  AX_VAL_BYTES = 4,
  AX_VAL_TENSOR = 5,
  AX_VAL_EXT = 6, /* an extension kind (RRefs: rref/rref_codec.c) */
} ax_value_type;

typedef struct ax_values ax_values;

/* Extension values: a layer above rpc/ (rref/) registers a kind with codec
 * hooks; its objects then travel inside value lists. `encode` writes a
 * payload into a malloc'ed buffer (*out, *len) that the caller frees;
 * `decode` builds a new object (one reference) from a payload received from
 * node `from`, or returns an error (AX_EMALFORMED for bad bytes). `retain`
 * and `release` manage references held by value lists. Hooks may be called
 * from any thread. */
typedef struct ax_value_ext_ops {
  const char *name;
  int (*encode)(void *obj, void **out, size_t *len);
  int (*decode)(const void *data, size_t len, const char *from, void **obj);
  void (*retain)(void *obj);
  void (*release)(void *obj);
} ax_value_ext_ops;

#define AX_VALUE_EXT_MAX 16
/* Registers kind (0 <= kind < AX_VALUE_EXT_MAX) once per process; ops must
 * stay valid for the life of the process. AX_ESTATE if already taken. */
int ax_value_ext_register(uint32_t kind, const ax_value_ext_ops *ops);

ax_values *ax_values_new(void);    /* NULL on out-of-memory */
void ax_values_free(ax_values *v); /* NULL-safe; releases tensors */
/* Appends every value of src (NULL: none) to dst: strings and bytes
 * copied, tensors and extension objects shared (retained). The one copy of
 * value lists: a part of a list is appended through a view of it
 * (ax_values_view). On an error dst may hold part of src. */
int ax_values_append(ax_values *dst, const ax_values *src);
/* A copy (ax_values_append into a new list); NULL on out-of-memory. */
ax_values *ax_values_clone(const ax_values *v);
/* Drops the values from index n on (releasing their tensors and extension
 * objects); nothing when the list holds n values or fewer. */
void ax_values_truncate(ax_values *v, size_t n);

/* A borrowed view of the values [from, end) of a list: a list of its own
 * to every reader (getters, ax_values_count, ax_values_append, a method's
 * arguments) without copying or retaining anything. Its storage is the
 * caller's (a local variable, say) and its fields are private to
 * rpc/value.c. The view is valid while the viewed list lives and is not
 * modified; it is never freed (ax_values_free ignores it) and never grows.
 * Returns the view as a list, or NULL with AX_EINVAL set when the range is
 * not within the list. */
typedef struct ax_values_view {
  void *items_;
  size_t n_, cap_;
  int view_;
} ax_values_view;
const ax_values *ax_values_view_range(const ax_values *v, size_t from,
                                      size_t end, ax_values_view *out);

int ax_values_add_i64(ax_values *v, int64_t x);
int ax_values_add_f64(ax_values *v, double x);
int ax_values_add_str(ax_values *v, const char *s);
int ax_values_add_bytes(ax_values *v, const void *p, size_t n);
int ax_values_add_tensor(ax_values *v, ax_tensor *t);
int ax_values_add_ext(ax_values *v, uint32_t kind, void *obj);

size_t ax_values_count(const ax_values *v); /* 0 for NULL */
/* The type at index i, or 0 when i is out of range. */
ax_value_type ax_values_type(const ax_values *v, size_t i);
const char *ax_value_type_name(ax_value_type t);

int ax_values_get_i64(const ax_values *v, size_t i, int64_t *out);
int ax_values_get_f64(const ax_values *v, size_t i, double *out);
int ax_values_get_str(const ax_values *v, size_t i, const char **out);
int ax_values_get_bytes(const ax_values *v, size_t i, const void **p,
                        size_t *n);
/* Borrowed tensor; retain it to keep it beyond the list. */
int ax_values_get_tensor(const ax_values *v, size_t i, ax_tensor **out);
int ax_values_get_ext(const ax_values *v, size_t i, uint32_t kind, void **out);

/* Total bytes of tensor data in the list (decides inline vs bulk). */
size_t ax_values_tensor_bytes(const ax_values *v);

#ifdef __cplusplus
}
#endif
#endif
