/* Parameter-server example: shared declarations of its three files.
 *
 * One server node (rank 0, the rendezvous master) owns the model as a
 * remote object of kind "ps.model"; N trainers (ranks 1..N, named
 * "trainerR") each train on shard R-1 of Fashion-MNIST. A trainer asks the
 * server for the model's RRef ("ps.model"), pulls the parameters once
 * ("pull"), then per step computes the gradient of its batch's mean loss
 * and pushes it ("push"), whose reply carries the parameters to use next.
 *
 * Modes: sync (the server averages the N gradients of a step, then makes
 * one update; each push is answered through a deferred future when the
 * barrier fills, so no handler thread waits), async (each gradient is
 * applied on arrival under a lock) and hogwild (no lock; see ps_server.c
 * for the race it accepts). Mode "single" trains in one process on the N
 * shards' concatenated batches: the reference the sync mode must match. */
#ifndef PS_H
#define PS_H

#include <stdint.h>

#include <axon/models/data/dataset.h>
#include <axon/models/model.h>
#include <axon/models/optim.h>
#include <axon/rref/rref.h>

#define PS_MAX_TRAINERS 64

enum { PS_SYNC = 0, PS_ASYNC = 1, PS_HOGWILD = 2, PS_SINGLE = 3 };

typedef struct ps_opts {
  int mode;
  int trainers;       /* N */
  int rank;           /* this process; 0 is the server */
  const char *master; /* "HOST:PORT" of the server */
  const char *listen; /* a trainer's own "HOST:PORT" (NULL: loopback) */
  long steps;         /* steps per trainer */
  int batch;          /* examples per trainer and step */
  uint64_t seed;
  const char *model_config; /* overrides of the MLP's defaults */
  const char *data_config;  /* Fashion-MNIST settings (dir=, limit=) */
  const char *optim_config; /* models/optim.h keys */
  long eval_limit;          /* test examples evaluated at the end (0: all) */
  const char *save;         /* file receiving the final flat parameters */
  int kill_rank;      /* failure drill: this trainer SIGKILLs itself ... */
  long kill_step;     /* ... before this step (kill_rank 0: never) */
  int64_t timeout_ms; /* bound on the whole run */
} ps_opts;

/* The examples of shard `shard` of `nshards` used at step `step`:
 * shard t holds the examples i with i % nshards == t, visited in an order
 * reshuffled every pass from (seed, t, pass). Writes `batch` indices. */
void ps_batch_indices(int64_t dataset_size, int nshards, int shard,
                      uint64_t seed, long step, int batch, int64_t *idx);

/* Builds the MLP (whole model) with the run's seed. */
int ps_build_net(const ps_opts *o, ax_net **out);
/* Parses the optimizer settings (default: SGD, lr 0.05, momentum 0.9). */
int ps_optim_cfg(const ps_opts *o, ax_optim_cfg *out);
/* Adds the gradient of the batch's mean loss to net->grads (zeroed first);
 * returns the mean loss in *loss. */
int ps_grad(ax_net *net, const ax_dataset *ds, const int64_t *idx, int n,
            double *loss);

/* Roles; each returns a process exit code. */
int ps_server_main(const ps_opts *o);
int ps_trainer_main(const ps_opts *o);
int ps_single_main(const ps_opts *o);

/* Evaluates, prints the accuracy and saves the parameters (o->save). */
int ps_finish(const ps_opts *o, ax_net *net);

/* Waits (bounded) until this process has no live RRefs, calls or futures;
 * prints the counts and returns 0 when all are zero. */
int ps_check_leaks(ax_node *n, const char *who);

#endif
