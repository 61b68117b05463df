/* CartPole: the classic cart-pole dynamics (Barto, Sutton & Anderson 1983)
 * with the constants and termination rules of OpenAI Gym's CartPole-v1:
 * gravity 9.8, cart mass 1.0, pole mass 0.1, pole half-length 0.5, force
 * 10, tau 0.02 s, explicit Euler; the episode ends when |x| > 2.4, |theta|
 * > 12 degrees or after the step cap; every step earns a reward of 1. */
#include <math.h>

#include "rl.h"
#include <axon/kernels/rng.h>

#define GRAVITY 9.8
#define MASSCART 1.0
#define MASSPOLE 0.1
#define TOTAL_MASS (MASSCART + MASSPOLE)
#define LENGTH 0.5
#define POLEMASS_LENGTH (MASSPOLE * LENGTH)
#define FORCE_MAG 10.0
#define TAU 0.02
#define X_LIMIT 2.4
#define THETA_LIMIT (12.0 * 2.0 * M_PI / 360.0)

void rl_cartpole_reset(rl_cartpole *e, uint64_t seed, uint64_t stream) {
  ax_rng r;
  ax_rng_seed2(&r, seed, stream);
  e->x = ax_rng_uniform(&r) * 0.1 - 0.05;
  e->x_dot = ax_rng_uniform(&r) * 0.1 - 0.05;
  e->theta = ax_rng_uniform(&r) * 0.1 - 0.05;
  e->theta_dot = ax_rng_uniform(&r) * 0.1 - 0.05;
  e->steps = 0;
  e->done = 0;
}

double rl_cartpole_step(rl_cartpole *e, int action, int max_steps) {
  double force = action == 1 ? FORCE_MAG : -FORCE_MAG;
  double c = cos(e->theta), s = sin(e->theta);
  double temp =
      (force + POLEMASS_LENGTH * e->theta_dot * e->theta_dot * s) / TOTAL_MASS;
  double theta_acc = (GRAVITY * s - c * temp) /
                     (LENGTH * (4.0 / 3.0 - MASSPOLE * c * c / TOTAL_MASS));
  double x_acc = temp - POLEMASS_LENGTH * theta_acc * c / TOTAL_MASS;
  e->x += TAU * e->x_dot;
  e->x_dot += TAU * x_acc;
  e->theta += TAU * e->theta_dot;
  e->theta_dot += TAU * theta_acc;
  e->steps++;
  e->done = e->x < -X_LIMIT || e->x > X_LIMIT || e->theta < -THETA_LIMIT ||
            e->theta > THETA_LIMIT || e->steps >= max_steps;
  return 1.0;
}
