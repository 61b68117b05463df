/* The collective algorithms (ring all-reduce, ring broadcast, neighbour
 * exchange) run by a group's communication thread, their public async
 * entry points, and the bucketed all-reduce fed by ax_exec.grad_ready. */
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/autograd/collective-impl.h"

int axi_coll_submit(ax_coll_op *op); /* collective.c */

/* Chunk i of N of a range of n elements starting at off. */
static void chunk(size_t off, size_t n, int N, int i, size_t *c0, size_t *cn) {
  size_t base = n / N, rem = n % N;
  *c0 = off + i * base + ((size_t)i < rem ? (size_t)i : rem);
  *cn = base + ((size_t)i < rem);
}

static int mod(int a, int N) { return ((a % N) + N) % N; }

/* Pieces a ring step's chunk is cut into, so that a member forwards the
 * first piece of a chunk while later ones are still arriving (the steps
 * overlap instead of running one after the other). Both ends derive the
 * same cut from the chunk's size. */
#define RING_PIECE ((size_t)1 << 17) /* floats: 512 KiB */

static size_t n_pieces(size_t cn) {
  return cn ? (cn + RING_PIECE - 1) / RING_PIECE : 1;
}

static void piece(size_t c0, size_t cn, size_t p, size_t *p0, size_t *pn) {
  *p0 = c0 + p * RING_PIECE;
  *pn = cn - p * RING_PIECE < RING_PIECE ? cn - p * RING_PIECE : RING_PIECE;
  if (cn == 0)
    *pn = 0;
}

/* Message id of piece p of step s (steps of one phase < 2N). */
static int64_t msg_id(int s, size_t p) { return (int64_t)p * 4096 + s; }

/* One phase of the ring: steps 0..N-2 with message steps base + s. At step
 * s a member sends chunk send_chunk(s) and receives chunk send_chunk(s + 1)
 * (adding it when `add`), piece by piece; a received piece is forwarded at
 * once as part of the next step's send. */
static int ring_phase(ax_coll_op *op, float *d, int64_t deadline, int base,
                      int first, int add) {
  ax_coll_group *g = op->g;
  int N = g->size, r = g->rank, next = mod(r + 1, N);
  size_t c0, cn;
  chunk(op->off, op->n, N, mod(first, N), &c0, &cn);
  for (size_t p = 0; p < n_pieces(cn); p++) { /* step 0: what we hold */
    size_t p0, pn;
    piece(c0, cn, p, &p0, &pn);
    AX_TRY(axi_coll_send(g, next, op->seq, msg_id(base, p), d + p0, pn));
  }
  for (int s = 0; s < N - 1; s++) {
    chunk(op->off, op->n, N, mod(first - s - 1, N), &c0, &cn);
    for (size_t p = 0; p < n_pieces(cn); p++) {
      size_t p0, pn;
      piece(c0, cn, p, &p0, &pn);
      AX_TRY(axi_coll_recv(g, op->seq, msg_id(base + s, p), d + p0, pn, add,
                           deadline));
      if (s + 1 < N - 1) /* forward it as step s + 1 */
        AX_TRY(axi_coll_send(g, next, op->seq, msg_id(base + s + 1, p), d + p0,
                             pn));
    }
  }
  return AX_OK;
}

/* Reduce-scatter (message steps 0..N-2) then all-gather (steps N..2N-2):
 * after the first phase member r holds the full sum of chunk r + 1, which
 * it scales for AVG before passing it on, so every member ends with the
 * same bits. Every element is summed in the same ring order whatever the
 * piece size. */
static int ring_reduce_scatter(ax_coll_op *op, float *d, int64_t deadline) {
  ax_coll_group *g = op->g;
  int N = g->size, r = g->rank;
  AX_TRY(ring_phase(op, d, deadline, 0, r, 1));
  if (op->reduce == AX_COLL_AVG && N > 1) {
    size_t c0, cn;
    chunk(op->off, op->n, N, mod(r + 1, N), &c0, &cn);
    for (size_t i = 0; i < cn; i++)
      d[c0 + i] /= (float)N;
  }
  return AX_OK;
}

static int ring_allgather(ax_coll_op *op, float *d, int64_t deadline) {
  return ring_phase(op, d, deadline, op->g->size, op->g->rank + 1, 0);
}

static int ring_allreduce(ax_coll_op *op, float *d, int64_t deadline) {
  AX_TRY(ring_reduce_scatter(op, d, deadline));
  return ring_allgather(op, d, deadline);
}

void ax_coll_shard(const ax_coll_group *g, size_t n, size_t *off, size_t *len) {
  chunk(0, n, g->size, mod(g->rank + 1, g->size), off, len);
}

/* Root sends to its successor, each member forwards to its own unless the
 * successor is the root; pieces of 1 MiB pipeline along the ring. */
static int ring_broadcast(ax_coll_op *op, float *d, int64_t deadline) {
  ax_coll_group *g = op->g;
  int N = g->size, r = g->rank, next = mod(r + 1, N);
  const size_t piece = 1 << 18;
  size_t n = op->n, pieces = n ? (n + piece - 1) / piece : 1;
  for (size_t p = 0; p < pieces; p++) {
    size_t c0 = op->off + p * piece, cn = n - p * piece;
    if (cn > piece)
      cn = piece;
    if (r != op->root)
      AX_TRY(axi_coll_recv(g, op->seq, (int64_t)p, d + c0, cn, 0, deadline));
    if (next != op->root)
      AX_TRY(axi_coll_send(g, next, op->seq, (int64_t)p, d + c0, cn));
  }
  return AX_OK;
}

/* Step 0 travels to the successor (its "from previous"), step 1 to the
 * predecessor (its "from next"). */
static int neighbors(ax_coll_op *op, float *x, int64_t deadline) {
  ax_coll_group *g = op->g;
  int N = g->size, r = g->rank;
  size_t n = op->n;
  if (N == 1) {
    memcpy(op->a->data, x, n * sizeof(float));
    memcpy(op->b->data, x, n * sizeof(float));
    return AX_OK;
  }
  AX_TRY(axi_coll_send(g, mod(r + 1, N), op->seq, 0, x, n));
  AX_TRY(axi_coll_send(g, mod(r - 1, N), op->seq, 1, x, n));
  AX_TRY(axi_coll_recv(g, op->seq, 0, ax_f32(op->a), n, 0, deadline));
  return axi_coll_recv(g, op->seq, 1, ax_f32(op->b), n, 0, deadline);
}

int axi_coll_run(ax_coll_op *op, float *data) {
  int64_t deadline = axi_coll_now_ms() + op->g->timeout_ms;
  switch (op->kind) {
  case AXI_OP_ALLREDUCE:
    return op->g->size == 1 ? AX_OK : ring_allreduce(op, data, deadline);
  case AXI_OP_BCAST:
    return op->g->size == 1 ? AX_OK : ring_broadcast(op, data, deadline);
  case AXI_OP_NEIGH:
    return neighbors(op, data, deadline);
  case AXI_OP_REDUCE_SCATTER:
    return op->g->size == 1 ? AX_OK : ring_reduce_scatter(op, data, deadline);
  case AXI_OP_ALLGATHER:
    return op->g->size == 1 ? AX_OK : ring_allgather(op, data, deadline);
  }
  return ax_seterr(AX_EINTERNAL, "collective: unknown op");
}

/* ---- public entry points ------------------------------------------------ */

static int new_op(ax_coll_group *g, axi_coll_kind kind, ax_tensor *t,
                  size_t off, size_t n, ax_coll_op **out) {
  *out = NULL;
  if (!g || !t || t->dtype != AX_F32)
    return ax_seterr(AX_EINVAL, "collective: need a group and an f32 tensor");
  size_t numel = ax_tensor_numel(t);
  if (n == 0 && off <= numel)
    n = numel - off;
  if (off + n > numel || n == 0)
    return ax_seterr(AX_EINVAL, "collective: range [%zu, +%zu) outside %zu",
                     off, n, numel);
  ax_coll_op *op = calloc(1, sizeof *op);
  if (!op)
    return AX_ENOMEM;
  op->g = g;
  op->kind = kind;
  op->t = ax_tensor_retain(t);
  op->off = off;
  op->n = n;
  *out = op;
  return AX_OK;
}

int ax_coll_allreduce_async(ax_coll_group *g, ax_tensor *t, size_t off,
                            size_t n, ax_coll_reduce red, ax_coll_op **out) {
  AX_TRY(new_op(g, AXI_OP_ALLREDUCE, t, off, n, out));
  (*out)->reduce = red;
  return axi_coll_submit(*out);
}

int ax_coll_allreduce(ax_coll_group *g, ax_tensor *t, ax_coll_reduce red) {
  ax_coll_op *op;
  AX_TRY(ax_coll_allreduce_async(g, t, 0, 0, red, &op));
  return ax_coll_wait(op, 0);
}

int ax_coll_reduce_scatter(ax_coll_group *g, ax_tensor *t, ax_coll_reduce red) {
  ax_coll_op *op;
  AX_TRY(new_op(g, AXI_OP_REDUCE_SCATTER, t, 0, 0, &op));
  op->reduce = red;
  AX_TRY(axi_coll_submit(op));
  return ax_coll_wait(op, 0);
}

int ax_coll_allgather(ax_coll_group *g, ax_tensor *t) {
  ax_coll_op *op;
  AX_TRY(new_op(g, AXI_OP_ALLGATHER, t, 0, 0, &op));
  AX_TRY(axi_coll_submit(op));
  return ax_coll_wait(op, 0);
}

int ax_coll_broadcast(ax_coll_group *g, ax_tensor *t, int root) {
  if (!g || root < 0 || root >= g->size)
    return ax_seterr(AX_EINVAL, "ax_coll_broadcast: bad root %d", root);
  ax_coll_op *op;
  AX_TRY(new_op(g, AXI_OP_BCAST, t, 0, 0, &op));
  op->root = root;
  AX_TRY(axi_coll_submit(op));
  return ax_coll_wait(op, 0);
}

int ax_coll_neighbors_async(ax_coll_group *g, ax_tensor *x,
                            ax_tensor *from_prev, ax_tensor *from_next,
                            ax_coll_op **out) {
  *out = NULL;
  if (!from_prev || !from_next || !x ||
      ax_tensor_numel(from_prev) != ax_tensor_numel(x) ||
      ax_tensor_numel(from_next) != ax_tensor_numel(x))
    return ax_seterr(AX_EINVAL, "ax_coll_neighbors: outputs must be CPU "
                                "tensors of x's size");
  const ax_tensor *dev_out = from_prev->device.type != AX_DEV_CPU   ? from_prev
                             : from_next->device.type != AX_DEV_CPU ? from_next
                                                                    : NULL;
  if (dev_out) { /* received straight into host memory */
    char b[16];
    return ax_seterr(AX_EUNSUPPORTED,
                     "ax_coll_neighbors: outputs must be CPU "
                     "tensors, got one on %s",
                     ax_device_str(dev_out->device, b, sizeof b));
  }
  AX_TRY(new_op(g, AXI_OP_NEIGH, x, 0, 0, out));
  (*out)->a = ax_tensor_retain(from_prev);
  (*out)->b = ax_tensor_retain(from_next);
  return axi_coll_submit(*out);
}

/* ---- buckets ------------------------------------------------------------- */

struct ax_coll_buckets {
  ax_coll_group *g;
  ax_tensor *grads;
  size_t total, min_floats;
  ax_coll_reduce reduce;
  size_t lo, hi; /* reported but not yet submitted, when `have` */
  int have, any;
  size_t sent_lo, sent_hi; /* hull of the submitted ranges */
  ax_coll_op **ops;
  int nops, cap, err;
};

int ax_coll_buckets_begin(ax_coll_group *g, ax_tensor *grads,
                          size_t bucket_bytes, ax_coll_reduce red,
                          ax_coll_buckets **out) {
  *out = NULL;
  if (!g || !grads || grads->dtype != AX_F32)
    return ax_seterr(AX_EINVAL, "ax_coll_buckets_begin: bad arguments");
  ax_coll_buckets *b = calloc(1, sizeof *b);
  if (!b)
    return AX_ENOMEM;
  b->g = g;
  b->grads = ax_tensor_retain(grads);
  b->total = ax_tensor_numel(grads);
  b->min_floats = bucket_bytes / sizeof(float);
  b->reduce = red;
  *out = b;
  return AX_OK;
}

static void submit_range(ax_coll_buckets *b, size_t lo, size_t hi) {
  if (hi <= lo || b->err)
    return;
  if (b->nops == b->cap) {
    int cap = b->cap ? 2 * b->cap : 16;
    ax_coll_op **o = realloc(b->ops, cap * sizeof *o);
    if (!o) {
      b->err = AX_ENOMEM;
      return;
    }
    b->ops = o;
    b->cap = cap;
  }
  ax_coll_op *op;
  int rc = ax_coll_allreduce_async(b->g, b->grads, lo, hi - lo, b->reduce, &op);
  if (rc != AX_OK) {
    b->err = rc;
    return;
  }
  b->ops[b->nops++] = op;
  if (!b->any || lo < b->sent_lo)
    b->sent_lo = lo;
  if (!b->any || hi > b->sent_hi)
    b->sent_hi = hi;
  b->any = 1;
}

void ax_coll_buckets_ready(void *arg, size_t off, size_t n) {
  ax_coll_buckets *b = arg;
  if (off + n > b->total)
    return;
  if (b->have && off + n == b->lo) {
    b->lo = off;
  } else {
    if (b->have)
      submit_range(b, b->lo, b->hi);
    b->lo = off;
    b->hi = off + n;
    b->have = 1;
  }
  if (b->hi - b->lo >= b->min_floats) {
    submit_range(b, b->lo, b->hi);
    b->have = 0;
  }
}

int ax_coll_buckets_end(ax_coll_buckets *b, int64_t timeout_ms) {
  if (b->have)
    submit_range(b, b->lo, b->hi);
  if (!b->any) {
    submit_range(b, 0, b->total);
  } else {
    submit_range(b, b->sent_hi, b->total);
    submit_range(b, 0, b->sent_lo);
  }
  int rc = b->err;
  for (int i = 0; i < b->nops; i++) {
    int r = ax_coll_wait(b->ops[i], timeout_ms);
    if (rc == AX_OK && r != AX_OK)
      rc = r;
  }
  ax_tensor_release(b->grads);
  free(b->ops);
  free(b);
  return rc;
}
