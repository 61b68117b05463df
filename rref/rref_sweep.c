/* Stale ids and sweeps.
 *
 * Stale ids. An owner answers a fetch or call naming an id it does not hold
 * at once with AX_ESTALE when it can tell the id will never exist: the id
 * was freed here (a ring of recently freed ids), it was minted here (this
 * node creates its own values synchronously, so an absent one is gone), or
 * the caller's reference was acknowledged by this owner (metadata rr.conf:
 * the value existed, so its absence means it was freed). Otherwise the call
 * may have overtaken the creation (ax_remote returns at once and a fork can
 * travel faster than the create), so it waits for the creation: briefly
 * (AXI_REORDER_GRACE_MS) when the id is at or below the highest counter the
 * owner has seen created by that creator (only a reordered create can still
 * come), longer (AXI_PENDING_GRACE_MS, never past the call's deadline) when
 * above, then answers AX_ESTALE.
 *
 * Sweeps. A user that forks its reference into a message counts the child
 * until the receiver accepts it; a child whose message never arrives (the
 * call failed, the receiver died before sending its fork) is dropped after
 * the fork timeout. A fork made by the owner records its holder when the
 * receiver accepts it (so the holder's death frees it, see
 * ax_rref_peer_down); one never accepted is dropped after the same timeout.
 * The timeout must exceed the time a message can take to arrive and be
 * confirmed: a message slower than that may find its value freed, and its
 * receiver then gets AX_ESTALE (never a crash). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/builtin-impl.h"
#include "axon/rref/rref-impl.h"

#define CTR_MASK 0xffffffffffffull

static int freed_has(const axi_rctx *rc, uint64_t id) {
  long n = rc->nfreed < AXI_FREED_MAX ? rc->nfreed : AXI_FREED_MAX;
  for (long i = 0; i < n; i++)
    if (rc->freed[i] == id)
      return 1;
  return 0;
}

void axi_hw_note(axi_rctx *rc, uint64_t id) {
  uint64_t creator = id >> 48, ctr = id & CTR_MASK;
  if (creator < AXI_HW_RANKS && ctr > rc->hw[creator])
    rc->hw[creator] = ctr;
}

int axi_absent_verdict(axi_rctx *rc, uint64_t id, int known,
                       int64_t *grace_ms) {
  uint64_t creator = id >> 48, ctr = id & CTR_MASK;
  uint64_t self = (uint64_t)(ax_node_rank(rc->node) + 1) & 0xffff;
  if (freed_has(rc, id))
    return ax_seterr(AX_ESTALE, "rref: %016llx was freed on %s",
                     (unsigned long long)id, rc->name);
  if (known)
    return ax_seterr(AX_ESTALE, "rref: %016llx no longer exists on %s",
                     (unsigned long long)id, rc->name);
  if (creator == self || creator == 0)
    return ax_seterr(AX_ESTALE, "rref: %016llx is not a value of %s",
                     (unsigned long long)id, rc->name);
  *grace_ms = (creator < AXI_HW_RANKS && ctr <= rc->hw[creator])
                  ? AXI_REORDER_GRACE_MS
                  : AXI_PENDING_GRACE_MS;
  return AX_OK;
}

axi_owned *axi_owned_lookup(axi_rctx *rc, uint64_t id, ax_call_ctx *ctx,
                            int64_t *grace_ms, int *err) {
  *grace_ms = -1;
  axi_owned *e = axi_owned_find(rc, id, 0);
  if (e)
    return e;
  int64_t known = 0;
  if (ax_call_meta(ctx, "rr.conf", &known) != AX_OK) {
    ax_clearerr();
    known = 0;
  }
  *err = axi_absent_verdict(rc, id, (int)known, grace_ms);
  if (*err != AX_OK)
    return NULL;
  e = axi_owned_find(rc, id, 1);
  if (!e)
    *err = ax_seterr(AX_ENOMEM, "rref: no memory");
  return e;
}

ax_call_opts axi_opts_conf(const ax_call_opts *o, const ax_rref *r,
                           const char **keys, int64_t *vals) {
  ax_call_opts c = o ? *o : (ax_call_opts){0};
  int n = 0;
  for (int i = 0; o && i < o->nmeta && n < 8; i++, n++) {
    keys[n] = o->meta_key[i];
    vals[n] = o->meta_val[i];
  }
  pthread_mutex_lock(&r->rc->mu);
  int known = r->known;
  pthread_mutex_unlock(&r->rc->mu);
  if (known && n < 8) {
    keys[n] = "rr.conf";
    vals[n++] = 1;
  }
  c.nmeta = n;
  c.meta_key = n ? keys : NULL;
  c.meta_val = n ? vals : NULL;
  return c;
}

/* ---- children and holderless forks --------------------------------------- */
static int64_t fork_timeout(axi_rctx *rc) {
  int64_t t = __atomic_load_n(&rc->fork_timeout_ms, __ATOMIC_RELAXED);
  return t > 0 ? t : AXI_FORK_TIMEOUT_MS;
}

void axi_child_add(axi_rctx *rc, ax_rref *u, uint64_t fork) {
  if (u->pending_children == u->capchildren) {
    int cap = u->capchildren ? u->capchildren * 2 : 4;
    axi_child *c = realloc(u->children, (size_t)cap * sizeof *c);
    if (!c) { /* counted without a record: only the sweep-less path */
      u->pending_children++;
      return;
    }
    u->children = c;
    u->capchildren = cap;
  }
  u->children[u->pending_children].fork = fork;
  u->children[u->pending_children].deadline = ax_clock_ms() + fork_timeout(rc);
  u->pending_children++;
}

void axi_child_accepted(axi_rctx *rc, ax_rref *u, uint64_t fork) {
  int n = u->pending_children < u->capchildren ? u->pending_children
                                               : u->capchildren;
  for (int i = 0; i < n; i++)
    if (u->children[i].fork == fork || fork == 0) {
      u->children[i] = u->children[n - 1];
      u->pending_children--;
      break;
    }
  axi_user_maybe_done(rc, u);
}

void axi_fork_holder(axi_rctx *rc, uint64_t fork, int holder) {
  for (axi_owned *e = rc->owned; e; e = e->next)
    for (int i = 0; i < e->nforks; i++)
      if (e->forks[i].id == fork) {
        e->forks[i].holder = holder;
        e->forks[i].deadline = 0;
        return;
      }
}

void axi_rref_sweep(axi_rctx *rc, int64_t now) {
  axi_owned *gone = NULL;
  pthread_mutex_lock(&rc->mu);
  if (now < rc->next_sweep_ms) {
    pthread_mutex_unlock(&rc->mu);
    return;
  }
  rc->next_sweep_ms = now + 100;
  for (ax_rref *u = rc->users, *nx; u; u = nx) {
    nx = u->next; /* maybe_done may free u */
    int n = u->pending_children < u->capchildren ? u->pending_children
                                                 : u->capchildren;
    int swept = 0;
    for (int i = 0; i < n;)
      if (u->children[i].deadline <= now) {
        u->children[i] = u->children[--n];
        u->pending_children--;
        swept = 1;
      } else {
        i++;
      }
    if (swept)
      axi_user_maybe_done(rc, u);
  }
  for (axi_owned *e = rc->owned, *nx; e; e = nx) {
    nx = e->next;
    int swept = 0;
    for (int i = 0; i < e->nforks;)
      if (e->forks[i].holder < 0 && e->forks[i].deadline &&
          e->forks[i].deadline <= now) {
        e->forks[i] = e->forks[--e->nforks];
        swept = 1;
      } else {
        i++;
      }
    axi_owned *d = swept ? axi_owned_maybe_unlink(rc, e) : NULL;
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

/* Deadline of a fork the owner makes itself (holder still unknown). */
int64_t axi_owner_fork_deadline(axi_rctx *rc) {
  return ax_clock_ms() + fork_timeout(rc);
}

static int h_live(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                  void *user) {
  long o, u;
  AX_TRY(ax_rref_live(ax_call_node(ctx), &o, &u));
  ax_values_add_i64(out, o);
  ax_values_add_i64(out, u);
  ax_values_add_i64(out, ax_node_world_size(ax_call_node(ctx)));
  return AX_OK;
}

static int h_debug(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                   void *user) {
  const char *kind;
  int64_t ms;
  AX_TRY(ax_values_get_str(args, 0, &kind));
  AX_TRY(ax_values_get_i64(args, 1, &ms));
  return ax_rref_debug_delay(ax_call_node(ctx), kind, ms);
}

/* "axon.rref.list" [] -> [str]: ax_rref_debug_list of the node, remotely. */
static int h_list(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                  void *user) {
  char buf[4096];
  AX_TRY(ax_rref_debug_list(ax_call_node(ctx), buf, sizeof buf));
  return ax_values_add_str(out, buf);
}

int axi_rref_register_debug(ax_node *n) {
  AX_TRY(axi_register(n, "axon.rref.live", h_live, NULL));
  AX_TRY(axi_register(n, "axon.rref.debug", h_debug, NULL));
  return axi_register(n, "axon.rref.list", h_list, NULL);
}
