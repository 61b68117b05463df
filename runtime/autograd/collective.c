/* Collectives: the per-node mailbox behind "axon.coll.put", a group's
 * failure state, and the bounded send/receive primitives. The ring
 * algorithms are in collective_ring.c, groups and their communication
 * thread in collective_group.c, the public operations in
 * collective_ops.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/builtin-impl.h"
#include "axon/rpc/rpc.h"
#include "axon/runtime/autograd/collective-impl.h"

static pthread_mutex_t g_boxes_mu = PTHREAD_MUTEX_INITIALIZER;
static axi_coll_box *g_boxes;

axi_coll_box *axi_coll_box_find(ax_node *n) {
  pthread_mutex_lock(&g_boxes_mu);
  axi_coll_box *b = g_boxes;
  while (b && b->node != n)
    b = b->next_box;
  pthread_mutex_unlock(&g_boxes_mu);
  return b;
}

/* "axon.coll.put" [tag, seq, step, tensor] -> []: stores the message. Runs
 * inline on the transport thread; never blocks beyond the box lock. */
static int h_put(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                 void *user) {
  (void)ctx;
  (void)out;
  axi_coll_box *box = user;
  const char *tag;
  int64_t seq, step;
  ax_tensor *t;
  AX_TRY(ax_values_get_str(args, 0, &tag));
  AX_TRY(ax_values_get_i64(args, 1, &seq));
  AX_TRY(ax_values_get_i64(args, 2, &step));
  AX_TRY(ax_values_get_tensor(args, 3, &t));
  if (t->dtype != AX_F32 || strlen(tag) >= AXI_COLL_TAG)
    return ax_seterr(AX_EBADARG, "axon.coll.put: bad tag or tensor type");
  axi_coll_msg *m = calloc(1, sizeof *m);
  if (!m)
    return AX_ENOMEM;
  strcpy(m->tag, tag);
  m->seq = seq;
  m->step = step;
  m->t = ax_tensor_retain(t);
  pthread_mutex_lock(&box->mu);
  m->next = box->head;
  box->head = m;
  pthread_cond_broadcast(&box->cv);
  pthread_mutex_unlock(&box->mu);
  return AX_OK;
}

int ax_coll_init(ax_node *n) {
  if (!n)
    return ax_seterr(AX_EINVAL, "ax_coll_init: no node");
  if (axi_coll_box_find(n))
    return AX_OK;
  axi_coll_box *b = calloc(1, sizeof *b);
  if (!b)
    return AX_ENOMEM;
  b->node = n;
  pthread_mutex_init(&b->mu, NULL);
  pthread_cond_init(&b->cv, NULL);
  int rc = axi_register_ex(n, AXI_COLL_FN, h_put, b, 1);
  if (rc != AX_OK) {
    free(b);
    return rc;
  }
  pthread_mutex_lock(&g_boxes_mu);
  b->next_box = g_boxes;
  g_boxes = b;
  pthread_mutex_unlock(&g_boxes_mu);
  return AX_OK;
}

void axi_coll_drop_msgs(axi_coll_box *b, const char *tag) {
  pthread_mutex_lock(&b->mu);
  axi_coll_msg **pp = &b->head;
  while (*pp) {
    axi_coll_msg *m = *pp;
    if (!tag || strcmp(m->tag, tag) == 0) {
      *pp = m->next;
      ax_tensor_release(m->t);
      free(m);
    } else {
      pp = &m->next;
    }
  }
  pthread_mutex_unlock(&b->mu);
}

void ax_coll_fini(ax_node *n) {
  pthread_mutex_lock(&g_boxes_mu);
  axi_coll_box **pp = &g_boxes, *b = NULL;
  while (*pp && (*pp)->node != n)
    pp = &(*pp)->next_box;
  if (*pp) {
    b = *pp;
    *pp = b->next_box;
  }
  pthread_mutex_unlock(&g_boxes_mu);
  if (!b)
    return;
  axi_coll_drop_msgs(b, NULL);
  pthread_mutex_destroy(&b->mu);
  pthread_cond_destroy(&b->cv);
  free(b);
}

void axi_coll_tag_of(const ax_coll_group *g, int rank, char out[AXI_COLL_TAG]) {
  char t[AXI_COLL_TAG + 16]; /* the group's creation checked that it fits */
  if (g->shared)
    snprintf(t, sizeof t, "%s@%d", g->tag, rank);
  else
    snprintf(t, sizeof t, "%s", g->tag);
  size_t n = strnlen(t, AXI_COLL_TAG - 1);
  memcpy(out, t, n);
  out[n] = 0;
}

/* ---- failure state ------------------------------------------------------- */

void axi_coll_set_failed(ax_coll_group *g, int rc, const char *peer) {
  pthread_mutex_lock(&g->mu);
  if (!g->failed_rc) {
    g->failed_rc = rc;
    snprintf(g->failed_peer, sizeof g->failed_peer, "%s", peer ? peer : "");
  }
  pthread_mutex_unlock(&g->mu);
}

/* Reaps answered sends; returns the first failure (and records it). */
int axi_coll_check_sends(ax_coll_group *g) {
  int i = 0, bad = AX_OK;
  while (i < g->nsends) {
    ax_future *f = g->sends[i];
    if (!ax_future_is_done(f)) {
      i++;
      continue;
    }
    int rc = ax_future_err(f);
    if (rc != AX_OK && bad == AX_OK) {
      bad = rc;
      axi_coll_set_failed(g, rc, g->members[g->send_to[i]]);
      ax_seterr(rc, "collective %s: send to %s failed: %s", g->tag,
                g->members[g->send_to[i]], ax_future_errmsg(f));
    }
    ax_future_release(f);
    g->sends[i] = g->sends[g->nsends - 1];
    g->send_to[i] = g->send_to[g->nsends - 1];
    g->nsends--;
  }
  return bad;
}

/* AX_EPEERDOWN naming the first member that is down, else AX_OK. */
static int check_members(ax_coll_group *g) {
  for (int r = 0; r < g->size; r++) {
    if (r != g->rank && ax_node_peer_is_down(g->node, g->members[r])) {
      axi_coll_set_failed(g, AX_EPEERDOWN, g->members[r]);
      return ax_seterr(AX_EPEERDOWN, "collective %s: member %s is down", g->tag,
                       g->members[r]);
    }
  }
  return AX_OK;
}

/* Tells every other member that this group failed here (once): a message
 * (seq -1, step -(rank + 1)) that fails their waits at once, instead of
 * leaving them to wait for this member until their timeout. Fire and
 * forget: a member that is gone fails its send. */
void axi_coll_notify_abort(ax_coll_group *g) {
  pthread_mutex_lock(&g->mu);
  int done = g->notified;
  g->notified = 1;
  pthread_mutex_unlock(&g->mu);
  if (done)
    return;
  int64_t one = 1;
  ax_tensor *t = ax_tensor_new(AX_F32, 1, &one, AX_CPU);
  for (int r = 0; t && r < g->size; r++) {
    if (r == g->rank)
      continue;
    ax_values *v = ax_values_new();
    ax_future *f = NULL;
    ax_call_opts o = {.timeout_ms = 5000};
    char tag[AXI_COLL_TAG];
    axi_coll_tag_of(g, r, tag);
    if (v && ax_values_add_str(v, tag) == AX_OK &&
        ax_values_add_i64(v, -1) == AX_OK &&
        ax_values_add_i64(v, -(int64_t)(g->rank + 1)) == AX_OK &&
        ax_values_add_tensor(v, t) == AX_OK)
      ax_rpc_async(g->node, g->members[r], AXI_COLL_FN, v, &o, &f);
    ax_values_free(v);
    ax_future_release(f);
  }
  ax_tensor_release(t);
}

/* AX_ECANCELLED naming the member whose group failed and told this one
 * (axi_coll_notify_abort), else AX_OK. */
static int check_remote_abort(ax_coll_group *g) {
  axi_coll_box *b = g->box;
  int64_t from = 0;
  pthread_mutex_lock(&b->mu);
  for (axi_coll_msg *m = b->head; m && !from; m = m->next)
    if (m->seq == -1 && m->step < 0 && m->step >= -(int64_t)g->size &&
        !strcmp(m->tag, g->rx_tag)) /* a notice from a member of this group */
      from = -m->step;
  pthread_mutex_unlock(&b->mu);
  if (!from)
    return AX_OK;
  const char *who = g->members[from - 1];
  pthread_mutex_lock(&g->mu);
  if (!g->failed_rc) {
    g->failed_rc = AX_ECANCELLED;
    g->notified = 1; /* the failure came from there: no echo */
    snprintf(g->abort_why, sizeof g->abort_why,
             "member %s ended the group (its operation failed or its owner "
             "ended it)",
             who);
  }
  pthread_mutex_unlock(&g->mu);
  return ax_seterr(AX_ECANCELLED, "collective %s: member %s ended the group",
                   g->tag, who);
}

/* AX_ECANCELLED if ax_coll_group_abort ended the group, else AX_OK. */
static int check_aborted(ax_coll_group *g) {
  pthread_mutex_lock(&g->mu);
  int rc = g->failed_rc == AX_ECANCELLED ? AX_ECANCELLED : AX_OK;
  pthread_mutex_unlock(&g->mu);
  return rc == AX_OK ? AX_OK
                     : ax_seterr(rc, "collective %s: %s", g->tag, g->abort_why);
}

void ax_coll_group_abort(ax_coll_group *g, const char *why) {
  if (!g)
    return;
  pthread_mutex_lock(&g->mu);
  if (!g->failed_rc) {
    g->failed_rc = AX_ECANCELLED;
    snprintf(g->abort_why, sizeof g->abort_why, "%s",
             why ? why : "aborted by its owner");
  }
  pthread_mutex_unlock(&g->mu);
  pthread_mutex_lock(&g->box->mu);
  pthread_cond_broadcast(&g->box->cv);
  pthread_mutex_unlock(&g->box->mu);
  axi_coll_notify_abort(g);
}

int axi_coll_send(ax_coll_group *g, int to, int64_t seq, int64_t step,
                  const float *src, size_t n) {
  if (g->nsends == g->capsends) {
    int cap = g->capsends ? 2 * g->capsends : 16;
    ax_future **s = realloc(g->sends, cap * sizeof *s);
    if (s)
      g->sends = s;
    int *st = realloc(g->send_to, cap * sizeof *st);
    if (st)
      g->send_to = st;
    if (!s || !st)
      return AX_ENOMEM;
    g->capsends = cap;
  }
  int64_t shape = (int64_t)n;
  ax_tensor *t = ax_tensor_new(AX_F32, 1, &shape, AX_CPU);
  if (!t)
    return AX_ENOMEM;
  memcpy(t->data, src, n * sizeof(float));
  ax_values *v = ax_values_new();
  int rc = v ? AX_OK : AX_ENOMEM;
  char tag[AXI_COLL_TAG];
  axi_coll_tag_of(g, to, tag);
  if (rc == AX_OK && (rc = ax_values_add_str(v, tag)) == AX_OK &&
      (rc = ax_values_add_i64(v, seq)) == AX_OK &&
      (rc = ax_values_add_i64(v, step)) == AX_OK)
    rc = ax_values_add_tensor(v, t);
  ax_tensor_release(t);
  ax_future *f = NULL;
  if (rc == AX_OK) {
    ax_call_opts o = {.timeout_ms = g->timeout_ms};
    rc = ax_rpc_async(g->node, g->members[to], AXI_COLL_FN, v, &o, &f);
  }
  ax_values_free(v);
  if (rc != AX_OK) {
    if (rc == AX_EPEERDOWN)
      axi_coll_set_failed(g, rc, g->members[to]);
    return rc;
  }
  g->sends[g->nsends] = f;
  g->send_to[g->nsends++] = to;
  return AX_OK;
}

static axi_coll_msg *take(axi_coll_box *b, const char *tag, int64_t seq,
                          int64_t step) {
  for (axi_coll_msg **pp = &b->head; *pp; pp = &(*pp)->next) {
    axi_coll_msg *m = *pp;
    if (m->seq == seq && m->step == step && strcmp(m->tag, tag) == 0) {
      *pp = m->next;
      return m;
    }
  }
  return NULL;
}

int axi_coll_recv(ax_coll_group *g, int64_t seq, int64_t step, float *dst,
                  size_t n, int add, int64_t deadline_ms) {
  axi_coll_box *b = g->box;
  axi_coll_msg *m = NULL;
  for (;;) {
    pthread_mutex_lock(&b->mu);
    m = take(b, g->rx_tag, seq, step);
    if (!m) {
      /* re-check liveness every 20 ms */
      struct timespec ts = ax_clock_after_ms(CLOCK_REALTIME, 20);
      pthread_cond_timedwait(&b->cv, &b->mu, &ts);
      m = take(b, g->rx_tag, seq, step);
    }
    pthread_mutex_unlock(&b->mu);
    if (m)
      break;
    AX_TRY(axi_coll_check_sends(g));
    AX_TRY(check_members(g));
    AX_TRY(check_aborted(g));
    AX_TRY(check_remote_abort(g));
    if (ax_clock_ms() > deadline_ms) {
      axi_coll_set_failed(g, AX_ETIMEOUT, NULL);
      return ax_seterr(AX_ETIMEOUT, "collective %s: no message %lld/%lld",
                       g->tag, (long long)seq, (long long)step);
    }
  }
  int rc = AX_OK;
  size_t mn = ax_tensor_numel(m->t);
  float *src = ax_f32(m->t), *tmp = NULL;
  if (mn != n) {
    rc = ax_seterr(AX_ESHAPE, "collective %s: got %zu elements, want %zu",
                   g->tag, mn, n);
  } else if (m->t->device.type != AX_DEV_CPU) {
    tmp = malloc(n * sizeof(float) + 1);
    rc = tmp ? ax_tensor_read(m->t, tmp, n * sizeof(float)) : AX_ENOMEM;
    src = tmp;
  }
  if (rc == AX_OK) {
    if (add)
      for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
    else
      memcpy(dst, src, n * sizeof(float));
  }
  free(tmp);
  ax_tensor_release(m->t);
  free(m);
  return rc;
}
