/* RRefs inside value lists: the extension codec. Encoding forks the
 * reference (a new fork id; the owner records it at once, a user counts a
 * pending child); decoding makes the receiving handle and queues the fork
 * registration and accept messages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/rref/rref-impl.h"

/* ---- value codec --------------------------------------------------------- */
typedef struct wire_rref {
  uint64_t id, fork, parent_fork;
  uint32_t type, pad;
  char owner[AXI_NAME_MAX], parent[AXI_NAME_MAX];
} wire_rref;

static int ext_encode(void *obj, void **out, size_t *len) {
  ax_rref *r = obj;
  axi_rctx *rc = r->rc;
  wire_rref *w = calloc(1, sizeof *w);
  if (!w)
    return AX_ENOMEM;
  w->id = r->id;
  w->fork = axi_rref_new_id(rc);
  w->type = (uint32_t)r->type;
  snprintf(w->owner, sizeof w->owner, "%s", r->owner);
  snprintf(w->parent, sizeof w->parent, "%s", rc->name);
  pthread_mutex_lock(&rc->mu);
  if (r->is_owner) {
    axi_owned *e = r->entry;
    axi_owned_add_fork(e, w->fork, -1);
    for (int i = 0; i < e->nforks; i++) /* swept unless its holder accepts */
      if (e->forks[i].id == w->fork)
        e->forks[i].deadline = axi_owner_fork_deadline(rc);
  } else {
    w->parent_fork = r->fork_id;
    axi_child_add(rc, r, w->fork);
  }
  pthread_mutex_unlock(&rc->mu);
  *out = w;
  *len = sizeof *w;
  return AX_OK;
}

/* A payload names its owner and its parent (the node that sent it). Once
 * this node has the membership, both must be members (or this node): a
 * payload naming strangers would queue protocol messages to nobody and
 * leave records behind. Before the membership nothing is known to check. */
static int check_names(axi_rctx *rc, const wire_rref *w, const char *from) {
  if (ax_node_rank(rc->node) < 0)
    return AX_OK;
  const char *names[2] = {w->owner, w->parent};
  for (int i = 0; i < 2; i++) {
    int rank;
    if (strcmp(names[i], rc->name) &&
        ax_node_rank_of(rc->node, names[i], &rank) != AX_OK)
      return ax_seterr(AX_EMALFORMED,
                       "rref: a payload from %s names %s '%s', not a member "
                       "of this world",
                       from ? from : "?", i ? "parent" : "owner", names[i]);
  }
  return AX_OK;
}

static int ext_decode(const void *data, size_t len, const char *from,
                      void **obj) {
  axi_rctx *rc = axi_rctx_get();
  if (!rc)
    return ax_seterr(AX_ESTATE, "rref: no node of this process is initialised");
  if (len != sizeof(wire_rref))
    return ax_seterr(AX_EMALFORMED, "rref: payload of %zu bytes", len);
  wire_rref w;
  memcpy(&w, data, sizeof w);
  w.owner[AXI_NAME_MAX - 1] = w.parent[AXI_NAME_MAX - 1] = 0;
  if (w.type > AX_RREF_OBJECT)
    return ax_seterr(AX_EMALFORMED, "rref: bad type %u", w.type);
  AX_TRY(check_names(rc, &w, from));
  ax_rref *r = NULL;
  pthread_mutex_lock(&rc->mu);
  if (!strcmp(w.owner, rc->name)) {
    axi_owned *e = axi_owned_find(rc, w.id, rc->nowned < AXI_OWNED_MAX);
    if (!e && rc->nowned >= AXI_OWNED_MAX) {
      pthread_mutex_unlock(&rc->mu);
      return ax_seterr(AX_ETOOBIG,
                       "rref: %ld RRefs owned here already; a payload from "
                       "%s naming another is refused",
                       rc->nowned, from ? from : "?");
    }
    if (e) {
      if (e->state == AXI_OWN_PENDING)
        e->type = (int)w.type;
      r = axi_owner_handle(rc, e);
    }
    if (r && strcmp(w.parent, rc->name))
      axi_pmsg_push(rc, AXI_MSG_ACCEPT, w.parent, w.parent_fork, w.fork, NULL);
    else if (r && e)
      axi_owned_del_fork(e, w.fork);
  } else {
    r = axi_user_new(rc, w.id, w.fork, (int)w.type, w.owner);
    if (r) {
      snprintf(r->parent, sizeof r->parent, "%s", w.parent);
      r->parent_fork = w.parent_fork;
      if (!strcmp(w.parent, w.owner)) {
        /* The owner recorded the fork when sending; tell it the holder. */
        r->confirmed = r->known = 1;
        axi_pmsg_push(rc, AXI_MSG_ACCEPT, w.owner, 0, w.fork, NULL);
      } else {
        r->busy++;
        axi_pmsg_push(rc, AXI_MSG_FORK, w.owner, w.id, w.fork, r);
      }
    }
  }
  pthread_mutex_unlock(&rc->mu);
  if (!r)
    return ax_seterr(AX_ENOMEM, "rref: no memory");
  *obj = r;
  return AX_OK;
}

static void ext_retain(void *obj) { ax_rref_retain(obj); }
static void ext_release(void *obj) { ax_rref_release(obj); }

const ax_value_ext_ops axi_rref_ext_ops = {
    /* .name = */ "rref",
    /* .encode = */ ext_encode,
    /* .decode = */ ext_decode,
    /* .retain = */ ext_retain,
    /* .release = */ ext_release,
};

int ax_values_add_rref(ax_values *v, ax_rref *r) {
  if (!r)
    return ax_seterr(AX_EINVAL, "values: NULL rref");
  return ax_values_add_ext(v, AX_VALUE_EXT_RREF, r);
}

int ax_values_get_rref(const ax_values *v, size_t i, ax_rref **out) {
  void *o;
  AX_TRY(ax_values_get_ext(v, i, AX_VALUE_EXT_RREF, &o));
  *out = o;
  return AX_OK;
}
