/* Helpers shared by the axon-bench modes that run local agents (dist,
 * pipe): starting axon-agent children next to this
 * binary, and medians of timings. Internal to axon-bench. */
#ifndef AX_BENCH_LOCAL_H
#define AX_BENCH_LOCAL_H

#include <sys/types.h>

#include "axon/rpc/node.h"

/* Forks and execs axon-agent (next to this binary) as `name`, joining
 * 127.0.0.1:port, with the NULL-terminated extra arguments `args`. When env
 * is not NULL, the child sets environment variable env to val first
 * (replacing a value already set only when overwrite is non-zero). Call it
 * before gRPC starts in this process. Returns the pid, or -1. */
pid_t axi_bench_spawn_agent(const char *name, int port, const char *env,
                            const char *val, int overwrite,
                            const char *const *args);

/* The master node `name` on 127.0.0.1:port for `world` nodes (itself and
 * the agents), with distributed autograd, joined (up to 90 s). */
int axi_bench_master(const char *name, int port, int world, ax_node **out);

/* The median of v[0..n) (sorts v in place). */
double axi_bench_median(double *v, int n);

#endif
