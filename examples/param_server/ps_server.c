/* Parameter-server example: the server node and the "ps.model" object.
 *
 * Methods of "ps.model" (called by trainers through the model's RRef):
 *   "pull" []                          -> [params (n)]
 *   "push" [trainer, step, grads (n), rows] -> [params (n) to use next]
 *
 * sync: a push stores its gradient and defers its reply (ax_robj_defer);
 * the push that fills the barrier (one gradient per live trainer) averages
 * the gradients in trainer order, updates once and completes every deferred
 * reply with the new parameters. A trainer declared down (peer-down
 * callback) leaves the barrier, which may then fill at once.
 * async: a push updates under the lock and answers a snapshot.
 * hogwild: a push updates without any lock, element by element with
 * relaxed atomic loads and stores (plain SGD; the optimizer's momentum
 * state is not used). The race it accepts: two pushes on one element may
 * interleave load-modify-store, so one of the updates is lost, and a pull
 * may see a mix of old and new elements (never a torn float). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps.h"
#include <axon/kernels/clock.h>

typedef struct ps_model {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int mode, n;
  float lr; /* hogwild's SGD rate */
  ax_net *net;
  ax_optim *opt;
  int down[PS_MAX_TRAINERS + 1], done[PS_MAX_TRAINERS + 1];
  ax_tensor *grad[PS_MAX_TRAINERS + 1]; /* sync: this step's arrivals */
  ax_future *reply[PS_MAX_TRAINERS + 1];
  int arrived;
  long step, updates, samples;
  double t_first, t_last;
} ps_model;

static ps_model *g_ps; /* for the peer-down callback */

static ax_tensor *snapshot(ps_model *m) {
  ax_tensor *t = ax_tensor_like(m->net->params);
  if (t && m->mode == PS_HOGWILD) {
    float *d = ax_f32(t), *s = ax_f32(m->net->params);
    for (size_t i = 0; i < m->net->n_params; i++) {
      int32_t b = __atomic_load_n((int32_t *)&s[i], __ATOMIC_RELAXED);
      memcpy(&d[i], &b, 4);
    }
  } else if (t) {
    ax_tensor_copy(t, m->net->params);
  }
  return t;
}

static int live_trainers(const ps_model *m) {
  int k = 0;
  for (int r = 1; r <= m->n; r++)
    k += !m->down[r] && !m->done[r];
  return k;
}

/* sync: with mu held, updates once the barrier is full; moves the replies
 * to complete (after unlocking) into fut/vals. Returns their count. */
static int barrier_fire(ps_model *m, ax_future **fut, ax_tensor **params) {
  int k = live_trainers(m);
  if (m->arrived == 0 || m->arrived < k)
    return 0;
  float *g = ax_f32(m->net->grads);
  memset(g, 0, sizeof(float) * m->net->n_params);
  int nf = 0;
  for (int r = 1; r <= m->n; r++) {
    if (!m->grad[r])
      continue;
    const float *x = ax_f32(m->grad[r]);
    for (size_t i = 0; i < m->net->n_params; i++)
      g[i] += x[i];
    ax_tensor_release(m->grad[r]);
    m->grad[r] = NULL;
    fut[nf++] = m->reply[r];
    m->reply[r] = NULL;
  }
  float inv = 1.0f / (float)m->arrived;
  for (size_t i = 0; i < m->net->n_params; i++)
    g[i] *= inv;
  int rc = ax_optim_step(m->opt, m->net->params, m->net->grads);
  *params = rc == AX_OK ? snapshot(m) : NULL;
  m->arrived = 0;
  m->step++;
  m->updates++;
  return nf;
}

static void complete_all(ax_future **fut, int nf, ax_tensor *params) {
  for (int i = 0; i < nf; i++) {
    if (params) {
      ax_values *v = ax_values_new();
      ax_values_add_tensor(v, params);
      ax_future_complete(fut[i], AX_OK, v, NULL);
    } else {
      ax_future_complete(fut[i], AX_EINVAL, NULL, "server update failed");
    }
    ax_future_release(fut[i]);
  }
  ax_tensor_release(params);
}

static int m_pull(ax_call_ctx *ctx, void *obj, const ax_values *args,
                  ax_values *out) {
  ps_model *m = obj;
  int lock = m->mode != PS_HOGWILD;
  if (lock)
    pthread_mutex_lock(&m->mu);
  ax_tensor *t = snapshot(m);
  if (lock)
    pthread_mutex_unlock(&m->mu);
  if (!t)
    return AX_ENOMEM;
  ax_values_add_tensor(out, t);
  ax_tensor_release(t);
  return AX_OK;
}

static int m_push(ax_call_ctx *ctx, void *obj, const ax_values *args,
                  ax_values *out) {
  ps_model *m = obj;
  int64_t r = 0, step = 0, rows = 0;
  ax_tensor *g = NULL;
  AX_TRY(ax_values_get_i64(args, 0, &r));
  AX_TRY(ax_values_get_i64(args, 1, &step));
  AX_TRY(ax_values_get_tensor(args, 2, &g));
  AX_TRY(ax_values_get_i64(args, 3, &rows));
  if (r < 1 || r > m->n || g->dtype != AX_F32 ||
      ax_tensor_numel(g) != m->net->n_params)
    return ax_seterr(AX_EINVAL, "push: bad trainer %lld or gradient size",
                     (long long)r);
  double t = ax_clock_s();
  if (m->mode == PS_HOGWILD) {
    float *p = ax_f32(m->net->params);
    const float *x = ax_f32(g);
    for (size_t i = 0; i < m->net->n_params; i++) {
      int32_t *pi = (int32_t *)&p[i],
              bits = __atomic_load_n(pi, __ATOMIC_RELAXED);
      float v;
      memcpy(&v, &bits, 4);
      v -= m->lr * x[i];
      memcpy(&bits, &v, 4);
      __atomic_store_n(pi, bits, __ATOMIC_RELAXED);
    }
    pthread_mutex_lock(&m->mu); /* statistics only */
    m->samples += rows;
    m->updates++;
    if (m->t_first == 0)
      m->t_first = t;
    m->t_last = ax_clock_s();
    pthread_mutex_unlock(&m->mu);
    ax_tensor *s = snapshot(m);
    ax_values_add_tensor(out, s);
    ax_tensor_release(s);
    return AX_OK;
  }
  pthread_mutex_lock(&m->mu);
  if (m->t_first == 0)
    m->t_first = t;
  m->samples += rows;
  if (m->mode == PS_ASYNC) {
    int rc = ax_optim_step(m->opt, m->net->params, g);
    ax_tensor *s = rc == AX_OK ? snapshot(m) : NULL;
    m->updates++;
    m->t_last = ax_clock_s();
    pthread_mutex_unlock(&m->mu);
    AX_TRY(rc);
    ax_values_add_tensor(out, s);
    ax_tensor_release(s);
    return AX_OK;
  }
  /* sync */
  if (step != m->step || m->grad[r]) {
    pthread_mutex_unlock(&m->mu);
    return ax_seterr(AX_ESTATE,
                     "push: trainer %lld at step %lld, server at "
                     "%ld",
                     (long long)r, (long long)step, m->step);
  }
  ax_future *f = ax_future_new();
  m->grad[r] = ax_tensor_retain(g);
  m->reply[r] = ax_future_retain(f);
  m->arrived++;
  ax_future *fire[PS_MAX_TRAINERS];
  ax_tensor *params = NULL;
  int nf = barrier_fire(m, fire, &params);
  m->t_last = ax_clock_s();
  pthread_mutex_unlock(&m->mu);
  int rc = ax_robj_defer(ctx, f);
  ax_future_release(f);
  if (nf)
    complete_all(fire, nf, params);
  return rc;
}

static const ax_robj_method_def ps_methods[] = {
    {"pull", m_pull}, {"push", m_push}, {NULL, NULL}};

/* The server makes its one model itself (ax_rref_own_object); trainers
 * cannot create more. */
static int ps_create(ax_node *n, const char *config, ax_device dev,
                     void **obj) {
  return ax_seterr(AX_EUNSUPPORTED, "ps.model is created by the server only");
}

static void ps_destroy(void *obj) { (void)obj; /* freed by the server */ }

static const ax_robj_kind ps_kind = {.name = "ps.model",
                                     .create = ps_create,
                                     .destroy = ps_destroy,
                                     .methods = ps_methods};

/* Peer-down: the RRef layer drops the peer's forks; a trainer that had not
 * finished leaves the run (and, in sync mode, the barrier). */
static void on_peer_down(ax_node *n, const char *peer, void *user) {
  ax_rref_peer_down(n, peer);
  ps_model *m = g_ps;
  int r = 0;
  if (!m || sscanf(peer, "trainer%d", &r) != 1 || r < 1 || r > m->n)
    return;
  ax_future *fire[PS_MAX_TRAINERS];
  ax_tensor *params = NULL;
  int nf = 0;
  pthread_mutex_lock(&m->mu);
  if (!m->done[r] && !m->down[r]) {
    m->down[r] = 1;
    printf("server: trainer%d is down; carrying on with %d trainer(s)\n", r,
           live_trainers(m));
    fflush(stdout);
    if (m->mode == PS_SYNC)
      nf = barrier_fire(m, fire, &params);
  }
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
  if (nf)
    complete_all(fire, nf, params);
}

static ax_rref *g_model_rref;

/* "ps.model" [] -> [RRef of the model]: how trainers find it. */
static int fn_model(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                    void *user) {
  return ax_values_add_rref(out, g_model_rref);
}

/* "ps.done" [trainer] -> []: the trainer finished its steps. */
static int fn_done(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                   void *user) {
  ps_model *m = user;
  int64_t r = 0;
  AX_TRY(ax_values_get_i64(args, 0, &r));
  if (r < 1 || r > m->n)
    return ax_seterr(AX_EINVAL, "done: bad trainer %lld", (long long)r);
  pthread_mutex_lock(&m->mu);
  m->done[r] = 1;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
  return AX_OK;
}

int ps_server_main(const ps_opts *o) {
  static const char *names[] = {"sync", "async", "hogwild"};
  ps_model m = {.mode = o->mode, .n = o->trainers};
  pthread_mutex_init(&m.mu, NULL);
  pthread_cond_init(&m.cv, NULL);
  ax_optim_cfg oc;
  int rc = ps_optim_cfg(o, &oc);
  if (rc == AX_OK)
    rc = ps_build_net(o, &m.net);
  if (rc == AX_OK && !(m.opt = ax_optim_new(&oc, m.net->n_params, AX_CPU)))
    rc = AX_ENOMEM;
  m.lr = oc.lr;
  if (rc != AX_OK) {
    fprintf(stderr, "server: %s: %s\n", ax_strerror(rc), ax_errmsg());
    ax_net_free(m.net);
    return 1;
  }
  ax_node_opts no;
  ax_node_opts_init(&no);
  no.name = "server";
  no.listen = o->master;
  no.master = o->master;
  no.world_size = o->trainers + 1;
  no.rank = 0;
  no.threads = o->trainers + 2;
  no.peer_timeout_ms = 3000;
  ax_node *n = NULL;
  rc = ax_node_create(&no, &n);
  if (rc == AX_OK)
    rc = ax_rref_init(n);
  if (rc == AX_OK)
    rc = ax_robj_register(n, &ps_kind);
  if (rc == AX_OK)
    rc = ax_rref_own_object(n, &ps_kind, &m, &g_model_rref);
  if (rc == AX_OK)
    rc = ax_rpc_register(n, "ps.model", fn_model, &m);
  if (rc == AX_OK)
    rc = ax_rpc_register(n, "ps.done", fn_done, &m);
  g_ps = &m;
  if (rc == AX_OK) {
    ax_node_on_peer_down(n, on_peer_down, NULL);
    printf("server: %s mode, %d trainer(s), %ld steps of %d, %zu "
           "parameters\n",
           names[o->mode], o->trainers, o->steps, o->batch, m.net->n_params);
    fflush(stdout);
    rc = ax_node_join(n, 120000);
  }
  if (rc == AX_OK) {
    /* Wait until every trainer finished or went down (bounded). */
    double end = ax_clock_s() + o->timeout_ms / 1000.0;
    pthread_mutex_lock(&m.mu);
    while (live_trainers(&m) > 0 && ax_clock_s() < end) {
      struct timespec ts = ax_clock_after_ms(CLOCK_REALTIME, 1000);
      pthread_cond_timedwait(&m.cv, &m.mu, &ts);
    }
    int left = live_trainers(&m), lost = 0;
    for (int r = 1; r <= m.n; r++)
      lost += m.down[r];
    pthread_mutex_unlock(&m.mu);
    if (left > 0)
      rc = ax_seterr(AX_ETIMEOUT, "%d trainer(s) still running", left);
    double secs = m.t_last - m.t_first;
    printf("server: %ld updates, %ld samples in %.2f s: %.0f samples/s "
           "(%d trainer(s) lost)\n",
           m.updates, m.samples, secs, secs > 0 ? m.samples / secs : 0.0, lost);
  }
  if (rc == AX_OK)
    rc = ps_finish(o, m.net);
  if (rc != AX_OK)
    fprintf(stderr, "server: %s: %s\n", ax_strerror(rc), ax_errmsg());
  ax_rref_release(g_model_rref);
  g_model_rref = NULL;
  /* End the world: the trainers (all done or down by now) leave. */
  ax_world_report rep;
  int ended = n ? ax_node_shutdown_world(n, 20000, &rep) : AX_OK;
  if (ended != AX_OK && rc == AX_OK)
    fprintf(stderr, "server: %s\n", ax_errmsg());
  else
    ended = AX_OK; /* an earlier error is reported already */
  int leaks = n ? ps_check_leaks(n, "server") : 0;
  if (n)
    ax_node_shutdown(n, 5000);
  g_ps = NULL;
  ax_rref_fini(n);
  ax_node_destroy(n);
  for (int r = 1; r <= m.n; r++)
    ax_tensor_release(m.grad[r]);
  ax_optim_free(m.opt);
  ax_net_free(m.net);
  return rc != AX_OK || ended != AX_OK ? 1 : leaks;
}
