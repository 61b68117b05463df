/* The summation order of axon's gradient reductions: one helper for every
 * place that sums a list of same-sized buffers whose order matters to the
 * bits (a stage's micro-batch gradients, a collective group's members, the
 * tests' single-process references), so that they all add in the same
 * order.
 *
 * Leaves 0, 1, ..., n-1 are summed in one of two orders:
 *  - AX_SUM_TREE: a fixed binary tree. The sum over leaves [lo, hi) is
 *    the sum over [lo, lo + p) plus the sum over [lo + p, hi), p the
 *    largest power of two below hi - lo: ((x0 + x1) + (x2 + x3)) for four
 *    leaves, ((x0 + x1) + x2) for three. Every aligned block of 2^k leaves
 *    [j 2^k, (j + 1) 2^k) is a subtree, so summing such blocks apart (the
 *    micro-batches of one replica) and then the block sums in this same
 *    tree (the replicas) gives the bits of the tree over all the leaves:
 *    the result depends on the leaves' global order only, not on how
 *    they are spread, as long as every block holds 2^k of them.
 *  - AX_SUM_CHAIN: left to right, (((x0 + x1) + x2) + ...).
 * Each addition is one IEEE addition per element (commutative, so the
 * side an operand comes from does not matter).
 *
 * Use: ax_sum_tree_init, then ax_sum_tree_push leaf 0, 1, ... in order;
 * the helper keeps the partial sums (at most log2(n) + 1 of them for the
 * tree, 1 for the chain) and merges them as soon as the order allows,
 * calling add(user, acc, x) for acc += x (acc holds the left operand and
 * keeps the result) and then drop(user, x), after which x is the caller's
 * again. ax_sum_tree_finish merges what is left and hands out the sum in
 * leaf 0's buffer. The buffers are opaque to the helper (a tensor, a host
 * array: whatever add and drop take). Not thread-safe: one caller at a
 * time. */
#ifndef AX_KERNELS_SUM_TREE_H
#define AX_KERNELS_SUM_TREE_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ax_sum_order {
  AX_SUM_TREE = 0,  /* the fixed binary tree (the default) */
  AX_SUM_CHAIN = 1, /* left to right */
} ax_sum_order;

#define AX_SUM_ORDERS 2
#define AX_SUM_TREE_DEPTH 64 /* partial sums at most (any 64-bit count) */

typedef struct ax_sum_tree {
  ax_sum_order order;
  int (*add)(void *user, void *acc, void *x); /* acc += x; AX_OK or error */
  void (*drop)(void *user, void *x);          /* x is free again */
  void *user;
  long leaves;                   /* pushed so far */
  int depth;                     /* partial sums held */
  void *part[AX_SUM_TREE_DEPTH]; /* partial sums, leftmost first */
  long size[AX_SUM_TREE_DEPTH];  /* leaves in each */
} ax_sum_tree;

/* An empty sum. add and drop must not be NULL. */
void ax_sum_tree_init(ax_sum_tree *t, ax_sum_order order,
                      int (*add)(void *user, void *acc, void *x),
                      void (*drop)(void *user, void *x), void *user);
/* Adds leaf number t->leaves (the helper holds it until a merge drops it
 * or the finish hands it out). On a failed add the operands involved are
 * dropped, the error returned, and the sum must be cleared. */
int ax_sum_tree_push(ax_sum_tree *t, void *leaf);
/* Merges every partial sum (right to left) and hands the total out in
 * *out (leaf 0's buffer; NULL when nothing was pushed); the sum is empty
 * afterwards. On error *out is NULL and the sum must be cleared. */
int ax_sum_tree_finish(ax_sum_tree *t, void **out);
/* Drops every partial sum held; the sum is empty afterwards. */
void ax_sum_tree_clear(ax_sum_tree *t);
/* The order's name ("tree", "chain"), or NULL; and the order of a name
 * (-1 if none). */
const char *ax_sum_order_name(int order);
int ax_sum_order_find(const char *name);

#ifdef __cplusplus
}
#endif
#endif
