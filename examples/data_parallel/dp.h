/* The data-parallel example: options and the replica entry point. */
#ifndef DP_H
#define DP_H

#include <stdint.h>

typedef struct dp_opts {
  int rank, world;          /* this replica, number of replicas */
  const char *master;       /* "HOST:PORT" of rank 0 */
  const char *listen;       /* this replica's address; NULL: any port */
  const char *algo;         /* allreduce | easgd | dpsgd */
  const char *model;        /* mlp | resnet20 */
  const char *model_config; /* overrides, or NULL */
  const char *data_config;  /* data-set overrides, or NULL */
  const char *optim;        /* models/optim.h keys */
  long steps;               /* optimizer steps per replica */
  int batch;                /* examples per replica per step */
  int bucket_kb;            /* all-reduce bucket size */
  int tau;                  /* EASGD communication period */
  double alpha;             /* EASGD elastic rate (eta * rho); <0: 0.9/N */
  long eval_limit;          /* test examples evaluated by rank 0 */
  uint64_t seed;
  int64_t timeout_ms; /* bound of every collective */
  const char *dump;   /* rank 0 writes its final parameters here */
  int die_rank;       /* fault injection: this rank exits ... */
  long die_step;      /* ... at the start of this step (-1: never) */
  int quiet;
  int threads;     /* CPU kernel threads; 0: the default (--local: cores / N) */
  double bench_mb; /* > 0: all-reduce benchmark instead */
} dp_opts;

/* Runs one replica to the end; returns the process exit code. */
int dp_replica(const dp_opts *o);
/* The all-reduce bandwidth benchmark (bench.c); the exit code. */
int dp_bench_allreduce(const dp_opts *o);

#endif
