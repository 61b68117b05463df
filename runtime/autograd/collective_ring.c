/* The collective algorithms (ring all-reduce and its halves, ring
 * broadcast, neighbour exchange), run by a group's communication thread on
 * host data. Their public entry points are in collective_ops.c. */
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "axon/runtime/autograd/collective-impl.h"

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

/* ---- the tree's reduce-scatter ------------------------------------------
 * Chunk c of the range belongs to the member that holds it after the
 * ring's reduce-scatter (c - 1), so the all-gather, the shards
 * (ax_coll_shard) and ZeRO are the ring's. Every member sends its pieces
 * of the other members' chunks straight to them (message step = the
 * sender's rank); each member sums the N pieces of its own chunk, piece by
 * piece, as leaves 0 .. N-1 in rank order of the sum tree
 * (kernels/sum_tree.h), the same helper and tree as a stage's
 * micro-batches. Each member sends (N - 1) / N of the range, as in the
 * ring, straight to where it is summed instead of along N - 1 steps. */
typedef struct tree_pieces { /* the piece buffers of one chunk's sum */
  float *own;                /* this member's piece, in place */
  float *spare[AX_SUM_TREE_DEPTH + 1];
  int nspare;
  size_t n; /* elements of the current piece */
} tree_pieces;

static int piece_add(void *user, void *acc, void *x) {
  size_t n = ((tree_pieces *)user)->n;
  float *a = acc;
  const float *b = x;
  for (size_t i = 0; i < n; i++)
    a[i] += b[i];
  return AX_OK;
}

static void piece_drop(void *user, void *x) {
  tree_pieces *tp = user;
  if (x != tp->own) /* a received piece's buffer: used again */
    tp->spare[tp->nspare++] = x;
}

static int tree_sum_piece(ax_coll_op *op, tree_pieces *tp, size_t p, float *dst,
                          int64_t deadline) {
  ax_coll_group *g = op->g;
  ax_sum_tree t;
  ax_sum_tree_init(&t, AX_SUM_TREE, piece_add, piece_drop, tp);
  tp->own = dst;
  int err = AX_OK;
  for (int src = 0; src < g->size && err == AX_OK; src++) {
    float *leaf = dst;
    if (src != g->rank) {
      leaf = tp->nspare ? tp->spare[--tp->nspare]
                        : malloc(RING_PIECE * sizeof(float));
      err = leaf ? axi_coll_recv(g, op->seq, msg_id(src, p), leaf, tp->n, 0,
                                 deadline)
                 : AX_ENOMEM;
      if (err != AX_OK) {
        if (leaf)
          tp->spare[tp->nspare++] = leaf;
        break;
      }
    }
    err = ax_sum_tree_push(&t, leaf);
  }
  void *sum = NULL;
  if (err == AX_OK)
    err = ax_sum_tree_finish(&t, &sum);
  ax_sum_tree_clear(&t);
  if (err == AX_OK && sum != dst) { /* leaf 0's buffer holds it */
    memcpy(dst, sum, tp->n * sizeof(float));
    piece_drop(tp, sum);
  }
  return err;
}

/* Sends piece p of every other member's chunk to its owner (where the
 * chunk has one). */
static int send_pieces(ax_coll_op *op, const float *d, size_t p) {
  ax_coll_group *g = op->g;
  int N = g->size, r = g->rank;
  for (int c = 0; c < N; c++) {
    size_t c0, cn, p0, pn;
    int owner = mod(c - 1, N);
    chunk(op->off, op->n, N, c, &c0, &cn);
    if (owner == r || p >= n_pieces(cn))
      continue;
    piece(c0, cn, p, &p0, &pn);
    AX_TRY(axi_coll_send(g, owner, op->seq, msg_id(r, p), d + p0, pn));
  }
  return AX_OK;
}

/* Piece by piece, sends run one piece ahead of the sums: a member sends
 * pieces p + 1 once it summed its piece p - 1 (for which every member
 * sent its pieces p - 1), so a mailbox holds a few pieces per member,
 * not the range. */
static int tree_reduce_scatter(ax_coll_op *op, float *d, int64_t deadline) {
  ax_coll_group *g = op->g;
  int N = g->size, r = g->rank;
  size_t c0, cn, p0, pn;
  chunk(op->off, op->n, N, 0, &c0, &cn); /* the largest chunk */
  size_t most = n_pieces(cn);
  chunk(op->off, op->n, N, mod(r + 1, N), &c0, &cn); /* this member's */
  tree_pieces tp = {0};
  int err = send_pieces(op, d, 0);
  for (size_t p = 0; p < most && err == AX_OK; p++) {
    if (p + 1 < most)
      err = send_pieces(op, d, p + 1);
    if (err != AX_OK || p >= n_pieces(cn))
      continue;
    piece(c0, cn, p, &p0, &pn);
    tp.n = pn;
    err = tree_sum_piece(op, &tp, p, d + p0, deadline);
    for (size_t i = 0; err == AX_OK && op->reduce == AX_COLL_AVG && i < pn; i++)
      d[p0 + i] /= (float)N;
  }
  while (tp.nspare)
    free(tp.spare[--tp.nspare]);
  return err;
}

/* The first half of the group's all-reduce: its order's. */
static int reduce_scatter(ax_coll_op *op, float *d, int64_t deadline) {
  return op->g->order == AX_SUM_TREE ? tree_reduce_scatter(op, d, deadline)
                                     : ring_reduce_scatter(op, d, deadline);
}

static int ring_allgather(ax_coll_op *op, float *d, int64_t deadline) {
  return ring_phase(op, d, deadline, op->g->size, op->g->rank + 1, 0);
}

static int allreduce(ax_coll_op *op, float *d, int64_t deadline) {
  AX_TRY(reduce_scatter(op, d, deadline));
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
  int64_t deadline = ax_clock_ms() + op->g->timeout_ms;
  switch (op->kind) {
  case AXI_OP_ALLREDUCE:
    return op->g->size == 1 ? AX_OK : allreduce(op, data, deadline);
  case AXI_OP_BCAST:
    return op->g->size == 1 ? AX_OK : ring_broadcast(op, data, deadline);
  case AXI_OP_NEIGH:
    return neighbors(op, data, deadline);
  case AXI_OP_REDUCE_SCATTER:
    return op->g->size == 1 ? AX_OK : reduce_scatter(op, data, deadline);
  case AXI_OP_ALLGATHER:
    return op->g->size == 1 ? AX_OK : ring_allgather(op, data, deadline);
  }
  return ax_seterr(AX_EINTERNAL, "collective: unknown op");
}
