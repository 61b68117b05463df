/* Single-process training on the installed Fashion-MNIST: reproducibility
 * bit for bit, and the MLP's accuracy after one epoch. */
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "axon/runtime/pipeline/coord/train.h"
#include "harness.h"

static void same_seed_same_curve(void **state) {
  ax_cpu_set_threads(2);
  ax_train_opts o = ax_train_defaults();
  o.max_steps = 40;
  o.eval_limit = 500;
  o.data_config = "limit=5000";
  ax_train_report a, b, c;
  AX_ASSERT_OK(ax_train_local(&o, &a));
  AX_ASSERT_OK(ax_train_local(&o, &b));
  o.seed = 2;
  AX_ASSERT_OK(ax_train_local(&o, &c));
  assert_int_equal(a.n_loss, 40);
  assert_int_equal(b.n_loss, 40);
  assert_memory_equal(a.loss_curve, b.loss_curve, 40 * sizeof(double));
  assert_memory_not_equal(a.loss_curve, c.loss_curve, 40 * sizeof(double));
  free(a.loss_curve);
  free(b.loss_curve);
  free(c.loss_curve);
}

static void mlp_one_epoch_accuracy(void **state) {
  ax_cpu_set_threads(2);
  ax_train_opts o = ax_train_defaults();
  o.epochs = 1;
  o.batch = 64;
  o.optim_config = "opt=adamw,lr=2e-3,wd=0,sched=cosine";
  double t0 = ax_clock_s();
  ax_train_report r;
  AX_ASSERT_OK(ax_train_local(&o, &r));
  double dt = ax_clock_s() - t0;
  print_message("mlp: 1 epoch, test accuracy %.4f, %.1f s, %.0f samples/s\n",
                r.test_accuracy, dt, r.samples_per_s);
  assert_true(r.test_accuracy >= 0.85);
  assert_true(dt < 120.0);
  free(r.loss_curve);
}

static void bad_input_is_a_clear_error(void **state) {
  ax_train_opts o = ax_train_defaults();
  o.model = "nosuchmodel";
  ax_train_report r;
  AX_ASSERT_ERR(ax_train_local(&o, &r), AX_ENOTFOUND);
  free(r.loss_curve);
  o = ax_train_defaults();
  o.data_config = "dir=/nonexistent";
  AX_ASSERT_ERR(ax_train_local(&o, &r), AX_ENOTFOUND);
  free(r.loss_curve);
  /* MLP widths that do not match 28x28 images: a shape error, no crash. */
  o = ax_train_defaults();
  o.model_config = "widths=100/10";
  o.max_steps = 1;
  AX_ASSERT_ERR(ax_train_local(&o, &r), AX_ESHAPE);
  free(r.loss_curve);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(same_seed_same_curve),
      cmocka_unit_test(mlp_one_epoch_accuracy),
      cmocka_unit_test(bad_input_is_a_clear_error),
  };
  return AX_TEST_MAIN(t);
}
