/* Internal layout of value lists, shared by value.c and the codec. */
#ifndef AX_RPC_VALUE_IMPL_H
#define AX_RPC_VALUE_IMPL_H

#include "axon/rpc/value.h"

typedef struct axi_value {
  ax_value_type type;
  union {
    int64_t i;
    double d;
    struct {
      char *p; /* NUL-terminated for strings; malloc'ed */
      size_t n;
    } buf;
    ax_tensor *t;
    struct {
      uint32_t kind;
      void *obj;
    } ext;
  } u;
} axi_value;

/* The layout of ax_values_view (value.h): a view is a list whose items
 * belong to another (view = 1: it never grows and is never freed). */
struct ax_values {
  axi_value *v;
  size_t n, cap;
  int view;
};

const ax_value_ext_ops *axi_value_ext_ops(uint32_t kind);
/* Appends a value slot and returns it (NULL on out-of-memory). */
axi_value *axi_values_push(ax_values *v);

#endif
