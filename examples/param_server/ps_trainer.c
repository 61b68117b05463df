/* Parameter-server example: a trainer, and the single-process reference.
 *
 * Trainer R works on shard R-1: it fetches the model's RRef from the
 * server, pulls the parameters, then per step computes the gradient of its
 * batch's mean loss with a local copy of the MLP and pushes it; the reply
 * holds the parameters for the next step. The reference ("--mode single
 * --shards N") makes one update per step from the N shards' batches
 * concatenated (mean over N * B examples), which is what the synchronous
 * server computes by averaging N per-shard means. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps.h"
#include <axon/kernels/clock.h>

static int open_train(const ps_opts *o, ax_dataset **ds) {
  ax_config dc;
  AX_TRY(ax_config_parse(&dc, o->data_config));
  return ax_dataset_open("fashion-mnist", &dc, AX_SPLIT_TRAIN, ds);
}

static int set_params(ax_net *net, const ax_values *v) {
  ax_tensor *p = NULL;
  AX_TRY(ax_values_get_tensor(v, 0, &p));
  if (ax_tensor_numel(p) != net->n_params)
    return ax_seterr(AX_ESHAPE, "server sent %zu parameters, want %zu",
                     ax_tensor_numel(p), net->n_params);
  return ax_tensor_copy(net->params, p);
}

static int train(const ps_opts *o, ax_node *n, ax_net *net,
                 const ax_dataset *ds, char *name) {
  ax_call_opts co = {.timeout_ms = 120000};
  ax_values *v = NULL;
  ax_rref *model = NULL;
  AX_TRY(ax_rpc_sync(n, "server", "ps.model", NULL, &co, &v));
  int rc = ax_values_get_rref(v, 0, &model);
  if (rc == AX_OK)
    ax_rref_retain(model);
  ax_values_free(v);
  v = NULL;
  AX_TRY(rc);
  rc = ax_rref_rpc_sync(n, model, "pull", NULL, &co, &v);
  if (rc == AX_OK)
    rc = set_params(net, v);
  ax_values_free(v);
  int64_t *idx = malloc(sizeof *idx * (size_t)o->batch);
  double t0 = ax_clock_s(), loss = 0, sum = 0;
  long s = 0;
  for (; rc == AX_OK && s < o->steps; s++) {
    if (o->kill_rank == o->rank && s == o->kill_step) {
      printf("%s: failure drill: killing myself at step %ld\n", name, s);
      fflush(stdout);
      raise(SIGKILL);
    }
    ps_batch_indices(ax_dataset_size(ds), o->trainers, o->rank - 1, o->seed, s,
                     o->batch, idx);
    rc = ps_grad(net, ds, idx, o->batch, &loss);
    sum += loss;
    ax_values *a = ax_values_new();
    ax_values_add_i64(a, o->rank);
    ax_values_add_i64(a, s);
    ax_values_add_tensor(a, net->grads);
    ax_values_add_i64(a, o->batch);
    v = NULL;
    if (rc == AX_OK)
      rc = ax_rref_rpc_sync(n, model, "push", a, &co, &v);
    ax_values_free(a);
    if (rc == AX_OK)
      rc = set_params(net, v);
    ax_values_free(v);
    if ((s + 1) % 100 == 0 || s + 1 == o->steps) {
      printf("%s: step %ld loss %.4f\n", name, s + 1, sum / (s % 100 + 1));
      fflush(stdout);
      sum = 0;
    }
  }
  free(idx);
  double secs = ax_clock_s() - t0;
  if (rc == AX_OK)
    printf("%s: %ld steps, %.0f samples/s\n", name, s,
           s * o->batch / (secs > 0 ? secs : 1));
  ax_rref_release(model);
  if (rc == AX_OK) {
    /* Let the RRef's delete reach the server before saying done. */
    long owned = 0, users = 1;
    for (int i = 0; i < 500 && users; i++) {
      ax_rref_live(n, &owned, &users);
      if (users)
        nanosleep(&(struct timespec){0, 20000000}, NULL);
    }
    ax_values *a = ax_values_new();
    ax_values_add_i64(a, o->rank);
    rc = ax_rpc_sync(n, "server", "ps.done", a, &co, &v);
    ax_values_free(a);
    ax_values_free(v);
  }
  return rc;
}

int ps_trainer_main(const ps_opts *o) {
  char name[32];
  snprintf(name, sizeof name, "trainer%d", o->rank);
  ax_net *net = NULL;
  ax_dataset *ds = NULL;
  int rc = ps_build_net(o, &net);
  if (rc == AX_OK)
    rc = open_train(o, &ds);
  ax_node *n = NULL;
  if (rc == AX_OK) {
    ax_node_opts no;
    ax_node_opts_init(&no);
    no.name = name;
    no.master = o->master;
    no.listen = o->listen;
    no.rank = o->rank;
    no.threads = 2;
    no.peer_timeout_ms = 3000;
    rc = ax_node_create(&no, &n);
  }
  if (rc == AX_OK)
    rc = ax_rref_init(n);
  if (rc == AX_OK)
    rc = ax_node_join(n, 120000);
  if (rc == AX_OK)
    rc = train(o, n, net, ds, name);
  /* Done: stay until the server ends the world (a failed trainer leaves at
   * once; the server counts it as down). */
  if (rc == AX_OK &&
      (rc = ax_node_wait_leave(n, o->timeout_ms)) == AX_EPEERDOWN) {
    printf("%s: %s; leaving\n", name, ax_errmsg());
    rc = AX_OK;
  }
  if (rc != AX_OK)
    fprintf(stderr, "%s: %s: %s\n", name, ax_strerror(rc), ax_errmsg());
  int leaks = n ? ps_check_leaks(n, name) : 0;
  if (n)
    ax_node_shutdown(n, 5000);
  ax_rref_fini(n);
  ax_node_destroy(n);
  ax_dataset_close(ds);
  ax_net_free(net);
  return rc != AX_OK ? 1 : leaks;
}

int ps_single_main(const ps_opts *o) {
  ax_net *net = NULL;
  ax_dataset *ds = NULL;
  ax_optim *opt = NULL;
  ax_optim_cfg oc;
  int rc = ps_optim_cfg(o, &oc);
  if (rc == AX_OK)
    rc = ps_build_net(o, &net);
  if (rc == AX_OK)
    rc = open_train(o, &ds);
  if (rc == AX_OK && !(opt = ax_optim_new(&oc, net->n_params, AX_CPU)))
    rc = AX_ENOMEM;
  int k = o->trainers, b = o->batch;
  int64_t *idx = malloc(sizeof *idx * (size_t)k * (size_t)b);
  double t0 = ax_clock_s(), loss = 0;
  printf("single: %d shard(s), %ld steps of %d x %d examples\n", k, o->steps, k,
         b);
  for (long s = 0; rc == AX_OK && s < o->steps; s++) {
    for (int t = 0; t < k; t++)
      ps_batch_indices(ax_dataset_size(ds), k, t, o->seed, s, b,
                       idx + (size_t)t * b);
    rc = ps_grad(net, ds, idx, k * b, &loss);
    if (rc == AX_OK)
      rc = ax_optim_step(opt, net->params, net->grads);
  }
  double secs = ax_clock_s() - t0;
  free(idx);
  if (rc == AX_OK)
    printf("single: %.0f samples/s, last loss %.4f\n",
           o->steps * k * b / (secs > 0 ? secs : 1), loss);
  if (rc == AX_OK)
    rc = ps_finish(o, net);
  if (rc != AX_OK)
    fprintf(stderr, "single: %s: %s\n", ax_strerror(rc), ax_errmsg());
  ax_optim_free(opt);
  ax_dataset_close(ds);
  ax_net_free(net);
  return rc != AX_OK;
}
