/* RL example: command line, the --local launcher and the leak check.
 *
 *   rl --local N [options]
 *   rl --rank R --world-size N+1 --master HOST:PORT [options] */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rl.h"
#include <axon/kernels/device.h>
#include <axon/rpc/launch.h>

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: rl --local N [options]\n"
      "       rl --rank R --world-size N+1 --master HOST:PORT [options]\n"
      "options:\n"
      "  --target R        stop at this running reward (default 475)\n"
      "  --episodes E      stop after E episodes in all (default 5000)\n"
      "  --hidden H        policy width (default 128)\n"
      "  --lr X            Adam learning rate (default 0.01)\n"
      "  --gamma G         discount (default 0.99)\n"
      "  --max-steps T     episode cap (default 500)\n"
      "  --seed S          (default 1)\n"
      "  --kill R:ROUND    failure drill: observer R SIGKILLs itself at ROUND\n"
      "  --timeout SEC     bound on the whole run (default 900)\n");
}

/* A local child (ax_local_fork): its own copy of the options, its rank. */
static int run_child(int rank, void *user) {
  rl_opts *o = user;
  o->rank = rank;
  return rl_observer_main(o);
}

static int run_agent(int rank, void *user) {
  rl_opts *o = user;
  o->rank = rank;
  return rl_agent_main(o);
}

int main(int argc, char **argv) {
  rl_opts o = {.rank = -1,
               .hidden = 128,
               .lr = 1e-2,
               .gamma = 0.99,
               .max_steps = 500,
               .max_episodes = 5000,
               .target = 475,
               .seed = 1,
               .timeout_ms = 900000};
  int local = 0, world = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    }
    if (!v) {
      fprintf(stderr, "rl: %s needs a value\n", a);
      return 2;
    }
    i++;
    if (!strcmp(a, "--local"))
      local = atoi(v);
    else if (!strcmp(a, "--rank"))
      o.rank = atoi(v);
    else if (!strcmp(a, "--world-size"))
      world = atoi(v);
    else if (!strcmp(a, "--master"))
      o.master = v;
    else if (!strcmp(a, "--target"))
      o.target = atof(v);
    else if (!strcmp(a, "--episodes"))
      o.max_episodes = atol(v);
    else if (!strcmp(a, "--hidden"))
      o.hidden = atoi(v);
    else if (!strcmp(a, "--lr"))
      o.lr = atof(v);
    else if (!strcmp(a, "--gamma"))
      o.gamma = atof(v);
    else if (!strcmp(a, "--max-steps"))
      o.max_steps = atoi(v);
    else if (!strcmp(a, "--seed"))
      o.seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--timeout"))
      o.timeout_ms = atol(v) * 1000;
    else if (!strcmp(a, "--kill")) {
      if (sscanf(v, "%d:%ld", &o.kill_rank, &o.kill_round) != 2) {
        fprintf(stderr, "rl: --kill wants RANK:ROUND, got '%s'\n", v);
        return 2;
      }
    } else {
      fprintf(stderr, "rl: unknown option %s\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (o.hidden <= 0 || o.lr <= 0 || o.gamma <= 0 || o.gamma > 1 ||
      o.max_steps <= 0 || o.max_episodes <= 0 || o.timeout_ms <= 0) {
    fprintf(stderr, "rl: bad --hidden, --lr, --gamma, --max-steps, "
                    "--episodes or --timeout\n");
    return 2;
  }
  if (local > 0) {
    if (local > RL_MAX_OBSERVERS) {
      fprintf(stderr, "rl: at most %d observers\n", RL_MAX_OBSERVERS);
      return 2;
    }
    /* One compute thread per process (inherited by the children):
     * N + 1 processes share the machine. */
    ax_cpu_set_threads(1);
    static char master[64];
    o.master = master;
    o.observers = local;
    /* Children first: nothing here has initialised gRPC yet. */
    return ax_local_world(local, master, sizeof master, run_child, run_agent,
                          &o, "agent", "observer", o.kill_rank);
  }
  if (o.rank < 0 || world < 2 || !o.master || o.rank >= world ||
      world - 1 > RL_MAX_OBSERVERS) {
    fprintf(stderr, "rl: give --local N, or --rank, --world-size and "
                    "--master\n");
    usage(stderr);
    return 2;
  }
  o.observers = world - 1;
  return o.rank == 0 ? rl_agent_main(&o) : rl_observer_main(&o);
}

int rl_check_leaks(ax_node *n, const char *who) {
  long owned = -1, users = -1;
  for (int i = 0; i < 500; i++) { /* up to 10 s */
    ax_rref_live(n, &owned, &users);
    if (owned == 0 && users == 0 && ax_rpc_live_calls() == 0 &&
        ax_future_live_count() == 0)
      break;
    nanosleep(&(struct timespec){0, 20000000}, NULL);
  }
  long calls = ax_rpc_live_calls(), futs = ax_future_live_count();
  printf("%s: live at exit: rrefs owned %ld, user forks %ld, calls %ld, "
         "futures %ld\n",
         who, owned, users, calls, futs);
  return (owned || users || calls || futs) ? 1 : 0;
}
