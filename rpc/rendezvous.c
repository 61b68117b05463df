/* Rendezvous, the master's side: it collects joins and publishes the
 * membership once the world is complete; built-in functions
 * "axon.rendezvous.join" and "axon.rendezvous.stats". A member's side
 * (joining, applying a membership) is rendezvous_member.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/node-impl.h"

typedef struct axi_join {
  int world, count;
  char **name, **addr, **bulk; /* indexed by rank, grown as needed */
  uint64_t *inc; /* per rank: the incarnation of the process that joined */
  char *picked;  /* per rank: 1 when the master chose it (the joiner asked
                    for none); it may still move until the membership is out */
  int cap;
  ax_future **waiting; /* deferred join replies */
  int nwaiting;
} axi_join;

static ax_values *membership(ax_node *n, axi_join *j) {
  ax_values *v = ax_values_new();
  if (!v)
    return NULL;
  ax_values_add_i64(v, j->cap);
  ax_values_add_str(v, n->name);
  for (int r = 0; r < j->cap; r++) {
    ax_values_add_str(v, j->name[r] ? j->name[r] : "");
    ax_values_add_str(v, j->addr[r] ? j->addr[r] : "");
    ax_values_add_str(v, j->bulk[r] ? j->bulk[r] : "");
    ax_values_add_i64(v, (int64_t)j->inc[r]);
  }
  return v;
}

static int grow(axi_join *j, int cap) {
  if (cap <= j->cap)
    return AX_OK;
  char **a = realloc(j->name, cap * sizeof *a);
  if (a)
    j->name = a;
  char **b = realloc(j->addr, cap * sizeof *b);
  if (b)
    j->addr = b;
  char **c = realloc(j->bulk, cap * sizeof *c);
  if (c)
    j->bulk = c;
  char *d = realloc(j->picked, cap);
  if (d)
    j->picked = d;
  uint64_t *e = realloc(j->inc, cap * sizeof *e);
  if (e)
    j->inc = e;
  if (!a || !b || !c || !d || !e)
    return ax_seterr(AX_ENOMEM, "join: no memory");
  for (int r = j->cap; r < cap; r++) {
    j->name[r] = j->addr[r] = j->bulk[r] = NULL;
    j->picked[r] = 0;
    j->inc[r] = 0;
  }
  j->cap = cap;
  return AX_OK;
}

/* The lowest free rank other than `reserved` and `skip`; j->world if none. */
static int free_rank(const axi_join *j, int reserved, int skip) {
  int r = 0;
  while (r < j->world && (j->name[r] || r == reserved || r == skip))
    r++;
  return r;
}

/* Adds a member (n->mu held). Returns the rank or a negative error. A
 * member without a rank gets the lowest free one except `reserved` (the
 * master's own, which it may claim after others arrived). A member that
 * asks for a rank the master chose for an earlier one (an agent started by
 * srun or mpirun, its rank from the environment, after a coordinator that
 * asked for none) gets it, and the earlier one moves to another free rank:
 * nobody learns a rank before the membership is complete. */
static int add_member(axi_join *j, const char *name, int rank, const char *addr,
                      const char *bulk, uint64_t inc, int reserved, int down,
                      int *rejoined) {
  for (int r = 0; r < j->cap; r++)
    if (j->name[r] && !strcmp(j->name[r], name)) {
      if (inc == j->inc[r] && !strcmp(j->addr[r], addr))
        return r; /* a retried join */
      /* A member that is down may come back (a restarted agent): once the
       * membership is out, a newer process joins under its name, from the
       * same addresses or new ones, which every member then dials instead.
       * The old process is refused from then on (its incarnation is not
       * the membership's). */
      if (inc <= j->inc[r])
        return -ax_seterr(AX_ESTATE,
                          "join: %s is an earlier process of "
                          "member %s (incarnation %llu, the world has %llu)",
                          addr, name, (unsigned long long)inc,
                          (unsigned long long)j->inc[r]);
      if (j->count < j->world || !down)
        return -ax_seterr(AX_ESTATE, "join: name %s is taken", name);
      char *a = strdup(addr), *b = strdup(bulk);
      if (!a || !b) {
        free(a);
        free(b);
        return -AX_ENOMEM;
      }
      free(j->addr[r]);
      free(j->bulk[r]);
      j->addr[r] = a;
      j->bulk[r] = b;
      j->inc[r] = inc;
      *rejoined = 1;
      return r;
    }
  if (grow(j, j->world) != AX_OK)
    return -AX_ENOMEM;
  int picked = rank < 0;
  if (picked) {
    rank = free_rank(j, reserved, -1);
  } else if (rank < j->world && j->name[rank]) {
    int to = j->picked[rank] ? free_rank(j, reserved, rank) : j->world;
    if (to >= j->world)
      return -ax_seterr(AX_ESTATE, "join: rank %d is taken by %s", rank,
                        j->name[rank]);
    j->name[to] = j->name[rank];
    j->addr[to] = j->addr[rank];
    j->bulk[to] = j->bulk[rank];
    j->inc[to] = j->inc[rank];
    j->picked[to] = 1;
    j->name[rank] = j->addr[rank] = j->bulk[rank] = NULL;
  }
  if (rank >= j->world)
    return -ax_seterr(AX_ESTATE, "join: the world of %d is full", j->world);
  j->name[rank] = strdup(name);
  j->addr[rank] = strdup(addr);
  j->bulk[rank] = strdup(bulk);
  j->inc[rank] = inc;
  j->picked[rank] = (char)picked;
  j->count++;
  return rank;
}

/* Completes the waiting joins if the world is complete (n->mu held);
 * returns the futures to complete outside the lock via *out. */
static ax_values *check_complete(ax_node *n, axi_join *j) {
  if (j->count < j->world)
    return NULL;
  return membership(n, j);
}

static void finish_waiting(ax_node *n, ax_future **w, int nw,
                           const ax_values *members) {
  for (int i = 0; i < nw; i++) {
    ax_future_complete(w[i], AX_OK, ax_values_clone(members), NULL);
    ax_future_release(w[i]);
  }
  free(w);
}

/* The rejoined member's answer, given once every other member has
 * applied the new membership (or failed to, or timed out): so no member
 * refuses the new process as another one under a live member's name. */
typedef struct axi_push {
  int left; /* atomic: pushes not yet done, plus one while sending */
  ax_future *reply;
  ax_values *members;
} axi_push;

static void push_one_done(axi_push *q) {
  if (__atomic_sub_fetch(&q->left, 1, __ATOMIC_ACQ_REL))
    return;
  ax_future_complete(q->reply, AX_OK, q->members, NULL);
  ax_future_release(q->reply);
  free(q);
}

static void push_done(ax_future *f, void *user) {
  ax_future_release(f);
  push_one_done(user);
}

/* After a rejoin: every other member learns the new membership
 * ("axon.rendezvous.members"), then the rejoined one gets it as its answer
 * (reply, which takes members). */
static void push_members(ax_node *n, ax_values *members, const char *skip,
                         ax_future *reply) {
  axi_push *q = malloc(sizeof *q);
  if (!q) { /* answered at once: a member may refuse it until it learns */
    ax_future_complete(reply, AX_OK, members, NULL);
    return;
  }
  *q = (axi_push){
      .left = 1, .reply = ax_future_retain(reply), .members = members};
  int64_t world = 0;
  ax_values_get_i64(members, 0, &world);
  for (int64_t r = 0; r < world; r++) {
    const char *name;
    ax_future *f = NULL;
    if (ax_values_get_str(members, (size_t)(2 + AXI_MEMBER_FIELDS * r),
                          &name) != AX_OK ||
        !*name || !strcmp(name, n->name) || !strcmp(name, skip) ||
        ax_node_peer_is_down(n, name))
      continue;
    ax_call_opts o = {.timeout_ms = 5000};
    __atomic_add_fetch(&q->left, 1, __ATOMIC_ACQ_REL);
    if (ax_rpc_async(n, name, "axon.rendezvous.members", members, &o, &f) !=
        AX_OK) {
      push_one_done(q);
    } else if (ax_future_on_done(f, push_done, q) != AX_OK) {
      ax_future_release(f);
      push_one_done(q);
    }
  }
  push_one_done(q);
}

/* A member applies the membership its master pushed after a rejoin; from
 * anyone else it is refused. */
static int members_handler(ax_call_ctx *ctx, const ax_values *args,
                           ax_values *out, void *user) {
  (void)out;
  (void)user;
  ax_node *n = ax_call_node(ctx);
  const char *from = ax_call_caller(ctx), *master = ax_node_master_name(n);
  if (!from || !master || strcmp(from, master))
    return ax_seterr(AX_EINVAL,
                     "axon.rendezvous.members: only the master (%s) hands "
                     "out the membership, not %s",
                     master ? master : "?", from ? from : "?");
  axi_rendezvous_apply(n, args);
  return AX_OK;
}

static int join_handler(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                        void *user) {
  ax_node *n = ax_call_node(ctx);
  const char *name, *addr, *bulk;
  int64_t rank, world, inc;
  AX_TRY(ax_values_get_str(args, 0, &name));
  AX_TRY(ax_values_get_i64(args, 1, &rank));
  AX_TRY(ax_values_get_str(args, 2, &addr));
  AX_TRY(ax_values_get_str(args, 3, &bulk));
  AX_TRY(ax_values_get_i64(args, 4, &world));
  AX_TRY(ax_values_get_i64(args, 5, &inc));
  if (!axi_is_master(n))
    return ax_seterr(AX_ESTATE, "join: %s is not the master", n->name);
  axi_join *j = n->joins;
  /* A rank is the joiner's choice: it must name a slot of this world
   * (j->world is fixed at creation), so that no join grows the tables. */
  if (rank < -1 || rank >= j->world)
    return ax_seterr(AX_EINVAL,
                     "join: %s asked for rank %lld; this world has "
                     "ranks 0..%d (or -1: any)",
                     name, (long long)rank, j->world - 1);
  if (!*name || strlen(name) > 255 || strlen(addr) > 255 || strlen(bulk) > 255)
    return ax_seterr(AX_EINVAL, "join: empty or overlong name or address");
  if (inc <= 0)
    return ax_seterr(AX_EINVAL, "join: %s gave no incarnation", name);
  ax_future *f = ax_future_new();
  if (!f)
    return AX_ENOMEM;
  int down = ax_node_peer_is_down(n, name); /* takes n->mu */
  pthread_mutex_lock(&n->mu);
  int self = !strcmp(name, n->name), rejoined = 0;
  int r = add_member(j, name, (int)rank, addr, bulk, (uint64_t)inc,
                     self ? -1 : n->o.rank, down, &rejoined);
  if (r < 0) {
    pthread_mutex_unlock(&n->mu);
    ax_future_release(f);
    return -r;
  }
  ax_values *members = check_complete(n, j);
  ax_future **w = NULL;
  int nw = 0;
  if (members) {
    w = j->waiting;
    nw = j->nwaiting;
    j->waiting = NULL;
    j->nwaiting = 0;
  } else {
    ax_future **g = realloc(j->waiting, (j->nwaiting + 1) * sizeof *g);
    if (!g) {
      pthread_mutex_unlock(&n->mu);
      ax_future_release(f);
      return AX_ENOMEM;
    }
    j->waiting = g;
    g[j->nwaiting++] = ax_future_retain(f);
  }
  pthread_mutex_unlock(&n->mu);
  if (members) {
    axi_rendezvous_apply(n, members);
    finish_waiting(n, w, nw, members);
    if (rejoined) {
      fprintf(stderr, "axon: %s: %s rejoined from %s (incarnation %lld)\n",
              n->name, name, addr, (long long)inc);
      push_members(n, members, name, f);
    } else {
      ax_future_complete(f, AX_OK, members, NULL);
    }
  }
  int rc = ax_call_defer(ctx, f);
  ax_future_release(f);
  return rc;
}

static int stats_handler(ax_call_ctx *ctx, const ax_values *args,
                         ax_values *out, void *user) {
  ax_node *n = ax_call_node(ctx);
  AX_TRY(ax_values_add_i64(out, ax_rpc_live_calls() - 1));
  AX_TRY(ax_values_add_i64(out, ax_future_live_count()));
  AX_TRY(ax_values_add_i64(out,
                           __atomic_load_n(&n->incalls, __ATOMIC_RELAXED) - 1));
  return AX_OK;
}

int axi_rendezvous_init(ax_node *n) {
  n->joins = calloc(1, sizeof(axi_join));
  if (!n->joins)
    return ax_seterr(AX_ENOMEM, "node: no memory");
  n->joins->world = n->o.world_size > 0 ? n->o.world_size : 1;
  AX_TRY(axi_register(n, "axon.rendezvous.join", join_handler, NULL));
  AX_TRY(axi_register(n, "axon.rendezvous.members", members_handler, NULL));
  return axi_register(n, "axon.rendezvous.stats", stats_handler, NULL);
}

void axi_rendezvous_close(ax_node *n) {
  axi_join *j = n->joins;
  if (!j)
    return;
  pthread_mutex_lock(&n->mu);
  ax_future **w = j->waiting;
  int nw = j->nwaiting;
  j->waiting = NULL;
  j->nwaiting = 0;
  pthread_mutex_unlock(&n->mu);
  for (int i = 0; i < nw; i++) { /* answered while the transport is up */
    ax_future_complete(w[i], AX_ECLOSED, NULL, "the master is shutting down");
    ax_future_release(w[i]);
  }
  free(w);
}

void axi_rendezvous_fini(ax_node *n) {
  axi_join *j = n->joins;
  if (!j)
    return;
  for (int r = 0; r < j->cap; r++) {
    free(j->name[r]);
    free(j->addr[r]);
    free(j->bulk[r]);
  }
  free(j->name);
  free(j->addr);
  free(j->bulk);
  free(j->picked);
  free(j->inc);
  for (int i = 0; i < j->nwaiting; i++) {
    ax_future_complete(j->waiting[i], AX_ECLOSED, NULL, "node destroyed");
    ax_future_release(j->waiting[i]);
  }
  free(j->waiting);
  free(j);
  n->joins = NULL;
}
