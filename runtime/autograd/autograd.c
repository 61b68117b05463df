/* Distributed autograd contexts: the table, recording of functions, the
 * send/recv hooks used by RRef calls and fetches, and release. The
 * per-context gradient buffers are in autograd_grads.c, start-up and
 * shutdown in autograd_init.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "axon/runtime/autograd/autograd-impl.h"

static axi_ag_state *g_d;

axi_ag_state *axi_ag_get(void) {
  return __atomic_load_n(&g_d, __ATOMIC_ACQUIRE);
}

void axi_ag_set(axi_ag_state *d) {
  __atomic_store_n(&g_d, d, __ATOMIC_RELEASE);
}

int axi_ag_was_released(axi_ag_state *d, uint64_t id) {
  long n = d->nrel < AXD_RELEASED_RING ? d->nrel : AXD_RELEASED_RING;
  for (long i = 0; i < n; i++)
    if (d->released[i] == id)
      return 1;
  return 0;
}

axi_ag_ctx *axi_ag_ctx_find(axi_ag_state *d, uint64_t id, int create) {
  for (axi_ag_ctx *c = d->ctxs; c; c = c->next)
    if (c->id == id)
      return c;
  if (!create || !id || axi_ag_was_released(d, id))
    return NULL;
  axi_ag_ctx *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->id = id;
  c->next = d->ctxs;
  d->ctxs = c;
  d->nctx++;
  return c;
}

void axi_ag_peer_add(axi_ag_ctx *c, const char *name) {
  for (axi_ag_peer *p = c->peers; p; p = p->next)
    if (!strcmp(p->name, name))
      return;
  axi_ag_peer *p = calloc(1, sizeof *p);
  if (!p)
    return;
  snprintf(p->name, sizeof p->name, "%s", name);
  p->next = c->peers;
  c->peers = p;
}

axi_ag_fn *axi_ag_fn_find(axi_ag_ctx *c, uint64_t id) {
  for (axi_ag_fn *f = c->fns; f; f = f->next)
    if (f->id == id)
      return f;
  return NULL;
}

axi_ag_map *axi_ag_map_find(axi_ag_ctx *c, const ax_tensor *t) {
  for (axi_ag_map *m = c->map; m; m = m->next)
    if (m->t == t)
      return m;
  return NULL;
}

/* A pushed list (push.c) kept in a context until taken. */
void axi_ag_box_free(axi_ag_box *b) {
  if (!b)
    return;
  ax_tlist_clear(&b->t);
  free(b->desc);
  free(b);
}

void axi_ag_ctx_free(axi_ag_ctx *c) {
  for (axi_ag_fn *f = c->fns, *nx; f; f = nx) {
    nx = f->next;
    if (!f->ran && f->ops->release)
      f->ops->release(f->state);
    for (int k = 0; k < AX_TLIST_MAX; k++)
      ax_tensor_release(f->dout[k]);
    free(f);
  }
  for (axi_ag_map *m = c->map, *nx; m; m = nx) {
    nx = m->next;
    ax_tensor_release(m->t);
    free(m);
  }
  for (axi_ag_grad *g = c->grads, *nx; g; g = nx) {
    nx = g->next;
    ax_tensor_release(g->g);
    free(g);
  }
  for (axi_ag_peer *p = c->peers, *nx; p; p = nx) {
    nx = p->next;
    free(p);
  }
  for (axi_ag_box *b = c->boxes, *nx; b; b = nx) {
    nx = b->next;
    axi_ag_box_free(b);
  }
  free(c);
}

/* ---- contexts ------------------------------------------------------------ */
int ax_dist_context_new(ax_node *n, uint64_t *out) {
  axi_ag_state *d = axi_ag_get();
  if (!d || d->node != n || !out)
    return ax_seterr(AX_ESTATE, "dist: node not initialised");
  uint64_t c = __atomic_add_fetch(&d->counter, 1, __ATOMIC_RELAXED);
  uint64_t id = ((uint64_t)(ax_node_rank(n) + 1) << 48) | c;
  pthread_mutex_lock(&d->mu);
  axi_ag_ctx *x = axi_ag_ctx_find(d, id, 1);
  pthread_mutex_unlock(&d->mu);
  if (!x)
    return ax_seterr(AX_ENOMEM, "dist: no memory");
  ax_autograd_ctx_set_current(id);
  *out = id;
  return AX_OK;
}

long ax_dist_live_contexts(ax_node *n) {
  axi_ag_state *d = axi_ag_get();
  if (!d)
    return 0;
  pthread_mutex_lock(&d->mu);
  long k = d->nctx;
  pthread_mutex_unlock(&d->mu);
  return k;
}

/* ---- recording ----------------------------------------------------------- */
static int map_add(axi_ag_ctx *c, ax_tensor *t, const axi_ag_src *s) {
  axi_ag_map *m = calloc(1, sizeof *m);
  if (!m)
    return AX_ENOMEM;
  m->t = ax_tensor_retain(t);
  m->s = *s;
  m->next = c->map;
  c->map = m;
  return AX_OK;
}

static const ax_dist_fn_ops g_held_ops = {NULL, NULL};

static int record(axi_ag_state *d, uint64_t ctx, const ax_dist_fn_ops *ops,
                  void *state, const ax_tlist *inputs, const ax_tlist *outputs,
                  uint64_t *id);

int ax_dist_record(ax_node *n, uint64_t ctx, const ax_dist_fn_ops *ops,
                   void *state, const ax_tlist *inputs,
                   const ax_tlist *outputs) {
  axi_ag_state *d = axi_ag_get();
  if (!d || d->node != n || !ops || !ops->backward || !inputs || !outputs)
    return ax_seterr(AX_EINVAL, "dist: bad arguments to record");
  return record(d, ctx, ops, state, inputs, outputs, NULL);
}

int ax_dist_record_held(ax_node *n, uint64_t ctx, const ax_tlist *inputs,
                        const ax_tlist *outputs, uint64_t *fn) {
  axi_ag_state *d = axi_ag_get();
  if (!d || d->node != n || !inputs || !outputs || !fn)
    return ax_seterr(AX_EINVAL, "dist: bad arguments to record_held");
  return record(d, ctx, &g_held_ops, NULL, inputs, outputs, fn);
}

/* Records a function; held when ops is g_held_ops (its id into *id). */
static int record(axi_ag_state *d, uint64_t ctx, const ax_dist_fn_ops *ops,
                  void *state, const ax_tlist *inputs, const ax_tlist *outputs,
                  uint64_t *id) {
  axi_ag_fn *f = calloc(1, sizeof *f);
  if (!f)
    return AX_ENOMEM;
  f->id = __atomic_add_fetch(&d->fn_counter, 1, __ATOMIC_RELAXED);
  f->held = ops == &g_held_ops;
  if (id)
    *id = f->id;
  f->ops = ops;
  f->state = state;
  f->n_in = inputs->n;
  f->n_out = outputs->n;
  int err = AX_OK;
  pthread_mutex_lock(&d->mu);
  axi_ag_ctx *c = axi_ag_ctx_find(d, ctx, 1);
  if (!c)
    err = ax_seterr(AX_ESTALE, "dist: context %llx released",
                    (unsigned long long)ctx);
  for (int i = 0; err == AX_OK && i < inputs->n; i++) {
    axi_ag_map *m = inputs->t[i] ? axi_ag_map_find(c, inputs->t[i]) : NULL;
    if (!m)
      continue;
    f->in[i] = m->s;
    if (m->s.kind == AXD_SRC_LOCAL)
      m->s.fn->expected++;
  }
  for (int k = 0; err == AX_OK && k < outputs->n; k++) {
    axi_ag_src s = {.kind = AXD_SRC_LOCAL, .fn = f, .k = k};
    if (outputs->t[k])
      err = map_add(c, outputs->t[k], &s);
  }
  if (c) { /* linked even on failure: map entries may point at it */
    f->ran = err != AX_OK; /* never run; the caller keeps its state */
    f->next = c->fns;
    c->fns = f;
  }
  pthread_mutex_unlock(&d->mu);
  if (!c)
    free(f);
  return err;
}

/* ---- hooks --------------------------------------------------------------- */
typedef struct axi_ag_desc {
  uint32_t index, k;
  uint64_t fn;
} axi_ag_desc;

/* The function a tensor received with autograd metadata gets on the
 * receiving node (its RECV edge): every local use of the tensor (a recorded
 * consumer, a send to another node, a backward root) is one expected
 * contribution, and its backward passes their sum on, once, along the edge
 * to the producer, which expects one contribution per send. A tensor that
 * is passed on (a relay) thus sends its gradient back to where it came
 * from, and relays several hops long chain these functions. */
static int recv_backward(void *state, uint64_t ctx, const ax_tlist *dout,
                         ax_tlist *din) {
  din->n = 1;
  din->t[0] = dout->n > 0 ? ax_tensor_retain(dout->t[0]) : NULL;
  return AX_OK;
}

static const ax_dist_fn_ops g_recv_ops = {
    /* .backward = */ recv_backward,
    /* .release = */ NULL,
};

/* Records t's RECV edge from s (a remote source) in c: a function with
 * input s and output t, to which the map points t. d->mu held. */
static int recv_edge(axi_ag_state *d, axi_ag_ctx *c, ax_tensor *t,
                     const axi_ag_src *s) {
  axi_ag_fn *f = calloc(1, sizeof *f);
  if (!f)
    return ax_seterr(AX_ENOMEM, "dist: no memory for a receive edge");
  f->id = __atomic_add_fetch(&d->fn_counter, 1, __ATOMIC_RELAXED);
  f->ops = &g_recv_ops;
  f->n_in = 1;
  f->n_out = 1;
  f->in[0] = *s;
  axi_ag_src out = {.kind = AXD_SRC_LOCAL, .fn = f, .k = 0};
  int err = map_add(c, t, &out);
  if (err != AX_OK) {
    free(f);
    return ax_seterr(err, "dist: no memory for a receive edge");
  }
  f->next = c->fns;
  c->fns = f;
  return AX_OK;
}

static int hook_send(ax_node *n, uint64_t ctx, const char *to,
                     const ax_values *vals, size_t first, void **desc,
                     size_t *len) {
  axi_ag_state *d = axi_ag_get();
  *desc = NULL;
  *len = 0;
  if (!d)
    return AX_OK;
  size_t cnt = ax_values_count(vals), nd = 0;
  axi_ag_desc *out = calloc(cnt ? cnt : 1, sizeof *out);
  if (!out)
    return AX_ENOMEM;
  pthread_mutex_lock(&d->mu);
  axi_ag_ctx *c = axi_ag_ctx_find(d, ctx, 1);
  if (!c) {
    pthread_mutex_unlock(&d->mu);
    free(out);
    return ax_seterr(AX_ESTALE, "dist: context %llx released",
                     (unsigned long long)ctx);
  }
  axi_ag_peer_add(c, to);
  for (size_t i = first; i < cnt; i++) {
    ax_tensor *t;
    if (ax_values_type(vals, i) != AX_VAL_TENSOR ||
        ax_values_get_tensor(vals, i, &t) != AX_OK)
      continue;
    axi_ag_map *m = axi_ag_map_find(c, t);
    if (!m || m->s.kind != AXD_SRC_LOCAL)
      continue;          /* not differentiable in this context */
    m->s.fn->expected++; /* received tensors: their RECV edge function */
    if (!m->s.fn->consumer[0])
      snprintf(m->s.fn->consumer, sizeof m->s.fn->consumer, "%s", to);
    out[nd].index = (uint32_t)(i - first);
    out[nd].k = (uint32_t)m->s.k;
    out[nd].fn = m->s.fn->id;
    nd++;
  }
  pthread_mutex_unlock(&d->mu);
  if (!nd) {
    free(out);
    return AX_OK;
  }
  *desc = out;
  *len = nd * sizeof *out;
  return AX_OK;
}

static int hook_recv(ax_node *n, uint64_t ctx, const char *from,
                     const ax_values *vals, size_t first, const void *desc,
                     size_t len) {
  axi_ag_state *d = axi_ag_get();
  if (!d)
    return AX_OK;
  if (len % sizeof(axi_ag_desc))
    return ax_seterr(AX_EMALFORMED, "dist: descriptor of %zu bytes", len);
  size_t nd = len / sizeof(axi_ag_desc);
  int err = AX_OK;
  pthread_mutex_lock(&d->mu);
  axi_ag_ctx *c = axi_ag_ctx_find(d, ctx, 1);
  if (!c)
    err = ax_seterr(AX_ESTALE, "dist: context %llx released",
                    (unsigned long long)ctx);
  else
    axi_ag_peer_add(c, from);
  for (size_t j = 0; err == AX_OK && j < nd; j++) {
    axi_ag_desc e;
    memcpy(&e, (const char *)desc + j * sizeof e, sizeof e);
    ax_tensor *t;
    if (e.k >= AX_TLIST_MAX ||
        ax_values_get_tensor(vals, first + e.index, &t) != AX_OK) {
      err = ax_seterr(AX_EMALFORMED, "dist: bad descriptor entry");
      break;
    }
    axi_ag_src s = {.kind = AXD_SRC_REMOTE, .k = (int)e.k, .rfn = e.fn};
    snprintf(s.from, sizeof s.from, "%s", from);
    err = recv_edge(d, c, t, &s);
  }
  pthread_mutex_unlock(&d->mu);
  return err;
}

const ax_rref_grad_hooks axi_ag_grad_hooks = {
    /* .send = */ hook_send,
    /* .recv = */ hook_recv,
};

/* ---- edges on a program's own messages ----------------------------------- */
/* The tensors of t as a value list (NULL entries as i64 placeholders), so
 * the RRef hooks' rules apply unchanged. */
static ax_values *tlist_values(const ax_tlist *t) {
  ax_values *v = ax_values_new();
  int err = v ? AX_OK : AX_ENOMEM;
  for (int i = 0; err == AX_OK && i < t->n; i++)
    err = t->t[i] ? ax_values_add_tensor(v, t->t[i]) : ax_values_add_i64(v, 0);
  if (err != AX_OK) {
    ax_values_free(v);
    return NULL;
  }
  return v;
}

int axi_ag_send_edges(ax_node *n, uint64_t ctx, const char *to,
                      const ax_tlist *t, void **desc, size_t *len) {
  *desc = NULL;
  *len = 0;
  axi_ag_state *d = axi_ag_get();
  if (!d || d->node != n || !to || !t)
    return ax_seterr(AX_EINVAL, "dist: bad arguments to send_edges");
  ax_values *v = tlist_values(t);
  if (!v)
    return AX_ENOMEM;
  int err = hook_send(n, ctx, to, v, 0, desc, len);
  ax_values_free(v);
  return err;
}

int axi_ag_recv_edges(ax_node *n, uint64_t ctx, const char *from,
                      const ax_tlist *t, const void *desc, size_t len) {
  axi_ag_state *d = axi_ag_get();
  if (!d || d->node != n || !from || !t)
    return ax_seterr(AX_EINVAL, "dist: bad arguments to recv_edges");
  ax_values *v = tlist_values(t);
  if (!v)
    return AX_ENOMEM;
  int err = hook_recv(n, ctx, from, v, 0, desc, len);
  ax_values_free(v);
  return err;
}

int ax_dist_forget(ax_node *n, uint64_t ctx, const ax_tlist *t) {
  axi_ag_state *d = axi_ag_get();
  if (!d || d->node != n || !t)
    return ax_seterr(AX_EINVAL, "dist: bad arguments to forget");
  axi_ag_map *gone = NULL;
  pthread_mutex_lock(&d->mu);
  axi_ag_ctx *c = axi_ag_ctx_find(d, ctx, 0);
  for (axi_ag_map **pp = c ? &c->map : NULL; pp && *pp;) {
    axi_ag_map *m = *pp;
    int hit = 0;
    for (int i = 0; i < t->n && !hit; i++)
      hit = t->t[i] && m->t == t->t[i];
    if (hit) {
      *pp = m->next;
      m->next = gone;
      gone = m;
    } else {
      pp = &m->next;
    }
  }
  pthread_mutex_unlock(&d->mu);
  for (axi_ag_map *nx; gone; gone = nx) {
    nx = gone->next;
    ax_tensor_release(gone->t);
    free(gone);
  }
  return AX_OK;
}
