/* Optimizer steps and learning-rate schedules against hand-computed values
 * (PyTorch's update rules). */
#include <math.h>
#include <string.h>

#include "axon/models/optim.h"
#include "harness.h"

static ax_tensor *vec(const float *v, int n) {
  int64_t s = n;
  ax_tensor *t = ax_tensor_new(AX_F32, 1, &s, AX_CPU);
  memcpy(ax_f32(t), v, sizeof(float) * (size_t)n);
  return t;
}

static void sgd_momentum_nesterov_wd(void **state) {
  ax_config c;
  AX_ASSERT_OK(ax_config_parse(&c, "opt=sgd,lr=0.1,momentum=0.9,wd=0.01"));
  ax_optim_cfg cfg;
  AX_ASSERT_OK(ax_optim_cfg_parse(&c, &cfg));
  ax_optim *o = ax_optim_new(&cfg, 2, AX_CPU);
  float w0[2] = {1.0f, -2.0f}, g0[2] = {0.5f, 0.25f};
  ax_tensor *w = vec(w0, 2), *g = vec(g0, 2);
  /* step 1: d = g + wd w = (0.51, 0.23); buf = d; w -= 0.1 d */
  AX_ASSERT_OK(ax_optim_step(o, w, g));
  AX_ASSERT_CLOSE(ax_f32(w)[0], 1.0 - 0.1 * 0.51, 1e-6, 0);
  AX_ASSERT_CLOSE(ax_f32(w)[1], -2.0 - 0.1 * 0.23, 1e-6, 0);
  /* step 2: d = g + wd w1; buf = 0.9 buf + d; w -= 0.1 buf */
  double w1 = 1.0 - 0.051, d = 0.5 + 0.01 * w1, buf = 0.9 * 0.51 + d;
  AX_ASSERT_OK(ax_optim_step(o, w, g));
  AX_ASSERT_CLOSE(ax_f32(w)[0], w1 - 0.1 * buf, 1e-6, 0);
  ax_optim_free(o);

  /* Nesterov: step = d + momentum * buf */
  AX_ASSERT_OK(ax_config_parse(&c, "opt=sgd,lr=0.1,momentum=0.9,nesterov=1"));
  AX_ASSERT_OK(ax_optim_cfg_parse(&c, &cfg));
  o = ax_optim_new(&cfg, 2, AX_CPU);
  memcpy(ax_f32(w), w0, sizeof w0);
  AX_ASSERT_OK(ax_optim_step(o, w, g));
  AX_ASSERT_CLOSE(ax_f32(w)[0], 1.0 - 0.1 * (0.5 + 0.9 * 0.5), 1e-6, 0);
  AX_ASSERT_OK(ax_optim_step(o, w, g));
  buf = 0.9 * 0.5 + 0.5;
  AX_ASSERT_CLOSE(ax_f32(w)[0], 1.0 - 0.095 - 0.1 * (0.5 + 0.9 * buf), 1e-6, 0);
  ax_optim_free(o);
  ax_tensor_release(w);
  ax_tensor_release(g);
}

static void adamw_two_steps(void **state) {
  ax_config c;
  AX_ASSERT_OK(ax_config_parse(&c, "opt=adamw,lr=0.01,wd=0.1"));
  ax_optim_cfg cfg;
  AX_ASSERT_OK(ax_optim_cfg_parse(&c, &cfg));
  ax_optim *o = ax_optim_new(&cfg, 1, AX_CPU);
  float w0 = 2.0f, g0 = 0.5f;
  ax_tensor *w = vec(&w0, 1), *g = vec(&g0, 1);
  double W = 2.0, m = 0, v = 0;
  for (int t = 1; t <= 2; t++) {
    AX_ASSERT_OK(ax_optim_step(o, w, g));
    W *= 1 - 0.01 * 0.1;
    m = 0.9 * m + 0.1 * 0.5;
    v = 0.999 * v + 0.001 * 0.25;
    double mh = m / (1 - pow(0.9, t)), vh = v / (1 - pow(0.999, t));
    W -= 0.01 * mh / (sqrt(vh) + 1e-8);
    AX_ASSERT_CLOSE(ax_f32(w)[0], W, 1e-6, 1e-6);
  }
  ax_optim_free(o);
  ax_tensor_release(w);
  ax_tensor_release(g);
}

static void schedules(void **state) {
  ax_config c;
  ax_optim_cfg cfg;
  AX_ASSERT_OK(ax_config_parse(&c, "lr=1,sched=cosine,warmup=4,total=10,"
                                   "min_lr=0.1"));
  AX_ASSERT_OK(ax_optim_cfg_parse(&c, &cfg));
  AX_ASSERT_CLOSE(ax_lr_at(&cfg, 0), 0.25, 1e-6, 0);
  AX_ASSERT_CLOSE(ax_lr_at(&cfg, 3), 1.0, 1e-6, 0);
  AX_ASSERT_CLOSE(ax_lr_at(&cfg, 4), 1.0, 1e-6, 0);
  AX_ASSERT_CLOSE(ax_lr_at(&cfg, 9), 0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 0.5)),
                  1e-6, 0);
  AX_ASSERT_CLOSE(ax_lr_at(&cfg, 14), 0.1, 1e-6, 0);
  AX_ASSERT_OK(ax_config_parse(&c, "lr=0.1,sched=step,step_size=3,gamma=0.5"));
  AX_ASSERT_OK(ax_optim_cfg_parse(&c, &cfg));
  AX_ASSERT_CLOSE(ax_lr_at(&cfg, 2), 0.1, 1e-7, 0);
  AX_ASSERT_CLOSE(ax_lr_at(&cfg, 3), 0.05, 1e-7, 0);
  AX_ASSERT_CLOSE(ax_lr_at(&cfg, 7), 0.025, 1e-7, 0);
  AX_ASSERT_OK(ax_config_parse(&c, "opt=rmsprop"));
  AX_ASSERT_ERR(ax_optim_cfg_parse(&c, &cfg), AX_EINVAL);
  AX_ASSERT_OK(ax_config_parse(&c, "sched=linear"));
  AX_ASSERT_ERR(ax_optim_cfg_parse(&c, &cfg), AX_EINVAL);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(sgd_momentum_nesterov_wd),
      cmocka_unit_test(adamw_two_steps),
      cmocka_unit_test(schedules),
  };
  return AX_TEST_MAIN(t);
}
