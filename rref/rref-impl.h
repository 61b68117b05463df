/* Internal structures of the RRef layer. Nothing outside rref/ includes
 * this file. One lock (rc->mu) guards every table and record field marked
 * "mu"; it is never held while calling into rpc/ except for
 * ax_future_complete of futures nobody waits on under it. */
#ifndef AX_RREF_IMPL_H
#define AX_RREF_IMPL_H

#include <pthread.h>

#include "rref/rref.h"

#define AXI_NAME_MAX 64

enum { AXI_OWN_PENDING = 0, AXI_OWN_READY = 1, AXI_OWN_ERROR = 2 };

/* A call waiting at the owner for a value still being created. */
typedef struct axi_waiter {
  ax_future *reply; /* the deferred reply of the waiting handler */
  char *fn;         /* re-issued locally once the value is ready */
  ax_values *args;
  uint64_t ctx;
  int64_t caller_rank;
  int64_t keep; /* metadata rr.keep of the waiting call */
  int64_t deadline_ms;
  struct axi_waiter *next;
} axi_waiter;

typedef struct axi_fork {
  uint64_t id;
  int holder; /* rank, -1 unknown */
} axi_fork;

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
  int local_refs; /* owner handles alive (mu) */
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
  int pending_children;
  int busy; /* protocol messages or a creation in flight naming it */
  int err; /* creation error stored (AX_OK when none) */
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
  long inflight; /* protocol RPCs not yet answered */
  struct axi_kindreg {
    const ax_robj_kind *k;
    struct axi_kindreg *next;
  } * kinds;
} axi_rctx;

/* rref_table.c */
axi_rctx *axi_rctx_get(void);
uint64_t axi_rref_new_id(axi_rctx *rc); /* mu not held */
int64_t axi_rnow_ms(void);
/* Finds the owned entry id; creates a pending one when create != 0. mu
 * held. */
axi_owned *axi_owned_find(axi_rctx *rc, uint64_t id, int create);
/* Frees e if nothing references it any more. mu held; the entry's value is
 * destroyed after unlocking via the returned pointer (NULL: kept). */
axi_owned *axi_owned_maybe_unlink(axi_rctx *rc, axi_owned *e);
void axi_owned_free(axi_owned *e);
/* Marks e created (vals taken) or failed, and wakes its waiters. mu not
 * held. */
void axi_owned_settle(axi_rctx *rc, axi_owned *e, int err, const char *msg,
                      ax_values *vals, const ax_robj_kind *kind, void *obj);
/* A new owner handle on e (local_refs++). mu held. */
ax_rref *axi_owner_handle(axi_rctx *rc, axi_owned *e);
/* A new user record, in the table. mu held. */
ax_rref *axi_user_new(axi_rctx *rc, uint64_t id, uint64_t fork, int type,
                      const char *owner);
/* Queues a protocol message (mu held). */
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
const char *axi_caller_of(ax_call_ctx *ctx);
int axi_rref_register_proto(ax_node *n);
/* Adds a waiter for a pending entry: defers ctx and re-issues fn(args) once
 * the entry settles. mu held. */
int axi_rref_wait_entry(axi_rctx *rc, axi_owned *e, ax_call_ctx *ctx,
                        const char *fn, const ax_values *args,
                        int64_t caller_rank);
void axi_waiters_run(axi_rctx *rc, axi_waiter *w, int err, const char *msg);
void axi_waiters_expire(axi_rctx *rc, int64_t now);

/* rref_box.c */
extern const ax_robj_kind axi_box_kind;

/* rref_call.c */
int axi_rref_register_calls(ax_node *n);
const ax_robj_kind *axi_kind_find(axi_rctx *rc, const char *name);
/* Copies v[first..] into a new list (tensors and ext objects shared). */
ax_values *axi_values_tail(const ax_values *v, size_t first, size_t end);
int axi_values_append(ax_values *dst, const ax_values *src, size_t first,
                      size_t end);
const ax_rref_grad_hooks *axi_grad_hooks(void);
/* The autograd context of a call: opts->autograd_ctx, else the current. */
uint64_t axi_ctx_of(const ax_call_opts *o);
/* Splits a reply [values..., bytes descriptor] (feeding the recv hook). */
int axi_take_reply(axi_rctx *rc, ax_values *raw, uint64_t ctx,
                   const char *from, ax_values **out);

#endif
