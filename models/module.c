#include "axon/models/module.h"

#include <stdlib.h>
#include <string.h>

#include "axon/models/precision-impl.h"

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
    m->ops->init(m, params + m->param_off,
                 buffers ? buffers + m->buf_off : NULL, rng);
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
      return ax_seterr(AX_EDEVICE,
                       "%s(%s): %s %d on %s, parameters on %s "
                       "(move it with ax_tensor_to)",
                       call, m->ops->kind, what, i,
                       ax_device_str(l->t[i]->device, a, sizeof a),
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
  if (ex->kv_decode && (ex->training || ex->kv_pos < 0))
    return ax_seterr(AX_EINVAL,
                     "forward(%s): decoding with a key/value cache is "
                     "inference at a position >= 0 (training %d, position "
                     "%lld)",
                     m->ops->kind, ex->training, (long long)ex->kv_pos);
  AX_TRY(same_device(m, ex, "forward", "input", in));
  int rc = m->ops->forward(m, ex, slot, in, out);
  if (rc != AX_OK)
    ax_tlist_clear(out);
  return rc;
}

/* The checks shared by the backward entry points (dout NULL for W). */
static int bwd_check(const char *call, ax_module *m, const ax_exec *ex,
                     ax_slot *slot, const ax_tlist *dout, int want_dout) {
  if (!m || !ex || !ex->params || !ex->grads || !slot || (want_dout && !dout))
    return ax_seterr(AX_EINVAL, "%s: missing module, exec, slot or grad", call);
  return same_device(m, ex, call, "output gradient", dout);
}

static int no_split(const ax_module *m) {
  return ax_seterr(AX_EUNSUPPORTED, "%s has no split backward (no input half)",
                   m->ops->kind);
}

/* Whether m's own ops have the split backward (its children aside). */
static int has_split(const ax_module *m) {
  return m->ops->walk || m->ops->backward_input;
}

int ax_backward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                const ax_tlist *dout, ax_tlist *din) {
  din->n = 0;
  AX_TRY(bwd_check("backward", m, ex, slot, dout, 1));
  const ax_module_ops *o = m->ops;
  if (!o->walk && !o->backward && !o->backward_input)
    return ax_seterr(AX_EUNSUPPORTED, "backward: %s has none", o->kind);
  int rc;
  if (o->walk) {
    rc = o->walk(AX_BWD_FULL, m, ex, slot, dout, din);
  } else if (o->backward) {
    rc = o->backward(m, ex, slot, dout, din);
  } else { /* the two halves back to back */
    rc = o->backward_input(m, ex, slot, dout, din);
    if (rc == AX_OK && o->backward_weight)
      rc = o->backward_weight(m, ex, slot);
  }
  if (rc != AX_OK)
    ax_tlist_clear(din);
  return rc;
}

int ax_backward_input(ax_module *m, const ax_exec *ex, ax_slot *slot,
                      const ax_tlist *dout, ax_tlist *din) {
  din->n = 0;
  AX_TRY(bwd_check("backward_input", m, ex, slot, dout, 1));
  if (!has_split(m))
    return no_split(m);
  const ax_module_ops *o = m->ops;
  int rc = o->walk ? o->walk(AX_BWD_INPUT, m, ex, slot, dout, din)
                   : o->backward_input(m, ex, slot, dout, din);
  if (rc != AX_OK)
    ax_tlist_clear(din);
  return rc;
}

int ax_backward_weight(ax_module *m, const ax_exec *ex, ax_slot *slot) {
  AX_TRY(bwd_check("backward_weight", m, ex, slot, NULL, 0));
  if (!has_split(m))
    return no_split(m);
  const ax_module_ops *o = m->ops;
  if (o->walk)
    return o->walk(AX_BWD_WEIGHT, m, ex, slot, NULL, NULL);
  return o->backward_weight ? o->backward_weight(m, ex, slot) : AX_OK;
}

int ax_module_can_split(const ax_module *m) {
  if (!m || !has_split(m))
    return 0;
  for (int i = 0; i < m->n_children; i++)
    if (!ax_module_can_split(m->children[i]))
      return 0;
  return 1;
}

int ax_backward_part(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                     ax_slot *slot, const ax_tlist *dout, ax_tlist *din) {
  switch (part) {
  case AX_BWD_FULL:
    return ax_backward(m, ex, slot, dout, din);
  case AX_BWD_INPUT:
    return ax_backward_input(m, ex, slot, dout, din);
  case AX_BWD_WEIGHT:
    if (din)
      din->n = 0;
    return ax_backward_weight(m, ex, slot);
  }
  return ax_seterr(AX_EINVAL, "backward: no part %d", (int)part);
}

/* Trainable floats of a subtree (the module's own plus its children's). */
static size_t subtree_params(const ax_module *m) {
  size_t n = m->n_params;
  for (int i = 0; i < m->n_children; i++)
    n += subtree_params(m->children[i]);
  return n;
}

/* Reports child i's whole parameter range to ex->grad_ready, if any. */
static void report_ready(const ax_module *m, int i, const ax_exec *ex) {
  if (!ex->grad_ready)
    return;
  size_t n = subtree_params(m->children[i]);
  if (n > 0)
    ex->grad_ready(ex->grad_ready_user, m->children[i]->param_off, n);
}

/* Whether m rounds at its children's boundaries in ex's precision: a
 * model's blocks (ax_blocks_new) in bf16. */
static int rounds(const ax_module *m, const ax_exec *ex);

/* Part `part` of child i's backward, at a block boundary (bounds) in
 * bf16 (axi_prec_block_bwd). */
static int child_bwd(ax_bwd_part part, ax_module *m, int i, ax_exec *cex,
                     ax_slot *cs, const ax_tlist *dout, ax_tlist *din,
                     int bounds) {
  return bounds ? axi_prec_block_bwd(part, m->children[i], cex, cs, dout, din)
                : ax_backward_part(part, m->children[i], cex, cs, dout, din);
}

/* ax_walk_children; with `report`, each child's range goes to
 * ex->grad_ready once the part that writes its gradients (the whole
 * backward or the weight half) is done. */
static int walk_chain(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                      ax_slot *slot, const ax_tlist *dout, ax_tlist *din,
                      int report) {
  int weight = part == AX_BWD_WEIGHT, bounds = rounds(m, ex);
  ax_tlist cur = {0};
  if (!weight)
    cur = *dout;
  int owned = 0;
  for (int i = m->n_children - 1; i >= 0; i--) {
    ax_exec cex = *ex;
    if (!weight)
      cex.need_dx = i > 0 ? 1 : ex->need_dx;
    cex.grad_ready = NULL; /* only the walk's caller reports */
    cex.grad_ready_user = NULL;
    ax_tlist next = {0};
    ax_slot *cs = ax_slot_child(slot, i);
    int rc = cs ? child_bwd(part, m, i, &cex, cs, &cur, &next, bounds)
                : ax_seterr(AX_ENOMEM, "%s: out of memory", m->ops->kind);
    if (owned)
      ax_tlist_clear(&cur);
    if (rc != AX_OK)
      return rc;
    if (report && part != AX_BWD_INPUT)
      report_ready(m, i, ex);
    cur = next;
    owned = 1;
  }
  if (weight)
    return AX_OK;
  if (!owned) { /* no children: the gradients pass through */
    for (int i = 0; i < dout->n; i++)
      cur.t[i] = ax_tensor_retain(dout->t[i]);
  }
  *din = cur;
  return AX_OK;
}

int ax_walk_children(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                     ax_slot *slot, const ax_tlist *dout, ax_tlist *din) {
  return walk_chain(part, m, ex, slot, dout, din, 0);
}

/* ---- sequential ---- */

/* Child i's forward, at a block boundary (bounds) in bf16
 * (axi_prec_block_fwd): its outputs stay f32 only after the model's last
 * block (ends). */
static int child_fwd(ax_module *m, int i, const ax_exec *ex, ax_slot *cs,
                     const ax_tlist *in, ax_tlist *out, int bounds) {
  if (!bounds)
    return ax_forward(m->children[i], ex, cs, in, out);
  int logits = *(const int *)m->priv && i == m->n_children - 1;
  return axi_prec_block_fwd(m->children[i], ex, cs, in, out, !logits);
}

static int seq_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                       const ax_tlist *in, ax_tlist *out) {
  ax_tlist cur = *in;
  int owned = 0, bounds = rounds(m, ex);
  for (int i = 0; i < m->n_children; i++) {
    ax_tlist next = {0};
    ax_slot *cs = slot ? ax_slot_child(slot, i) : NULL;
    if (slot && !cs)
      return AX_ENOMEM;
    int rc = child_fwd(m, i, ex, cs, &cur, &next, bounds);
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

/* The sequential container's backward: the chain's walk, each child's
 * range reported to ex->grad_ready once its gradients are final. */
static int seq_walk(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                    ax_slot *slot, const ax_tlist *dout, ax_tlist *din) {
  return walk_chain(part, m, ex, slot, dout, din, 1);
}

static const ax_module_ops seq_ops = {
    /* .kind = */ "sequential",
    /* .forward = */ seq_forward,
    /* .backward = */ NULL,
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ NULL,
    /* .backward_weight = */ NULL,
    /* .walk = */ seq_walk,
};

ax_module *ax_sequential_new(void) { return ax_module_new(&seq_ops, 0); }

/* The blocks container: the sequential's functions; priv holds `ends`. */
static const ax_module_ops blocks_ops = {
    /* .kind = */ "blocks",
    /* .forward = */ seq_forward,
    /* .backward = */ NULL,
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ NULL,
    /* .backward_weight = */ NULL,
    /* .walk = */ seq_walk,
};

static int rounds(const ax_module *m, const ax_exec *ex) {
  return m->ops == &blocks_ops && ex->precision == AX_PREC_BF16;
}

ax_module *ax_blocks_new(int ends) {
  ax_module *m = ax_module_new(&blocks_ops, sizeof(int));
  if (m)
    *(int *)m->priv = ends != 0;
  return m;
}
