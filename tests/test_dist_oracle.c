/* The distributed-autograd oracle: a model split into 3 stages on 3 agent
 * processes, trained with distributed autograd and the distributed
 * optimizer (activations pass stage to stage as RRefs, the driver sends
 * only inputs, labels and control), ends with the same parameters (and
 * batch-norm running statistics) as single-process training of the same
 * model, seed and batches. MLP for 20 steps, ResNet20 for a few steps.
 * Also reports the time per step of both (AXON_BENCH=1 prints more). */
#include "harness.h"
#include "tests/dist_testutil.h"
#include "tests/mp_testutil.h"

#define NAGENTS 3
static const char *g_names[NAGENTS] = {"w1", "w2", "w3"};
static pid_t g_pids[NAGENTS];
static ax_node *g_drv;

static void test_mlp_oracle(void **state) {
  dt_oracle_cfg c = {"mlp",
                     "mlp.stage",
                     "widths=784/64/32/10",
                     "shape=1/28/28,classes=10,examples=640,seed=9",
                     "opt=sgd,lr=0.05,momentum=0.9",
                     20,
                     32,
                     1e-5};
  dt_run_oracle(g_drv, g_names, NAGENTS, NULL, &c);
}

static void test_resnet20_oracle(void **state) {
  dt_oracle_cfg c = {"resnet20",
                     "resnet20.stage",
                     "in_channels=1,image=16",
                     "shape=1/16/16,classes=10,examples=64,seed=4",
                     "opt=adamw,lr=1e-3",
                     3,
                     8,
                     1e-5};
  dt_run_oracle(g_drv, g_names, NAGENTS, NULL, &c);
}

int main(void) {
  static const char *const args[] = {"--threads", "2", NULL};
  if (mt_start("driver", g_names, NAGENTS, args, g_pids, &g_drv) != AX_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mlp_oracle),
      cmocka_unit_test(test_resnet20_oracle),
  };
  int failed = AX_TEST_MAIN(tests);
  mt_end(g_drv, g_pids, NAGENTS);
  return failed;
}
