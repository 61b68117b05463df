/* Internal structures of distributed autograd (runtime/autograd/autograd*.c,
 * engine.c). One lock (d->mu) guards every context; backward callbacks and
 * RPCs run without it. */
#ifndef AX_DIST_AUTOGRAD_IMPL_H
#define AX_DIST_AUTOGRAD_IMPL_H

#include <pthread.h>

#include "axon/runtime/autograd/autograd.h"

#define AXD_NAME 64

enum { AXD_SRC_NONE = 0, AXD_SRC_LOCAL = 1, AXD_SRC_REMOTE = 2 };

typedef struct axi_ag_fn axi_ag_fn;

/* Where the gradient of a tensor goes. */
typedef struct axi_ag_src {
  int kind;
  axi_ag_fn *fn;       /* local: producing function */
  int k;               /* output index at the producer */
  char from[AXD_NAME]; /* remote: producing node */
  uint64_t rfn;        /* remote: function id there */
} axi_ag_src;

struct axi_ag_fn {
  uint64_t id;
  const ax_dist_fn_ops *ops;
  void *state;
  int n_in, n_out;
  axi_ag_src in[AX_TLIST_MAX];
  ax_tensor *dout[AX_TLIST_MAX];
  int dout_own[AX_TLIST_MAX]; /* dout[k] is our own sum buffer */
  int expected, received, ran;
  int held;                /* ax_dist_record_held: the owner runs it */
  char consumer[AXD_NAME]; /* node of the first send of an output */
  axi_ag_fn *next;
};

typedef struct axi_ag_map { /* tensor handle -> gradient source */
  ax_tensor *t;             /* retained */
  axi_ag_src s;
  struct axi_ag_map *next;
} axi_ag_map;

typedef struct axi_ag_grad {
  uint64_t key;
  ax_tensor *g;
  struct axi_ag_grad *next;
} axi_ag_grad;

typedef struct axi_ag_peer {
  char name[AXD_NAME];
  struct axi_ag_peer *next;
} axi_ag_peer;

/* A list pushed to consumer `key` under a context (ax_dist_push), kept as
 * received until ax_dist_take or the context's release. */
typedef struct axi_ag_box {
  uint64_t key;
  char from[AXD_NAME]; /* the producing node */
  ax_tlist t;          /* retained; NULL entries: no tensor */
  void *desc;          /* the producer's send-edge descriptor (malloc'd) */
  size_t len;
  struct axi_ag_box *next;
} axi_ag_box;

typedef struct axi_ag_ctx {
  uint64_t id;
  axi_ag_fn *fns;
  axi_ag_map *map;
  axi_ag_grad *grads;
  axi_ag_peer *peers;
  axi_ag_box *boxes; /* pushed, not taken yet, in arrival order */
  int busy;          /* backward callbacks running */
  int released;      /* unlinked; freed when busy drops to zero */
  struct axi_ag_ctx *next;
} axi_ag_ctx;

#define AXD_RELEASED_RING 1024
#define AXD_POOL_MAX 16 /* recycled gradient buffers kept per node */

typedef struct axi_ag_state {
  ax_node *node;
  char name[AXD_NAME];
  pthread_mutex_t mu;
  axi_ag_ctx *ctxs;
  long nctx;
  uint64_t counter, fn_counter;
  uint64_t released[AXD_RELEASED_RING];
  long nrel;
  int64_t grad_delay_ms;
  pthread_cond_t cv; /* a held function got a gradient, a list was pushed,
                        a context released or a key closed (with mu) */
  ax_tensor *pool[AXD_POOL_MAX]; /* recycled gradient buffers (mu) */
  int npool;
  uint64_t *closed; /* consumer keys closed by ax_dist_take_close (mu) */
  int nclosed, capclosed;
} axi_ag_state;

axi_ag_state *axi_ag_get(void);
void axi_ag_set(axi_ag_state *d); /* ax_dist_init, ax_dist_fini (NULL) */
/* The send/recv hooks RRef calls and fetches run (ax_rref_set_grad_hooks). */
extern const ax_rref_grad_hooks axi_ag_grad_hooks;
/* Finds ctx; creates it when create and it was not released. mu held. */
axi_ag_ctx *axi_ag_ctx_find(axi_ag_state *d, uint64_t id, int create);
/* Whether id is among the recently released contexts, which are never
 * created again (d->mu held). */
int axi_ag_was_released(axi_ag_state *d, uint64_t id);
void axi_ag_peer_add(axi_ag_ctx *c, const char *name);
axi_ag_fn *axi_ag_fn_find(axi_ag_ctx *c, uint64_t id);
axi_ag_map *axi_ag_map_find(axi_ag_ctx *c, const ax_tensor *t);
/* Frees a context unlinked from the table (mu not held). */
void axi_ag_ctx_free(axi_ag_ctx *c);

/* The edges of tensors a program moves itself (push.c): the sender records
 * the send edges of t to node `to` under ctx and ships the descriptor
 * (*desc, *len bytes, malloc'd, NULL when no tensor is a recorded output;
 * the caller frees it) with them; the receiver records the receive edges
 * of the tensors as it will use them (after moving them to their device),
 * with the same positions. Both AX_ESTALE if ctx was released here. */
int axi_ag_send_edges(ax_node *n, uint64_t ctx, const char *to,
                      const ax_tlist *t, void **desc, size_t *len);
int axi_ag_recv_edges(ax_node *n, uint64_t ctx, const char *from,
                      const ax_tlist *t, const void *desc, size_t len);

/* engine.c */
int axi_ag_engine_register(ax_node *n);
/* The timeout of the engine's calls and waits when none is given (ms). */
#define AXD_CALL_MS 60000
/* engine_agg.c: a future completing once every part added to it did (the
 * first error wins unless ignore_errors). new: the builder holds a token;
 * add: one more part (the aggregate takes f's reference); finish: drops
 * the token with err/msg and returns the aggregate's future (one
 * reference); wait: waits for it (timeout_ms <= 0: AXD_CALL_MS), names a
 * timeout, releases it. */
typedef struct axi_ag_agg axi_ag_agg;
axi_ag_agg *axi_ag_agg_new(int ignore_errors);
void axi_ag_agg_add(axi_ag_agg *a, ax_future *f);
ax_future *axi_ag_agg_finish(axi_ag_agg *a, int err, const char *msg);
int axi_ag_agg_wait(ax_future *f, int64_t timeout_ms);
/* engine.c, for engine_held.c: adds g (NULL: a contribution without
 * gradient) to fn's output k and runs fn once every contribution came;
 * sends g along a remote edge ("axon.autograd.grad"). Their calls' futures
 * join a. */
int axi_ag_deliver(axi_ag_state *d, uint64_t ctx, axi_ag_fn *fn, int k,
                   ax_tensor *g, axi_ag_agg *a);
int axi_ag_send_grad(axi_ag_state *d, uint64_t ctx, const axi_ag_src *s,
                     ax_tensor *g, axi_ag_agg *a);

/* take_wait.c: the one wait of the takes (ax_dist_take_grads,
 * ax_dist_take). Called and returning with d->mu held. ready(d, arg) runs
 * under d->mu: 1 when the data is there (it takes it), 0 not yet, or a
 * negative error code (-AX_E..., already set with ax_seterr) that ends the
 * wait; it may refresh the string `peer` points to. Between looks the wait
 * sleeps on d->cv, which every delivery broadcasts. Returns AX_OK (ready),
 * the predicate's error, AX_ETIMEOUT once ax_clock_ms() reaches end_ms, or
 * AX_EPEERDOWN as soon as node `peer` (NULL or "": not watched) is down;
 * those two are not set: the caller names them. */
typedef int (*axi_ag_ready_fn)(axi_ag_state *d, void *arg);
int axi_ag_wait(axi_ag_state *d, int64_t end_ms, const char *peer,
                axi_ag_ready_fn ready, void *arg);
/* push.c: registers "axon.autograd.push". */
int axi_ag_push_register(ax_node *n);
/* autograd.c, beside the contexts that keep them: frees a box (NULL-safe). */
void axi_ag_box_free(axi_ag_box *b);

/* optim_dist.c, stage.c */
int axi_ag_optim_register(ax_node *n);
int axi_ag_stages_register(ax_node *n);

#endif
