/* Internal structures of the RRef layer. Nothing outside rref/ includes
 * this file. One lock (rc->mu) guards every table and record field marked
 * "mu"; it is never held while calling into rpc/ except for
 * ax_future_complete of futures nobody waits on under it. */
#ifndef AX_RREF_IMPL_H
#define AX_RREF_IMPL_H

#include <pthread.h>

#include "axon/rref/rref.h"

#define AXI_NAME_MAX 64
#define AXI_FREED_MAX 1024
#define AXI_HW_RANKS 1024
/* Default of the fork sweep timeout (ax_rref_debug_delay "fork_timeout"). */
#define AXI_FORK_TIMEOUT_MS 30000
/* How long a call on an absent id may wait for its creation: ids at or
 * below the creator's high-water mark (a reordered create) and above it. */
#define AXI_REORDER_GRACE_MS 1000
#define AXI_PENDING_GRACE_MS 10000
/* Most entries this node owns at once; a received payload naming one more
 * (not yet known here) is refused beyond it (rref_codec.c). */
#define AXI_OWNED_MAX (1L << 20)

enum { AXI_OWN_PENDING = 0, AXI_OWN_READY = 1, AXI_OWN_ERROR = 2 };

/* A call waiting at the owner for a value still being created. */
typedef struct axi_waiter {
  ax_future *reply; /* the deferred reply of the waiting handler */
  char *fn;         /* re-issued locally once the value is ready */
  ax_values *args;
  uint64_t ctx;
  int64_t caller_rank;
  int nmeta; /* the waiting call's metadata (rr.keep among them) */
  char *meta_key[8];
  int64_t meta_val[8];
  int64_t deadline_ms;
  int expire_err; /* AX_ETIMEOUT, or AX_ESTALE past a grace period */
  struct axi_waiter *next;
} axi_waiter;

typedef struct axi_fork {
  uint64_t id;
  int holder;       /* rank, -1 unknown */
  int64_t deadline; /* holder unknown: dropped past this time (0: never) */
} axi_fork;

/* A fork a user sent on that the receiver has not accepted yet. */
typedef struct axi_child {
  uint64_t fork;
  int64_t deadline; /* swept (as if accepted) past this time */
} axi_child;

/* A value or object owned by this node. */
typedef struct axi_owned {
  uint64_t id;
  int type;
  int state; /* mu */
  int err;
  char *msg;
  ax_values *vals;
  const ax_robj_kind *kind;
  void *obj;
  axi_fork *forks; /* mu */
  int nforks, capforks;
  int local_refs;      /* owner handles alive (mu) */
  axi_waiter *waiters; /* mu */
  struct axi_owned *next;
} axi_owned;

struct ax_rref {
  int refs; /* atomic */
  struct axi_rctx *rc;
  uint64_t id, fork_id;
  int type;
  int is_owner;
  char owner[AXI_NAME_MAX];
  char parent[AXI_NAME_MAX];
  uint64_t parent_fork;
  axi_owned *entry; /* owner handles */
  /* user record state (mu) */
  int confirmed, dropped, dead, in_table;
  int known; /* the owner acknowledged this fork (creation or fork reply) */
  axi_child *children; /* unaccepted child forks (mu) */
  int pending_children, capchildren;
  int busy; /* protocol messages or a creation in flight naming it */
  int err;  /* creation error stored (AX_OK when none) */
  char *errmsg;
  ax_future *created; /* completes with the creation outcome */
  struct ax_rref *next;
};

/* A protocol message queued for the protocol thread. */
typedef struct axi_pmsg {
  int kind; /* AXI_MSG_* */
  char to[AXI_NAME_MAX];
  uint64_t a, b;
  ax_rref *rec; /* fork: the user record to confirm */
  int64_t not_before_ms;
  struct axi_pmsg *next;
} axi_pmsg;

enum { AXI_MSG_FORK = 0, AXI_MSG_ACCEPT = 1, AXI_MSG_DELETE = 2, AXI_MSG_N };

typedef struct axi_rctx {
  ax_node *node;
  char name[AXI_NAME_MAX];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  axi_owned *owned;
  ax_rref *users;
  long nowned, nusers;
  uint64_t counter;
  uint64_t tomb[256][2]; /* deletes that came before their fork (ring) */
  int ntomb;
  axi_pmsg *q;
  int stop;
  pthread_t thread;
  int64_t delay_ms[AXI_MSG_N];
  int64_t create_delay_ms; /* test hook: h_create sleeps this long */
  int64_t fork_timeout_ms; /* unaccepted/holderless forks are swept after */
  uint64_t freed[AXI_FREED_MAX]; /* ids of settled values freed (ring, mu) */
  long nfreed;
  uint64_t hw[AXI_HW_RANKS]; /* highest creation counter seen per creator */
  int64_t next_sweep_ms;
  long inflight; /* protocol RPCs not yet answered */
  struct axi_kindreg {
    const ax_robj_kind *k;
    struct axi_kindreg *next;
  } * kinds;
  ax_robj_resolver resolver; /* kinds made on demand (mu) */
  void *resolver_user;
} axi_rctx;

/* rref_table.c */
axi_rctx *axi_rctx_get(void);
void axi_rctx_set(axi_rctx *rc);        /* ax_rref_init, ax_rref_fini (NULL) */
uint64_t axi_rref_new_id(axi_rctx *rc); /* mu not held */
/* Finds the owned entry id; creates a pending one when create != 0. mu
 * held. */
axi_owned *axi_owned_find(axi_rctx *rc, uint64_t id, int create);
/* Frees e if nothing references it any more. mu held; the entry's value is
 * destroyed after unlocking via the returned pointer (NULL: kept). */
axi_owned *axi_owned_maybe_unlink(axi_rctx *rc, axi_owned *e);
void axi_owned_free(axi_owned *e);
/* Records a freed id in the ring axi_absent_verdict reads (mu held). */
void axi_freed_add(axi_rctx *rc, uint64_t id);
/* A new owner handle on e (local_refs++). mu held. */
ax_rref *axi_owner_handle(axi_rctx *rc, axi_owned *e);
/* A new user record, in the table. mu held. */
ax_rref *axi_user_new(axi_rctx *rc, uint64_t id, uint64_t fork, int type,
                      const char *owner);
/* Queues a protocol message for the protocol thread (mu held); dropped
 * once ax_rref_fini began. */
void axi_pmsg_push(axi_rctx *rc, int kind, const char *to, uint64_t a,
                   uint64_t b, ax_rref *rec);
void axi_user_free(ax_rref *u);
/* rref_codec.c, rref_thread.c */
extern const ax_value_ext_ops axi_rref_ext_ops;
void *axi_proto_thread(void *rc);
/* Checks whether a dropped user record can go (mu held). */
void axi_user_maybe_done(axi_rctx *rc, ax_rref *u);
/* Tombstones (mu held). */
int axi_tomb_take(axi_rctx *rc, uint64_t id, uint64_t fork);
void axi_tomb_add(axi_rctx *rc, uint64_t id, uint64_t fork);
void axi_owned_add_fork(axi_owned *e, uint64_t fork, int holder);
int axi_owned_del_fork(axi_owned *e, uint64_t fork);

/* rref_proto.c: protocol handlers */
int axi_rref_register_proto(ax_node *n);

/* rref_wait.c: waiters on values still being created. */
/* Marks e created (vals taken) or failed, and wakes its waiters. mu not
 * held. */
void axi_owned_settle(axi_rctx *rc, axi_owned *e, int err, const char *msg,
                      ax_values *vals, const ax_robj_kind *kind, void *obj);
/* Adds a waiter for a pending entry: defers ctx and re-issues fn(args) once
 * the entry settles. mu held. */
int axi_rref_wait_entry(axi_rctx *rc, axi_owned *e, ax_call_ctx *ctx,
                        const char *fn, const ax_values *args,
                        int64_t caller_rank, int64_t grace_ms);
/* Re-issues (err AX_OK) or fails the waiters w and frees them. */
void axi_waiters_run(axi_rctx *rc, axi_waiter *w, int err, const char *msg);
/* Answers the waiters whose deadline passed (the protocol thread). */
void axi_waiters_expire(axi_rctx *rc, int64_t now);

/* rref_sweep.c: stale ids and sweeps of forks nobody accepted. */
/* The verdict on a fetch or call naming an id absent here (mu held):
 * AX_ESTALE (answer at once) when the id was freed, was minted here, or the
 * caller's reference was acknowledged (known); else AX_OK and *grace_ms,
 * the longest the call may wait for the creation before AX_ESTALE. */
int axi_absent_verdict(axi_rctx *rc, uint64_t id, int known, int64_t *grace_ms);
/* Looks id up for a fetch or call: the entry (pending ones created), or
 * NULL with AX_ESTALE/AX_ENOMEM set in *err. mu held. */
axi_owned *axi_owned_lookup(axi_rctx *rc, uint64_t id, ax_call_ctx *ctx,
                            int64_t *grace_ms, int *err);
void axi_hw_note(axi_rctx *rc, uint64_t id); /* mu held */
/* Records an unaccepted child fork of u (mu held). */
void axi_child_add(axi_rctx *rc, ax_rref *u, uint64_t fork);
/* The child `fork` of u was accepted (mu held). */
void axi_child_accepted(axi_rctx *rc, ax_rref *u, uint64_t fork);
/* The owner learned the holder of its own fork `fork` (mu held). */
void axi_fork_holder(axi_rctx *rc, uint64_t fork, int holder);
/* Drops children and holderless owner forks past their deadline; runs on
 * the protocol thread (mu not held). */
void axi_rref_sweep(axi_rctx *rc, int64_t now);
/* Deadline of a fork the owner makes itself (holder still unknown). */
int64_t axi_owner_fork_deadline(axi_rctx *rc);
/* Registers "axon.rref.live", "axon.rref.debug" and "axon.rref.list". */
int axi_rref_register_debug(ax_node *n);
/* The call options with metadata rr.conf (the reference is known) added
 * to the caller's; keys/vals are caller storage of 9 entries. */
ax_call_opts axi_opts_conf(const ax_call_opts *o, const ax_rref *r,
                           const char **keys, int64_t *vals);

/* rref_box.c */
extern const ax_robj_kind axi_box_kind;

/* rref_call.c */
int axi_rref_register_calls(ax_node *n);
/* The kind registered under name, else the one the resolver makes (then
 * registered), else NULL. */
const ax_robj_kind *axi_kind_find(axi_rctx *rc, const char *name);
/* Runs the kind's constructor (create_kind or create). */
int axi_kind_create(const ax_robj_kind *k, ax_node *n, const char *config,
                    ax_device dev, void **obj);
const ax_rref_grad_hooks *axi_grad_hooks(void);
/* The autograd context of a call: opts->autograd_ctx, else the current. */
uint64_t axi_ctx_of(const ax_call_opts *o);
/* Splits a reply [values..., bytes descriptor] (feeding the recv hook):
 * takes raw, which becomes *out without its descriptor (freed on error). */
int axi_take_reply(axi_rctx *rc, ax_values *raw, uint64_t ctx, const char *from,
                   ax_values **out);

#endif
