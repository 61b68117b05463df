/* One data-parallel replica: joins the others, trains its full copy of the
 * model on its shard of every global batch and combines with the others by
 * the chosen algorithm (ring all-reduce of gradients overlapped with the
 * backward, EASGD, or D-PSGD on a ring). On a dead replica the survivors
 * re-form the ring without it, re-synchronise from the new rank 0 and carry
 * on. Uses only the public headers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <axon/kernels/clock.h>

#include "dp.h"
#include "dp_state.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Examples of replica `rank` of `world` for the next step: the global batch
 * is perm[pos, pos + world * b) of epoch `epoch`'s permutation (seeded by
 * (seed, epoch)); replica r takes its r-th slice of b. So the replicas'
 * batches concatenated are exactly the batch a single process with batch
 * world * b trains on. */
static int next_batch(dp_state *s, ax_tlist *in, ax_tlist *lab) {
  int64_t n = ax_dataset_size(s->train), B = (int64_t)s->world * s->o->batch;
  if (s->pos + B > n || !s->perm_valid) {
    if (s->perm_valid) {
      s->epoch++;
      s->pos = 0;
    }
    ax_rng r;
    ax_rng_seed2(&r, s->o->seed, (uint64_t)s->epoch);
    for (int64_t i = 0; i < n; i++)
      s->perm[i] = (int32_t)i;
    ax_rng_shuffle_i32(&r, s->perm, n);
    s->perm_valid = 1;
  }
  int64_t idx[4096];
  int b = s->o->batch;
  for (int i = 0; i < b; i++)
    idx[i] = s->perm[s->pos + (int64_t)s->rank * b + i];
  s->pos += B;
  return ax_dataset_batch(s->train, idx, b, in, lab);
}

/* Forward, mean loss and backward of one local batch into net->grads. With
 * all-reduce the backward reports each block's gradients as they become
 * final and the group reduces them in buckets meanwhile. */
static int compute(dp_state *s, double *loss, int *comm_rc) {
  ax_tlist in = {0}, lab = {0}, out = {0}, dl = {0}, din = {0};
  ax_loss_result res = {0};
  int rc = next_batch(s, &in, &lab);
  uint64_t seed = s->o->seed * 1000003u + (uint64_t)s->step;
  if (rc == AX_OK)
    rc = ax_net_forward(s->net, s->slot, 1, seed, &in, &out);
  if (rc == AX_OK)
    rc = ax_loss_xent(&out, &lab, s->info.ignore_index, NULL, 1.0f, &res, &dl);
  if (rc == AX_OK)
    rc = ax_net_zero_grad(s->net);
  ax_coll_buckets *b = NULL;
  ax_exec ex = ax_net_exec(s->net, 1);
  ex.seed = seed;
  ex.need_dx = 0;
  if (rc == AX_OK && s->algo == DP_ALLREDUCE) {
    rc = ax_coll_buckets_begin(s->group, s->net->grads,
                               (size_t)s->o->bucket_kb << 10, AX_COLL_AVG, &b);
    ex.grad_ready = ax_coll_buckets_ready;
    ex.grad_ready_user = b;
  }
  if (rc == AX_OK)
    rc = ax_backward(s->net->root, &ex, s->slot, &dl, &din);
  if (b) /* always ended, so the group's operations stay paired */
    *comm_rc = ax_coll_buckets_end(b, 0);
  *loss = res.loss;
  ax_slot_reset(s->slot);
  ax_tlist_clear(&in);
  ax_tlist_clear(&lab);
  ax_tlist_clear(&out);
  ax_tlist_clear(&dl);
  ax_tlist_clear(&din);
  return rc;
}

/* x = w_self x + w_n (prev + next): the ring's doubly-stochastic mixing
 * (1/3 each for N >= 3; 1/2 self and 1/4 per side, i.e. 1/2 the one
 * neighbour, for N = 2). */
static void mix(dp_state *s) {
  float ws = s->world >= 3 ? 1.0f / 3 : 0.5f,
        wn = s->world >= 3 ? 1.0f / 3 : 0.25f;
  float *x = ax_f32(s->net->params), *a = ax_f32(s->aux1), *c = ax_f32(s->aux2);
  for (size_t i = 0; i < s->net->n_params; i++)
    x[i] = ws * x[i] + wn * (a[i] + c[i]);
}

/* One step of the chosen algorithm. Returns AX_OK, AX_EPEERDOWN (group
 * broken: the caller re-forms it) or another error. */
static int step(dp_state *s, double *loss) {
  int comm = AX_OK, rc;
  size_t n = s->net->n_params;
  float *x = ax_f32(s->net->params);
  if (s->algo == DP_ALLREDUCE) {
    AX_TRY(compute(s, loss, &comm));
    AX_TRY(comm);
    return ax_optim_step(s->opt, s->net->params, s->net->grads);
  }
  if (s->algo == DP_DPSGD) { /* exchange x_t while computing g(x_t) */
    ax_coll_op *op = NULL;
    AX_TRY(ax_coll_neighbors_async(s->group, s->net->params, s->aux1, s->aux2,
                                   &op));
    rc = compute(s, loss, &comm);
    comm = ax_coll_wait(op, 0);
    AX_TRY(rc);
    AX_TRY(comm);
    mix(s);
    return ax_optim_step(s->opt, s->net->params, s->net->grads);
  }
  /* EASGD: every tau steps d = x - c; x -= alpha d; c += alpha sum_i d_i,
   * the sum all-reduced while this step's gradient is computed. */
  int talk = s->step % s->o->tau == 0;
  ax_coll_op *op = NULL;
  float *c = ax_f32(s->center), *d = ax_f32(s->aux1), *sum = ax_f32(s->aux2);
  if (talk) {
    for (size_t i = 0; i < n; i++)
      d[i] = sum[i] = x[i] - c[i];
    AX_TRY(ax_coll_allreduce_async(s->group, s->aux2, 0, 0, AX_COLL_SUM, &op));
  }
  rc = compute(s, loss, &comm);
  if (op)
    comm = ax_coll_wait(op, 0);
  AX_TRY(rc);
  AX_TRY(comm);
  AX_TRY(ax_optim_step(s->opt, s->net->params, s->net->grads));
  if (talk) {
    float a = (float)s->alpha;
    for (size_t i = 0; i < n; i++) {
      x[i] -= a * d[i];
      c[i] += a * sum[i];
    }
  }
  return AX_OK;
}

/* Survivors form a ring without the dead replicas and take the new rank
 * 0's parameters, centre and data position, so they continue as one. */
static int reform(dp_state *s) {
  const char *dead = ax_coll_failed_peer(s->group);
  fprintf(stderr,
          "dp: rank %d: replica %s is down (%s); re-forming the "
          "ring without it\n",
          s->rank, dead ? dead : "?", ax_errmsg());
  fflush(stderr);
  sleep_ms(300); /* let every survivor see the failure */
  ax_coll_group *ng = NULL;
  AX_TRY(ax_coll_group_shrink(s->group, &ng));
  ax_coll_group_free(s->group);
  s->group = ng;
  s->world = ax_coll_group_size(ng);
  s->rank = ax_coll_group_rank(ng);
  s->reforms++;
  float *st = ax_f32(s->sync);
  st[0] = (float)s->step;
  st[1] = (float)s->pos;
  st[2] = (float)s->epoch;
  AX_TRY(ax_coll_broadcast(ng, s->sync, 0));
  s->step = (long)st[0];
  s->pos = (int64_t)st[1];
  s->epoch = (int)st[2];
  AX_TRY(ax_coll_broadcast(ng, s->net->params, 0));
  if (s->center)
    AX_TRY(ax_coll_broadcast(ng, s->center, 0));
  fprintf(stderr, "dp: rank %d: continuing with %d replicas at step %ld\n",
          s->rank, s->world, s->step);
  return AX_OK;
}

int dp_replica(const dp_opts *o) {
  dp_state st, *s = &st;
  if (o->threads > 0)
    ax_cpu_set_threads(o->threads);
  int rc = dp_state_open(s, o);
  if (rc != AX_OK) {
    fprintf(stderr, "dp: rank %d: setup: %s: %s\n", o->rank, ax_errname(rc),
            ax_errmsg());
    dp_state_close(s);
    return 1;
  }
  ax_progress prog;
  int bar = s->rank == 0 && !o->quiet;
  if (bar)
    ax_progress_start(&prog, stderr, o->steps);
  double t0 = ax_clock_s(), loss = 0, first = 0, last = 0;
  long nfirst = 0, nlast = 0, samples = 0;
  while (rc == AX_OK && s->step < o->steps) {
    if (s->step == o->die_step && o->rank == o->die_rank) {
      fprintf(stderr, "dp: rank %d: dying at step %ld (fault injection)\n",
              o->rank, s->step);
      _exit(3);
    }
    rc = step(s, &loss);
    if (rc == AX_EPEERDOWN) {
      rc = reform(s);
      continue;
    }
    if (rc != AX_OK)
      break;
    samples += o->batch;
    if (s->step < 10) {
      first += loss;
      nfirst++;
    }
    if (s->step >= o->steps - 10) {
      last += loss;
      nlast++;
    }
    s->step++;
    if (bar)
      ax_progress_update(&prog, s->step,
                         samples * s->world / (ax_clock_s() - t0), loss, "dp");
  }
  double secs = ax_clock_s() - t0;
  if (bar)
    ax_progress_end(&prog);
  if (rc != AX_OK) {
    fprintf(stderr, "dp: rank %d: step %ld: %s: %s\n", o->rank, s->step,
            ax_errname(rc), ax_errmsg());
    dp_state_close(s);
    return 1;
  }
  double rate = samples / secs, total = rate * s->world, acc = -1;
  rc = dp_state_finish(s, &rate, &total, &acc);
  if (rc == AX_OK && (rc = dp_leave(s->node, o->rank)) == AX_OK)
    s->left = 1;
  printf("dp: result rank=%d world=%d algo=%s model=%s steps=%ld "
         "loss_first=%.4f loss_last=%.4f acc=%.4f samples_per_s=%.1f "
         "replica_samples_per_s=%.1f reforms=%d",
         o->rank, s->world, o->algo, o->model, s->step,
         nfirst ? first / nfirst : 0, nlast ? last / nlast : 0, acc, total,
         rate, s->reforms);
  dp_state_close(s);
  printf(" %s\n", dp_live_report());
  fflush(stdout);
  return rc == AX_OK ? 0 : 1;
}
