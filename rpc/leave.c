/* Ending a world (node.h, ax_node_shutdown_world): the master's two phases
 * and the members' built-in "axon.node.leave" [phase].
 *
 * Phase 1 (drain) is answered late: the handler defers its reply and the
 * node's timer thread (the tick hook axi_leave_tick) answers once this node's
 * program is done and no call is in flight, or with AX_ETIMEOUT a little
 * before the caller's deadline. Phase 2 (leave) sets the flag that
 * ax_node_wait_leave reports. The built-in's name does not start with
 * "axon.rendezvous.", so a request that reaches a member before its join
 * completed is held until then, when the master's name is known. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/node-impl.h"

#define LEAVE_FN "axon.node.leave"

enum { PHASE_DRAIN = 1, PHASE_LEAVE = 2 };

/* Incoming calls besides a pending drain request, and outgoing calls. */
static void in_flight(ax_node *n, long *in, long *out) {
  *in = __atomic_load_n(&n->incalls, __ATOMIC_RELAXED) - (n->leave_drain != 0);
  *out = axi_pcall_count(n);
}

static int leave_handler(ax_call_ctx *ctx, const ax_values *args,
                         ax_values *out, void *user) {
  ax_node *n = ax_call_node(ctx);
  int64_t phase;
  AX_TRY(ax_values_get_i64(args, 0, &phase));
  const char *caller = ax_call_caller(ctx);
  pthread_mutex_lock(&n->mu);
  const char *master = n->master_name;
  int ok =
      master && caller && !strcmp(master, caller) && strcmp(master, n->name);
  pthread_mutex_unlock(&n->mu);
  if (!ok)
    return ax_seterr(AX_ESTATE,
                     "leave: only the master (%s) may end the "
                     "world, not %s",
                     master ? master : "unknown", caller ? caller : "?");
  if (phase == PHASE_LEAVE) {
    pthread_mutex_lock(&n->mu);
    n->leave_told = 1;
    pthread_mutex_unlock(&n->mu);
    return AX_OK;
  }
  if (phase != PHASE_DRAIN)
    return ax_seterr(AX_EINVAL, "leave: bad phase %lld", (long long)phase);
  ax_future *f = ax_future_new();
  if (!f)
    return AX_ENOMEM;
  /* Answer a little before the caller gives up, so it learns why. */
  int64_t left = ax_call_remaining_ms(ctx);
  int64_t margin = left / 10 < 500 ? left / 10 : 500;
  pthread_mutex_lock(&n->mu);
  ax_future *old = n->leave_drain;
  n->leave_drain = ax_future_retain(f);
  n->leave_deadline_ms = ax_clock_ms() + left - margin;
  pthread_mutex_unlock(&n->mu);
  if (old) { /* a repeated request replaces the first */
    ax_future_complete(old, AX_ECANCELLED, NULL,
                       "leave: drain requested "
                       "again");
    ax_future_release(old);
  }
  int rc = ax_call_defer(ctx, f);
  ax_future_release(f);
  return rc;
}

int axi_leave_init(ax_node *n) {
  return axi_register(n, LEAVE_FN, leave_handler, NULL);
}

void axi_leave_tick(ax_node *n, int64_t now_ms, void *arg) {
  pthread_mutex_lock(&n->mu);
  ax_future *f = n->leave_drain;
  if (!f) {
    pthread_mutex_unlock(&n->mu);
    return;
  }
  long in, out;
  in_flight(n, &in, &out);
  int err = AX_OK;
  char msg[160] = "";
  if (n->closing) {
    err = AX_ECLOSED;
    snprintf(msg, sizeof msg, "%s is shutting down", n->name);
  } else if (!n->leave_ready || in > 0 || out > 0) {
    if (now_ms < n->leave_deadline_ms) {
      pthread_mutex_unlock(&n->mu);
      return;
    }
    err = AX_ETIMEOUT;
    snprintf(msg, sizeof msg, "%s%s: %ld incoming, %ld outgoing call(s)",
             n->leave_ready ? "still busy" : "its program is not done",
             n->leave_ready ? "" : " (no ax_node_wait_leave yet)", in, out);
  }
  n->leave_drain = NULL;
  pthread_mutex_unlock(&n->mu);
  ax_future_complete(f, err, NULL, err ? msg : NULL);
  ax_future_release(f);
}

void axi_leave_close(ax_node *n) {
  pthread_mutex_lock(&n->mu);
  ax_future *f = n->leave_drain;
  n->leave_drain = NULL;
  pthread_mutex_unlock(&n->mu);
  if (f) {
    ax_future_complete(f, AX_ECLOSED, NULL, "node is shutting down");
    ax_future_release(f);
  }
}

int ax_node_wait_leave(ax_node *n, int64_t timeout_ms) {
  int64_t end = ax_clock_ms() + (timeout_ms > 0 ? timeout_ms : 0);
  for (;;) {
    pthread_mutex_lock(&n->mu);
    n->leave_ready = 1;
    int told = n->leave_told, closing = n->closing;
    char master[128] = "";
    if (n->master_name)
      snprintf(master, sizeof master, "%s", n->master_name);
    pthread_mutex_unlock(&n->mu);
    if (told)
      return AX_OK;
    if (!*master)
      return ax_seterr(AX_ESTATE, "leave: %s has not joined", n->name);
    if (!strcmp(master, n->name))
      return ax_seterr(AX_ESTATE,
                       "leave: %s is the master; it ends the "
                       "world (ax_node_shutdown_world)",
                       n->name);
    if (closing)
      return ax_seterr(AX_ECLOSED, "leave: %s is shutting down", n->name);
    if (ax_node_peer_is_down(n, master))
      return ax_seterr(AX_EPEERDOWN, "leave: the master %s is down", master);
    if (ax_clock_ms() >= end)
      return ax_seterr(AX_ETIMEOUT, "leave: not told to leave in %lld ms",
                       (long long)timeout_ms);
    struct timespec ts = {0, 20000000L};
    nanosleep(&ts, NULL);
  }
}

/* ---- the master's side --------------------------------------------------- */
enum { M_ASKED, M_DRAINED, M_LEFT, M_DOWN, M_LATE, M_FAILED };

typedef struct member {
  const char *name;
  ax_future *f;
  int state;    /* M_* */
  int send, ok; /* this phase: ask it; the state an AX_OK answer gives */
  char why[200];
} member;

/* Sends phase to every member with send set, then waits for the answers
 * until the call deadline: AX_OK gives state `ok`, a member down or
 * shutting down becomes M_DOWN, no answer in time M_LATE, another error
 * M_FAILED (with the reason in why). */
static void run_phase(ax_node *n, member *m, int k, int phase,
                      int64_t timeout_ms) {
  ax_values *a = ax_values_new();
  if (a)
    ax_values_add_i64(a, phase);
  for (int i = 0; i < k; i++) {
    if (!m[i].send)
      continue;
    ax_call_opts o = {.timeout_ms = timeout_ms};
    int rc = ax_node_peer_is_down(n, m[i].name)
                 ? ax_seterr(AX_EPEERDOWN, "%s is down", m[i].name)
             : !a ? ax_seterr(AX_ENOMEM, "no memory")
                  : ax_rpc_async(n, m[i].name, LEAVE_FN, a, &o, &m[i].f);
    if (rc != AX_OK) {
      m[i].state = rc == AX_EPEERDOWN ? M_DOWN : M_FAILED;
      snprintf(m[i].why, sizeof m[i].why, "%s", ax_errmsg());
    }
  }
  ax_values_free(a);
  for (int i = 0; i < k; i++) {
    if (!m[i].f)
      continue;
    int rc = ax_future_wait(m[i].f, timeout_ms + 2000);
    if (rc == AX_OK)
      m[i].state = m[i].ok;
    else if (rc == AX_EPEERDOWN || rc == AX_ECLOSED)
      m[i].state = M_DOWN;
    else
      m[i].state = rc == AX_ETIMEOUT ? M_LATE : M_FAILED;
    if (rc != AX_OK)
      snprintf(m[i].why, sizeof m[i].why, "%s",
               ax_future_is_done(m[i].f) ? ax_future_errmsg(m[i].f)
                                         : "no answer");
    ax_future_release(m[i].f);
    m[i].f = NULL;
  }
}

/* The outcome of a finished shutdown: names every late or failed member. */
static int report(const member *m, int k, ax_world_report *rep) {
  ax_world_report r = {.members = k};
  char msg[2048] = "world shutdown:";
  size_t len = strlen(msg);
  int err = AX_OK;
  for (int i = 0; i < k; i++) {
    r.left += m[i].state == M_LEFT;
    r.down += m[i].state == M_DOWN;
    r.late += m[i].state == M_LATE;
    r.failed += m[i].state == M_FAILED;
    if (m[i].state != M_LATE && m[i].state != M_FAILED)
      continue;
    if (err == AX_OK || (err == AX_EREMOTE && m[i].state == M_LATE))
      err = m[i].state == M_LATE ? AX_ETIMEOUT : AX_EREMOTE;
    int w =
        snprintf(msg + len, sizeof msg - len, " %s: %s (%s);",
                 m[i].state == M_LATE ? "late" : "failed", m[i].name, m[i].why);
    if (w > 0 && (size_t)w < sizeof msg - len)
      len += (size_t)w;
  }
  if (rep)
    *rep = r;
  return err ? ax_seterr(err, "%s", msg) : AX_OK;
}

int ax_node_shutdown_world(ax_node *n, int64_t timeout_ms,
                           ax_world_report *rep) {
  if (rep)
    memset(rep, 0, sizeof *rep);
  if (!n)
    return ax_seterr(AX_EINVAL, "world shutdown: no node");
  pthread_mutex_lock(&n->mu);
  int is_master = n->master_name && !strcmp(n->master_name, n->name);
  int world = n->nmembers;
  pthread_mutex_unlock(&n->mu);
  if (!is_master)
    return ax_seterr(AX_ESTATE,
                     "world shutdown: %s is not the master of a "
                     "joined world",
                     n->name);
  member *m = calloc((size_t)(world > 0 ? world : 1), sizeof *m);
  if (!m)
    return AX_ENOMEM;
  int k = 0;
  for (int r = 0; r < world; r++) {
    const char *name = NULL;
    if (ax_node_member(n, r, &name) == AX_OK && *name && strcmp(name, n->name))
      m[k++].name = name;
  }
  if (timeout_ms <= 0)
    timeout_ms = n->o.timeout_ms;
  int64_t end = ax_clock_ms() + timeout_ms;
  for (int i = 0; i < k; i++)
    m[i].send = 1, m[i].ok = M_DRAINED;
  run_phase(n, m, k, PHASE_DRAIN, timeout_ms);
  /* Late members are told to leave too (the master's program is over) and
   * stay reported as late. */
  for (int i = 0; i < k; i++) {
    m[i].send = m[i].state == M_DRAINED || m[i].state == M_LATE;
    m[i].ok = m[i].state == M_DRAINED ? M_LEFT : M_LATE;
  }
  int64_t left = end - ax_clock_ms();
  run_phase(n, m, k, PHASE_LEAVE, left > 1000 ? left : 1000);
  int err = report(m, k, rep);
  free(m);
  return err;
}
