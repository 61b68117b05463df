/* Collective groups: creation, shrinking after a failure, and each group's
 * communication thread, which runs the queued operations one at a time
 * (the algorithms of collective_ring.c on host data); submitting an
 * operation and waiting for it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/rpc.h"
#include "axon/runtime/autograd/collective-impl.h"

static void op_free(ax_coll_op *op) {
  ax_tensor_release(op->t);
  ax_tensor_release(op->a);
  ax_tensor_release(op->b);
  free(op);
}

static void run_op(ax_coll_group *g, ax_coll_op *op) {
  pthread_mutex_lock(&g->mu);
  int failed = g->failed_rc;
  pthread_mutex_unlock(&g->mu);
  if (failed) {
    op->rc = failed;
    if (failed == AX_ECANCELLED)
      snprintf(op->msg, sizeof op->msg, "collective %s: %s", g->tag,
               g->abort_why);
    else
      snprintf(op->msg, sizeof op->msg, "collective %s failed earlier%s%s",
               g->tag, g->failed_peer[0] ? ": member down: " : "",
               g->failed_peer);
    return;
  }
  /* The algorithms work on host floats. A device tensor is run on a host
   * copy of the op's range only: the rest of it (gradients a backward is
   * still accumulating, other buckets) is neither read nor written back. */
  ax_tensor *t = op->t, *range = NULL;
  float *data = ax_f32(t), *host = NULL;
  size_t off = op->off, bytes = op->n * sizeof(float);
  if (t->device.type != AX_DEV_CPU) {
    int64_t n = (int64_t)op->n;
    range = ax_tensor_view(t, off, 1, &n);
    host = malloc(bytes + 1);
    op->rc = range && host ? ax_tensor_read(range, host, bytes) : AX_ENOMEM;
    data = host;
    op->off = 0; /* offsets now count from the copy */
  }
  if (op->rc == AX_OK)
    op->rc = axi_coll_run(op, data);
  if (op->rc == AX_OK && host)
    op->rc = ax_tensor_write(range, host, bytes);
  op->off = off;
  ax_tensor_release(range);
  if (op->rc != AX_OK) {
    snprintf(op->msg, sizeof op->msg, "%s", ax_errmsg());
    if (op->rc != AX_EPEERDOWN)
      axi_coll_set_failed(g, op->rc, NULL);
    axi_coll_notify_abort(g); /* the others need not wait for this member */
  }
  free(host);
  axi_coll_check_sends(g);
}

static void *comm_main(void *arg) {
  ax_coll_group *g = arg;
  pthread_mutex_lock(&g->mu);
  for (;;) {
    while (!g->qhead && !g->stop)
      pthread_cond_wait(&g->cv, &g->mu);
    if (!g->qhead)
      break;
    ax_coll_op *op = g->qhead;
    g->qhead = op->next;
    if (!g->qhead)
      g->qtail = NULL;
    pthread_mutex_unlock(&g->mu);
    run_op(g, op);
    pthread_mutex_lock(&g->mu);
    op->done = 1;
    if (op->abandoned)
      op_free(op);
    pthread_cond_broadcast(&g->cv);
  }
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

/* This node's rank in members: `rank` when given (members[rank] must be
 * the node's name), else the index of its name, which must appear once;
 * sets g->shared when a name repeats. */
static int own_rank(ax_coll_group *g, const char *const *members, int rank) {
  const char *self = ax_node_name(g->node);
  int found = -1, times = 0;
  for (int i = 0; i < g->size; i++) {
    for (int j = 0; j < i && !g->shared; j++)
      g->shared = strcmp(members[i], members[j]) == 0;
    if (strcmp(members[i], self) == 0 && !times++)
      found = i;
  }
  if (rank >= g->size || (rank >= 0 && strcmp(members[rank], self)))
    return ax_seterr(AX_EINVAL, "ax_coll_group_new: rank %d of %d is not %s",
                     rank, g->size, self);
  if (rank < 0 && times != 1)
    return ax_seterr(AX_EINVAL,
                     times ? "ax_coll_group_new: %s holds %d ranks (give its "
                             "rank)"
                           : "ax_coll_group_new: %s is not a member",
                     self, times);
  g->rank = rank >= 0 ? rank : found;
  char last[AXI_COLL_TAG + 16]; /* the longest tag on the wire */
  if (snprintf(last, sizeof last, "%s@%d", g->tag, g->size - 1) >= AXI_COLL_TAG)
    return ax_seterr(AX_EINVAL, "ax_coll_group_new: tag %s too long", g->tag);
  axi_coll_tag_of(g, g->rank, g->rx_tag);
  return AX_OK;
}

int ax_coll_group_new(ax_node *n, const char *tag, int n_members,
                      const char *const *members, int64_t timeout_ms,
                      ax_coll_group **out) {
  return ax_coll_group_new_rank(n, tag, n_members, members, -1, timeout_ms,
                                out);
}

int ax_coll_group_new_rank(ax_node *n, const char *tag, int n_members,
                           const char *const *members, int rank,
                           int64_t timeout_ms, ax_coll_group **out) {
  *out = NULL;
  if (!n || !tag || strlen(tag) + 8 >= AXI_COLL_TAG || n_members < 1 ||
      !members)
    return ax_seterr(AX_EINVAL, "ax_coll_group_new: bad arguments");
  for (int i = 0; i < n_members; i++)
    if (!members[i])
      return ax_seterr(AX_EINVAL, "ax_coll_group_new: member %d unnamed", i);
  axi_coll_box *box = axi_coll_box_find(n);
  if (!box)
    return ax_seterr(AX_ESTATE, "ax_coll_group_new: ax_coll_init not called");
  ax_coll_group *g = calloc(1, sizeof *g);
  if (!g || !(g->members = calloc(n_members, sizeof(char *)))) {
    free(g);
    return AX_ENOMEM;
  }
  g->node = n;
  g->box = box;
  snprintf(g->tag, sizeof g->tag, "%s", tag);
  snprintf(g->base, sizeof g->base, "%s", tag);
  g->size = n_members;
  g->rank = -1;
  g->order = AX_SUM_CHAIN;
  g->timeout_ms = timeout_ms > 0 ? timeout_ms : 60000;
  for (int i = 0; i < n_members; i++)
    g->members[i] = strdup(members[i]);
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  int err = own_rank(g, members, rank);
  if (err != AX_OK) {
    ax_coll_group_free(g);
    return err;
  }
  if (pthread_create(&g->th, NULL, comm_main, g) != 0) {
    ax_coll_group_free(g);
    return ax_seterr(AX_ENOMEM, "ax_coll_group_new: no thread");
  }
  g->started = 1;
  *out = g;
  return AX_OK;
}

int ax_coll_group_shrink(ax_coll_group *g, ax_coll_group **out) {
  const char **live = calloc(g->size, sizeof(char *));
  if (!live)
    return AX_ENOMEM;
  int k = 0, rank = -1;
  for (int r = 0; r < g->size; r++) {
    const char *m = g->members[r];
    int dead = strcmp(m, g->failed_peer) == 0 ||
               (r != g->rank && ax_node_peer_is_down(g->node, m));
    if (!dead && r == g->rank)
      rank = k;
    if (!dead)
      live[k++] = m;
  }
  char tag[AXI_COLL_TAG + 16];
  snprintf(tag, sizeof tag, "%s.e%d", g->base, g->epoch + 1);
  int rc = rank < 0 ? AX_EINVAL
                    : ax_coll_group_new_rank(g->node, tag, k, live, rank,
                                             g->timeout_ms, out);
  free(live);
  if (rank < 0)
    return ax_seterr(AX_EPEERDOWN, "shrink %s: this node is not a survivor",
                     g->tag);
  if (rc == AX_OK) {
    snprintf((*out)->base, sizeof(*out)->base, "%s", g->base);
    (*out)->epoch = g->epoch + 1;
    (*out)->order = g->order;
  }
  return rc;
}

void ax_coll_group_free(ax_coll_group *g) {
  if (!g)
    return;
  if (g->started) {
    pthread_mutex_lock(&g->mu);
    g->stop = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->th, NULL); /* each queued op is bounded by its deadline */
  }
  for (int i = 0; i < g->nsends; i++) {
    ax_future_wait(g->sends[i], g->timeout_ms + 1000);
    ax_future_release(g->sends[i]);
  }
  axi_coll_drop_msgs(g->box, g->rx_tag);
  for (int i = 0; i < g->size; i++)
    free(g->members[i]);
  free(g->members);
  free(g->sends);
  free(g->send_to);
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  free(g);
}

void ax_coll_group_set_order(ax_coll_group *g, ax_sum_order order) {
  if (g) /* before any operation: the submit's lock publishes it */
    g->order = order == AX_SUM_TREE ? AX_SUM_TREE : AX_SUM_CHAIN;
}

int ax_coll_group_size(const ax_coll_group *g) { return g->size; }
int ax_coll_group_rank(const ax_coll_group *g) { return g->rank; }
const char *ax_coll_group_member(const ax_coll_group *g, int rank) {
  return rank >= 0 && rank < g->size ? g->members[rank] : NULL;
}
const char *ax_coll_failed_peer(const ax_coll_group *g) {
  return g->failed_peer[0] ? g->failed_peer : NULL;
}

/* Queues op on its group's thread (collective_ops.c builds the ops). */
int axi_coll_submit(ax_coll_op *op) {
  ax_coll_group *g = op->g;
  pthread_mutex_lock(&g->mu);
  op->seq = g->next_seq++;
  if (g->qtail)
    g->qtail->next = op;
  else
    g->qhead = op;
  g->qtail = op;
  pthread_cond_signal(&g->cv);
  pthread_mutex_unlock(&g->mu);
  return AX_OK;
}

int ax_coll_wait(ax_coll_op *op, int64_t timeout_ms) {
  ax_coll_group *g = op->g;
  int64_t end =
      ax_clock_ms() + (timeout_ms > 0 ? timeout_ms : g->timeout_ms + 1000);
  pthread_mutex_lock(&g->mu);
  while (!op->done && ax_clock_ms() < end) {
    struct timespec ts = ax_clock_after_ms(CLOCK_REALTIME, 1000);
    pthread_cond_timedwait(&g->cv, &g->mu, &ts);
  }
  if (!op->done) {
    op->abandoned = 1; /* the thread frees it */
    if (!g->failed_rc)
      g->failed_rc = AX_ETIMEOUT;
    pthread_mutex_unlock(&g->mu);
    return ax_seterr(AX_ETIMEOUT, "collective %s: wait timed out", g->tag);
  }
  pthread_mutex_unlock(&g->mu);
  int rc = op->rc;
  if (rc != AX_OK)
    ax_seterr(rc, "%s", op->msg);
  op_free(op);
  return rc;
}
