/* Typed value lists (see rpc/value.h). */
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/value-impl.h"

static const ax_value_ext_ops *g_ext[AX_VALUE_EXT_MAX];

int ax_value_ext_register(uint32_t kind, const ax_value_ext_ops *ops) {
  if (kind >= AX_VALUE_EXT_MAX || !ops || !ops->encode || !ops->decode)
    return ax_seterr(AX_EINVAL, "value ext: bad kind %u or ops", kind);
  const ax_value_ext_ops *expect = NULL;
  if (!__atomic_compare_exchange_n(&g_ext[kind], &expect, ops, 0,
                                   __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return ax_seterr(AX_ESTATE, "value ext: kind %u already registered", kind);
  return AX_OK;
}

const ax_value_ext_ops *axi_value_ext_ops(uint32_t kind) {
  if (kind >= AX_VALUE_EXT_MAX)
    return NULL;
  return __atomic_load_n(&g_ext[kind], __ATOMIC_ACQUIRE);
}

ax_values *ax_values_new(void) { return calloc(1, sizeof(ax_values)); }

static void value_clear(axi_value *x) {
  switch (x->type) {
  case AX_VAL_STR:
  case AX_VAL_BYTES:
    free(x->u.buf.p);
    break;
  case AX_VAL_TENSOR:
    ax_tensor_release(x->u.t);
    break;
  case AX_VAL_EXT: {
    const ax_value_ext_ops *ops = axi_value_ext_ops(x->u.ext.kind);
    if (ops && ops->release)
      ops->release(x->u.ext.obj);
    break;
  }
  default:
    break;
  }
}

void ax_values_free(ax_values *v) {
  if (!v || v->view)
    return;
  for (size_t i = 0; i < v->n; i++)
    value_clear(&v->v[i]);
  free(v->v);
  free(v);
}

void ax_values_truncate(ax_values *v, size_t n) {
  if (!v || v->view)
    return;
  while (v->n > n)
    value_clear(&v->v[--v->n]);
}

/* A view is a list (value-impl.h) in the caller's ax_values_view. */
_Static_assert(sizeof(ax_values_view) == sizeof(ax_values) &&
                   _Alignof(ax_values_view) == _Alignof(ax_values),
               "ax_values_view must have the layout of ax_values");

const ax_values *ax_values_view_range(const ax_values *v, size_t from,
                                      size_t end, ax_values_view *out) {
  size_t n = ax_values_count(v);
  if (!out || from > end || end > n) {
    ax_seterr(AX_EINVAL, "values: no view [%zu, %zu) of a list of %zu", from,
              end, n);
    return NULL;
  }
  ax_values *w = (ax_values *)(void *)out;
  w->v = end > from ? v->v + from : NULL;
  w->n = end - from;
  w->cap = w->n;
  w->view = 1;
  return w;
}

axi_value *axi_values_push(ax_values *v) {
  if (v->view)
    return NULL;
  if (v->n == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 4;
    axi_value *p = realloc(v->v, cap * sizeof *p);
    if (!p)
      return NULL;
    v->v = p;
    v->cap = cap;
  }
  axi_value *x = &v->v[v->n++];
  memset(x, 0, sizeof *x);
  return x;
}

#define PUSH_OR_FAIL(x, v)                                                     \
  axi_value *x = (v) ? axi_values_push(v) : NULL;                              \
  if (!x)                                                                      \
    return ax_seterr((v) && !(v)->view ? AX_ENOMEM : AX_EINVAL,                \
                     "values: cannot append");

int ax_values_add_i64(ax_values *v, int64_t i) {
  PUSH_OR_FAIL(x, v);
  x->type = AX_VAL_I64;
  x->u.i = i;
  return AX_OK;
}

int ax_values_add_f64(ax_values *v, double d) {
  PUSH_OR_FAIL(x, v);
  x->type = AX_VAL_F64;
  x->u.d = d;
  return AX_OK;
}

static int add_buf(ax_values *v, ax_value_type t, const void *p, size_t n) {
  char *c = malloc(n + 1);
  if (!c)
    return ax_seterr(AX_ENOMEM, "values: no memory for %zu bytes", n);
  if (n)
    memcpy(c, p, n);
  c[n] = 0;
  axi_value *x = v ? axi_values_push(v) : NULL;
  if (!x) {
    free(c);
    return ax_seterr(v && !v->view ? AX_ENOMEM : AX_EINVAL,
                     "values: cannot append");
  }
  x->type = t;
  x->u.buf.p = c;
  x->u.buf.n = n;
  return AX_OK;
}

int ax_values_add_str(ax_values *v, const char *s) {
  if (!s)
    return ax_seterr(AX_EINVAL, "values: NULL string");
  return add_buf(v, AX_VAL_STR, s, strlen(s));
}

int ax_values_add_bytes(ax_values *v, const void *p, size_t n) {
  if (!p && n)
    return ax_seterr(AX_EINVAL, "values: NULL bytes");
  return add_buf(v, AX_VAL_BYTES, p, n);
}

int ax_values_add_tensor(ax_values *v, ax_tensor *t) {
  if (!t)
    return ax_seterr(AX_EINVAL, "values: NULL tensor");
  PUSH_OR_FAIL(x, v);
  x->type = AX_VAL_TENSOR;
  x->u.t = ax_tensor_retain(t);
  return AX_OK;
}

int ax_values_add_ext(ax_values *v, uint32_t kind, void *obj) {
  const ax_value_ext_ops *ops = axi_value_ext_ops(kind);
  if (!ops)
    return ax_seterr(AX_EINVAL, "values: extension kind %u not registered",
                     kind);
  PUSH_OR_FAIL(x, v);
  x->type = AX_VAL_EXT;
  x->u.ext.kind = kind;
  x->u.ext.obj = obj;
  if (ops->retain)
    ops->retain(obj);
  return AX_OK;
}

int ax_values_append(ax_values *dst, const ax_values *src) {
  if (!dst)
    return ax_seterr(AX_EINVAL, "values: cannot append");
  size_t n = src ? src->n : 0; /* src may be dst */
  for (size_t i = 0; i < n; i++) {
    const axi_value *x = &src->v[i];
    int rc = AX_OK;
    switch (x->type) {
    case AX_VAL_I64:
      rc = ax_values_add_i64(dst, x->u.i);
      break;
    case AX_VAL_F64:
      rc = ax_values_add_f64(dst, x->u.d);
      break;
    case AX_VAL_STR:
    case AX_VAL_BYTES:
      rc = add_buf(dst, x->type, x->u.buf.p, x->u.buf.n);
      break;
    case AX_VAL_TENSOR:
      rc = ax_values_add_tensor(dst, x->u.t);
      break;
    case AX_VAL_EXT:
      rc = ax_values_add_ext(dst, x->u.ext.kind, x->u.ext.obj);
      break;
    }
    if (rc != AX_OK)
      return rc;
  }
  return AX_OK;
}

ax_values *ax_values_clone(const ax_values *v) {
  ax_values *c = ax_values_new();
  if (c && ax_values_append(c, v) != AX_OK) {
    ax_values_free(c);
    return NULL;
  }
  return c;
}

size_t ax_values_count(const ax_values *v) { return v ? v->n : 0; }

ax_value_type ax_values_type(const ax_values *v, size_t i) {
  return (v && i < v->n) ? v->v[i].type : (ax_value_type)0;
}

const char *ax_value_type_name(ax_value_type t) {
  switch (t) {
  case AX_VAL_I64:
    return "i64";
  case AX_VAL_F64:
    return "f64";
  case AX_VAL_STR:
    return "str";
  case AX_VAL_BYTES:
    return "bytes";
  case AX_VAL_TENSOR:
    return "tensor";
  case AX_VAL_EXT:
    return "ext";
  }
  return "none";
}

static const axi_value *get(const ax_values *v, size_t i, ax_value_type t) {
  ax_value_type have = ax_values_type(v, i);
  if (have != t) {
    ax_seterr(AX_EBADARG, "argument %zu is %s, expected %s", i,
              ax_value_type_name(have), ax_value_type_name(t));
    return NULL;
  }
  return &v->v[i];
}

int ax_values_get_i64(const ax_values *v, size_t i, int64_t *out) {
  const axi_value *x = get(v, i, AX_VAL_I64);
  if (!x)
    return AX_EBADARG;
  *out = x->u.i;
  return AX_OK;
}

int ax_values_get_f64(const ax_values *v, size_t i, double *out) {
  const axi_value *x = get(v, i, AX_VAL_F64);
  if (!x)
    return AX_EBADARG;
  *out = x->u.d;
  return AX_OK;
}

int ax_values_get_str(const ax_values *v, size_t i, const char **out) {
  const axi_value *x = get(v, i, AX_VAL_STR);
  if (!x)
    return AX_EBADARG;
  *out = x->u.buf.p;
  return AX_OK;
}

int ax_values_get_bytes(const ax_values *v, size_t i, const void **p,
                        size_t *n) {
  const axi_value *x = get(v, i, AX_VAL_BYTES);
  if (!x)
    return AX_EBADARG;
  *p = x->u.buf.p;
  *n = x->u.buf.n;
  return AX_OK;
}

int ax_values_get_tensor(const ax_values *v, size_t i, ax_tensor **out) {
  const axi_value *x = get(v, i, AX_VAL_TENSOR);
  if (!x)
    return AX_EBADARG;
  *out = x->u.t;
  return AX_OK;
}

int ax_values_get_ext(const ax_values *v, size_t i, uint32_t kind, void **out) {
  const axi_value *x = get(v, i, AX_VAL_EXT);
  if (!x)
    return AX_EBADARG;
  if (x->u.ext.kind != kind)
    return ax_seterr(AX_EBADARG, "argument %zu is ext kind %u, expected %u", i,
                     x->u.ext.kind, kind);
  *out = x->u.ext.obj;
  return AX_OK;
}

size_t ax_values_tensor_bytes(const ax_values *v) {
  size_t n = 0;
  for (size_t i = 0; v && i < v->n; i++)
    if (v->v[i].type == AX_VAL_TENSOR)
      n += ax_tensor_nbytes(v->v[i].u.t);
  return n;
}
