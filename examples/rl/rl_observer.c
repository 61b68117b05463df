/* RL example: an observer. Its object ("rl.observer", created by the
 * agent through ax_remote_object) owns one CartPole; "run_episode"
 * [round, max_steps] plays one episode, calling the agent's
 * "rl.select_action" [observer, step, x, x_dot, theta, theta_dot] -> [action]
 * at every step, and answers [steps, rewards (T)]. The method runs the
 * whole episode on one of this node's worker threads (the observer serves
 * one episode at a time; its calls to the agent are bounded by their
 * deadlines). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rl.h"

static const rl_opts *g_o;

typedef struct observer {
  int id;
  uint64_t seed;
  rl_cartpole env;
} observer;

static int o_create(ax_node *n, const char *config, ax_device dev, void **obj) {
  ax_config c;
  AX_TRY(ax_config_parse(&c, config));
  int err = AX_OK;
  observer *ob = calloc(1, sizeof *ob);
  if (!ob)
    return AX_ENOMEM;
  ob->id = (int)ax_config_int(&c, "id", 0, &err);
  ob->seed = (uint64_t)ax_config_int(&c, "seed", 1, &err);
  if (err != AX_OK || ob->id < 1) {
    free(ob);
    return ax_seterr(AX_EINVAL, "rl.observer: bad config '%s'", config);
  }
  *obj = ob;
  return AX_OK;
}

static void o_destroy(void *obj) { free(obj); }

static int m_run_episode(ax_call_ctx *ctx, void *obj, const ax_values *args,
                         ax_values *out) {
  observer *ob = obj;
  int64_t round = 0, max_steps = 0;
  AX_TRY(ax_values_get_i64(args, 0, &round));
  AX_TRY(ax_values_get_i64(args, 1, &max_steps));
  if (max_steps < 1 || max_steps > 100000)
    return ax_seterr(AX_EINVAL, "run_episode: bad max_steps %lld",
                     (long long)max_steps);
  if (g_o->kill_rank == g_o->rank && round == g_o->kill_round) {
    printf("observer%d: failure drill: killing myself in round %lld\n",
           g_o->rank, (long long)round);
    fflush(stdout);
    raise(SIGKILL);
  }
  ax_node *n = ax_call_node(ctx);
  rl_cartpole_reset(&ob->env, ob->seed,
                    ((uint64_t)ob->id << 40) | (uint64_t)round);
  float *rewards = malloc(sizeof(float) * (size_t)max_steps);
  if (!rewards)
    return AX_ENOMEM;
  ax_call_opts co = {.timeout_ms = 30000};
  int rc = AX_OK;
  while (!ob->env.done) {
    ax_values *a = ax_values_new(), *r = NULL;
    ax_values_add_i64(a, ob->id);
    ax_values_add_i64(a, ob->env.steps);
    ax_values_add_f64(a, ob->env.x);
    ax_values_add_f64(a, ob->env.x_dot);
    ax_values_add_f64(a, ob->env.theta);
    ax_values_add_f64(a, ob->env.theta_dot);
    rc = ax_rpc_sync(n, ax_call_caller(ctx), "rl.select_action", a, &co, &r);
    ax_values_free(a);
    int64_t action = 0;
    if (rc == AX_OK)
      rc = ax_values_get_i64(r, 0, &action);
    ax_values_free(r);
    if (rc != AX_OK)
      break;
    int t = ob->env.steps;
    rewards[t] = (float)rl_cartpole_step(&ob->env, (int)action, (int)max_steps);
  }
  if (rc == AX_OK) {
    ax_tensor *t = ax_tensor_new_v(AX_F32, AX_CPU, 1, (int64_t)ob->env.steps);
    if (!t)
      rc = AX_ENOMEM;
    else {
      memcpy(t->data, rewards, sizeof(float) * (size_t)ob->env.steps);
      ax_values_add_i64(out, ob->env.steps);
      ax_values_add_tensor(out, t);
      ax_tensor_release(t);
    }
  }
  free(rewards);
  return rc;
}

static const ax_robj_method_def o_methods[] = {{"run_episode", m_run_episode},
                                               {NULL, NULL}};
static const ax_robj_kind o_kind = {.name = "rl.observer",
                                    .create = o_create,
                                    .destroy = o_destroy,
                                    .methods = o_methods};

int rl_observer_main(const rl_opts *o) {
  char name[32];
  snprintf(name, sizeof name, "observer%d", o->rank);
  g_o = o;
  ax_node_opts no;
  ax_node_opts_init(&no);
  no.name = name;
  no.master = o->master;
  no.rank = o->rank;
  no.threads = 2;
  no.peer_timeout_ms = 3000;
  ax_node *n = NULL;
  int rc = ax_node_create(&no, &n);
  if (rc == AX_OK)
    rc = ax_rref_init(n);
  if (rc == AX_OK)
    rc = ax_robj_register(n, &o_kind);
  if (rc == AX_OK)
    rc = ax_node_join(n, 120000);
  /* An observer only serves: its part is done from the start. It stays
   * until the agent ends the world, which waits for the episodes in flight,
   * so it never leaves while the agent still needs it, nor sees the agent
   * leave first. */
  if (rc == AX_OK && (rc = ax_node_wait_leave(n, o->timeout_ms)) != AX_OK)
    rc = ax_seterr(rc, "%s",
                   rc == AX_EPEERDOWN  ? "the agent went down"
                   : rc == AX_ETIMEOUT ? "the agent never finished"
                                       : ax_errmsg());
  if (rc != AX_OK)
    fprintf(stderr, "%s: %s: %s\n", name, ax_strerror(rc), ax_errmsg());
  int leaks = n ? rl_check_leaks(n, name) : 0;
  if (n)
    ax_node_shutdown(n, 5000);
  ax_rref_fini(n);
  ax_node_destroy(n);
  return rc != AX_OK ? 1 : leaks;
}
