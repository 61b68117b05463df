/* The summation order of kernels/sum_tree.h, on symbolic leaves (each
 * buffer a string, each addition "(a+b)"): the tree's shape for 1 to 8
 * leaves and the chain's; a tree of aligned blocks of 2^k leaves summed
 * apart, then the block sums in the same tree, equals the tree over all the
 * leaves (what makes R replicas of M micro-batches layout-independent);
 * at most log2(n) + 1 partial sums held; clearing drops every buffer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/sum_tree.h"
#include "harness.h"

typedef struct sym {
  int live, most; /* buffers held now, at most */
} sym;

/* A leaf's buffer, large enough for any sum of these tests. */
static char *leaf(sym *y, const char *s) {
  y->live++;
  y->most = y->live > y->most ? y->live : y->most;
  char *b = malloc(1024);
  assert_non_null(b);
  snprintf(b, 1024, "%s", s);
  return b;
}

static int sym_add(void *u, void *acc, void *x) {
  (void)u;
  char buf[1024];
  snprintf(buf, sizeof buf, "(%s+%s)", (char *)acc, (char *)x);
  assert_true(strlen(buf) < sizeof buf - 1);
  strcpy(acc, buf);
  return 0;
}

static void sym_drop(void *u, void *x) {
  ((sym *)u)->live--;
  free(x);
}

/* The sum of leaves names[0 .. n-1] in `order` (a new string). */
static char *sum_of(ax_sum_order order, int n, char **names, sym *y) {
  ax_sum_tree t;
  ax_sum_tree_init(&t, order, sym_add, sym_drop, y);
  for (int i = 0; i < n; i++)
    AX_ASSERT_OK(ax_sum_tree_push(&t, leaf(y, names[i])));
  void *out = NULL;
  AX_ASSERT_OK(ax_sum_tree_finish(&t, &out));
  y->live--; /* handed out */
  return out;
}

static char *sum_n(ax_sum_order order, int n, sym *y) {
  char *names[64], bufs[64][8];
  for (int i = 0; i < n; i++) {
    snprintf(bufs[i], sizeof bufs[i], "%d", i);
    names[i] = bufs[i];
  }
  return sum_of(order, n, names, y);
}

static void test_shapes(void **state) {
  (void)state;
  static const char *tree[] = {
      "0",
      "(0+1)",
      "((0+1)+2)",
      "((0+1)+(2+3))",
      "(((0+1)+(2+3))+4)",
      "(((0+1)+(2+3))+(4+5))",
      "(((0+1)+(2+3))+((4+5)+6))",
      "(((0+1)+(2+3))+((4+5)+(6+7)))",
  };
  for (int n = 1; n <= 8; n++) {
    sym y = {0};
    char *s = sum_n(AX_SUM_TREE, n, &y);
    assert_string_equal(s, tree[n - 1]);
    free(s);
    assert_int_equal(y.live, 0);
    s = sum_n(AX_SUM_CHAIN, n, &y);
    char want[256] = "0";
    for (int i = 1; i < n; i++) {
      char w[256];
      snprintf(w, sizeof w, "(%s+%d)", want, i);
      strcpy(want, w);
    }
    assert_string_equal(s, want);
    free(s);
    assert_int_equal(y.live, 0);
  }
}

/* R blocks of M leaves (R, M powers of two): each block's tree, then the
 * tree of the block sums, is the tree over R M leaves; and the partial
 * sums held stay within log2(n) + 1 (plus the leaf being pushed). */
static void test_blocks_equal_whole(void **state) {
  (void)state;
  for (int RM = 1; RM <= 32; RM *= 2)
    for (int R = 1; R <= RM; R *= 2) {
      int M = RM / R;
      sym y = {0};
      char *whole = sum_n(AX_SUM_TREE, RM, &y);
      char *blocks[32];
      for (int r = 0; r < R; r++) {
        char *names[32], bufs[32][8];
        for (int j = 0; j < M; j++) {
          snprintf(bufs[j], sizeof bufs[j], "%d", r * M + j);
          names[j] = bufs[j];
        }
        blocks[r] = sum_of(AX_SUM_TREE, M, names, &y);
      }
      char *two = sum_of(AX_SUM_TREE, R, blocks, &y);
      assert_string_equal(two, whole);
      int lg = 0;
      while ((1 << lg) < RM)
        lg++;
      assert_true(y.most <= lg + 2);
      free(two);
      free(whole);
      for (int r = 0; r < R; r++)
        free(blocks[r]);
    }
}

static void test_clear_and_names(void **state) {
  (void)state;
  sym y = {0};
  ax_sum_tree t;
  ax_sum_tree_init(&t, AX_SUM_TREE, sym_add, sym_drop, &y);
  for (int i = 0; i < 7; i++)
    AX_ASSERT_OK(ax_sum_tree_push(&t, leaf(&y, "x")));
  assert_int_equal(t.depth, 3); /* 7 = 4 + 2 + 1 */
  ax_sum_tree_clear(&t);
  assert_int_equal(y.live, 0);
  void *out = (void *)1;
  AX_ASSERT_OK(ax_sum_tree_finish(&t, &out));
  assert_null(out);
  assert_string_equal(ax_sum_order_name(AX_SUM_TREE), "tree");
  assert_string_equal(ax_sum_order_name(AX_SUM_CHAIN), "chain");
  assert_null(ax_sum_order_name(AX_SUM_ORDERS));
  assert_int_equal(ax_sum_order_find("chain"), AX_SUM_CHAIN);
  assert_int_equal(ax_sum_order_find("ring"), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shapes),
      cmocka_unit_test(test_blocks_equal_whole),
      cmocka_unit_test(test_clear_and_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
