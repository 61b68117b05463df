/* The protocol thread: sends fork, accept and delete messages (after the
 * test delays, if any) and expires waiters at their deadlines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "axon/rref/rref-impl.h"

/* The owner answered (or could not be asked about) the fork of u: confirm
 * it and tell the parent that its child is accounted for. mu held. */
static void fork_done(axi_rctx *rc, ax_rref *u, int err) {
  u->busy--;
  if (err == AX_OK)
    u->confirmed = u->known = 1;
  else
    u->dead = 1;
  if (strcmp(u->parent, rc->name))
    axi_pmsg_push(rc, AXI_MSG_ACCEPT, u->parent, u->parent_fork, u->fork_id,
                  NULL);
  axi_user_maybe_done(rc, u);
}

typedef struct sent {
  axi_rctx *rc;
  axi_pmsg *m;
} sent;

static void on_sent(ax_future *f, void *user) {
  sent *s = user;
  axi_rctx *rc = s->rc;
  axi_pmsg *m = s->m;
  int err = ax_future_err(f);
  ax_future_release(f);
  pthread_mutex_lock(&rc->mu);
  rc->inflight--;
  if (m->kind == AXI_MSG_FORK && m->rec)
    fork_done(rc, m->rec, err);
  pthread_mutex_unlock(&rc->mu);
  free(m);
  free(s);
}

static void send_one(axi_rctx *rc, axi_pmsg *m) {
  static const char *fns[AXI_MSG_N] = {"axon.rref.fork", "axon.rref.accept",
                                       "axon.rref.delete"};
  ax_values *a = ax_values_new();
  sent *s = malloc(sizeof *s);
  ax_future *f = NULL;
  int err = (a && s) ? AX_OK : AX_ENOMEM;
  if (err == AX_OK) {
    ax_values_add_i64(a, (int64_t)m->a);
    ax_values_add_i64(a, (int64_t)m->b);
    ax_call_opts o = {.timeout_ms = 30000};
    err = ax_rpc_async(rc->node, m->to, fns[m->kind], a, &o, &f);
  }
  ax_values_free(a);
  if (err == AX_OK) {
    s->rc = rc;
    s->m = m;
    pthread_mutex_lock(&rc->mu);
    rc->inflight++;
    pthread_mutex_unlock(&rc->mu);
    if (ax_future_on_done(f, on_sent, s) == AX_OK)
      return;
    ax_future_release(f);
    err = AX_ENOMEM;
    pthread_mutex_lock(&rc->mu);
    rc->inflight--;
    pthread_mutex_unlock(&rc->mu);
  }
  /* Could not send: treat like a failed reply. */
  free(s);
  pthread_mutex_lock(&rc->mu);
  if (m->kind == AXI_MSG_FORK && m->rec)
    fork_done(rc, m->rec, AX_EPEERDOWN);
  pthread_mutex_unlock(&rc->mu);
  free(m);
}

void *axi_proto_thread(void *arg) {
  axi_rctx *rc = arg;
  pthread_mutex_lock(&rc->mu);
  while (!rc->stop) {
    int64_t now = ax_clock_ms(), next = now + 50;
    axi_pmsg *due = NULL, **pp = &rc->q;
    while (*pp) {
      axi_pmsg *m = *pp;
      if (m->not_before_ms <= now) {
        *pp = m->next;
        m->next = NULL;
        due = m;
        break;
      }
      if (m->not_before_ms < next)
        next = m->not_before_ms;
      pp = &m->next;
    }
    if (due) {
      pthread_mutex_unlock(&rc->mu);
      send_one(rc, due);
      pthread_mutex_lock(&rc->mu);
      continue;
    }
    pthread_mutex_unlock(&rc->mu);
    axi_waiters_expire(rc, now);
    axi_rref_sweep(rc, now);
    pthread_mutex_lock(&rc->mu);
    if (rc->stop)
      break;
    /* rc->cv waits on CLOCK_MONOTONIC (ax_rref_init). */
    struct timespec ts = ax_clock_at_ms(next);
    pthread_cond_timedwait(&rc->cv, &rc->mu, &ts);
  }
  pthread_mutex_unlock(&rc->mu);
  return NULL;
}
