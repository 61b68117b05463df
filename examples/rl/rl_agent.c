/* RL example: the agent. It owns the policy (Linear 4-H, ReLU, Linear H-2),
 * answers "rl.select_action" for every observer step, and after each round
 * of episodes makes one REINFORCE update with Adam. A handler call only
 * reads the policy, which changes only between rounds (when no episode
 * runs), and writes the memory of its own observer, whose steps arrive one
 * after another; so handlers need no lock. Sampling uses one random stream
 * per observer and episode, so a run is reproducible whatever the thread
 * interleaving. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rl.h"
#include <axon/kernels/clock.h>
#include <axon/kernels/rng.h>
#include <axon/models/layers/basic.h>
#include <axon/models/net.h>
#include <axon/models/optim.h>

typedef struct obs_mem {
  float *states; /* (max_steps, 4) */
  int32_t *actions;
  int steps;
  ax_rng rng;
} obs_mem;

typedef struct agent {
  const rl_opts *o;
  ax_net *net;
  long round;
  obs_mem mem[RL_MAX_OBSERVERS + 1];
} agent;

/* Action probabilities of one state: softmax of the policy's logits. */
static int policy_probs(agent *a, const float *s, float *p) {
  ax_tensor *x = ax_tensor_new_v(AX_F32, AX_CPU, 2, (int64_t)1, (int64_t)4);
  if (!x)
    return AX_ENOMEM;
  memcpy(x->data, s, 4 * sizeof(float));
  ax_tlist in = ax_tlist1(x), out = {0};
  int rc = ax_net_forward(a->net, NULL, 0, 0, &in, &out);
  ax_tensor_release(x);
  if (rc != AX_OK)
    return rc;
  const float *l = ax_f32(out.t[0]);
  float m = l[0] > l[1] ? l[0] : l[1];
  float e0 = expf(l[0] - m), e1 = expf(l[1] - m);
  p[0] = e0 / (e0 + e1);
  p[1] = e1 / (e0 + e1);
  ax_tlist_clear(&out);
  return AX_OK;
}

static int fn_select_action(ax_call_ctx *ctx, const ax_values *args,
                            ax_values *out, void *user) {
  agent *a = user;
  int64_t id = 0, step = 0;
  double v[4];
  AX_TRY(ax_values_get_i64(args, 0, &id));
  AX_TRY(ax_values_get_i64(args, 1, &step));
  for (int i = 0; i < 4; i++)
    AX_TRY(ax_values_get_f64(args, 2 + (size_t)i, &v[i]));
  if (id < 1 || id > a->o->observers || step < 0 || step >= a->o->max_steps)
    return ax_seterr(AX_EINVAL,
                     "select_action: bad observer %lld or step "
                     "%lld",
                     (long long)id, (long long)step);
  obs_mem *m = &a->mem[id];
  if (step == 0)
    ax_rng_seed2(&m->rng, a->o->seed ^ 0x5eedULL,
                 ((uint64_t)id << 40) | (uint64_t)a->round);
  float *s = m->states + 4 * step, p[2];
  for (int i = 0; i < 4; i++)
    s[i] = (float)v[i];
  AX_TRY(policy_probs(a, s, p));
  int action = ax_rng_uniform(&m->rng) < p[1] ? 1 : 0;
  m->actions[step] = action;
  m->steps = (int)step + 1;
  return ax_values_add_i64(out, action);
}

/* One REINFORCE step over the episodes of the round's observers (ok[i]):
 * returns R_t = sum_k gamma^k r_{t+k} per episode, normalised over the
 * round; loss -sum_t R_t log pi(a_t | s_t); one Adam step. */
static int reinforce(agent *a, ax_optim *opt, const int *ok,
                     ax_tensor *const *rewards) {
  int total = 0, N = a->o->observers;
  for (int i = 1; i <= N; i++)
    total += ok[i] ? a->mem[i].steps : 0;
  if (total == 0)
    return AX_OK;
  ax_tensor *x = ax_tensor_new_v(AX_F32, AX_CPU, 2, (int64_t)total, (int64_t)4);
  ax_tensor *dl =
      ax_tensor_new_v(AX_F32, AX_CPU, 2, (int64_t)total, (int64_t)2);
  double *ret = malloc(sizeof(double) * (size_t)total);
  int32_t *act = malloc(sizeof(int32_t) * (size_t)total);
  if (!x || !dl || !ret || !act) {
    ax_tensor_release(x);
    ax_tensor_release(dl);
    free(ret);
    free(act);
    return AX_ENOMEM;
  }
  int k = 0;
  for (int i = 1; i <= N; i++) {
    if (!ok[i])
      continue;
    obs_mem *m = &a->mem[i];
    const float *r = ax_f32(rewards[i]);
    double g = 0;
    for (int t = m->steps - 1; t >= 0; t--) {
      g = r[t] + a->o->gamma * g;
      ret[k + t] = g;
    }
    memcpy(ax_f32(x) + 4 * k, m->states, sizeof(float) * 4 * m->steps);
    memcpy(act + k, m->actions, sizeof(int32_t) * m->steps);
    k += m->steps;
  }
  double mean = 0, var = 0;
  for (int t = 0; t < total; t++)
    mean += ret[t];
  mean /= total;
  for (int t = 0; t < total; t++)
    var += (ret[t] - mean) * (ret[t] - mean);
  double sd = sqrt(var / total);
  ax_slot *slot = ax_slot_new();
  ax_tlist in = ax_tlist1(x), out = {0}, dout = ax_tlist1(dl), din = {0};
  int rc = ax_net_zero_grad(a->net);
  if (rc == AX_OK)
    rc = ax_net_forward(a->net, slot, 1, 0, &in, &out);
  if (rc == AX_OK) {
    const float *l = ax_f32(out.t[0]);
    float *d = ax_f32(dl);
    for (int t = 0; t < total; t++) {
      double R = (ret[t] - mean) / (sd + 1e-8);
      float m = l[2 * t] > l[2 * t + 1] ? l[2 * t] : l[2 * t + 1];
      double e0 = exp(l[2 * t] - m), e1 = exp(l[2 * t + 1] - m);
      double p1 = e1 / (e0 + e1);
      /* d(-R log p_a)/dlogits = R (softmax - onehot(a)) */
      d[2 * t] = (float)(R * ((1 - p1) - (act[t] == 0)));
      d[2 * t + 1] = (float)(R * (p1 - (act[t] == 1)));
    }
    rc = ax_net_backward(a->net, slot, 0, 0, &dout, &din);
  }
  if (rc == AX_OK)
    rc = ax_optim_step(opt, a->net->params, a->net->grads);
  ax_tlist_clear(&out);
  ax_tlist_clear(&din);
  ax_slot_free(slot);
  ax_tensor_release(x);
  ax_tensor_release(dl);
  free(ret);
  free(act);
  return rc;
}

static ax_net *make_policy(const rl_opts *o) {
  ax_module *seq = ax_sequential_new();
  if (!seq || ax_module_add(seq, ax_linear_new(4, o->hidden, 1)) != AX_OK ||
      ax_module_add(seq, ax_relu_new()) != AX_OK ||
      ax_module_add(seq, ax_linear_new(o->hidden, 2, 1)) != AX_OK) {
    ax_module_free(seq);
    return NULL;
  }
  return ax_net_new(seq, AX_CPU, o->seed);
}

static void on_peer_down(ax_node *n, const char *peer, void *user) {
  ax_rref_peer_down(n, peer);
}

/* Plays rounds until the running reward reaches the target or the episode
 * budget is spent. Returns AX_OK (solved), AX_ETIMEOUT (not solved) or an
 * error. */
static int train(agent *a, ax_node *n, ax_rref **obs, ax_optim *opt) {
  const rl_opts *o = a->o;
  int N = o->observers, alive = N;
  double running = 10, t0 = ax_clock_s();
  long episodes = 0;
  ax_call_opts co = {.timeout_ms = 120000};
  for (a->round = 0; episodes < o->max_episodes; a->round++) {
    if (ax_clock_s() - t0 > o->timeout_ms / 1000.0)
      return ax_seterr(AX_ETIMEOUT, "out of time after %ld episodes", episodes);
    ax_future *f[RL_MAX_OBSERVERS + 1] = {0};
    for (int i = 1; i <= N; i++) {
      if (!obs[i])
        continue;
      a->mem[i].steps = 0;
      ax_values *args = ax_values_new();
      ax_values_add_i64(args, a->round);
      ax_values_add_i64(args, o->max_steps);
      int rc = ax_rref_rpc_async(n, obs[i], "run_episode", args, &co, &f[i]);
      ax_values_free(args);
      if (rc != AX_OK)
        f[i] = NULL; /* reported below like a failed episode */
    }
    int ok[RL_MAX_OBSERVERS + 1] = {0}, err = AX_OK;
    ax_tensor *rew[RL_MAX_OBSERVERS + 1] = {0};
    double sum = 0;
    for (int i = 1; i <= N; i++) {
      if (!obs[i])
        continue;
      int rc = f[i] ? ax_future_wait(f[i], co.timeout_ms + 5000) : AX_EIO;
      char name[32];
      snprintf(name, sizeof name, "observer%d", i);
      if (rc == AX_OK) {
        const ax_values *v = ax_future_values(f[i]);
        int64_t steps = 0;
        ax_tensor *r = NULL;
        rc = ax_values_get_i64(v, 0, &steps);
        if (rc == AX_OK)
          rc = ax_values_get_tensor(v, 1, &r);
        if (rc == AX_OK &&
            (steps != a->mem[i].steps || (int64_t)ax_tensor_numel(r) != steps))
          rc = ax_seterr(AX_EMALFORMED, "%s: %lld steps reported, %d seen",
                         name, (long long)steps, a->mem[i].steps);
        if (rc == AX_OK) {
          rew[i] = ax_tensor_retain(r);
          ok[i] = 1;
          double ep = 0;
          for (int64_t t = 0; t < steps; t++)
            ep += ax_f32(r)[t];
          sum += ep;
          running = 0.05 * ep + 0.95 * running;
          episodes++;
        }
      } else if (rc == AX_EPEERDOWN || ax_node_peer_is_down(n, name)) {
        alive--;
        printf("agent: %s is down (%s); carrying on with %d observer(s)\n",
               name, ax_strerror(rc), alive);
        fflush(stdout);
        ax_rref_release(obs[i]);
        obs[i] = NULL;
      } else if (err == AX_OK) {
        err = ax_seterr(rc, "%s: run_episode: %s", name,
                        f[i] ? ax_future_errmsg(f[i]) : ax_errmsg());
      }
      ax_future_release(f[i]);
    }
    if (err == AX_OK && alive == 0)
      err = ax_seterr(AX_EPEERDOWN, "every observer is down");
    if (err == AX_OK)
      err = reinforce(a, opt, ok, rew);
    for (int i = 1; i <= N; i++)
      ax_tensor_release(rew[i]);
    AX_TRY(err);
    int played = 0;
    for (int i = 1; i <= N; i++)
      played += ok[i];
    if (a->round % 10 == 0 || running >= o->target)
      printf("round %ld: episodes %ld, mean reward %.1f, running reward "
             "%.1f, %.1f s\n",
             a->round, episodes, played ? sum / played : 0.0, running,
             ax_clock_s() - t0);
    fflush(stdout);
    if (running >= o->target) {
      printf("solved: running reward %.1f >= %.0f after %ld episodes "
             "(%ld rounds) in %.1f s\n",
             running, o->target, episodes, a->round + 1, ax_clock_s() - t0);
      return AX_OK;
    }
  }
  printf("not solved: running reward %.1f after %ld episodes\n", running,
         episodes);
  return AX_ETIMEOUT;
}

int rl_agent_main(const rl_opts *o) {
  static agent a;
  a.o = o;
  ax_optim_cfg oc = ax_optim_defaults(AX_OPT_ADAMW);
  oc.lr = (float)o->lr;
  oc.weight_decay = 0; /* plain Adam */
  ax_optim *opt = NULL;
  int rc = AX_OK;
  if (!(a.net = make_policy(o)) ||
      !(opt = ax_optim_new(&oc, a.net->n_params, AX_CPU)))
    rc = AX_ENOMEM;
  for (int i = 1; rc == AX_OK && i <= o->observers; i++) {
    a.mem[i].states = malloc(sizeof(float) * 4 * (size_t)o->max_steps);
    a.mem[i].actions = malloc(sizeof(int32_t) * (size_t)o->max_steps);
    if (!a.mem[i].states || !a.mem[i].actions)
      rc = AX_ENOMEM;
  }
  ax_node_opts no;
  ax_node_opts_init(&no);
  no.name = "agent";
  no.listen = o->master;
  no.master = o->master;
  no.world_size = o->observers + 1;
  no.rank = 0;
  no.threads = o->observers + 2;
  no.peer_timeout_ms = 3000;
  ax_node *n = NULL;
  if (rc == AX_OK)
    rc = ax_node_create(&no, &n);
  if (rc == AX_OK)
    rc = ax_rref_init(n);
  if (rc == AX_OK)
    rc = ax_rpc_register(n, "rl.select_action", fn_select_action, &a);
  if (rc == AX_OK) {
    ax_node_on_peer_down(n, on_peer_down, NULL);
    rc = ax_node_join(n, 120000);
  }
  ax_rref *obs[RL_MAX_OBSERVERS + 1] = {0};
  for (int i = 1; rc == AX_OK && i <= o->observers; i++) {
    char to[32], cfg[64];
    snprintf(to, sizeof to, "observer%d", i);
    snprintf(cfg, sizeof cfg, "id=%d,seed=%llu", i,
             (unsigned long long)o->seed);
    rc = ax_remote_object(n, to, "rl.observer", cfg, AX_CPU, NULL, &obs[i]);
  }
  int solved = 0;
  if (rc == AX_OK) {
    printf("agent: %d observer(s), policy 4-%d-2 (%zu parameters), Adam lr "
           "%g, gamma %g, target %.0f\n",
           o->observers, o->hidden, a.net->n_params, o->lr, o->gamma,
           o->target);
    rc = train(&a, n, obs, opt);
    solved = rc == AX_OK;
    if (rc == AX_ETIMEOUT)
      rc = AX_OK;
  }
  if (rc != AX_OK)
    fprintf(stderr, "agent: %s: %s\n", ax_strerror(rc), ax_errmsg());
  /* Drop the observers' RRefs, let the deletes out, then release them. */
  for (int i = 1; i <= o->observers; i++)
    ax_rref_release(obs[i]);
  long owned = 0, users = 1;
  for (int i = 0; n && i < 500 && users; i++) {
    ax_rref_live(n, &owned, &users);
    if (users)
      nanosleep(&(struct timespec){0, 20000000}, NULL);
  }
  /* End the world: every observer finishes what it is doing, then leaves
   * (those already down are skipped). */
  ax_world_report rep;
  int ended = n ? ax_node_shutdown_world(n, 20000, &rep) : AX_OK;
  if (ended != AX_OK)
    fprintf(stderr, "agent: %s\n", ax_errmsg());
  int leaks = n ? rl_check_leaks(n, "agent") : 0;
  if (n)
    ax_node_shutdown(n, 5000);
  ax_rref_fini(n);
  ax_node_destroy(n);
  for (int i = 1; i <= o->observers; i++) {
    free(a.mem[i].states);
    free(a.mem[i].actions);
  }
  ax_optim_free(opt);
  ax_net_free(a.net);
  if (rc != AX_OK || leaks || ended != AX_OK)
    return 1;
  return solved ? 0 : 3;
}
