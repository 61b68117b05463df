/* Causal multi-head self-attention (GPT) on the fused attention kernel.
 *
 * Children: 0 = fused QKV projection (hidden -> 3 hidden), 1 = output
 * projection (hidden -> hidden). The projection's output (B, S, 3, heads,
 * dh) is read in place by attn_causal_fwd (kernels/backend-impl.h), whose
 * output (B, S, heads, dh) = (B, S, hidden) goes straight into the output
 * projection: no permutation, no (S, S) matrix. The kernel's backward
 * writes the gradient of the packed projection output in one buffer.
 *
 * A member of a tensor-parallel group (models/layers/parallel.h) holds
 * heads / T heads: its QKV projection is a column part (3 segments), its
 * output projection a row part (which sums the members' outputs), and the
 * kernel runs its heads as heads [rank heads / T, ...) of the whole layer,
 * so it draws the whole layer's dropout mask for them.
 *
 * In bf16 (the rules at the top of models/module.h) the projections are
 * Linears (their GEMMs in bf16), the kernel's q, k and v are the packed
 * projection output rounded to bf16 (widened back to f32 for the kernel,
 * which sums the products of these bf16 values in f32), and what the
 * backward needs, the rounded qkv and the kernel's output o, is kept in
 * bf16; the log-sum-exp stays f32. */
#include <math.h>

#include "axon/models/layers/parallel.h"
#include "axon/models/layers/tf-impl.h"
#include "axon/models/precision-impl.h"

#include "axon/kernels/error.h"

typedef struct causal_priv {
  int hidden, heads, dh; /* heads: this member's */
  int head0, heads_total;
  float dropout;
  uint64_t salt;
} causal_priv;

/* Slot: tensors 0 = the projection's output qkv (B, S, 3 width), 1 = the
 * kernel's output o (B, S, width), each in the exec's precision
 * (ax_slot_put_act), 2 = its lse (B, heads, S), f32; ints 0 = the
 * dropout seed, 1 = 1 when the forward applied dropout. Decoding
 * (ax_exec.kv_decode) keeps instead the keys and values of the positions
 * so far in tensors 3 and 4, (B, capacity, width) each (f32; in bf16
 * their values are bf16's), and their count in int 2. */
enum { SAVE_QKV = 0, SAVE_O = 1, SAVE_LSE = 2, CACHE_K = 3, CACHE_V = 4 };
enum { INT_SEED = 0, INT_DROP = 1, INT_KV = 2 };

/* The kernel's geometry for B sequences of S positions. */
static ax_attn_desc desc_of(const causal_priv *p, int B, int S, int drop,
                            uint64_t seed) {
  long w = (long)p->heads * p->dh;
  ax_attn_desc d = {B, p->heads, S, S, p->dh};
  d.q_ss = d.k_ss = d.v_ss = 3 * w;
  d.q_sb = d.k_sb = d.v_sb = S * d.q_ss;
  d.o_ss = w;
  d.o_sb = S * w;
  d.scale = 1.0f / sqrtf((float)p->dh);
  d.dropout = drop ? p->dropout : 0.0f;
  d.seed = seed;
  d.head0 = p->head0;
  d.heads_total = p->heads_total;
  return d;
}

static ax_tensor *new3(int64_t a, int64_t b, int64_t c, ax_device dev) {
  int64_t shape[3] = {a, b, c};
  return axi_tf_new(3, shape, dev);
}

/* The kernel's operands from the projection's output qkv in ex's
 * precision: *kept, qkv as the backward keeps it (bf16: its rounding,
 * fp32: qkv itself), and *wide, its f32 values for the kernel (new
 * references; kept may be NULL to drop it). */
static int operands(const ax_exec *ex, ax_tensor *qkv, ax_tensor **kept,
                    ax_tensor **wide) {
  ax_tensor *k = NULL;
  *wide = NULL;
  int rc =
      axi_prec_cast(qkv, ex->precision == AX_PREC_BF16 ? AX_BF16 : AX_F32, &k);
  if (rc == AX_OK)
    rc = axi_prec_cast(k, AX_F32, wide);
  if (rc == AX_OK && kept)
    *kept = k;
  else
    ax_tensor_release(k);
  return rc;
}

/* qkv (B, S, 3 width) -> o (B, S, width) and, with a slot, lse; qkv's
 * values in ex's precision (operands). */
static int attend(const causal_priv *p, const ax_exec *ex, ax_slot *slot,
                  ax_tensor *qkv, ax_tensor **o) {
  int B = (int)qkv->shape[0], S = (int)qkv->shape[1];
  int drop = ex->training && p->dropout > 0.0f;
  uint64_t seed = axi_tf_dropout_seed(ex->seed, p->salt);
  ax_attn_desc d = desc_of(p, B, S, drop, seed);
  ax_tensor *lse = NULL, *kept = NULL, *wide = NULL;
  AX_TRY(operands(ex, qkv, &kept, &wide));
  int rc = AX_ENOMEM;
  if ((*o = new3(B, S, (int64_t)p->heads * p->dh, qkv->device)) &&
      (!slot || (lse = new3(B, p->heads, S, qkv->device)))) {
    const float *q = ax_f32(wide), *k = q + d.o_ss, *v = k + d.o_ss;
    rc = AX_K(ax_backend_of(qkv->device), attn_causal_fwd, &d, q, k, v,
              ax_f32(*o), lse ? ax_f32(lse) : NULL);
  }
  if (rc == AX_OK && slot) {
    rc = ax_slot_put_act(slot, SAVE_QKV, ex, kept);
    if (rc == AX_OK)
      rc = ax_slot_put_act(slot, SAVE_O, ex, *o);
    ax_slot_put(slot, SAVE_LSE, lse);
    ax_slot_set_int(slot, INT_SEED, (int64_t)seed);
    ax_slot_set_int(slot, INT_DROP, drop);
  }
  if (rc != AX_OK) {
    ax_tensor_release(*o);
    *o = NULL;
  }
  ax_tensor_release(lse);
  ax_tensor_release(kept);
  ax_tensor_release(wide);
  return rc;
}

/* ---- decoding with a key/value cache ------------------------------------ */

/* Room in the slot's caches for B sequences of n positions, the first
 * `keep` of each kept: grown to twice what is asked when too small. */
static int cache_reserve(ax_slot *slot, int B, int64_t n, int64_t keep, long w,
                         ax_device dev, ax_tensor **k, ax_tensor **v) {
  *k = ax_slot_get(slot, CACHE_K);
  *v = ax_slot_get(slot, CACHE_V);
  if (*k && (*k)->shape[0] == B && (*k)->shape[1] >= n)
    return AX_OK;
  int64_t cap = 2 * n > 16 ? 2 * n : 16;
  ax_tensor *nk = new3(B, cap, w, dev), *nv = new3(B, cap, w, dev);
  int rc = nk && nv ? AX_OK : AX_ENOMEM;
  ax_backend *be = ax_backend_of(dev);
  for (int b = 0; b < B && keep > 0 && rc == AX_OK; b++) { /* the old rows */
    size_t at = (size_t)b * (size_t)cap * (size_t)w,
           was = (size_t)b * (size_t)(*k)->shape[1] * (size_t)w,
           bytes = (size_t)keep * (size_t)w * sizeof(float);
    rc = AX_K(be, copy, ax_f32(nk) + at, ax_f32(*k) + was, bytes);
    if (rc == AX_OK)
      rc = AX_K(be, copy, ax_f32(nv) + at, ax_f32(*v) + was, bytes);
  }
  if (rc == AX_OK) {
    ax_slot_put(slot, CACHE_K, nk);
    ax_slot_put(slot, CACHE_V, nv);
    *k = nk;
    *v = nv;
  }
  ax_tensor_release(nk);
  ax_tensor_release(nv);
  return rc;
}

/* Appends the keys and values of qkv (B, T, 3 width) at position pos of
 * the caches k and v: (B, T, 3, width) permuted to (B, 3, T, width), whose
 * key and value blocks are each one copy per sequence. */
static int cache_append(const causal_priv *p, ax_tensor *qkv, int64_t pos,
                        ax_tensor *k, ax_tensor *v) {
  int B = (int)qkv->shape[0], T = (int)qkv->shape[1];
  long w = (long)p->heads * p->dh;
  int64_t shape[4] = {B, 3, T, w};
  ax_tensor *t = axi_tf_new(4, shape, qkv->device);
  if (!t)
    return AX_ENOMEM;
  ax_backend *be = ax_backend_of(qkv->device);
  int rc = AX_K(be, permute0213, B, T, 3, (int)w, ax_f32(qkv), ax_f32(t));
  size_t block = (size_t)T * (size_t)w, cap = (size_t)k->shape[1];
  for (int b = 0; b < B && rc == AX_OK; b++) {
    size_t at = ((size_t)b * cap + (size_t)pos) * (size_t)w;
    const float *src = ax_f32(t) + (size_t)b * 3 * block;
    rc = AX_K(be, copy, ax_f32(k) + at, src + block, block * sizeof(float));
    if (rc == AX_OK)
      rc = AX_K(be, copy, ax_f32(v) + at, src + 2 * block,
                block * sizeof(float));
  }
  ax_tensor_release(t);
  return rc;
}

/* The decoding forward's attention: qkv (B, T, 3 width) of positions pos
 * .. pos + T - 1, f32 values in ex's precision (operands) -> o (B, T,
 * width), attending over the cached positions and the new ones (sq = T <
 * sk = pos + T: the kernel's queries are the last positions), the new keys
 * and values appended to the cache. */
static int attend_wide(const causal_priv *p, const ax_exec *ex, ax_slot *slot,
                       ax_tensor *qkv, ax_tensor **o) {
  int B = (int)qkv->shape[0], T = (int)qkv->shape[1];
  long w = (long)p->heads * p->dh;
  int64_t pos = ex->kv_pos, held = pos ? ax_slot_int(slot, INT_KV) : 0;
  ax_tensor *k = ax_slot_get(slot, CACHE_K), *v;
  if (pos && (!k || held != pos || k->shape[0] != B))
    return ax_seterr(AX_ESTATE,
                     "causal attention: decoding at position %lld of %d "
                     "sequences, but the cache holds %lld positions of %lld",
                     (long long)pos, B, (long long)(k ? held : 0),
                     (long long)(k ? k->shape[0] : 0));
  AX_TRY(cache_reserve(slot, B, pos + T, pos, w, qkv->device, &k, &v));
  ax_slot_set_int(slot, INT_KV, -1); /* until the append is whole */
  AX_TRY(cache_append(p, qkv, pos, k, v));
  ax_slot_set_int(slot, INT_KV, pos + T);
  ax_attn_desc d = {B, p->heads, T, (int)(pos + T), p->dh};
  d.q_ss = 3 * w;
  d.q_sb = T * d.q_ss;
  d.k_ss = d.v_ss = d.o_ss = w;
  d.k_sb = d.v_sb = k->shape[1] * w;
  d.o_sb = T * w;
  d.scale = 1.0f / sqrtf((float)p->dh);
  d.head0 = p->head0;
  d.heads_total = p->heads_total;
  if (!(*o = new3(B, T, w, qkv->device)))
    return AX_ENOMEM;
  return AX_K(ax_backend_of(qkv->device), attn_causal_fwd, &d, ax_f32(qkv),
              ax_f32(k), ax_f32(v), ax_f32(*o), NULL);
}

/* attend_wide on the operands of the projection's output qkv. */
static int attend_cached(const causal_priv *p, const ax_exec *ex, ax_slot *slot,
                         ax_tensor *qkv, ax_tensor **o) {
  ax_tensor *wide = NULL;
  int rc = operands(ex, qkv, NULL, &wide);
  if (rc == AX_OK)
    rc = attend_wide(p, ex, slot, wide, o);
  ax_tensor_release(wide);
  return rc;
}

static int causal_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                          const ax_tlist *in, ax_tlist *out) {
  causal_priv *p = m->priv;
  AX_TRY(axi_tf_check_in("causal attention", in, 1));
  ax_tensor *x = in->t[0]; // (B, S, hidden)
  char b[96];
  if (x->ndim != 3 || x->shape[2] != p->hidden)
    return ax_seterr(AX_ESHAPE, "causal attention: x %s must be (B, S, %d)",
                     ax_tensor_shape_str(x, b, sizeof b), p->hidden);
  if (ex->kv_decode && !slot)
    return ax_seterr(AX_EINVAL, "causal attention: decoding keeps its "
                                "key/value cache in the slot: none given");
  /* Decoding keeps nothing of the projections: only the cache. */
  ax_slot *ps = ex->kv_decode ? NULL : slot;
  ax_tensor *qkv = NULL, *o = NULL, *y = NULL;
  int rc = axi_tf_child_fwd(m, 0, ex, ps, x, &qkv); // (B, S, 3 width)
  if (rc == AX_OK)
    rc = ex->kv_decode ? attend_cached(p, ex, slot, qkv, &o)
                       : attend(p, ex, slot, qkv, &o);
  if (rc == AX_OK)
    rc = axi_tf_child_fwd(m, 1, ex, ps, o, &y); // (B, S, hidden)
  ax_tensor_release(qkv);
  ax_tensor_release(o);
  if (rc != AX_OK)
    return rc;
  *out = ax_tlist1(y);
  return AX_OK;
}

/* The backward walk, each child whole or only its input half (`part`). */
static int causal_grad(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                       ax_slot *slot, ax_tensor *dy, ax_tensor **dx) {
  causal_priv *p = m->priv;
  ax_tensor *qkv = ax_slot_get(slot, SAVE_QKV), *o = ax_slot_get(slot, SAVE_O);
  ax_tensor *lse = ax_slot_get(slot, SAVE_LSE);
  if (!qkv || !o || !lse)
    return axi_tf_no_state("causal attention");
  int B = (int)qkv->shape[0], S = (int)qkv->shape[1];
  if (ax_tensor_numel(dy) != (size_t)B * S * p->hidden)
    return ax_seterr(AX_ESHAPE,
                     "causal attention: gradient has %zu elements, "
                     "expected (%d, %d, %d)",
                     ax_tensor_numel(dy), B, S, p->hidden);
  ax_tensor *dout = NULL, *dqkv = NULL, *qw = NULL, *ow = NULL;
  AX_TRY(axi_tf_child_bwd(part, m, 1, ex, slot, 1, dy, &dout)); // (B, S, w)
  int rc = ax_slot_get_f32(slot, SAVE_QKV, &qw); /* widened, in bf16 */
  if (rc == AX_OK)
    rc = ax_slot_get_f32(slot, SAVE_O, &ow);
  if (rc == AX_OK && !(dqkv = ax_tensor_like(qw)))
    rc = AX_ENOMEM;
  if (rc == AX_OK) {
    ax_attn_desc d = desc_of(p, B, S, (int)ax_slot_int(slot, INT_DROP),
                             (uint64_t)ax_slot_int(slot, INT_SEED));
    const float *q = ax_f32(qw), *k = q + d.o_ss, *v = k + d.o_ss;
    float *dq = ax_f32(dqkv), *dk = dq + d.o_ss, *dv = dk + d.o_ss;
    rc = AX_K(ax_backend_of(dy->device), attn_causal_bwd, &d, q, k, v,
              ax_f32(ow), ax_f32(dout), ax_f32(lse), dq, dk, dv);
  }
  if (rc == AX_OK)
    rc = axi_tf_child_bwd(part, m, 0, ex, slot, ex->need_dx, dqkv, dx);
  ax_tensor_release(dout);
  ax_tensor_release(dqkv);
  ax_tensor_release(qw);
  ax_tensor_release(ow);
  return rc;
}

/* The backward (module.h's walk). The input half keeps nothing of its
 * own: the projections keep their inputs and output gradients, so the
 * weight half is the children's. */
static int causal_walk(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                       ax_slot *slot, const ax_tlist *dout, ax_tlist *din) {
  if (part == AX_BWD_WEIGHT)
    return ax_walk_children(part, m, ex, slot, dout, din);
  AX_TRY(axi_tf_check_in("causal attention", dout, 1));
  ax_tensor *dx = NULL;
  int rc = causal_grad(part, m, ex, slot, dout->t[0], &dx);
  if (rc == AX_OK) /* backward consumes the saved state */
    for (int i = SAVE_QKV; i <= SAVE_LSE; i++)
      ax_slot_put(slot, i, NULL);
  if (rc != AX_OK || !ex->need_dx) {
    ax_tensor_release(dx);
    return rc;
  }
  *din = ax_tlist1(dx);
  return AX_OK;
}

static const ax_module_ops causal_ops = {
    /* .kind = */ "causal attention",
    /* .forward = */ causal_forward,
    /* .backward = */ NULL,
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ NULL,
    /* .backward_weight = */ NULL,
    /* .walk = */ causal_walk,
};

ax_module *axi_tf_causal_new(int hidden, int heads, float dropout,
                             uint64_t salt, float proj_std, ax_tp tp) {
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size || heads <= 0 ||
      heads % tp.size != 0) {
    ax_seterr(AX_EINVAL,
              "causal attention: member %d of %d must hold a whole "
              "share of %d heads",
              tp.rank, tp.size, heads);
    return NULL;
  }
  if (hidden <= 0 || hidden % heads != 0) {
    ax_seterr(AX_EINVAL,
              "causal attention: %d heads must divide hidden %d "
              "(positive)",
              heads, hidden);
    return NULL;
  }
  if (!(dropout >= 0.0f && dropout < 1.0f) || !(proj_std > 0.0f)) {
    ax_seterr(AX_EINVAL,
              "causal attention: dropout %g outside [0, 1) or "
              "projection std %g not positive",
              (double)dropout, (double)proj_std);
    return NULL;
  }
  ax_module *m = ax_module_new(&causal_ops, sizeof(causal_priv));
  if (!m) {
    ax_seterr(AX_ENOMEM, "causal attention: no memory");
    return NULL;
  }
  causal_priv *p = m->priv;
  p->hidden = hidden;
  p->heads = heads / tp.size;
  p->dh = hidden / heads;
  p->head0 = tp.rank * p->heads;
  p->heads_total = heads;
  p->dropout = dropout;
  p->salt = salt;
  if (ax_module_add(m, ax_linear_column_new(hidden, 3 * hidden, 1,
                                            AX_BERT_INIT_STD, 3, tp)) ||
      ax_module_add(m, ax_linear_row_new(hidden, hidden, 1, proj_std, tp))) {
    ax_module_free(m);
    ax_seterr(AX_ENOMEM, "causal attention: no memory");
    return NULL;
  }
  return m;
}

ax_module *ax_causal_attn_new_tp(int hidden, int heads, float dropout,
                                 uint64_t salt, ax_tp tp) {
  return axi_tf_causal_new(hidden, heads, dropout, salt, AX_BERT_INIT_STD, tp);
}

ax_module *ax_causal_attn_new(int hidden, int heads, float dropout,
                              uint64_t salt) {
  return ax_causal_attn_new_tp(hidden, heads, dropout, salt, AX_TP_WHOLE);
}
