/* The summation order of the gradient reductions (sum_tree.h): a binary
 * counter over the leaves. Pushing leaf i puts it on a stack of partial
 * sums; the tree then merges the top two while they hold as many leaves
 * each (so the stack holds one sum per set bit of i + 1, largest first),
 * the chain always. Finishing merges the stack from the top, which is the
 * tree's split at the largest power of two below the leaf count. */
#include "axon/kernels/sum_tree.h"

#include <string.h>

#include "axon/kernels/error.h"

static const char *const g_names[AX_SUM_ORDERS] = {"tree", "chain"};

void ax_sum_tree_init(ax_sum_tree *t, ax_sum_order order,
                      int (*add)(void *user, void *acc, void *x),
                      void (*drop)(void *user, void *x), void *user) {
  memset(t, 0, sizeof *t);
  t->order = order;
  t->add = add;
  t->drop = drop;
  t->user = user;
}

/* The top two partial sums become one: part[d-2] += part[d-1]. */
static int merge_top(ax_sum_tree *t) {
  int d = t->depth;
  int err = t->add(t->user, t->part[d - 2], t->part[d - 1]);
  t->drop(t->user, t->part[d - 1]);
  t->size[d - 2] += t->size[d - 1];
  t->depth = d - 1;
  return err;
}

int ax_sum_tree_push(ax_sum_tree *t, void *leaf) {
  if (t->depth == AX_SUM_TREE_DEPTH) { /* a chain never gets here */
    t->drop(t->user, leaf);
    return ax_seterr(AX_EINTERNAL, "sum tree: more than 2^64 leaves");
  }
  t->part[t->depth] = leaf;
  t->size[t->depth++] = 1;
  t->leaves++;
  while (t->depth >= 2 && (t->order == AX_SUM_CHAIN ||
                           t->size[t->depth - 2] == t->size[t->depth - 1]))
    AX_TRY(merge_top(t));
  return AX_OK;
}

int ax_sum_tree_finish(ax_sum_tree *t, void **out) {
  *out = NULL;
  while (t->depth >= 2)
    AX_TRY(merge_top(t));
  if (t->depth == 1)
    *out = t->part[0];
  t->depth = 0;
  t->leaves = 0;
  return AX_OK;
}

void ax_sum_tree_clear(ax_sum_tree *t) {
  while (t->depth > 0)
    t->drop(t->user, t->part[--t->depth]);
  t->leaves = 0;
}

const char *ax_sum_order_name(int order) {
  return order >= 0 && order < AX_SUM_ORDERS ? g_names[order] : NULL;
}

int ax_sum_order_find(const char *name) {
  for (int i = 0; name && i < AX_SUM_ORDERS; i++)
    if (!strcmp(name, g_names[i]))
      return i;
  return -1;
}
