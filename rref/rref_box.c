/* "rref.box": a built-in object kind that holds RRefs. A box on one node
 * can be filled, passed on to another box and emptied remotely, which is
 * how tests (and debugging sessions) build fork trees of arbitrary shape. */
#include <pthread.h>
#include <stdlib.h>

#include "axon/rref/rref-impl.h"

#define BOX_MAX 64

typedef struct box {
  pthread_mutex_t mu;
  ax_rref *held[BOX_MAX];
  int n;
} box;

static int box_create(ax_node *n, const char *cfg, ax_device dev, void **obj) {
  box *b = calloc(1, sizeof *b);
  if (!b)
    return AX_ENOMEM;
  pthread_mutex_init(&b->mu, NULL);
  *obj = b;
  return AX_OK;
}

static void box_clear(box *b) {
  pthread_mutex_lock(&b->mu);
  int n = b->n;
  ax_rref *h[BOX_MAX];
  for (int i = 0; i < n; i++)
    h[i] = b->held[i];
  b->n = 0;
  pthread_mutex_unlock(&b->mu);
  for (int i = 0; i < n; i++)
    ax_rref_release(h[i]);
}

static void box_destroy(void *obj) {
  box *b = obj;
  box_clear(b);
  pthread_mutex_destroy(&b->mu);
  free(b);
}

/* "put" [rrefs...]: keeps them. */
static int m_put(ax_call_ctx *ctx, void *obj, const ax_values *args,
                 ax_values *out) {
  box *b = obj;
  for (size_t i = 0; i < ax_values_count(args); i++) {
    ax_rref *r;
    AX_TRY(ax_values_get_rref(args, i, &r));
    pthread_mutex_lock(&b->mu);
    int ok = b->n < BOX_MAX;
    if (ok)
      b->held[b->n++] = ax_rref_retain(r);
    pthread_mutex_unlock(&b->mu);
    if (!ok)
      return ax_seterr(AX_ENOMEM, "box: full");
  }
  return ax_values_add_i64(out, b->n);
}

/* "send" [box rref]: puts every held RRef into the other box. */
static int m_send(ax_call_ctx *ctx, void *obj, const ax_values *args,
                  ax_values *out) {
  box *b = obj;
  ax_rref *to;
  AX_TRY(ax_values_get_rref(args, 0, &to));
  ax_values *v = ax_values_new();
  if (!v)
    return AX_ENOMEM;
  pthread_mutex_lock(&b->mu);
  for (int i = 0; i < b->n; i++)
    ax_values_add_rref(v, b->held[i]);
  pthread_mutex_unlock(&b->mu);
  ax_call_opts o = {.timeout_ms = 20000, .autograd_ctx = 0};
  int err = ax_rref_rpc_sync(ax_call_node(ctx), to, "put", v, &o, NULL);
  ax_values_free(v);
  return err;
}

static int m_clear(ax_call_ctx *ctx, void *obj, const ax_values *args,
                   ax_values *out) {
  box_clear(obj);
  return AX_OK;
}

/* "fetch" [index, timeout_ms]: the value of the index-th RRef. */
static int m_fetch(ax_call_ctx *ctx, void *obj, const ax_values *args,
                   ax_values *out) {
  box *b = obj;
  int64_t i, t;
  AX_TRY(ax_values_get_i64(args, 0, &i));
  AX_TRY(ax_values_get_i64(args, 1, &t));
  pthread_mutex_lock(&b->mu);
  ax_rref *r = (i >= 0 && i < b->n) ? ax_rref_retain(b->held[i]) : NULL;
  pthread_mutex_unlock(&b->mu);
  if (!r)
    return ax_seterr(AX_EINVAL, "box: no entry %lld", (long long)i);
  ax_values *v = NULL;
  int err = ax_rref_to_here(ax_call_node(ctx), r, t, 0, &v);
  ax_rref_release(r);
  if (err == AX_OK)
    err = ax_values_append(out, v);
  ax_values_free(v);
  return err;
}

static const ax_robj_method_def g_box_methods[] = {
    {"put", m_put},     {"send", m_send}, {"clear", m_clear},
    {"fetch", m_fetch}, {NULL, NULL},
};

const ax_robj_kind axi_box_kind = {"rref.box", box_create, box_destroy,
                                   g_box_methods};
