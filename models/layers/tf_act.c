/* Elementwise transformer layers: GELU, tanh and dropout. */
#include "axon/models/layers/tf-impl.h"

#include "axon/kernels/error.h"

/* ---- GELU and tanh ---- */

/* What the unary layer saves (in the exec's precision, ax_slot_put_act):
 * GELU's gradient needs its input, tanh's needs its output. */
enum { ACT_GELU = 0, ACT_TANH = 1 };

typedef struct act_priv {
  int kind;
} act_priv;

static int act_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                       const ax_tlist *in, ax_tlist *out) {
  act_priv *p = m->priv;
  AX_TRY(axi_tf_check_in(m->ops->kind, in, 1));
  ax_tensor *x = in->t[0]; // (...)
  ax_tensor *y = ax_tensor_like(x);
  if (!y)
    return AX_ENOMEM;
  ax_backend *be = ax_backend_of(x->device);
  size_t n = ax_tensor_numel(x);
  int rc = p->kind == ACT_GELU ? AX_K(be, gelu_fwd, n, ax_f32(x), ax_f32(y))
                               : AX_K(be, tanh_fwd, n, ax_f32(x), ax_f32(y));
  if (rc == AX_OK && slot)
    rc = ax_slot_put_act(slot, 0, ex, p->kind == ACT_GELU ? x : y);
  if (rc != AX_OK) {
    ax_tensor_release(y);
    return rc;
  }
  *out = ax_tlist1(y);
  return AX_OK;
}

static int act_backward_input(ax_module *m, const ax_exec *ex, ax_slot *slot,
                              const ax_tlist *dout, ax_tlist *din) {
  act_priv *p = m->priv;
  ax_tensor *saved = ax_slot_get(slot, 0);
  if (!saved)
    return axi_tf_no_state(m->ops->kind);
  if (!ex->need_dx) {
    ax_slot_put(slot, 0, NULL);
    return AX_OK;
  }
  AX_TRY(axi_tf_check_in(m->ops->kind, dout, 1));
  ax_tensor *dy = dout->t[0];
  size_t n = ax_tensor_numel(saved);
  if (ax_tensor_numel(dy) != n)
    return ax_seterr(AX_ESHAPE, "%s: gradient has %zu elements, expected %zu",
                     m->ops->kind, ax_tensor_numel(dy), n);
  ax_tensor *s = NULL; /* the saved tensor as f32 */
  AX_TRY(ax_slot_get_f32(slot, 0, &s));
  ax_tensor *dx = ax_tensor_like(s);
  ax_backend *be = ax_backend_of(dy->device);
  int rc = !dx ? AX_ENOMEM
           : p->kind == ACT_GELU
               ? AX_K(be, gelu_bwd, n, ax_f32(s), ax_f32(dy), ax_f32(dx))
               : AX_K(be, tanh_bwd, n, ax_f32(s), ax_f32(dy), ax_f32(dx));
  ax_tensor_release(s);
  if (rc != AX_OK) {
    ax_tensor_release(dx);
    return rc;
  }
  ax_slot_put(slot, 0, NULL); /* backward consumes the saved state */
  *din = ax_tlist1(dx);
  return AX_OK;
}

static const ax_module_ops gelu_ops = {
    /* .kind = */ "gelu",
    /* .forward = */ act_forward,
    /* .backward = */ NULL, /* the input half alone */
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ act_backward_input,
    /* .backward_weight = */ NULL, /* no parameters */
};

static const ax_module_ops tanh_ops = {
    /* .kind = */ "tanh",
    /* .forward = */ act_forward,
    /* .backward = */ NULL, /* the input half alone */
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ act_backward_input,
    /* .backward_weight = */ NULL, /* no parameters */
};

static ax_module *act_new(const ax_module_ops *ops, int kind) {
  ax_module *m = ax_module_new(ops, sizeof(act_priv));
  if (!m) {
    ax_seterr(AX_ENOMEM, "%s: no memory", ops->kind);
    return NULL;
  }
  ((act_priv *)m->priv)->kind = kind;
  return m;
}

ax_module *ax_gelu_new(void) { return act_new(&gelu_ops, ACT_GELU); }
ax_module *ax_tanh_new(void) { return act_new(&tanh_ops, ACT_TANH); }

/* ---- dropout ---- */

typedef struct drop_priv {
  float p;
  uint64_t salt;
  int shards, shard; /* x is part `shard` of `shards` along dim 1 */
} drop_priv;

/* The mask of the whole tensor on this part: row o of x (its dim-0 index,
 * `inner` elements) is elements [(o shards + shard) inner, + inner) of the
 * whole tensor's rows. */
static int drop_run(const drop_priv *p, const ax_tensor *x, const float *src,
                    float *dst, uint64_t seed, int bwd) {
  ax_backend *be = ax_backend_of(x->device);
  size_t n = ax_tensor_numel(x);
  if (p->shards <= 1)
    return bwd ? AX_K(be, dropout_bwd, n, src, dst, p->p, seed, 0)
               : AX_K(be, dropout_fwd, n, src, dst, p->p, seed, 0);
  size_t outer = x->ndim > 0 ? (size_t)x->shape[0] : 1;
  size_t inner = outer ? n / outer : 0;
  for (size_t o = 0; o < outer; o++) {
    uint64_t first = (o * (size_t)p->shards + (size_t)p->shard) * inner;
    size_t at = o * inner;
    AX_TRY(bwd ? AX_K(be, dropout_bwd, inner, src + at, dst + at, p->p, seed,
                      first)
               : AX_K(be, dropout_fwd, inner, src + at, dst + at, p->p, seed,
                      first));
  }
  return AX_OK;
}

/* Slot layout: int 0 = 1 when the forward applied a mask, int 1 = its seed,
 * int 2 = 1 once a forward ran. */
static int drop_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                        const ax_tlist *in, ax_tlist *out) {
  drop_priv *p = m->priv;
  AX_TRY(axi_tf_check_in("dropout", in, 1));
  ax_tensor *x = in->t[0]; // (...)
  int active = ex->training && p->p > 0.0f;
  uint64_t seed = axi_tf_dropout_seed(ex->seed, p->salt);
  if (slot) {
    ax_slot_set_int(slot, 0, active);
    ax_slot_set_int(slot, 1, (int64_t)seed);
    ax_slot_set_int(slot, 2, 1);
  }
  if (!active) {
    *out = ax_tlist1(ax_tensor_retain(x));
    return AX_OK;
  }
  ax_tensor *y = ax_tensor_like(x);
  if (!y)
    return AX_ENOMEM;
  int rc = drop_run(p, x, ax_f32(x), ax_f32(y), seed, 0);
  if (rc != AX_OK) {
    ax_tensor_release(y);
    return rc;
  }
  *out = ax_tlist1(y);
  return AX_OK;
}

static int drop_backward_input(ax_module *m, const ax_exec *ex, ax_slot *slot,
                               const ax_tlist *dout, ax_tlist *din) {
  drop_priv *p = m->priv;
  if (!ax_slot_int(slot, 2))
    return axi_tf_no_state("dropout");
  if (!ex->need_dx)
    return AX_OK;
  AX_TRY(axi_tf_check_in("dropout", dout, 1));
  ax_tensor *dy = dout->t[0];
  if (!ax_slot_int(slot, 0)) {
    *din = ax_tlist1(ax_tensor_retain(dy));
    return AX_OK;
  }
  ax_tensor *dx = ax_tensor_like(dy);
  if (!dx)
    return AX_ENOMEM;
  int rc = drop_run(p, dy, ax_f32(dy), ax_f32(dx),
                    (uint64_t)ax_slot_int(slot, 1), 1);
  if (rc != AX_OK) {
    ax_tensor_release(dx);
    return rc;
  }
  *din = ax_tlist1(dx);
  return AX_OK;
}

static const ax_module_ops drop_ops = {
    /* .kind = */ "dropout",
    /* .forward = */ drop_forward,
    /* .backward = */ NULL, /* the input half alone */
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ drop_backward_input,
    /* .backward_weight = */ NULL, /* no parameters */
};

ax_module *ax_dropout_new(float p, uint64_t salt) {
  if (!(p >= 0.0f && p < 1.0f)) {
    ax_seterr(AX_EINVAL, "dropout: probability %g outside [0, 1)", (double)p);
    return NULL;
  }
  ax_module *m = ax_module_new(&drop_ops, sizeof(drop_priv));
  if (!m) {
    ax_seterr(AX_ENOMEM, "dropout: no memory");
    return NULL;
  }
  drop_priv *d = m->priv;
  d->p = p;
  d->salt = salt;
  d->shards = 1;
  return m;
}

ax_module *ax_dropout_new_shard(float p, uint64_t salt, int shards, int shard) {
  if (shards < 1 || shard < 0 || shard >= shards) {
    ax_seterr(AX_EINVAL, "dropout: part %d of %d", shard, shards);
    return NULL;
  }
  ax_module *m = ax_dropout_new(p, salt);
  if (m) {
    ((drop_priv *)m->priv)->shards = shards;
    ((drop_priv *)m->priv)->shard = shard;
  }
  return m;
}
