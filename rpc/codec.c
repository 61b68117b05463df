/* Frame codec (see rpc/codec-impl.h). protobuf-c types stay in this file. */
#include <stdlib.h>
#include <string.h>

#include "axon.pb-c.h"
#include "axon/rpc/codec-impl.h"
#include "axon/rpc/pool-impl.h"
#include "axon/rpc/value-impl.h"

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

void axi_prefix_put(uint8_t *p, const axi_prefix *x) {
  p[0] = x->kind;
  p[1] = x->flags;
  p[2] = p[3] = 0;
  put32(p + 4, x->hdr_len);
  put64(p + 8, x->call_id);
  put64(p + 16, x->blob_len);
}

int axi_prefix_get(const uint8_t *p, axi_prefix *x) {
  x->kind = p[0];
  x->flags = p[1];
  x->hdr_len = get32(p + 4);
  x->call_id = get64(p + 8);
  x->blob_len = get64(p + 16);
  if (x->kind < AXI_REQUEST || x->kind > AXI_CHALLENGE)
    return ax_seterr(AX_EMALFORMED, "frame: unknown kind %u", x->kind);
  if (x->hdr_len > AXI_MAX_HDR)
    return ax_seterr(AX_EMALFORMED, "frame: header of %u bytes", x->hdr_len);
  return AX_OK;
}

static char *nz(const char *s) { return (char *)(s ? s : ""); }

/* Builds the protobuf body for m. Every allocation lives in `arena`
 * (a single malloc), freed by the caller. */
static int build_body(const axi_msg *m, Axon__FrameBody *b, void **arena,
                      size_t *blob_len) {
  size_t n = ax_values_count(m->values);
  size_t sz = n * (sizeof(Axon__Value *) + sizeof(Axon__Value) +
                   sizeof(Axon__TensorDesc) + sizeof(Axon__ExtValue)) +
              m->nmeta * (sizeof(Axon__Meta *) + sizeof(Axon__Meta));
  axon__frame_body__init(b);
  char *a = malloc(sz ? sz : 1);
  if (!a)
    return ax_seterr(AX_ENOMEM, "codec: no memory");
  *arena = a;
  b->fn = nz(m->fn);
  b->timeout_ms = m->timeout_ms;
  b->err = m->err;
  b->errmsg = nz(m->errmsg);
  b->node = nz(m->node);
  b->addr = nz(m->addr);
  b->bulk_addr = nz(m->bulk_addr);
  b->autograd_ctx = m->autograd_ctx;
  b->depth = m->depth;
  b->incarnation = m->incarnation;
  b->auth.data = (uint8_t *)m->auth;
  b->auth.len = m->auth ? m->auth_len : 0;
  Axon__Value **vp = (Axon__Value **)a;
  Axon__Value *vals = (Axon__Value *)(vp + n);
  Axon__TensorDesc *td = (Axon__TensorDesc *)(vals + n);
  Axon__ExtValue *ev = (Axon__ExtValue *)(td + n);
  Axon__Meta **mp = (Axon__Meta **)(ev + n);
  Axon__Meta *meta = (Axon__Meta *)(mp + m->nmeta);
  *blob_len = 0;
  for (size_t i = 0; i < n; i++) {
    axon__value__init(&vals[i]);
    vp[i] = &vals[i];
  }
  b->n_values = n;
  b->values = vp;
  for (size_t i = 0; i < n; i++) {
    const axi_value *x = &m->values->v[i];
    Axon__Value *v = &vals[i];
    switch (x->type) {
    case AX_VAL_I64:
      v->v_case = AXON__VALUE__V_I;
      v->i = x->u.i;
      break;
    case AX_VAL_F64:
      v->v_case = AXON__VALUE__V_D;
      v->d = x->u.d;
      break;
    case AX_VAL_STR:
      v->v_case = AXON__VALUE__V_S;
      v->s = x->u.buf.p;
      break;
    case AX_VAL_BYTES:
      v->v_case = AXON__VALUE__V_B;
      v->b.data = (uint8_t *)x->u.buf.p;
      v->b.len = x->u.buf.n;
      break;
    case AX_VAL_TENSOR:
      axon__tensor_desc__init(&td[i]);
      td[i].dtype = x->u.t->dtype;
      td[i].n_shape = x->u.t->ndim;
      td[i].shape = (int64_t *)x->u.t->shape;
      td[i].nbytes = ax_tensor_nbytes(x->u.t);
      td[i].device_type = (int32_t)x->u.t->device.type;
      td[i].device_index = x->u.t->device.index;
      *blob_len += td[i].nbytes;
      v->v_case = AXON__VALUE__V_T;
      v->t = &td[i];
      break;
    case AX_VAL_EXT: {
      const ax_value_ext_ops *ops = axi_value_ext_ops(x->u.ext.kind);
      void *p = NULL;
      size_t len = 0;
      int rc = ops->encode(x->u.ext.obj, &p, &len);
      if (rc != AX_OK)
        return rc; /* the caller frees ext payloads already encoded */
      axon__ext_value__init(&ev[i]);
      ev[i].kind = x->u.ext.kind;
      ev[i].data.data = p;
      ev[i].data.len = len;
      v->v_case = AXON__VALUE__V_E;
      v->e = &ev[i];
      break;
    }
    }
  }
  for (int i = 0; i < m->nmeta; i++) {
    axon__meta__init(&meta[i]);
    meta[i].key = nz(m->meta_key[i]);
    meta[i].val = m->meta_val[i];
    mp[i] = &meta[i];
  }
  b->n_meta = m->nmeta;
  b->meta = mp;
  return AX_OK;
}

static void free_ext_payloads(Axon__FrameBody *b) {
  for (size_t i = 0; i < b->n_values; i++)
    if (b->values[i]->v_case == AXON__VALUE__V_E && b->values[i]->e)
      free(b->values[i]->e->data.data);
}

int axi_frame_encode(const axi_msg *m, size_t lead, int with_blob,
                     uint8_t **out, size_t *len, size_t *blob_len) {
  Axon__FrameBody b;
  void *arena = NULL;
  int rc = build_body(m, &b, &arena, blob_len);
  if (rc != AX_OK) {
    free_ext_payloads(&b);
    free(arena);
    return rc;
  }
  size_t hl = axon__frame_body__get_packed_size(&b);
  if (hl > AXI_MAX_HDR) {
    free_ext_payloads(&b);
    free(arena);
    return ax_seterr(AX_ETOOBIG, "codec: header of %zu bytes", hl);
  }
  size_t total = lead + AXI_PREFIX_LEN + hl + (with_blob ? *blob_len : 0);
  uint8_t *p = malloc(total);
  if (!p) {
    free_ext_payloads(&b);
    free(arena);
    return ax_seterr(AX_ENOMEM, "codec: no memory for %zu bytes", total);
  }
  axi_prefix x = {.kind = (uint8_t)m->kind,
                  .hdr_len = (uint32_t)hl,
                  .call_id = m->call_id,
                  .blob_len = *blob_len};
  axi_prefix_put(p + lead, &x);
  axon__frame_body__pack(&b, p + lead + AXI_PREFIX_LEN);
  free_ext_payloads(&b);
  free(arena);
  if (with_blob) {
    uint8_t *q = p + lead + AXI_PREFIX_LEN + hl;
    for (size_t i = 0; i < ax_values_count(m->values); i++) {
      const axi_value *v = &m->values->v[i];
      if (v->type != AX_VAL_TENSOR)
        continue;
      size_t nb = ax_tensor_nbytes(v->u.t);
      if ((rc = ax_tensor_read(v->u.t, q, nb)) != AX_OK) {
        free(p);
        return rc;
      }
      q += nb;
    }
  }
  *out = p;
  *len = total;
  return AX_OK;
}

/* The device the sender had t on; an unknown type or index reads as
 * "unlisted" (a CUDA index no map can name), so the tensor lands on the
 * receiver's own device. */
static ax_device sender_device(const Axon__TensorDesc *t) {
  if (t->device_type == AX_DEV_CPU)
    return AX_CPU;
  if (t->device_type == AX_DEV_CUDA && t->device_index >= 0 &&
      t->device_index < AX_MAX_CUDA_DEVICES)
    return (ax_device){AX_DEV_CUDA, t->device_index};
  return (ax_device){AX_DEV_CUDA, -1};
}

static int decode_value(const Axon__Value *pv, ax_device dev,
                        const ax_device_map *map, size_t max_bytes, int lazy,
                        const char *from, ax_values *vals, uint64_t *sum) {
  switch (pv->v_case) {
  case AXON__VALUE__V_I:
    return ax_values_add_i64(vals, pv->i);
  case AXON__VALUE__V_D:
    return ax_values_add_f64(vals, pv->d);
  case AXON__VALUE__V_S:
    return ax_values_add_str(vals, pv->s ? pv->s : "");
  case AXON__VALUE__V_B:
    return ax_values_add_bytes(vals, pv->b.data, pv->b.len);
  case AXON__VALUE__V_T: {
    const Axon__TensorDesc *t = pv->t;
    if (!t || t->dtype < AX_F32 || t->dtype > AX_BF16 ||
        t->n_shape > AX_MAX_DIMS)
      return ax_seterr(AX_EMALFORMED, "frame: bad tensor descriptor");
    uint64_t numel = 1;
    for (size_t d = 0; d < t->n_shape; d++) {
      if (t->shape[d] < 0 ||
          (t->shape[d] && numel > UINT64_MAX / 8 / (uint64_t)t->shape[d]))
        return ax_seterr(AX_EMALFORMED, "frame: bad tensor shape");
      numel *= (uint64_t)t->shape[d];
    }
    if (numel * ax_dtype_size(t->dtype) != t->nbytes)
      return ax_seterr(AX_EMALFORMED,
                       "frame: tensor size does not match shape");
    if (t->nbytes > max_bytes || *sum + t->nbytes > max_bytes)
      return ax_seterr(AX_ETOOBIG, "frame: tensor of %llu bytes over the limit",
                       (unsigned long long)t->nbytes);
    *sum += t->nbytes;
    if (lazy) { /* storage comes with the bytes (axi_frame_alloc_tensor) */
      axi_value *slot = axi_values_push(vals);
      if (!slot)
        return ax_seterr(AX_ENOMEM, "frame: no memory");
      slot->type = AX_VAL_TENSOR;
      slot->u.t = NULL;
      return AX_OK;
    }
    ax_device at = ax_device_map_lookup(map, sender_device(t), dev);
    ax_tensor *x = axi_pool_tensor(t->dtype, (int)t->n_shape, t->shape, at);
    if (!x)
      return AX_ENOMEM; /* the message says which device refused */
    int rc = ax_values_add_tensor(vals, x);
    ax_tensor_release(x);
    return rc;
  }
  case AXON__VALUE__V_E: {
    const ax_value_ext_ops *ops = pv->e ? axi_value_ext_ops(pv->e->kind) : NULL;
    if (!ops)
      return ax_seterr(AX_EMALFORMED, "frame: unknown extension kind");
    void *obj = NULL;
    AX_TRY(ops->decode(pv->e->data.data, pv->e->data.len, from, &obj));
    int rc = ax_values_add_ext(vals, pv->e->kind, obj);
    if (ops->release)
      ops->release(obj);
    return rc;
  }
  default:
    return ax_seterr(AX_EMALFORMED, "frame: value without a type");
  }
}

/* Reads a protobuf varint; 0 when it runs past the end. */
static size_t varint(const uint8_t *p, size_t n, uint64_t *v) {
  *v = 0;
  for (size_t i = 0; i < n && i < 10; i++) {
    *v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
    if (!(p[i] & 0x80))
      return i + 1;
  }
  return 0;
}

/* Counts the repeated fields (values, meta) of a FrameBody on the wire, so
 * that a header holding millions of tiny values is refused before protobuf
 * allocates tens of bytes per value. Malformed input is left to protobuf. */
static int check_counts(const uint8_t *p, size_t n, size_t max) {
  size_t count = 0, i = 0;
  while (i < n) {
    uint64_t key, len;
    size_t k = varint(p + i, n - i, &key);
    if (!k)
      return AX_OK;
    i += k;
    unsigned field = (unsigned)(key >> 3), wt = (unsigned)(key & 7);
    if (wt == 0) {
      if (!(k = varint(p + i, n - i, &len)))
        return AX_OK;
      i += k;
    } else if (wt == 1 || wt == 5) {
      i += wt == 1 ? 8 : 4;
    } else if (wt == 2) {
      if (!(k = varint(p + i, n - i, &len)) || len > n - i - k)
        return AX_OK;
      i += k + len;
    } else {
      return AX_OK;
    }
    if ((field == 3 || field == 9) && ++count > max)
      return ax_seterr(AX_ETOOBIG, "frame: more than %zu values", max);
  }
  return AX_OK;
}

static const axi_limits g_dflt_limits = {AXI_MAX_HDR, 65536, (size_t)4 << 30};

int axi_frame_decode_body(const axi_prefix *x, const uint8_t *hdr,
                          ax_device dev, const ax_device_map *map,
                          const axi_limits *lim, int lazy, axi_msg *m) {
  memset(m, 0, sizeof *m);
  m->kind = x->kind; /* kept on error so that the call can be answered */
  m->call_id = x->call_id;
  if (!lim)
    lim = &g_dflt_limits;
  if (x->hdr_len > lim->max_hdr)
    return ax_seterr(AX_ETOOBIG, "frame: header of %u bytes over the %zu limit",
                     x->hdr_len, lim->max_hdr);
  if (x->blob_len > lim->max_tensor)
    return ax_seterr(AX_ETOOBIG, "frame: %llu tensor bytes over the %zu limit",
                     (unsigned long long)x->blob_len, lim->max_tensor);
  AX_TRY(check_counts(hdr, x->hdr_len, lim->max_values));
  Axon__FrameBody *b = axon__frame_body__unpack(NULL, x->hdr_len, hdr);
  if (!b)
    return ax_seterr(AX_EMALFORMED, "frame: undecodable header");
  m->pb_ = b;
  m->fn = b->fn;
  m->timeout_ms = b->timeout_ms;
  m->err = b->err;
  m->errmsg = b->errmsg;
  m->node = b->node;
  m->addr = b->addr;
  m->bulk_addr = b->bulk_addr;
  m->autograd_ctx = b->autograd_ctx;
  m->depth = b->depth;
  m->incarnation = b->incarnation;
  m->auth = b->auth.data;
  m->auth_len = b->auth.len;
  for (size_t i = 0; i < b->n_meta && i < AXI_MAX_META; i++) {
    m->meta_key[i] = b->meta[i]->key;
    m->meta_val[i] = b->meta[i]->val;
    m->nmeta++;
  }
  int rc = AX_OK;
  uint64_t sum = 0;
  if (b->n_values && !(m->values = ax_values_new()))
    rc = AX_ENOMEM;
  for (size_t i = 0; rc == AX_OK && i < b->n_values; i++)
    rc = decode_value(b->values[i], dev, map, lim->max_tensor, lazy, b->node,
                      m->values, &sum);
  if (rc == AX_OK && sum != x->blob_len)
    rc =
        ax_seterr(AX_EMALFORMED, "frame: blob of %llu bytes, tensors need %llu",
                  (unsigned long long)x->blob_len, (unsigned long long)sum);
  if (rc != AX_OK) {
    int kind = m->kind;
    uint64_t id = m->call_id;
    axi_msg_clear(m);
    m->kind = kind; /* kept so the receiver can answer the call */
    m->call_id = id;
  }
  return rc;
}

int axi_frame_alloc_tensor(axi_msg *m, size_t i, ax_device dev,
                           const ax_device_map *map) {
  const Axon__FrameBody *b = m->pb_;
  const Axon__TensorDesc *t = b->values[i]->t;
  ax_device at = ax_device_map_lookup(map, sender_device(t), dev);
  ax_tensor *x = axi_pool_tensor(t->dtype, (int)t->n_shape, t->shape, at);
  if (!x)
    return AX_ENOMEM;
  m->values->v[i].u.t = x;
  return AX_OK;
}

size_t axi_frame_tensor_bytes(const axi_msg *m, size_t i) {
  const Axon__FrameBody *b = m->pb_;
  return (size_t)b->values[i]->t->nbytes;
}

int axi_frame_decode(const uint8_t *p, size_t len, ax_device dev,
                     const ax_device_map *map, size_t max_bytes, axi_msg *m) {
  axi_limits lim = g_dflt_limits;
  lim.max_tensor = max_bytes;
  return axi_frame_decode_lim(p, len, dev, map, &lim, m);
}

int axi_frame_decode_lim(const uint8_t *p, size_t len, ax_device dev,
                         const ax_device_map *map, const axi_limits *lim,
                         axi_msg *m) {
  axi_prefix x;
  memset(m, 0, sizeof *m);
  if (len < AXI_PREFIX_LEN)
    return ax_seterr(AX_EMALFORMED, "frame: truncated prefix (%zu bytes)", len);
  AX_TRY(axi_prefix_get(p, &x));
  m->kind = x.kind;
  m->call_id = x.call_id;
  if ((uint64_t)len - AXI_PREFIX_LEN < (uint64_t)x.hdr_len + x.blob_len ||
      (uint64_t)len - AXI_PREFIX_LEN != (uint64_t)x.hdr_len + x.blob_len)
    return ax_seterr(AX_EMALFORMED, "frame: length %zu does not match prefix",
                     len);
  AX_TRY(axi_frame_decode_body(&x, p + AXI_PREFIX_LEN, dev, map, lim, 0, m));
  const uint8_t *q = p + AXI_PREFIX_LEN + x.hdr_len;
  for (size_t i = 0; i < ax_values_count(m->values); i++) {
    axi_value *v = &m->values->v[i];
    if (v->type != AX_VAL_TENSOR)
      continue;
    size_t nb = ax_tensor_nbytes(v->u.t);
    int rc = ax_tensor_write(v->u.t, q, nb);
    if (rc != AX_OK) {
      axi_msg_clear(m);
      return rc;
    }
    q += nb;
  }
  return AX_OK;
}

void axi_msg_clear(axi_msg *m) {
  if (m->pb_)
    axon__frame_body__free_unpacked(m->pb_, NULL);
  ax_values_free(m->values);
  memset(m, 0, sizeof *m);
}
