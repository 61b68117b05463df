/* axon-bench rpc internals shared by axon_bench_rpc.c (axon RPC against raw
 * TCP) and axon_bench_rpc_pair.c (TCP against TLS or shared memory). */
#ifndef AX_AXON_BENCH_RPC_H
#define AX_AXON_BENCH_RPC_H

#include "axon/rpc/rpc.h"

/* One measurement: small-call round trip, calls/s with 64 in flight, and
 * GB/s for the tensor sizes of axi_bench_rpc_sizes (best of reps). */
typedef struct axi_rpc_row {
  double p50_us, p99_us, calls_s, gbs[3];
} axi_rpc_row;

extern const size_t axi_bench_rpc_sizes[3]; /* 1, 16 and 64 MiB */

/* The server child: connects to the raw TCP port (it answers raw
 * ping-pongs there until the parent sends a zero length), and joins the
 * world at master as "bench-server" with "ping" and "sink". TLS comes from
 * AXON_TLS_* when set. Returns the exit status. */
int axi_bench_rpc_child(int raw_port, const char *master);
/* Measures n's calls to "bench-server". */
void axi_bench_rpc_run(ax_node *n, int iters, int reps, axi_rpc_row *r);
/* A socket listening on a free loopback port (*port) with `backlog`. */
int axi_bench_listen(int backlog, int *port);
/* axon-bench rpc --tls (shm 0: tcp against tls) or --shm (shm 1: tcp
 * against shm); returns the exit status. */
int axi_bench_rpc_pair(int shm, int iters, int reps, int rounds);

#endif
