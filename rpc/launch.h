/* Starting and stopping local child processes for `--local N` modes (the
 * examples, axon-run, axon-bench) and the tests' agents.
 *
 * gRPC must not be initialised before fork(): pick the port and fork the
 * children first, then create this process's node. Every wait here is
 * bounded; a child still running at the deadline is killed with SIGKILL
 * and reaped, so no zombie and no hang is left behind. Not thread-safe
 * with respect to the same pid array. */
#ifndef AX_RPC_LAUNCH_H
#define AX_RPC_LAUNCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "axon/rpc/node.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A loopback port the OS considers free right now (bound to port 0, then
 * released), or -1. Another process may take it before it is used. */
int ax_local_free_port(void);

/* Every wait below ends a child that is stopped (SIGSTOP, SIGTSTP: it
 * cannot exit by itself) within about half a second: SIGTERM and SIGCONT,
 * then SIGKILL 500 ms later, whatever the timeout (reported on stderr).
 *
 * Waits, until one deadline timeout_ms from now, for every child whose
 * pids[i] > 0. A reaped child gets pids[i] = 0 and status[i] = its
 * waitpid status; one still running at the deadline is SIGKILLed, reaped,
 * and gets status[i] = -1. status may be NULL. Returns the number killed. */
int ax_local_reap(int n, pid_t *pids, int64_t timeout_ms, int *status);

/* Sends SIGTERM to every child with pids[i] > 0, then ax_local_reap. */
int ax_local_stop(int n, pid_t *pids, int64_t timeout_ms, int *status);

/* Ends a local world whose members are these children, from its master
 * node (before the master's own ax_node_shutdown): ax_node_shutdown_world
 * (master, timeout_ms) tells every member to leave (a failure is reported
 * on stderr, prefixed with who), then the children get timeout_ms to exit;
 * signals are the fallback: those still running get SIGTERM, and SIGKILL
 * timeout_ms later (ax_local_reap). Without a joined world the wait is
 * skipped. status as for ax_local_reap (may be NULL). Returns the code of
 * ax_node_shutdown_world. */
int ax_local_end_world(ax_node *master, int n, pid_t *pids, int64_t timeout_ms,
                       int *status, const char *who);

/* A world on this machine authenticates with a secret of its own: when
 * AXON_TOKEN_FILE is unset, writes 32 random bytes (hex) to a private
 * temporary file, sets AXON_TOKEN_FILE to it (children and this process's
 * nodes read it) and removes the file when this process exits. Set it to
 * "" to run without authentication. Call before forking; idempotent.
 * Returns 0, or -1 (perror'd) when no file could be written. */
int ax_local_token(void);

/* What ax_local_spawn starts and how. */
typedef struct ax_spawn_opts {
  /* The program's path and its arguments, NULL-terminated (argv[0] is
   * the path). */
  const char *const *argv;
  /* "NAME=VALUE" variables set in the child, replacing a value already
   * there; NULL-terminated, or NULL for none. */
  const char *const *env;
  /* The same, set only where NAME is unset (e.g. "AXON_THREADS=1"). */
  const char *const *env_default;
  /* The child's stdout and stderr go into this file (created or
   * truncated); NULL: both inherited. */
  const char *out;
  /* Only the child's stderr goes into this file (created or truncated);
   * NULL: inherited. Ignored with `out`. */
  const char *err;
  /* >= 0: the child is local agent number `pin` and pinned to one core
   * when AXON_PIN_AGENTS asks for it: "1" = core pin modulo the cores this
   * process may use, "a,b,c" = the pin-th listed core (modulo the list);
   * a pinned child gets AXON_THREADS=1 unless set. A failure to pin is
   * reported and the child runs unpinned. -1: never pinned. */
  int pin;
  /* Non-zero: the child leads a process group of its own, so that the
   * caller can end it with everything it started (kill(-pid, sig)). */
  int own_group;
} ax_spawn_opts;

/* The cores k local agents started with `pin` 0..k-1 run on: with
 * AXON_PIN_AGENTS, the distinct cores they are pinned to; without, the
 * cores this process may use (sched_getaffinity; the online ones if that
 * fails). At least 1. For the timing model (ax_pipe_costs.cores), which
 * treats them as one pool the agents share. */
int ax_local_cores(int k);

/* Forks and execs o->argv[0] with o's arguments, environment, output and
 * pinning (stdio flushed first; a failed exec says so on the child's
 * stderr and exits with 127). The caller makes the world's token first
 * when it wants one (ax_local_token). Returns the child's pid, or -1 when
 * fork fails (perror'd). Call it before anything initialises gRPC. */
pid_t ax_local_spawn(const ax_spawn_opts *o);

/* The path of program `name` in the directory of this process's
 * executable (e.g. the axon-agent next to axon-run) into buf (len
 * bytes). Returns 0, or -1 when it is not an executable file there. */
int ax_local_program(const char *name, char *buf, size_t len);

/* A child's body: runs in the forked process with its rank; its return
 * value is the child's exit status. */
typedef int (*ax_local_child_fn)(int rank, void *user);

/* Forks n children with ranks first_rank .. first_rank + n - 1 (pids[i]
 * for rank first_rank + i); each runs fn, flushes stdio and _exits with
 * its result. Returns 0, or -1 when a fork fails (perror'd; the children
 * already started are stopped). Call before anything initialises gRPC. */
int ax_local_fork(int n, int first_rank, ax_local_child_fn fn, void *user,
                  pid_t *pids);

/* Reaps the children of ax_local_fork (ax_local_reap, timeout_ms) and
 * reports each that did not exit with 0, as "<who>: <role><rank> exited
 * with 3" (stdout) or "... did not exit: SIGKILL" (stderr). A child killed
 * by a signal is a failure unless its rank is `victim` (a failure drill;
 * -1: none). Returns 0 when every child ended as expected, else 1. */
int ax_local_reap_report(int n, pid_t *pids, int first_rank, int64_t timeout_ms,
                         const char *who, const char *role, int victim);

/* The whole `--local N` pattern: picks a free loopback port and writes
 * "127.0.0.1:PORT" into master (len bytes; the children and the parent
 * read it through user), forks n children with ranks 1..n running child,
 * runs parent (rank 0) here, then reaps and reports the children
 * (ax_local_reap_report with a 30 s bound). Returns the parent's result,
 * or 1 when it succeeded but a child did not. */
int ax_local_world(int n, char *master, size_t len, ax_local_child_fn child,
                   ax_local_child_fn parent, void *user, const char *who,
                   const char *role, int victim);

#ifdef __cplusplus
}
#endif
#endif
