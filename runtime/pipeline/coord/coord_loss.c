/* A mini-batch's loss on the coordinator: the divisors of its labels and
 * the sum of its units' losses in the run's sum order (coordinator-impl.h),
 * for one pipeline (coord_run.c) and for replicas (replicas.c). */
#include "axon/kernels/sum_tree.h"
#include "axon/runtime/pipeline/coord/coordinator-impl.h"

/* Losses as the sum tree's leaves (sum_tree.h): the array's entries. */
static int loss_add(void *user, void *acc, void *x) {
  (void)user;
  *(double *)acc += *(double *)x;
  return AX_OK;
}
static void loss_drop(void *user, void *x) { (void)user, (void)x; }

double axi_pipe_sum_losses(int order, double *v, int n) {
  ax_sum_tree t;
  ax_sum_tree_init(&t, (ax_sum_order)order, loss_add, loss_drop, NULL);
  for (int i = 0; i < n; i++)
    ax_sum_tree_push(&t, &v[i]); /* loss_add cannot fail */
  void *sum = NULL;
  ax_sum_tree_finish(&t, &sum);
  return sum ? *(double *)sum : 0;
}

void axi_pipe_label_counts(const ax_tlist *lab, int ignore, int64_t *norm) {
  for (int i = 0; i < lab->n; i++) {
    const ax_tensor *l = lab->t[i];
    int64_t k = 0, n = (int64_t)ax_tensor_numel(l);
    for (int64_t j = 0; j < n; j++) {
      int64_t v = l->dtype == AX_I64 ? ((const int64_t *)l->data)[j]
                                     : ((const int32_t *)l->data)[j];
      k += v != ignore;
    }
    norm[i] = k;
  }
}
