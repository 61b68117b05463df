/* Starting and stopping local child processes for `--local N` modes (the
 * examples, axon-run, axon-bench).
 *
 * gRPC must not be initialised before fork(): pick the port and fork the
 * children first, then create this process's node. Every wait here is
 * bounded; a child still running at the deadline is killed with SIGKILL
 * and reaped, so no zombie and no hang is left behind. Not thread-safe
 * with respect to the same pid array. */
#ifndef AX_RPC_LAUNCH_H
#define AX_RPC_LAUNCH_H

#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A loopback port the OS considers free right now (bound to port 0, then
 * released), or -1. Another process may take it before it is used. */
int ax_local_free_port(void);

/* Waits, until one deadline timeout_ms from now, for every child whose
 * pids[i] > 0. A reaped child gets pids[i] = 0 and status[i] = its
 * waitpid status; one still running at the deadline is SIGKILLed, reaped,
 * and gets status[i] = -1. status may be NULL. Returns the number killed. */
int ax_local_reap(int n, pid_t *pids, int64_t timeout_ms, int *status);

/* Sends SIGTERM to every child with pids[i] > 0, then ax_local_reap. */
int ax_local_stop(int n, pid_t *pids, int64_t timeout_ms, int *status);

#ifdef __cplusplus
}
#endif
#endif
