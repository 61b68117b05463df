/* The RRef tables of this process: owned entries, user records, the value
 * codec hooks and handle reference counting. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/rref/rref-impl.h"

static axi_rctx *g_rc; /* the one initialised node of this process */

axi_rctx *axi_rctx_get(void) {
  return __atomic_load_n(&g_rc, __ATOMIC_ACQUIRE);
}

int64_t axi_rnow_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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

void axi_owned_settle(axi_rctx *rc, axi_owned *e, int err, const char *msg,
                      ax_values *vals, const ax_robj_kind *kind, void *obj) {
  pthread_mutex_lock(&rc->mu);
  axi_waiter *w = e->waiters;
  e->waiters = NULL;
  e->err = err;
  e->msg = msg ? strdup(msg) : NULL;
  e->vals = vals;
  e->kind = kind;
  e->obj = obj;
  e->state = err == AX_OK ? AXI_OWN_READY : AXI_OWN_ERROR;
  pthread_mutex_unlock(&rc->mu);
  axi_waiters_run(rc, w, err, msg);
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

/* ---- set-up, peer down, debugging ---------------------------------------- */

int ax_rref_init(ax_node *n) {
  static int ext_done;
  if (!n)
    return ax_seterr(AX_EINVAL, "rref: NULL node");
  if (!__atomic_exchange_n(&ext_done, 1, __ATOMIC_ACQ_REL)) {
    int rc = ax_value_ext_register(AX_VALUE_EXT_RREF, &axi_rref_ext_ops);
    if (rc != AX_OK)
      return rc;
  }
  if (axi_rctx_get())
    return ax_seterr(AX_ESTATE, "rref: a node of this process is initialised");
  axi_rctx *rc = calloc(1, sizeof *rc);
  if (!rc)
    return AX_ENOMEM;
  rc->node = n;
  snprintf(rc->name, sizeof rc->name, "%s", ax_node_name(n));
  pthread_mutex_init(&rc->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&rc->cv, &ca);
  pthread_condattr_destroy(&ca);
  int err = axi_rref_register_proto(n);
  if (err == AX_OK)
    err = axi_rref_register_calls(n);
  if (err == AX_OK)
    err = axi_rref_register_debug(n);
  if (err == AX_OK && pthread_create(&rc->thread, NULL, axi_proto_thread, rc))
    err = ax_seterr(AX_ENOMEM, "rref: cannot start the protocol thread");
  if (err != AX_OK) {
    free(rc);
    return err;
  }
  __atomic_store_n(&g_rc, rc, __ATOMIC_RELEASE);
  return ax_robj_register(n, &axi_box_kind);
}

void ax_rref_fini(ax_node *n) {
  axi_rctx *rc = axi_rctx_get();
  if (!rc || rc->node != n)
    return;
  pthread_mutex_lock(&rc->mu);
  rc->stop = 1; /* from now on axi_pmsg_push drops messages */
  pthread_cond_broadcast(&rc->cv);
  pthread_mutex_unlock(&rc->mu);
  pthread_join(rc->thread, NULL);
  __atomic_store_n(&g_rc, NULL, __ATOMIC_RELEASE);
  pthread_mutex_lock(&rc->mu);
  axi_pmsg *q = rc->q;
  axi_owned *owned = rc->owned;
  rc->q = NULL;
  rc->owned = NULL;
  rc->nowned = 0;
  pthread_mutex_unlock(&rc->mu);
  for (axi_pmsg *m = q, *nx; m; m = nx) {
    nx = m->next;
    free(m);
  }
  /* Destroying an object may release the RRefs it holds (under rc->mu). */
  int survivors = 0;
  for (axi_owned *e = owned, *nx; e; e = nx) {
    nx = e->next;
    survivors += e->local_refs > 0;
    axi_waiters_run(rc, e->waiters, AX_ECLOSED, "rref: node shut down");
    e->waiters = NULL;
    axi_owned_free(e);
  }
  /* User records still referenced by handles stay allocated (their owners
   * may release later; they are no longer in the table); unreferenced ones
   * are freed. */
  pthread_mutex_lock(&rc->mu);
  ax_rref *users = rc->users;
  rc->users = NULL;
  rc->nusers = 0;
  survivors += rc->inflight > 0;
  pthread_mutex_unlock(&rc->mu);
  for (ax_rref *u = users, *nx; u; u = nx) {
    nx = u->next;
    u->next = NULL;
    u->dead = 1;
    u->in_table = 0;
    if (u->dropped)
      axi_user_free(u);
    else
      survivors++;
  }
  for (struct axi_kindreg *k = rc->kinds, *nx; k; k = nx) {
    nx = k->next;
    free(k);
  }
  rc->kinds = NULL;
  rc->resolver = NULL;
  if (survivors) /* handles or callbacks still point at rc: kept on purpose */
    return;
  pthread_cond_destroy(&rc->cv);
  pthread_mutex_destroy(&rc->mu);
  free(rc);
}

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
