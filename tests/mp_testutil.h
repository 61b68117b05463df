/* Helpers for the multi-process tests (tests/mp_testutil.c, linked into
 * every test next to harness.c): free ports, paths of built programs,
 * spawning axon-agent children (before gRPC is initialised in this process:
 * gRPC aborts after fork), stopping them with a bounded wait, master nodes
 * with or without distributed autograd, starting and ending a whole test
 * world, and checks that every node ends with zero live RRefs, contexts,
 * calls and futures. */
#ifndef AX_MP_TESTUTIL_H
#define AX_MP_TESTUTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <libgen.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/rpc.h"
#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/autograd/stage.h"

/* Sleeps ms milliseconds. */
void rt_sleep_ms(int ms);

/* A loopback port free right now, below the ephemeral range (so no
 * outgoing connection takes it before a listener binds it) and held by a
 * non-listening SO_REUSEADDR socket for the rest of the process (so no
 * other test process picks it, while a listener with SO_REUSEADDR, as
 * gRPC's, still binds it), or -1. */
int rt_free_port(void);

/* Path of the built program `name`: $AXON_BIN_DIR/name, else in the parent
 * of the directory holding this test binary. */
void mt_bin_path(const char *name, char *buf, size_t len);

/* Path of the built axon-agent (mt_bin_path of "axon-agent"). */
void rt_agent_path(char *buf, size_t len);

/* Starts `axon-agent --name name --master 127.0.0.1:master_port` plus the
 * NULL-terminated extra arguments. Returns the pid, or -1. */
pid_t rt_spawn_agent(const char *name, int master_port, ...);

/* The same with the extra arguments as a NULL-terminated array. */
pid_t rt_spawn_agentv(const char *name, int master_port,
                      const char *const *args);

/* Sends sig, waits up to timeout_ms, then SIGKILLs. Returns the exit
 * status as waitpid reports it, or -1. */
int rt_stop_agent(pid_t pid, int sig, int timeout_ms);

/* Whether a status returned by rt_stop_agent is an exit with status 0. */
int mt_exit_clean(int st);

/* Stops agent `name` with SIGTERM (up to 15 s). Returns 0 when it exited
 * with status 0; otherwise reports the status on stderr and returns 1. */
int mt_stop_checked(const char *name, pid_t pid);

/* Options of a master node (rank 0) that listens on port and expects
 * `world` nodes; `listen` (64 bytes) holds the address the options point
 * to. */
void mt_master_opts(ax_node_opts *o, const char *name, int port, int world,
                    int threads, char *listen);

/* The master node of an RPC test: listens on port, expects `world` nodes. */
int rt_driver(const char *name, int port, int world, ax_node **out);

/* Polls `axon.rendezvous.stats` on node `to` (up to 10 s) until it reports zero
 * live calls and futures. Returns AX_OK or AX_ESTATE with the last counts. */
int rt_remote_zero(ax_node *n, const char *to);

/* Waits (up to 10 s) for this process to have zero live calls/futures. */
int rt_local_zero(void);

/* Agent `name` answers the built-in "add" (20 + 22 = 42) within 20 s:
 * AX_OK, or the call's error (AX_ESTATE for a wrong sum). */
int rt_alive(ax_node *n, const char *name);

/* A raw TCP connection to loopback at the port of "host:port" (a peer's
 * data channel, for hostile-peer tests), or -1. */
int rt_dial(const char *hostport);

/* Reads fd until EOF (10 s at most): 1 when the peer closed it. */
int rt_closed_by_peer(int fd);

/* The master node of a test with RRefs and distributed autograd. */
int dt_driver(const char *name, int port, int world, ax_node **out);

/* Shuts down, finalises and destroys a node made by dt_driver. */
void dt_driver_end(ax_node *n);

/* RRef records and contexts of node `to` (this node when to == NULL). */
int dt_counts(ax_node *n, const char *to, int64_t *owned, int64_t *users,
              int64_t *ctxs);

/* Waits (up to 10 s) until node `to` has the given numbers of owned
 * records, user records and contexts (-1: any). */
int dt_wait_counts(ax_node *n, const char *to, int64_t owned, int64_t users,
                   int64_t ctxs);

/* Zero RRefs, contexts, calls and futures on every listed node and here. */
int dt_all_zero(ax_node *n, const char *const *names, int k);

/* One-line argument lists. */
ax_values *dt_i64s(int k, const int64_t *v);

/* Starts the world of a distributed test: one agent per name on a fresh
 * master port with the NULL-terminated extra arguments `args` (pids[i]
 * receives agent i's pid), then the master node `drv_name` (dt_driver with
 * k + 1 nodes), and waits until every agent knows the membership. On an
 * error it reports it on stderr, SIGKILLs the agents and returns it. */
#define MT_MAX_AGENTS 64
int mt_start(const char *drv_name, const char *const *names, int k,
             const char *const *args, pid_t *pids, ax_node **drv);
/* The same with agent i's own NULL-terminated extra arguments args[i]
 * (e.g. each agent its --device). */
int mt_start_each(const char *drv_name, const char *const *names, int k,
                  const char *const *const *args, pid_t *pids, ax_node **drv);

/* Ends such a world: tells every agent to leave (ax_local_end_world: the
 * world shutdown, up to 15 s, then SIGTERM as the fallback; exit status not
 * checked), then ends the master node. */
void mt_end(ax_node *drv, const pid_t *pids, int k);

/* Forks and execs axon-run (next to the test programs) with the
 * NULL-terminated arguments argv (after the program's name), its stdout
 * and stderr into file `out`. Returns its pid, or -1. */
pid_t mt_spawn_axon_run(const char *out, const char *const *argv);
/* The same with the NULL-terminated "NAME=VALUE" variables env set in it
 * (NULL: none) and, with own_group, as the leader of a process group of
 * its own (kill(-pid, sig) ends it with its --local agents). */
pid_t mt_spawn_axon_run_env(const char *out, const char *const *argv,
                            const char *const *env, int own_group);
/* Runs axon-run with argv (NULL-terminated, after the program), output to
 * log. With watch, SIGKILLs it as soon as that file exists. Returns the
 * exit status, 128 + signal, or -1 after timeout_ms. */
int mt_run_axon(const char *log, const char *watch, int timeout_ms,
                const char **argv);
/* The whole file, NUL-terminated (the caller frees it), or NULL. */
char *mt_slurp(const char *path);

#endif
