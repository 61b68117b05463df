/* RL example (agent/observer): shared declarations.
 *
 * The agent (rank 0, "agent", the rendezvous master) holds the policy, a
 * small MLP 4-H-2, and one RRef per observer (ranks 1..N, "observerR",
 * objects of kind "rl.observer" it creates on them). Every round it asks
 * each observer to run one episode ("run_episode"); the observer steps its
 * own CartPole and calls the agent's "rl.select_action" at every step; the
 * agent samples an action from the policy (a per-observer random stream)
 * and remembers the observer's states and actions, which give the
 * log-probabilities of the actions taken. The episode's rewards come back
 * as the result of run_episode. After the round the agent runs REINFORCE:
 * discounted returns (gamma), normalised over the round, loss
 * -sum_t R_t log pi(a_t | s_t), one Adam step. */
#ifndef RL_H
#define RL_H

#include <stdint.h>

#include <axon/rref/rref.h>

#define RL_MAX_OBSERVERS 32

/* ---- CartPole (Barto, Sutton & Anderson; OpenAI Gym's CartPole-v1) ------ */
typedef struct rl_cartpole {
  double x, x_dot, theta, theta_dot;
  int steps, done;
} rl_cartpole;

/* Starts an episode: every state variable uniform in [-0.05, 0.05]. */
void rl_cartpole_reset(rl_cartpole *e, uint64_t seed, uint64_t stream);
/* One step with action 0 (push left) or 1 (push right); returns the reward
 * (1) and sets e->done when |x| > 2.4, |theta| > 12 degrees or after
 * max_steps steps. */
double rl_cartpole_step(rl_cartpole *e, int action, int max_steps);

typedef struct rl_opts {
  int observers; /* N */
  int rank;
  const char *master;
  int hidden;        /* policy width (128) */
  double lr, gamma;  /* Adam rate (1e-2), discount (0.99) */
  int max_steps;     /* episode length cap (500) */
  long max_episodes; /* stop after this many episodes in all */
  double target;     /* stop once the running reward reaches it (475) */
  uint64_t seed;
  int kill_rank;      /* failure drill: this observer SIGKILLs itself ... */
  long kill_round;    /* ... when asked to run this round */
  int64_t timeout_ms; /* bound on the whole run */
} rl_opts;

int rl_agent_main(const rl_opts *o);
int rl_observer_main(const rl_opts *o);
/* Waits (bounded) for zero live RRefs, calls and futures; prints them;
 * returns 0 when all are zero. */
int rl_check_leaks(ax_node *n, const char *who);

#endif
