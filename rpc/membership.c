/* The membership as this node sees it: its own name, rank and address, the
 * members by rank and name, the master's name, and each member's state
 * (down or not, its incarnation). Look-ups only: the membership is
 * recorded by rendezvous.c, peers' states by peer.c. */
#include <string.h>

#include "axon/rpc/node-impl.h"

const char *ax_node_name(const ax_node *n) { return n->name; }
int ax_node_rank(const ax_node *n) {
  return __atomic_load_n(&n->rank, __ATOMIC_ACQUIRE);
}
int ax_node_world_size(const ax_node *n) { return n->world_size; }
const char *ax_node_address(const ax_node *n) { return n->addr; }
uint64_t ax_node_incarnation(const ax_node *n) { return n->incarnation; }

int ax_node_member(const ax_node *n, int rank, const char **name) {
  ax_node *m = (ax_node *)n; /* the lock only */
  pthread_mutex_lock(&m->mu);
  const char *s = rank >= 0 && rank < n->nmembers ? n->member_name[rank] : NULL;
  pthread_mutex_unlock(&m->mu);
  if (!s)
    return ax_seterr(AX_ENOTFOUND, "node: no member with rank %d", rank);
  *name = s;
  return AX_OK;
}

int ax_node_rank_of(const ax_node *n, const char *name, int *rank) {
  ax_node *m = (ax_node *)n; /* the lock only */
  int found = -1;
  pthread_mutex_lock(&m->mu);
  for (int i = 0; i < n->nmembers && found < 0; i++)
    if (n->member_name[i] && !strcmp(n->member_name[i], name))
      found = i;
  pthread_mutex_unlock(&m->mu);
  if (found < 0)
    return ax_seterr(AX_ENOTFOUND, "node: no member named %s", name);
  *rank = found;
  return AX_OK;
}

const char *ax_node_master_name(const ax_node *n) { return n->master_name; }

int ax_node_peer_is_down(ax_node *n, const char *name) {
  axi_peer *p = axi_peer_find(n, name);
  return p && __atomic_load_n(&p->state, __ATOMIC_RELAXED) == AXI_PEER_DOWN;
}

int ax_node_member_incarnation(ax_node *n, const char *name, uint64_t *inc) {
  if (!strcmp(name, n->name)) {
    *inc = n->incarnation;
    return AX_OK;
  }
  axi_peer *p = axi_peer_find(n, name);
  if (!p)
    return ax_seterr(AX_ENOTFOUND, "no member named %s", name);
  pthread_mutex_lock(&p->mu);
  *inc = p->incarnation;
  pthread_mutex_unlock(&p->mu);
  return *inc ? AX_OK
              : ax_seterr(AX_ENOTFOUND, "%s's incarnation is not known yet",
                          name);
}

int ax_node_member_alive_as(ax_node *n, const char *name, uint64_t inc) {
  uint64_t now = 0;
  if (ax_node_peer_is_down(n, name))
    return 0;
  return !inc ||
         (ax_node_member_incarnation(n, name, &now) == AX_OK && now == inc);
}
