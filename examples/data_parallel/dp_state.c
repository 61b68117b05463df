/* Set-up and tear-down of a data-parallel replica (see dp_state.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <axon/kernels/clock.h>

#include "dp_state.h"

static char g_live[160] = "live_calls=? live_futures=? rrefs=? contexts=?";

const char *dp_live_report(void) { return g_live; }

static ax_tensor *vec(size_t n) {
  int64_t s = (int64_t)n;
  return ax_tensor_zeros(AX_F32, 1, &s, AX_CPU);
}

static int open_node(dp_state *s, const dp_opts *o) {
  char name[32];
  snprintf(name, sizeof name, "dp%d", o->rank);
  ax_node_opts no;
  ax_node_opts_init(&no);
  no.name = name;
  no.listen =
      o->rank == 0 ? o->master : (o->listen ? o->listen : "127.0.0.1:0");
  no.master = o->rank == 0 ? NULL : o->master;
  no.world_size = o->rank == 0 ? o->world : 0;
  no.rank = o->rank;
  no.threads = 2;
  no.heartbeat_ms = 250;
  no.peer_timeout_ms = 2000;
  no.timeout_ms = o->timeout_ms;
  AX_TRY(ax_node_create(&no, &s->node));
  AX_TRY(ax_coll_init(s->node));
  AX_TRY(ax_dist_init(s->node));
  AX_TRY(ax_node_join(s->node, 60000));
  const char *members[256];
  char names[256][16];
  if (o->world > 256)
    return ax_seterr(AX_EINVAL, "at most 256 replicas");
  for (int r = 0; r < o->world; r++) {
    snprintf(names[r], sizeof names[r], "dp%d", r);
    members[r] = names[r];
  }
  return ax_coll_group_new(s->node, "dp", o->world, members, o->timeout_ms,
                           &s->group);
}

int dp_state_open(dp_state *s, const dp_opts *o) {
  memset(s, 0, sizeof *s);
  s->o = o;
  s->rank = o->rank;
  s->world = o->world;
  s->algo = !strcmp(o->algo, "easgd")       ? DP_EASGD
            : !strcmp(o->algo, "dpsgd")     ? DP_DPSGD
            : !strcmp(o->algo, "allreduce") ? DP_ALLREDUCE
                                            : -1;
  if (s->algo < 0)
    return ax_seterr(AX_EINVAL, "unknown --algo %s", o->algo);
  if (o->batch < 1 || o->batch > 4096 || o->tau < 1)
    return ax_seterr(AX_EINVAL, "--batch must be in [1, 4096], --tau >= 1");
  s->alpha = o->alpha >= 0 ? o->alpha : 0.9 / o->world;
  const ax_model_def *def = ax_model_find(o->model);
  if (!def)
    return AX_ENOTFOUND;
  ax_config mcfg, dcfg, ocfg;
  AX_TRY(ax_model_config(def, o->model_config, &mcfg));
  AX_TRY(def->describe(&mcfg, &s->info));
  AX_TRY(ax_config_parse(&dcfg, !strcmp(o->model, "resnet20") ? "pad=1" : ""));
  ax_config extra;
  AX_TRY(ax_config_parse(&extra, o->data_config));
  AX_TRY(ax_config_merge(&dcfg, &extra));
  AX_TRY(ax_config_parse(&ocfg, o->optim));
  ax_optim_cfg oc;
  AX_TRY(ax_optim_cfg_parse(&ocfg, &oc));
  AX_TRY(ax_dataset_open("fashion-mnist", &dcfg, AX_SPLIT_TRAIN, &s->train));
  if (o->rank == 0)
    AX_TRY(ax_dataset_open("fashion-mnist", &dcfg, AX_SPLIT_TEST, &s->test));
  if (ax_dataset_size(s->train) < (int64_t)o->world * o->batch)
    return ax_seterr(AX_EINVAL, "data set smaller than one global batch");
  s->perm = malloc(ax_dataset_size(s->train) * sizeof(int32_t));
  if (!s->perm)
    return AX_ENOMEM;
  AX_TRY(ax_model_stage(def, &mcfg, 0, s->info.n_blocks, AX_CPU, o->seed,
                        &s->net));
  if (!(s->slot = ax_slot_new()) ||
      !(s->opt = ax_optim_new(&oc, s->net->n_params, AX_CPU)) ||
      !(s->aux1 = vec(s->net->n_params)) ||
      !(s->aux2 = vec(s->net->n_params)) || !(s->sync = vec(3)))
    return ax_seterr(AX_ENOMEM, "replica buffers");
  AX_TRY(open_node(s, o));
  /* Every replica starts from rank 0's parameters (identical anyway when
   * they share the seed; this is what a user does with differing seeds). */
  AX_TRY(ax_coll_broadcast(s->group, s->net->params, 0));
  if (s->algo == DP_EASGD) {
    if (!(s->center = ax_tensor_like(s->net->params)))
      return AX_ENOMEM;
    AX_TRY(ax_tensor_copy(s->center, s->net->params));
  }
  return AX_OK;
}

int dp_state_finish(dp_state *s, double *rate, double *total, double *acc) {
  float *one = ax_f32(s->sync);
  one[0] = (float)*rate;
  ax_tensor *r1 = ax_tensor_view(s->sync, 0, 1, (int64_t[]){1});
  int rc = r1 ? ax_coll_allreduce(s->group, r1, AX_COLL_SUM) : AX_ENOMEM;
  ax_tensor_release(r1);
  if (rc == AX_OK)
    *total = one[0];
  if (rc == AX_OK && s->algo == DP_EASGD)
    rc = ax_tensor_copy(s->net->params, s->center);
  if (rc == AX_OK && s->algo == DP_DPSGD)
    rc = ax_coll_allreduce(s->group, s->net->params, AX_COLL_AVG);
  if (rc == AX_OK && s->net->buffers)
    rc = ax_coll_allreduce(s->group, s->net->buffers, AX_COLL_AVG);
  if (rc == AX_OK && s->rank == 0 && s->o->dump) {
    FILE *f = fopen(s->o->dump, "wb");
    if (!f || fwrite(s->net->params->data, sizeof(float), s->net->n_params,
                     f) != s->net->n_params)
      rc = ax_seterr(AX_EIO, "cannot write %s", s->o->dump);
    if (f)
      fclose(f);
  }
  if (rc == AX_OK && s->rank == 0 && s->o->eval_limit > 0) {
    double loss;
    rc = ax_evaluate(s->net, s->test, 256, s->o->eval_limit,
                     s->info.ignore_index, acc, &loss);
  }
  if (rc != AX_OK)
    fprintf(stderr, "dp: rank %d: finish: %s: %s\n", s->rank, ax_errname(rc),
            ax_errmsg());
  return rc;
}

int dp_leave(ax_node *n, int rank) {
  int rc;
  if (rank == 0) {
    ax_world_report rep;
    rc = ax_node_shutdown_world(n, 60000, &rep);
  } else { /* rank 0 evaluates first */
    rc = ax_node_wait_leave(n, 600000);
    if (rc == AX_EPEERDOWN) {
      fprintf(stderr, "dp: rank %d: %s; leaving\n", rank, ax_errmsg());
      rc = AX_OK;
    }
  }
  if (rc != AX_OK)
    fprintf(stderr, "dp: rank %d: leave: %s: %s\n", rank, ax_errname(rc),
            ax_errmsg());
  return rc;
}

void dp_state_close(dp_state *s) {
  if (s->group) {
    /* Without an ended world (an error), the last collective completes on
     * every member within a few message times: wait that long so no one
     * sees this node leave mid-operation. */
    struct timespec ts = {1, 0};
    if (!s->left)
      nanosleep(&ts, NULL);
    ax_coll_group_free(s->group);
  }
  if (s->node) {
    double end = ax_clock_s() + 5;
    while ((ax_rpc_live_calls() || ax_future_live_count()) &&
           ax_clock_s() < end) {
      struct timespec ts = {0, 20000000L};
      nanosleep(&ts, NULL);
    }
    long owned = -1, users = -1;
    ax_rref_live(s->node, &owned, &users);
    snprintf(g_live, sizeof g_live,
             "live_calls=%ld live_futures=%ld rrefs=%ld contexts=%ld",
             ax_rpc_live_calls(), ax_future_live_count(), owned + users,
             ax_dist_live_contexts(s->node));
    ax_node_shutdown(s->node, 2000);
    ax_dist_fini(s->node);
    ax_coll_fini(s->node);
    ax_node_destroy(s->node);
  }
  ax_tensor_release(s->center);
  ax_tensor_release(s->aux1);
  ax_tensor_release(s->aux2);
  ax_tensor_release(s->sync);
  ax_optim_free(s->opt);
  ax_slot_free(s->slot);
  ax_net_free(s->net);
  ax_dataset_close(s->train);
  ax_dataset_close(s->test);
  free(s->perm);
  memset(s, 0, sizeof *s);
}
