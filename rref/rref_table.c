/* The RRef tables of this process: owned entries, user records, handle
 * reference counting, the protocol message queue and tombstones. Start-up
 * and shutdown are in rref_init.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "axon/rref/rref-impl.h"

static axi_rctx *g_rc; /* the one initialised node of this process */

axi_rctx *axi_rctx_get(void) {
  return __atomic_load_n(&g_rc, __ATOMIC_ACQUIRE);
}

void axi_rctx_set(axi_rctx *rc) {
  __atomic_store_n(&g_rc, rc, __ATOMIC_RELEASE);
}

uint64_t axi_rref_new_id(axi_rctx *rc) {
  uint64_t c = __atomic_add_fetch(&rc->counter, 1, __ATOMIC_RELAXED);
  uint64_t rank = (uint64_t)(ax_node_rank(rc->node) + 1) & 0xffff;
  return (rank << 48) | (c & 0xffffffffffffull);
}

/* ---- owned entries ------------------------------------------------------- */
axi_owned *axi_owned_find(axi_rctx *rc, uint64_t id, int create) {
  for (axi_owned *e = rc->owned; e; e = e->next)
    if (e->id == id)
      return e;
  if (!create)
    return NULL;
  axi_owned *e = calloc(1, sizeof *e);
  if (!e)
    return NULL;
  e->id = id;
  e->state = AXI_OWN_PENDING;
  e->next = rc->owned;
  rc->owned = e;
  rc->nowned++;
  return e;
}

void axi_owned_add_fork(axi_owned *e, uint64_t fork, int holder) {
  for (int i = 0; i < e->nforks; i++)
    if (e->forks[i].id == fork) {
      if (holder >= 0)
        e->forks[i].holder = holder;
      return;
    }
  if (e->nforks == e->capforks) {
    int cap = e->capforks ? e->capforks * 2 : 4;
    axi_fork *f = realloc(e->forks, (size_t)cap * sizeof *f);
    if (!f)
      return; /* the value then lives until fini; never freed early */
    e->forks = f;
    e->capforks = cap;
  }
  e->forks[e->nforks].id = fork;
  e->forks[e->nforks].holder = holder;
  e->nforks++;
}

int axi_owned_del_fork(axi_owned *e, uint64_t fork) {
  for (int i = 0; i < e->nforks; i++)
    if (e->forks[i].id == fork) {
      e->forks[i] = e->forks[--e->nforks];
      return 1;
    }
  return 0;
}

void axi_freed_add(axi_rctx *rc, uint64_t id) {
  rc->freed[rc->nfreed++ % AXI_FREED_MAX] = id;
}

axi_owned *axi_owned_maybe_unlink(axi_rctx *rc, axi_owned *e) {
  if (e->nforks || e->local_refs || e->waiters)
    return NULL;
  for (axi_owned **pp = &rc->owned; *pp; pp = &(*pp)->next)
    if (*pp == e) {
      *pp = e->next;
      rc->nowned--;
      if (e->state != AXI_OWN_PENDING) /* a pending one may still come */
        axi_freed_add(rc, e->id);
      return e;
    }
  return NULL;
}

void axi_owned_free(axi_owned *e) {
  if (!e)
    return;
  if (e->obj && e->kind && e->kind->destroy)
    e->kind->destroy(e->obj);
  ax_values_free(e->vals);
  free(e->msg);
  free(e->forks);
  free(e);
}

/* ---- handles ------------------------------------------------------------- */
ax_rref *axi_owner_handle(axi_rctx *rc, axi_owned *e) {
  ax_rref *r = calloc(1, sizeof *r);
  if (!r)
    return NULL;
  r->refs = 1;
  r->rc = rc;
  r->id = e->id;
  r->type = e->type;
  r->is_owner = 1;
  r->confirmed = 1;
  r->entry = e;
  snprintf(r->owner, sizeof r->owner, "%s", rc->name);
  e->local_refs++;
  return r;
}

ax_rref *axi_user_new(axi_rctx *rc, uint64_t id, uint64_t fork, int type,
                      const char *owner) {
  ax_rref *r = calloc(1, sizeof *r);
  if (!r)
    return NULL;
  r->refs = 1;
  r->rc = rc;
  r->id = id;
  r->fork_id = fork;
  r->type = type;
  snprintf(r->owner, sizeof r->owner, "%s", owner);
  r->in_table = 1;
  r->next = rc->users;
  rc->users = r;
  rc->nusers++;
  return r;
}

void axi_user_free(ax_rref *u) {
  ax_future_release(u->created);
  free(u->children);
  free(u->errmsg);
  free(u);
}

void axi_user_maybe_done(axi_rctx *rc, ax_rref *u) {
  if (!u->dropped || u->busy || !(u->confirmed || u->dead))
    return;
  if (!u->dead && u->pending_children > 0)
    return;
  if (u->confirmed && !u->dead)
    axi_pmsg_push(rc, AXI_MSG_DELETE, u->owner, u->id, u->fork_id, NULL);
  for (ax_rref **pp = &rc->users; *pp; pp = &(*pp)->next)
    if (*pp == u) {
      *pp = u->next;
      rc->nusers--;
      break;
    }
  axi_user_free(u);
}

ax_rref *ax_rref_retain(ax_rref *r) {
  if (r)
    __atomic_add_fetch(&r->refs, 1, __ATOMIC_RELAXED);
  return r;
}

void ax_rref_release(ax_rref *r) {
  if (!r || __atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL) != 0)
    return;
  axi_rctx *rc = r->rc;
  if (r->is_owner) {
    pthread_mutex_lock(&rc->mu);
    r->entry->local_refs--;
    axi_owned *dead = axi_owned_maybe_unlink(rc, r->entry);
    pthread_mutex_unlock(&rc->mu);
    axi_owned_free(dead);
    free(r);
    return;
  }
  pthread_mutex_lock(&rc->mu);
  r->dropped = 1;
  axi_user_maybe_done(rc, r);
  pthread_mutex_unlock(&rc->mu);
}

uint64_t ax_rref_id(const ax_rref *r) { return r->id; }
const char *ax_rref_owner(const ax_rref *r) { return r->owner; }
int ax_rref_is_owner(const ax_rref *r) { return r->is_owner; }
ax_rref_type ax_rref_type_of(const ax_rref *r) { return (ax_rref_type)r->type; }
int ax_rref_confirmed(const ax_rref *r) {
  pthread_mutex_lock(&r->rc->mu);
  int c = r->confirmed;
  pthread_mutex_unlock(&r->rc->mu);
  return c;
}

/* ---- the protocol message queue (sent by the protocol thread) ------------ */
void axi_pmsg_push(axi_rctx *rc, int kind, const char *to, uint64_t a,
                   uint64_t b, ax_rref *rec) {
  if (rc->stop) /* ax_rref_fini: nothing sends any more */
    return;
  axi_pmsg *m = calloc(1, sizeof *m);
  if (!m)
    return;
  m->kind = kind;
  snprintf(m->to, sizeof m->to, "%s", to);
  m->a = a;
  m->b = b;
  m->rec = rec;
  m->not_before_ms =
      ax_clock_ms() + __atomic_load_n(&rc->delay_ms[kind], __ATOMIC_RELAXED);
  axi_pmsg **pp = &rc->q;
  while (*pp)
    pp = &(*pp)->next;
  *pp = m;
  pthread_cond_broadcast(&rc->cv);
}

/* ---- tombstones ---------------------------------------------------------- */
void axi_tomb_add(axi_rctx *rc, uint64_t id, uint64_t fork) {
  int i = rc->ntomb++ % 256;
  rc->tomb[i][0] = id;
  rc->tomb[i][1] = fork;
}

int axi_tomb_take(axi_rctx *rc, uint64_t id, uint64_t fork) {
  int n = rc->ntomb < 256 ? rc->ntomb : 256;
  for (int i = 0; i < n; i++)
    if (rc->tomb[i][0] == id && rc->tomb[i][1] == fork) {
      rc->tomb[i][0] = rc->tomb[i][1] = 0;
      return 1;
    }
  return 0;
}

/* ---- peer down, debugging ------------------------------------------------ */

void ax_rref_peer_down(ax_node *n, const char *peer) {
  axi_rctx *rc = axi_rctx_get();
  if (!rc || rc->node != n || !peer)
    return;
  int rank = -1;
  ax_node_rank_of(n, peer, &rank);
  axi_owned *gone = NULL;
  pthread_mutex_lock(&rc->mu);
  for (ax_rref *u = rc->users, *nx; u; u = nx) {
    nx = u->next;
    if (!strcmp(u->owner, peer)) {
      u->dead = 1;
      axi_user_maybe_done(rc, u);
    }
  }
  for (axi_owned *e = rc->owned, *nx; e; e = nx) {
    nx = e->next;
    for (int i = 0; rank >= 0 && i < e->nforks;)
      if (e->forks[i].holder == rank)
        e->forks[i] = e->forks[--e->nforks];
      else
        i++;
    axi_owned *d = axi_owned_maybe_unlink(rc, e);
    if (d) {
      d->next = gone;
      gone = d;
    }
  }
  pthread_mutex_unlock(&rc->mu);
  for (axi_owned *e = gone, *nx; e; e = nx) {
    nx = e->next;
    axi_owned_free(e);
  }
}

int ax_rref_live(ax_node *n, long *owned, long *users) {
  axi_rctx *rc = axi_rctx_get();
  if (!rc || rc->node != n)
    return ax_seterr(AX_ESTATE, "rref: node not initialised");
  pthread_mutex_lock(&rc->mu);
  *owned = rc->nowned;
  *users = rc->nusers;
  pthread_mutex_unlock(&rc->mu);
  return AX_OK;
}

int ax_rref_debug_list(ax_node *n, char *buf, size_t len) {
  axi_rctx *rc = axi_rctx_get();
  if (!rc || rc->node != n || !len)
    return ax_seterr(AX_ESTATE, "rref: node not initialised");
  size_t o = 0;
  buf[0] = 0;
  pthread_mutex_lock(&rc->mu);
  for (axi_owned *e = rc->owned; e && o < len; e = e->next)
    o += (size_t)snprintf(
        buf + o, len - o, "owned %016llx state %d forks %d local %d\n",
        (unsigned long long)e->id, e->state, e->nforks, e->local_refs);
  for (ax_rref *u = rc->users; u && o < len; u = u->next)
    o += (size_t)snprintf(buf + o, len - o,
                          "user %016llx fork %016llx owner %s confirmed %d "
                          "dropped %d children %d\n",
                          (unsigned long long)u->id,
                          (unsigned long long)u->fork_id, u->owner,
                          u->confirmed, u->dropped, u->pending_children);
  pthread_mutex_unlock(&rc->mu);
  return AX_OK;
}

int ax_rref_debug_delay(ax_node *n, const char *msg, int64_t ms) {
  axi_rctx *rc = axi_rctx_get();
  if (!rc || rc->node != n || !msg)
    return ax_seterr(AX_ESTATE, "rref: node not initialised");
  static const char *names[AXI_MSG_N] = {"fork", "accept", "delete"};
  if (!strcmp(msg, "create")) {
    __atomic_store_n(&rc->create_delay_ms, ms, __ATOMIC_RELAXED);
    return AX_OK;
  }
  if (!strcmp(msg, "fork_timeout")) {
    __atomic_store_n(&rc->fork_timeout_ms, ms, __ATOMIC_RELAXED);
    return AX_OK;
  }
  for (int i = 0; i < AXI_MSG_N; i++)
    if (!strcmp(msg, names[i])) {
      __atomic_store_n(&rc->delay_ms[i], ms, __ATOMIC_RELAXED);
      return AX_OK;
    }
  return ax_seterr(AX_EINVAL, "rref: no message kind %s", msg);
}
