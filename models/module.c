#include "models/module.h"

#include <stdlib.h>
#include <string.h>

void ax_tlist_clear(ax_tlist *l) {
  for (int i = 0; i < l->n; i++) {
    ax_tensor_release(l->t[i]);
    l->t[i] = NULL;
  }
  l->n = 0;
}

ax_tlist ax_tlist1(ax_tensor *t) {
  ax_tlist l = {0};
  l.n = 1;
  l.t[0] = t;
  return l;
}

ax_module *ax_module_new(const ax_module_ops *ops, size_t priv_size) {
  ax_module *m = calloc(1, sizeof *m);
  if (!m)
    return NULL;
  m->ops = ops;
  if (priv_size && !(m->priv = calloc(1, priv_size))) {
    free(m);
    return NULL;
  }
  return m;
}

int ax_module_add(ax_module *m, ax_module *child) {
  if (!child)
    return AX_ENOMEM;
  ax_module **c = realloc(m->children, sizeof *c * (size_t)(m->n_children + 1));
  if (!c) {
    ax_module_free(child);
    return AX_ENOMEM;
  }
  c[m->n_children++] = child;
  m->children = c;
  return AX_OK;
}

void ax_module_free(ax_module *m) {
  if (!m)
    return;
  for (int i = 0; i < m->n_children; i++)
    ax_module_free(m->children[i]);
  free(m->children);
  if (m->ops && m->ops->destroy)
    m->ops->destroy(m);
  free(m->priv);
  free(m);
}

void ax_module_layout(ax_module *m, size_t param_base, size_t buf_base,
                      size_t *n_params, size_t *n_buffers) {
  m->param_off = param_base;
  m->buf_off = buf_base;
  size_t p = param_base + m->n_params, b = buf_base + m->n_buffers;
  for (int i = 0; i < m->n_children; i++) {
    size_t cp, cb;
    ax_module_layout(m->children[i], p, b, &cp, &cb);
    p += cp;
    b += cb;
  }
  *n_params = p - param_base;
  *n_buffers = b - buf_base;
}

void ax_module_init(ax_module *m, float *params, float *buffers, ax_rng *rng) {
  if (m->ops->init)
    m->ops->init(m, params + m->param_off, buffers ? buffers + m->buf_off : NULL,
                 rng);
  for (int i = 0; i < m->n_children; i++)
    ax_module_init(m->children[i], params, buffers, rng);
}

/* ---- slots ---- */

struct ax_slot {
  ax_tensor *saved[AX_SLOT_SAVED];
  int64_t ints[AX_SLOT_SAVED];
  ax_slot **children;
  int n_children;
};

ax_slot *ax_slot_new(void) { return calloc(1, sizeof(ax_slot)); }

void ax_slot_reset(ax_slot *s) {
  if (!s)
    return;
  for (int i = 0; i < AX_SLOT_SAVED; i++) {
    ax_tensor_release(s->saved[i]);
    s->saved[i] = NULL;
    s->ints[i] = 0;
  }
  for (int i = 0; i < s->n_children; i++)
    ax_slot_reset(s->children[i]);
}

void ax_slot_free(ax_slot *s) {
  if (!s)
    return;
  ax_slot_reset(s);
  for (int i = 0; i < s->n_children; i++)
    ax_slot_free(s->children[i]);
  free(s->children);
  free(s);
}

ax_slot *ax_slot_child(ax_slot *s, int i) {
  if (!s || i < 0)
    return NULL;
  if (i >= s->n_children) {
    ax_slot **c = realloc(s->children, sizeof *c * (size_t)(i + 1));
    if (!c)
      return NULL;
    for (int j = s->n_children; j <= i; j++)
      c[j] = NULL;
    s->children = c;
    s->n_children = i + 1;
  }
  if (!s->children[i])
    s->children[i] = ax_slot_new();
  return s->children[i];
}

void ax_slot_put(ax_slot *s, int i, ax_tensor *t) {
  ax_tensor_retain(t);
  ax_tensor_release(s->saved[i]);
  s->saved[i] = t;
}

ax_tensor *ax_slot_get(const ax_slot *s, int i) { return s->saved[i]; }

void ax_slot_set_int(ax_slot *s, int i, int64_t v) { s->ints[i] = v; }

int64_t ax_slot_int(const ax_slot *s, int i) { return s->ints[i]; }

size_t ax_slot_bytes(const ax_slot *s) {
  if (!s)
    return 0;
  size_t b = 0;
  for (int i = 0; i < AX_SLOT_SAVED; i++)
    if (s->saved[i])
      b += ax_tensor_nbytes(s->saved[i]);
  for (int i = 0; i < s->n_children; i++)
    b += ax_slot_bytes(s->children[i]);
  return b;
}

/* ---- calls ---- */

/* Kernels run on the parameters' device and get every pointer raw, so a
 * tensor elsewhere must be refused here, not dereferenced there. */
static int same_device(const ax_module *m, const ax_exec *ex, const char *call,
                       const char *what, const ax_tlist *l) {
  ax_device dev = ex->params->device;
  const ax_tensor *other[2] = {ex->grads, ex->buffers};
  const char *oname[2] = {"gradients", "buffers"};
  char a[16], b[16];
  for (int i = 0; i < 2; i++)
    if (other[i] && !ax_device_eq(other[i]->device, dev))
      return ax_seterr(AX_EDEVICE, "%s(%s): %s on %s, parameters on %s", call,
                       m->ops->kind, oname[i],
                       ax_device_str(other[i]->device, a, sizeof a),
                       ax_device_str(dev, b, sizeof b));
  for (int i = 0; l && i < l->n; i++)
    if (l->t[i] && !ax_device_eq(l->t[i]->device, dev))
      return ax_seterr(AX_EDEVICE, "%s(%s): %s %d on %s, parameters on %s "
                       "(move it with ax_tensor_to)", call, m->ops->kind, what,
                       i, ax_device_str(l->t[i]->device, a, sizeof a),
                       ax_device_str(dev, b, sizeof b));
  return AX_OK;
}

int ax_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
               const ax_tlist *in, ax_tlist *out) {
  out->n = 0;
  if (!m || !ex || !ex->params || !in)
    return ax_seterr(AX_EINVAL, "forward: missing module, exec or input");
  if (ex->training && !slot)
    return ax_seterr(AX_EINVAL, "forward(%s): training needs a slot",
                     m->ops->kind);
  AX_TRY(same_device(m, ex, "forward", "input", in));
  int rc = m->ops->forward(m, ex, slot, in, out);
  if (rc != AX_OK)
    ax_tlist_clear(out);
  return rc;
}

int ax_backward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                const ax_tlist *dout, ax_tlist *din) {
  din->n = 0;
  if (!m || !ex || !ex->params || !ex->grads || !slot || !dout)
    return ax_seterr(AX_EINVAL, "backward: missing module, exec, slot or grad");
  if (!m->ops->backward)
    return ax_seterr(AX_EUNSUPPORTED, "backward: %s has none", m->ops->kind);
  AX_TRY(same_device(m, ex, "backward", "output gradient", dout));
  int rc = m->ops->backward(m, ex, slot, dout, din);
  if (rc != AX_OK)
    ax_tlist_clear(din);
  return rc;
}

/* ---- sequential ---- */

static int seq_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                       const ax_tlist *in, ax_tlist *out) {
  ax_tlist cur = *in;
  int owned = 0;
  for (int i = 0; i < m->n_children; i++) {
    ax_tlist next = {0};
    ax_slot *cs = slot ? ax_slot_child(slot, i) : NULL;
    if (slot && !cs)
      return AX_ENOMEM;
    int rc = ax_forward(m->children[i], ex, cs, &cur, &next);
    if (owned)
      ax_tlist_clear(&cur);
    if (rc != AX_OK)
      return rc;
    cur = next;
    owned = 1;
  }
  if (!owned) { /* empty container: identity */
    for (int i = 0; i < in->n; i++)
      cur.t[i] = ax_tensor_retain(in->t[i]);
  }
  *out = cur;
  return AX_OK;
}

/* Trainable floats of a subtree (the module's own plus its children's). */
static size_t subtree_params(const ax_module *m) {
  size_t n = m->n_params;
  for (int i = 0; i < m->n_children; i++)
    n += subtree_params(m->children[i]);
  return n;
}

static int seq_backward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                        const ax_tlist *dout, ax_tlist *din) {
  ax_tlist cur = *dout;
  int owned = 0;
  for (int i = m->n_children - 1; i >= 0; i--) {
    ax_exec cex = *ex;
    cex.need_dx = i > 0 ? 1 : ex->need_dx;
    cex.grad_ready = NULL; /* only the outermost container reports */
    cex.grad_ready_user = NULL;
    ax_tlist next = {0};
    int rc = ax_backward(m->children[i], &cex, ax_slot_child(slot, i), &cur,
                         &next);
    if (owned)
      ax_tlist_clear(&cur);
    if (rc != AX_OK)
      return rc;
    if (ex->grad_ready) {
      size_t n = subtree_params(m->children[i]);
      if (n > 0)
        ex->grad_ready(ex->grad_ready_user, m->children[i]->param_off, n);
    }
    cur = next;
    owned = 1;
  }
  if (!owned) {
    for (int i = 0; i < dout->n; i++)
      cur.t[i] = ax_tensor_retain(dout->t[i]);
  }
  *din = cur;
  return AX_OK;
}

static const ax_module_ops seq_ops = {
    /* .kind = */ "sequential",
    /* .forward = */ seq_forward,
    /* .backward = */ seq_backward,
    /* .init = */ NULL,
    /* .destroy = */ NULL,
};

ax_module *ax_sequential_new(void) { return ax_module_new(&seq_ops, 0); }
