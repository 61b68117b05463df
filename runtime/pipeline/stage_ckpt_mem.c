/* In-memory checkpoints, the agents' side (checkpoint.h,
 * ax_pipe_checkpoint_memory): a store of checkpoint files per node, kept
 * under the name of the coordinator they belong to ("owner") and a key
 * ("stage-SS"), and the stage methods that fill it and load from it.
 *
 * A stage's "ckpt_mem_save" keeps its file in its own agent's store and
 * sends a copy to its neighbour's agent ("pipe.mem_keep"), so that losing
 * one agent loses no stage's copy. "ckpt_mem_load" takes the file from the
 * store of the agent the coordinator names ("pipe.mem_fetch"; this agent's
 * own store when it names itself), checks its size and SHA-256 and loads
 * it. An owner's copies go with "pipe.mem_forget" (the end of its run);
 * a later copy under the same owner and key replaces the earlier one, and
 * an owner keeps at most AXP_MEM_KEYS of them on one node. Members are
 * trusted (the world's token or certificates): any member may keep or
 * fetch. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rref/rref.h"
#include "runtime/pipeline/coordinator.h"
#include "runtime/pipeline/stage_host-impl.h"

#define AXP_MEM_KEYS (2 * AX_PIPE_MAX_STAGES)

typedef struct mem_entry {
  ax_node *node;
  char owner[128], key[64];
  uint8_t *buf;
  size_t len;
  char sha[2 * AX_SHA256_LEN + 1];
  struct mem_entry *next;
} mem_entry;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static mem_entry *g_store;

static int name_ok(const char *s, size_t cap) {
  return *s && strlen(s) < cap;
}

/* Keeps buf (taken) as owner's key on n, replacing an earlier copy. */
static int keep(ax_node *n, const char *owner, const char *key, uint8_t *buf,
                size_t len, const char *sha) {
  if (!name_ok(owner, sizeof g_store->owner) ||
      !name_ok(key, sizeof g_store->key) || strlen(sha) != 2 * AX_SHA256_LEN) {
    free(buf);
    return ax_seterr(AX_EINVAL, "pipe.mem_keep: bad owner, key or checksum");
  }
  pthread_mutex_lock(&g_mu);
  int count = 0;
  mem_entry *e = NULL;
  for (mem_entry *x = g_store; x; x = x->next)
    if (x->node == n && !strcmp(x->owner, owner)) {
      count++;
      if (!strcmp(x->key, key))
        e = x;
    }
  if (!e && count >= AXP_MEM_KEYS) {
    pthread_mutex_unlock(&g_mu);
    free(buf);
    return ax_seterr(AX_ETOOBIG, "pipe.mem_keep: %s keeps %d copies on %s "
                     "already", owner, count, ax_node_name(n));
  }
  if (!e && !(e = calloc(1, sizeof *e))) {
    pthread_mutex_unlock(&g_mu);
    free(buf);
    return AX_ENOMEM;
  }
  if (!e->node) { /* new */
    e->node = n;
    snprintf(e->owner, sizeof e->owner, "%s", owner);
    snprintf(e->key, sizeof e->key, "%s", key);
    e->next = g_store;
    g_store = e;
  }
  free(e->buf);
  e->buf = buf;
  e->len = len;
  snprintf(e->sha, sizeof e->sha, "%s", sha);
  pthread_mutex_unlock(&g_mu);
  return AX_OK;
}

/* A copy of owner's key on n (*buf malloc'd); AX_ENOTFOUND if none. */
static int fetch(ax_node *n, const char *owner, const char *key,
                 uint8_t **buf, size_t *len, char *sha) {
  pthread_mutex_lock(&g_mu);
  mem_entry *e = g_store;
  while (e && !(e->node == n && !strcmp(e->owner, owner) &&
                !strcmp(e->key, key)))
    e = e->next;
  int err = AX_OK;
  if (!e)
    err = ax_seterr(AX_ENOTFOUND, "%s holds no in-memory checkpoint %s of %s",
                    ax_node_name(n), key, owner);
  else if (!(*buf = malloc(e->len ? e->len : 1)))
    err = AX_ENOMEM;
  if (err == AX_OK) {
    memcpy(*buf, e->buf, e->len);
    *len = e->len;
    snprintf(sha, 2 * AX_SHA256_LEN + 1, "%s", e->sha);
  }
  pthread_mutex_unlock(&g_mu);
  return err;
}

/* Drops owner's copies on n (every owner's with NULL: the node goes). */
static void forget(ax_node *n, const char *owner) {
  pthread_mutex_lock(&g_mu);
  mem_entry *gone = NULL;
  for (mem_entry **pp = &g_store; *pp;) {
    mem_entry *e = *pp;
    if (e->node == n && (!owner || !strcmp(e->owner, owner))) {
      *pp = e->next;
      e->next = gone;
      gone = e;
    } else {
      pp = &e->next;
    }
  }
  pthread_mutex_unlock(&g_mu);
  while (gone) {
    mem_entry *e = gone;
    gone = e->next;
    free(e->buf);
    free(e);
  }
}

/* "pipe.mem_keep" [owner, key, size, sha256 hex, file (axi_ck_pack)]. */
static int h_keep(ax_call_ctx *cc, const ax_values *args, ax_values *out,
                  void *user) {
  const char *owner, *key, *sha;
  int64_t size;
  ax_tensor *t;
  uint8_t *buf;
  AX_TRY(ax_values_get_str(args, 0, &owner));
  AX_TRY(ax_values_get_str(args, 1, &key));
  AX_TRY(ax_values_get_i64(args, 2, &size));
  AX_TRY(ax_values_get_str(args, 3, &sha));
  AX_TRY(ax_values_get_tensor(args, 4, &t));
  if (size < 0)
    return ax_seterr(AX_EINVAL, "pipe.mem_keep: size %lld", (long long)size);
  AX_TRY(axi_ck_unpack(t, (size_t)size, &buf));
  char hex[2 * AX_SHA256_LEN + 1];
  int err = ax_sha256_hex(buf, (size_t)size, hex);
  if (err == AX_OK && strcmp(hex, sha))
    err = ax_seterr(AX_EMALFORMED, "pipe.mem_keep: %s of %s arrived damaged",
                    key, owner);
  if (err != AX_OK) {
    free(buf);
    return err;
  }
  return keep(ax_call_node(cc), owner, key, buf, (size_t)size, sha);
}

/* Adds [size, sha256 hex, file] to out. */
static int put_file(ax_values *out, const uint8_t *buf, size_t len,
                    const char *sha) {
  AX_TRY(ax_values_add_i64(out, (int64_t)len));
  AX_TRY(ax_values_add_str(out, sha));
  ax_tensor *t = axi_ck_pack(buf, len);
  int err = t ? ax_values_add_tensor(out, t) : AX_ENOMEM;
  ax_tensor_release(t);
  return err;
}

/* "pipe.mem_fetch" [owner, key] -> [size, sha256 hex, file]. */
static int h_fetch(ax_call_ctx *cc, const ax_values *args, ax_values *out,
                   void *user) {
  const char *owner, *key;
  AX_TRY(ax_values_get_str(args, 0, &owner));
  AX_TRY(ax_values_get_str(args, 1, &key));
  uint8_t *buf = NULL;
  size_t len = 0;
  char sha[2 * AX_SHA256_LEN + 1];
  AX_TRY(fetch(ax_call_node(cc), owner, key, &buf, &len, sha));
  int err = put_file(out, buf, len, sha);
  free(buf);
  return err;
}

/* "pipe.mem_forget" []: the caller's copies on this node go. */
static int h_forget(ax_call_ctx *cc, const ax_values *args, ax_values *out,
                    void *user) {
  const char *owner = ax_call_caller(cc);
  forget(ax_call_node(cc), owner ? owner : ax_node_name(ax_call_node(cc)));
  return AX_OK;
}

static void node_gone(ax_node *n, void *user) {
  (void)user;
  forget(n, NULL);
}

int axp_mem_store_register(ax_node *n) {
  AX_TRY(ax_node_on_destroy(n, node_gone, NULL));
  AX_TRY(ax_rpc_register(n, "pipe.mem_keep", h_keep, NULL));
  AX_TRY(ax_rpc_register(n, "pipe.mem_fetch", h_fetch, NULL));
  return ax_rpc_register(n, "pipe.mem_forget", h_forget, NULL);
}

/* The caller of a stage method: the coordinator that owns the copies. */
static const char *owner_of(ax_call_ctx *cc) {
  const char *c = ax_call_caller(cc);
  return c ? c : ax_node_name(ax_call_node(cc));
}

/* "ckpt_mem_save" [key, peer]: keeps the stage's file here and on agent
 * peer ("" or this agent: here only); returns [size, sha256 hex]. */
int axp_host_ckpt_mem_save(ax_call_ctx *cc, void *obj, const ax_values *args,
                           ax_values *out) {
  phost *h = obj;
  ax_node *n = ax_call_node(cc);
  const char *key, *peer;
  AX_TRY(ax_values_get_str(args, 0, &key));
  AX_TRY(ax_values_get_str(args, 1, &peer));
  uint8_t *buf = NULL;
  size_t len = 0;
  char sha[2 * AX_SHA256_LEN + 1];
  AX_TRY(axp_ckpt_snapshot(h, &buf, &len, sha));
  int err = AX_OK;
  if (*peer && strcmp(peer, ax_node_name(n))) { /* the neighbour's copy */
    ax_values *a = ax_values_new();
    err = a ? AX_OK : AX_ENOMEM;
    if (err == AX_OK) {
      ax_values_add_str(a, owner_of(cc));
      ax_values_add_str(a, key);
      err = put_file(a, buf, len, sha);
    }
    ax_call_opts o = {.timeout_ms = axp_wait_ms(cc)};
    if (err == AX_OK)
      err = ax_rpc_sync(n, peer, "pipe.mem_keep", a, &o, NULL);
    ax_values_free(a);
    if (err != AX_OK) {
      free(buf);
      return ax_seterr(err, "pipe.stage %d: its in-memory copy on %s: %s",
                       h->s->index, peer, ax_errmsg());
    }
  }
  AX_TRY(keep(n, owner_of(cc), key, buf, len, sha)); /* takes buf */
  AX_TRY(ax_values_add_i64(out, (int64_t)len));
  return ax_values_add_str(out, sha);
}

/* "ckpt_mem_load" [key, holder, size, sha256 hex]: the copy of the
 * caller's key in agent holder's store (this agent's when it is holder),
 * checked against size and sha, then loaded. */
int axp_host_ckpt_mem_load(ax_call_ctx *cc, void *obj, const ax_values *args,
                           ax_values *out) {
  phost *h = obj;
  ax_node *n = ax_call_node(cc);
  const char *key, *holder, *sha;
  int64_t size;
  AX_TRY(ax_values_get_str(args, 0, &key));
  AX_TRY(ax_values_get_str(args, 1, &holder));
  AX_TRY(ax_values_get_i64(args, 2, &size));
  AX_TRY(ax_values_get_str(args, 3, &sha));
  uint8_t *buf = NULL;
  size_t len = 0;
  char got[2 * AX_SHA256_LEN + 1];
  if (!strcmp(holder, ax_node_name(n))) {
    AX_TRY(fetch(n, owner_of(cc), key, &buf, &len, got));
  } else {
    ax_values *a = ax_values_new(), *r = NULL;
    if (!a)
      return AX_ENOMEM;
    ax_values_add_str(a, owner_of(cc));
    ax_values_add_str(a, key);
    ax_call_opts o = {.timeout_ms = axp_wait_ms(cc)};
    int err = ax_rpc_sync(n, holder, "pipe.mem_fetch", a, &o, &r);
    ax_values_free(a);
    int64_t rs = -1;
    ax_tensor *t = NULL;
    if (err == AX_OK)
      err = ax_values_get_i64(r, 0, &rs);
    if (err == AX_OK)
      err = ax_values_get_tensor(r, 2, &t);
    if (err == AX_OK && rs < 0)
      err = ax_seterr(AX_EMALFORMED, "pipe.mem_fetch: size %lld",
                      (long long)rs);
    if (err == AX_OK)
      err = axi_ck_unpack(t, (size_t)rs, &buf);
    ax_values_free(r);
    if (err != AX_OK)
      return ax_seterr(err, "pipe.stage %d: its in-memory copy from %s: %s",
                       h->s->index, holder, ax_errmsg());
    len = (size_t)rs;
  }
  char name[200];
  snprintf(name, sizeof name, "in-memory %s on %s", key, holder);
  axi_ckr r;
  AX_TRY(axi_ckr_mem(&r, name, buf, len, AXI_CK_STAGE, size, sha));
  int err = axp_ckpt_apply(h, &r);
  axi_ckr_close(&r);
  return err;
}
