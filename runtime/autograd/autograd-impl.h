/* Internal structures of distributed autograd (runtime/autograd/autograd*.c,
 * engine.c). One lock (d->mu) guards every context; backward callbacks and
 * RPCs run without it. */
#ifndef AX_DIST_AUTOGRAD_IMPL_H
#define AX_DIST_AUTOGRAD_IMPL_H

#include <pthread.h>

#include "axon/runtime/autograd/autograd.h"

#define AXD_NAME 64

enum { AXD_SRC_NONE = 0, AXD_SRC_LOCAL = 1, AXD_SRC_REMOTE = 2 };

typedef struct axd_fn axd_fn;

/* Where the gradient of a tensor goes. */
typedef struct axd_src {
  int kind;
  axd_fn *fn;  /* local: producing function */
  int k;       /* output index at the producer */
  char from[AXD_NAME]; /* remote: producing node */
  uint64_t rfn;        /* remote: function id there */
} axd_src;

struct axd_fn {
  uint64_t id;
  const ax_dist_fn_ops *ops;
  void *state;
  int n_in, n_out;
  axd_src in[AX_TLIST_MAX];
  ax_tensor *dout[AX_TLIST_MAX];
  int dout_own[AX_TLIST_MAX]; /* dout[k] is our own sum buffer */
  int expected, received, ran;
  int held;                 /* ax_dist_record_held: the owner runs it */
  char consumer[AXD_NAME];  /* node of the first send of an output */
  axd_fn *next;
};

typedef struct axd_map { /* tensor handle -> gradient source */
  ax_tensor *t;           /* retained */
  axd_src s;
  struct axd_map *next;
} axd_map;

typedef struct axd_grad {
  uint64_t key;
  ax_tensor *g;
  struct axd_grad *next;
} axd_grad;

typedef struct axd_peer {
  char name[AXD_NAME];
  struct axd_peer *next;
} axd_peer;

typedef struct axd_ctx {
  uint64_t id;
  axd_fn *fns;
  axd_map *map;
  axd_grad *grads;
  axd_peer *peers;
  int busy;     /* backward callbacks running */
  int released; /* unlinked; freed when busy drops to zero */
  struct axd_ctx *next;
} axd_ctx;

#define AXD_RELEASED_RING 1024
#define AXD_POOL_MAX 16 /* recycled gradient buffers kept per node */

typedef struct axd_state {
  ax_node *node;
  char name[AXD_NAME];
  pthread_mutex_t mu;
  axd_ctx *ctxs;
  long nctx;
  uint64_t counter, fn_counter;
  uint64_t released[AXD_RELEASED_RING];
  long nrel;
  int64_t grad_delay_ms;
  pthread_cond_t cv;  /* a held function got a gradient (with mu) */
  ax_tensor *pool[AXD_POOL_MAX]; /* recycled gradient buffers (mu) */
  int npool;
} axd_state;

axd_state *axd_get(void);
/* Finds ctx; creates it when create and it was not released. mu held. */
axd_ctx *axd_ctx_find(axd_state *d, uint64_t id, int create);
/* Whether id is among the recently released contexts, which are never
 * created again (d->mu held). */
int axd_was_released(axd_state *d, uint64_t id);
void axd_peer_add(axd_ctx *c, const char *name);
axd_fn *axd_fn_find(axd_ctx *c, uint64_t id);
axd_map *axd_map_find(axd_ctx *c, const ax_tensor *t);
/* Frees a context unlinked from the table (mu not held). */
void axd_ctx_free(axd_ctx *c);

/* engine.c */
int axd_engine_register(ax_node *n);

/* optim_dist.c, stage.c */
int axd_optim_register(ax_node *n);
int axd_stages_register(ax_node *n);

#endif
