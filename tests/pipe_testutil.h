/* Helpers for the pipeline tests: a synthetic batch source, the
 * single-process reference simulators of the oracles, and the checks of the
 * coordinator's events and of the stages' own events (schedule invariants
 * and data dependencies, pipe_eventcheck.h). Header-only.
 *
 * The reference keeps K stage nets and every weight version per stage:
 * Before every update, the gradients of a tie's two copies (models/model.h)
 * are summed into both (ax_model_tie_grads over the K stages).
 *  - REF_SYNC: plain SGD on the whole mini-batch (sequential, gpipe and 1f1b
 *    must match it: micro-batch gradients sum to the mini-batch gradient),
 *    or, with dropout, on its micro-batches (pt_ref_opts.units) each under
 *    the coordinator's per-unit seed, gradients summed (every unit's into
 *    its own buffer, the buffers summed in the stages' order,
 *    kernels/sum_tree.h);
 *  - REF_STASH (ddg, pipedream): at stage k the gradient of mini-batch t is
 *    computed with the weights after update t - d_k - 1 (version
 *    max(0, t - d_k)), forward and backward alike, and applied to the
 *    latest weights;
 *  - REF_REPLAY (fr): the forward uses those same stale weights, but the
 *    backward recomputes the stage from its stashed input with the latest
 *    weights (version t), without updating running statistics;
 *  - REF_2BW (2bw): every stage computes the gradient of mini-batch t (or
 *    of its micro-batches, summed) with the weights before update t - 1
 *    (version max(0, t - 1)) and applies it to the latest weights:
 *    w(t+1) = w(t) - lr grad f(w(t-1)).
 * With a staleness correction (pt_ref_opts.staleness, the asynchronous
 * kinds only; SGD with or without momentum, no Nesterov), the reference
 * steps with its own SGD and keeps, per stage and version v, the momentum
 * buffer m(v) and the learning rate l(v) of the update that produced v, and
 * the average D(v) of the updates. With s the stage's delay (t minus the
 * forward's version in the steady state, from ref_version):
 *  - predict: the forward of mini-batch t uses p = w(f) - s l(f) m(f), f
 *    the forward's version; the backward uses p too (REF_REPLAY: replays
 *    with the latest version t, as without a correction);
 *  - pipemare: the forward uses w(f); the backward (REF_REPLAY: its replay)
 *    uses w(t) - min(s, t) D(t), D(v+1) = gamma D(v) + (1 - gamma) (w(v+1)
 *    - w(v)), D(0) = 0; update t runs with lr(t) max(s, 1)^-e, e = 1 -
 *    min(t / warmup, 1) (e = 1 without a warm-up). */
#ifndef AX_PIPE_TESTUTIL_H
#define AX_PIPE_TESTUTIL_H

#include <math.h>
#include <pthread.h>
#include <signal.h>

#include "axon/kernels/backend-impl.h"
#include "axon/kernels/sum_tree.h"
#include "axon/models/data/dataset.h"
#include "axon/models/loss.h"
#include "axon/models/model.h"
#include "axon/models/optim.h"
#include "axon/runtime/pipeline/coord/coordinator.h"
#include "axon/runtime/pipeline/stage/staleness.h"
#include "harness.h"
#include "tests/mp_testutil.h"
#include "tests/pipe_eventcheck.h"
#include "tests/pipe_staleref.h"

enum { REF_SYNC = 0, REF_STASH = 1, REF_REPLAY = 2, REF_2BW = 3 };

static inline int ref_kind(int mode) {
  return mode == AX_MODE_DDG || mode == AX_MODE_PIPEDREAM ? REF_STASH
         : mode == AX_MODE_FR                             ? REF_REPLAY
         : mode == AX_MODE_2BW                            ? REF_2BW
                                                          : REF_SYNC;
}

/* The weight version stage k (d = K - 1 - k) uses for mini-batch t: its
 * forward, or its backward (bwd). REF_STASH: the one after update t - d
 * - 1 for both; REF_REPLAY: that one forward, the latest backward (after
 * the replay); REF_2BW: the one before update t - 1 for both (every
 * stage); REF_SYNC: the latest. */
static inline int ref_version(int kind, int t, int d, int bwd) {
  switch (kind) {
  case REF_STASH:
    return t - d > 0 ? t - d : 0;
  case REF_REPLAY:
    return bwd ? t : (t - d > 0 ? t - d : 0);
  case REF_2BW:
    return t - 1 > 0 ? t - 1 : 0;
  default:
    return t;
  }
}

typedef struct pt_data {
  ax_dataset *ds;
  int batch;
} pt_data;

/* Mini-batch t: examples [t B, (t + 1) B) modulo the data set size. */
static inline int pt_batch(void *user, long t, ax_tlist *in, ax_tlist *lab) {
  pt_data *d = user;
  int64_t idx[512], n = ax_dataset_size(d->ds);
  for (int i = 0; i < d->batch; i++)
    idx[i] = (t * d->batch + i) % n;
  return ax_dataset_batch(d->ds, idx, d->batch, in, lab);
}

/* Options of pt_reference_ex beyond pt_reference's. */
typedef struct pt_ref_opts {
  /* Micro-batches per mini-batch (REF_SYNC only; 0 or 1: the whole
   * mini-batch in one unit). Unit m of mini-batch t holds the rows the
   * coordinator sends (rows [B m / U, B (m + 1) / U) times each tensor's
   * rows per example) and its loss is divided by the mini-batch's label
   * counts, so the units' gradients sum to the mini-batch's. */
  int units;
  /* Nonzero: before every backward the stage's forward is replayed (with
   * the same weights, or the latest for REF_REPLAY) under the unit's seed
   * plus this delta: a negative control whose dropout masks at replay
   * differ from the forward's. */
  uint64_t replay_seed_delta;
  /* The staleness correction (AX_STALE_*, runtime/pipeline/stage/staleness.h),
   * PipeMare's gamma and learning-rate warm-up (see the top). */
  int staleness;
  double gamma;
  int warmup;
  /* How the units' gradients are summed (ax_sum_order, as
   * ax_pipe_opts.sum_order: 0 = the tree, the pipeline's default). */
  int sum_order;
  /* Nonzero: a negative control whose tied copies (models/model.h) step
   * with their own gradients, not summed. */
  int untied;
} pt_ref_opts;

/* The delay of stage d = K - 1 - k in a reference kind: how many versions
 * the forward of a late mini-batch lags behind it. */
static inline int ref_delay(int kind, int d) {
  return 1000 - ref_version(kind, 1000, d, 0);
}

/* The dropout seed of unit m of mini-batch t (U units per mini-batch), as
 * the coordinator derives it for the stages
 * (runtime/pipeline/coord/coord_run.c, make_args; base = 0, the pipe's first
 * train). */
static inline uint64_t pt_unit_seed(uint64_t seed, long t, int U, int m) {
  return seed * 1000003u + (uint64_t)(t * U + m);
}

/* Unit m of U of the tensor list l of a mini-batch of B examples, as the
 * coordinator cuts it (coord_run.c, unit_slice): rows [B m / U,
 * B (m + 1) / U) times the tensor's rows per example. New references (views)
 * in *out. */
static inline void pt_unit_slice(const ax_tlist *l, int64_t B, int U, int m,
                                 ax_tlist *out) {
  memset(out, 0, sizeof *out);
  for (int i = 0; i < l->n; i++) {
    int64_t f = l->t[i]->shape[0] / B, lo = B * m / U, hi = B * (m + 1) / U;
    out->t[out->n++] = ax_tensor_slice0(l->t[i], lo * f, (hi - lo) * f);
    assert_non_null(out->t[out->n - 1]);
  }
}

/* Labels other than ignore_index per label tensor (the loss divisors). */
static inline void pt_label_counts(const ax_tlist *lab, int ignore,
                                   int64_t *norm) {
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

/* The units' gradients of a stage, summed as the stage host sums them
 * (kernels/sum_tree.h, with the same addition): each unit's buffer is a
 * leaf. */
static inline int pt_leaf_add(void *user, void *acc, void *x) {
  (void)user;
  ax_tensor *a = acc;
  return AX_K(ax_backend_of(a->device), axpby, ax_tensor_numel(a), 1.0f,
              ax_f32((ax_tensor *)x), 1.0f, ax_f32(a));
}
static inline void pt_leaf_drop(void *user, void *x) {
  (void)user;
  ax_tensor_release(x);
}

/* Runs the reference for T mini-batches; params[k] / bufs[k] receive new
 * references to the final flat buffers of stage k (bufs[k] NULL if none).
 * Dropout uses the coordinator's per-unit seeds (pt_unit_seed), forward
 * and replay alike. ro may be NULL (one unit, no extra replay). */
static inline void pt_reference_ex(const ax_model_def *def,
                                   const ax_config *mcfg, const int *bounds,
                                   int K, int kind, int T,
                                   ax_pipe_batch_fn batch, void *data,
                                   const char *optim, uint64_t seed,
                                   const pt_ref_opts *ro, ax_tensor **params,
                                   ax_tensor **bufs) {
  int U = ro && ro->units > 1 ? ro->units : 1;
  uint64_t delta = ro ? ro->replay_seed_delta : 0;
  int stale = ro ? ro->staleness : AX_STALE_NONE;
  ax_sum_order order = ro ? (ax_sum_order)ro->sum_order : AX_SUM_TREE;
  ax_sum_tree sum[8];
  assert_true(U == 1 || kind == REF_SYNC || kind == REF_2BW);
  assert_true(stale == AX_STALE_NONE || kind != REF_SYNC);
  pt_stale_hist hist[8];
  ax_tensor *fwd_w[8] = {NULL}, *bwd_w[8] = {NULL};
  ax_net *net[8];
  ax_optim *opt[8];
  ax_tensor **ver[8];
  ax_config oc;
  ax_optim_cfg ocfg;
  AX_ASSERT_OK(ax_config_parse(&oc, optim));
  AX_ASSERT_OK(ax_optim_cfg_parse(&oc, &ocfg));
  ax_model_info info;
  AX_ASSERT_OK(ax_model_describe(def, mcfg, &info));
  for (int k = 0; k < K; k++) {
    AX_ASSERT_OK(ax_model_stage(def, mcfg, bounds[k], bounds[k + 1], AX_CPU,
                                seed, &net[k]));
    opt[k] = ax_optim_new(&ocfg, net[k]->n_params, AX_CPU);
    ver[k] = calloc((size_t)T + 1, sizeof *ver[k]);
    ver[k][0] = ax_tensor_like(net[k]->params);
    AX_ASSERT_OK(ax_tensor_copy(ver[k][0], net[k]->params));
    hist[k].n = net[k]->n_params;
    hist[k].mom = calloc((size_t)T + 1, sizeof(float *));
    hist[k].avg = calloc((size_t)T + 1, sizeof(float *));
    hist[k].lr = calloc((size_t)T + 1, sizeof(float));
    hist[k].mom[0] = calloc(hist[k].n, sizeof(float));
    hist[k].avg[0] = calloc(hist[k].n, sizeof(float));
  }
  for (int t = 0; t < T; t++) {
    ax_tlist in = {0}, lab = {0};
    AX_ASSERT_OK(batch(data, t, &in, &lab));
    int64_t norm[AX_TLIST_MAX] = {0};
    pt_label_counts(&lab, info.ignore_index, norm);
    for (int k = 0; k < K; k++) {
      AX_ASSERT_OK(ax_net_zero_grad(net[k]));
      ax_sum_tree_init(&sum[k], order, pt_leaf_add, pt_leaf_drop, NULL);
      /* the weights of mini-batch t's forwards and backwards */
      int d = K - 1 - k, sk = ref_delay(kind, d);
      int vf = ref_version(kind, t, d, 0), vb = ref_version(kind, t, d, 1);
      ax_tensor_release(fwd_w[k]);
      ax_tensor_release(bwd_w[k]);
      fwd_w[k] = ax_tensor_retain(ver[k][vf]);
      bwd_w[k] = ax_tensor_retain(ver[k][vb]);
      if (stale == AX_STALE_PREDICT) {
        ax_tensor_release(fwd_w[k]);
        fwd_w[k] =
            pt_shift(ver[k][vf], -(double)sk * hist[k].lr[vf], hist[k].mom[vf]);
        if (kind != REF_REPLAY) {
          ax_tensor_release(bwd_w[k]);
          bwd_w[k] = ax_tensor_retain(fwd_w[k]);
        }
      } else if (stale == AX_STALE_PIPEMARE) {
        ax_tensor_release(bwd_w[k]);
        bwd_w[k] =
            pt_shift(ver[k][t], -(double)(t < sk ? t : sk), hist[k].avg[t]);
      }
    }
    for (int m = 0; m < U; m++) {
      ax_tlist x[9] = {{0}}, ulab = {0};
      pt_unit_slice(&in, in.t[0]->shape[0], U, m, &x[0]);
      pt_unit_slice(&lab, in.t[0]->shape[0], U, m, &ulab);
      uint64_t sd = pt_unit_seed(seed, t, U, m);
      ax_slot *slot[8];
      for (int k = 0; k < K; k++) {
        ax_exec ex = ax_net_exec(net[k], 1);
        ex.params = fwd_w[k];
        ex.seed = sd;
        slot[k] = ax_slot_new();
        AX_ASSERT_OK(ax_forward(net[k]->root, &ex, slot[k], &x[k], &x[k + 1]));
      }
      ax_loss_result r;
      ax_tlist dy = {0}, dx = {0};
      AX_ASSERT_OK(
          ax_loss_xent(&x[K], &ulab, info.ignore_index, norm, 1.0f, &r, &dy));
      for (int k = K - 1; k >= 0; k--) {
        ax_exec ex = ax_net_exec(net[k], 1);
        ex.params = bwd_w[k];
        ex.seed = sd;
        if (kind == REF_REPLAY || delta) { /* recompute with bwd_w */
          ax_tlist y = {0};
          ax_slot_free(slot[k]);
          slot[k] = ax_slot_new();
          ex.update_stats = 0;
          ex.seed = sd + delta;
          AX_ASSERT_OK(ax_forward(net[k]->root, &ex, slot[k], &x[k], &y));
          ax_tlist_clear(&y);
        }
        ex.grads = ax_tensor_like(net[k]->grads); /* the unit's leaf */
        assert_non_null(ex.grads);
        AX_ASSERT_OK(ax_tensor_fill(ex.grads, 0.0f));
        ex.need_dx = k > 0;
        AX_ASSERT_OK(ax_backward(net[k]->root, &ex, slot[k], &dy, &dx));
        AX_ASSERT_OK(ax_sum_tree_push(&sum[k], ex.grads));
        ax_tlist_clear(&dy);
        dy = dx;
        memset(&dx, 0, sizeof dx);
        ax_slot_free(slot[k]);
      }
      ax_tlist_clear(&dy);
      for (int k = 0; k <= K; k++)
        ax_tlist_clear(&x[k]);
      ax_tlist_clear(&ulab);
    }
    for (int k = 0; k < K; k++) {
      void *g = NULL;
      AX_ASSERT_OK(ax_sum_tree_finish(&sum[k], &g));
      AX_ASSERT_OK(ax_tensor_copy(net[k]->grads, g));
      ax_tensor_release(g);
    }
    /* tied copies (models/model.h): both get the sum of their gradients */
    if (!ro || !ro->untied)
      AX_ASSERT_OK(ax_model_tie_grads(&info, K, bounds, net, NULL));
    for (int k = 0; k < K; k++) {
      ver[k][t + 1] = ax_tensor_like(ver[k][t]);
      AX_ASSERT_OK(ax_tensor_copy(ver[k][t + 1], ver[k][t]));
      if (stale == AX_STALE_NONE) {
        AX_ASSERT_OK(ax_optim_step(opt[k], ver[k][t + 1], net[k]->grads));
        continue;
      }
      double scale = 1, tau = ref_delay(kind, K - 1 - k);
      if (stale == AX_STALE_PIPEMARE && tau > 1) {
        double e = ro->warmup > 0 && t < ro->warmup
                       ? 1.0 - (double)t / ro->warmup
                   : ro->warmup > 0 ? 0.0
                                    : 1.0;
        scale = pow(tau, -e);
      }
      pt_stale_step(&ocfg, &hist[k], ver[k][t], net[k]->grads, t, scale,
                    stale == AX_STALE_PIPEMARE ? ro->gamma : 0.0,
                    ver[k][t + 1]);
    }
    ax_tlist_clear(&in);
    ax_tlist_clear(&lab);
  }
  for (int k = 0; k < K; k++) {
    params[k] = ax_tensor_retain(ver[k][T]);
    bufs[k] = net[k]->buffers ? ax_tensor_retain(net[k]->buffers) : NULL;
    for (int v = 0; v <= T; v++) {
      ax_tensor_release(ver[k][v]);
      free(hist[k].mom[v]);
      free(hist[k].avg[v]);
    }
    free(hist[k].mom);
    free(hist[k].avg);
    free(hist[k].lr);
    ax_tensor_release(fwd_w[k]);
    ax_tensor_release(bwd_w[k]);
    free(ver[k]);
    ax_optim_free(opt[k]);
    ax_net_free(net[k]);
  }
}

/* pt_reference_ex with one unit per mini-batch and no extra replay. */
static inline void pt_reference(const ax_model_def *def, const ax_config *mcfg,
                                const int *bounds, int K, int kind, int T,
                                ax_pipe_batch_fn batch, void *data,
                                const char *optim, uint64_t seed,
                                ax_tensor **params, ax_tensor **bufs) {
  pt_reference_ex(def, mcfg, bounds, K, kind, T, batch, data, optim, seed, NULL,
                  params, bufs);
}

/* Largest relative difference |a - b| / (floor + |b|), where floor is
 * 1e-6 or, when PT_FLOOR_RMS is defined, 1e-2 times the root mean square of
 * b (so parameters that are still nearly zero, e.g. biases after two steps,
 * do not turn float rounding of summation order into a large ratio). */
static inline double pt_worst(const ax_tensor *a, const ax_tensor *b) {
  assert_int_equal(ax_tensor_numel(a), ax_tensor_numel(b));
  size_t n = ax_tensor_numel(a);
  double w = 0, floor = 1e-6;
#ifdef PT_FLOOR_RMS
  double ss = 0;
  for (size_t i = 0; i < n; i++)
    ss += (double)ax_f32(b)[i] * ax_f32(b)[i];
  floor = n ? 1e-2 * sqrt(ss / (double)n) : floor;
#endif
  for (size_t i = 0; i < n; i++) {
    double x = ax_f32(a)[i], y = ax_f32(b)[i];
    double d = fabs(x - y) / (floor + fabs(y));
    w = d > w ? d : w;
  }
  return w;
}

/* The worst pt_worst over the K stages' parameters and buffers of p
 * against the references want/wbuf, which it releases. */
static inline double pt_worst_stages(ax_pipe *p, int K, ax_tensor **want,
                                     ax_tensor **wbuf) {
  double worst = 0;
  for (int k = 0; k < K; k++) {
    ax_tensor *got, *gbuf;
    AX_ASSERT_OK(ax_pipe_stage_state(p, k, &got, &gbuf));
    double w = pt_worst(got, want[k]);
    if (gbuf && wbuf[k]) {
      double wb = pt_worst(gbuf, wbuf[k]);
      w = wb > w ? wb : w;
    }
    worst = w > worst ? w : worst;
    ax_tensor_release(got);
    ax_tensor_release(gbuf);
    ax_tensor_release(want[k]);
    ax_tensor_release(wbuf[k]);
  }
  return worst;
}

/* Oracle 4: on the coordinator's events, every (stage, unit, fwd/bwd)
 * exactly once, live states within the table's bound, and weight versions
 * within d + 1 (1 without stashing); then the stages' own events
 * (pt_check_stage_trace in pipe_eventcheck.h: each stage's order, data
 * dependencies from send and receive events, forward locking). Call it
 * once, after the pipe's first ax_pipe_train; recompute as in the pipe's
 * options. */
static inline void pt_check_events(ax_pipe *p, int mode, int K, int M,
                                   int recompute, long n) {
  long ne;
  const ax_pipe_event *ev = ax_pipe_events(p, &ne);
  int U = ax_pipe_units(mode, M);
  assert_int_equal(ne, (long)K * 2 * n * U);
  unsigned char *seen = calloc((size_t)K * 2 * n * U, 1);
  for (long i = 0; i < ne; i++) {
    const ax_pipe_op *o = &ev[i].op;
    long at = ((long)o->stage * 2 + o->kind) * n * U + o->batch * U + o->micro;
    assert_false(seen[at]); /* exactly once */
    seen[at] = 1;
    assert_true(ev[i].live <= ax_pipe_live_bound(mode, K, o->stage, M));
    assert_true(ev[i].versions <= ax_pipe_version_bound(mode, K, o->stage, M));
  }
  free(seen);
  pt_check_stage_trace(p, mode, K, M, recompute, n);
}

/* A lost agent: trains p (up to a million mini-batches) while pid is
 * SIGKILLed 1.5 s in, and checks that the call fails with AX_EPEERDOWN
 * within 10 s of the kill, its message naming every string of `names`
 * (NULL-terminated: the dead agent, the replica or member). `who` labels
 * the report. */
static inline void *pt_kill_after_1500ms(void *arg) {
  rt_sleep_ms(1500);
  kill(*(pid_t *)arg, SIGKILL);
  return NULL;
}

static inline void pt_train_until_killed(ax_pipe *p, pid_t *pid,
                                         ax_pipe_batch_fn batch, void *user,
                                         const char *who,
                                         const char *const *names) {
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, pt_kill_after_1500ms, pid), 0);
  int64_t t0 = ax_clock_ms();
  int err = ax_pipe_train(p, 1000000, batch, NULL, user);
  double took = (double)(ax_clock_ms() - t0) / 1e3 - 1.5;
  pthread_join(th, NULL);
  fprintf(stderr, "  %s killed: %s after %.1f s: %s\n", who, ax_strerror(err),
          took, ax_errmsg());
  assert_int_equal(err, AX_EPEERDOWN);
  for (int i = 0; names && names[i]; i++)
    assert_non_null(strstr(ax_errmsg(), names[i]));
  assert_true(took < 10.0);
}

#endif
