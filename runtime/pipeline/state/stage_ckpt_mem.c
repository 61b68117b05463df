/* In-memory checkpoints, the agents' side (checkpoint.h,
 * ax_pipe_checkpoint_memory): a store of checkpoint files per node, kept
 * under the name of the coordinator they belong to ("owner") and a key
 * ("stage-SS"), and the stage methods that fill it and load from it.
 *
 * A stage's "ckpt_mem_save" keeps its file in its own agent's store and
 * sends a copy to its neighbour's agent ("axon.pipe.mem_keep"), so that losing
 * one agent loses no stage's copy. "ckpt_mem_load" takes the file from the
 * store of the agent the coordinator names ("axon.pipe.mem_fetch"; this agent's
 * own store when it names itself), checks its size and SHA-256 and loads
 * it. An owner's copies go with "axon.pipe.mem_forget" (the end of its run);
 * a later copy under the same owner and key replaces the earlier one, and
 * an owner keeps at most AXP_MEM_KEYS of them on one node. Members are
 * trusted (the world's token or certificates): any member may keep or
 * fetch. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/builtin-impl.h"
#include "axon/rref/rref.h"
#include "axon/runtime/pipeline/coord/coordinator.h"
#include "axon/runtime/pipeline/stage/stage_host-impl.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"

#define AXP_MEM_KEYS (2 * AX_PIPE_MAX_STAGES)

/* A copy: the file's bytes in a host tensor (axi_ck_pack's layout), which
 * the store, a reply being sent and a load may share (it is never
 * written after it is kept). */
typedef struct mem_entry {
  ax_node *node;
  char owner[128], key[64];
  ax_tensor *file;
  size_t len;
  char sha[2 * AX_SHA256_LEN + 1];
  struct mem_entry *next;
} mem_entry;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static mem_entry *g_store;

static int name_ok(const char *s, size_t cap) { return *s && strlen(s) < cap; }

/* Keeps file (a host tensor of len bytes whose SHA-256 is sha; the
 * reference is taken) as owner's key on n, replacing an earlier copy. */
static int keep(ax_node *n, const char *owner, const char *key, ax_tensor *file,
                size_t len, const char *sha) {
  if (!name_ok(owner, sizeof g_store->owner) ||
      !name_ok(key, sizeof g_store->key) || strlen(sha) != 2 * AX_SHA256_LEN) {
    ax_tensor_release(file);
    return ax_seterr(AX_EINVAL,
                     "axon.pipe.mem_keep: bad owner, key or checksum");
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
    ax_tensor_release(file);
    return ax_seterr(AX_ETOOBIG,
                     "axon.pipe.mem_keep: %s keeps %d copies on %s "
                     "already",
                     owner, count, ax_node_name(n));
  }
  if (!e && !(e = calloc(1, sizeof *e))) {
    pthread_mutex_unlock(&g_mu);
    ax_tensor_release(file);
    return AX_ENOMEM;
  }
  if (!e->node) { /* new */
    e->node = n;
    snprintf(e->owner, sizeof e->owner, "%s", owner);
    snprintf(e->key, sizeof e->key, "%s", key);
    e->next = g_store;
    g_store = e;
  }
  ax_tensor *old = e->file;
  e->file = file;
  e->len = len;
  snprintf(e->sha, sizeof e->sha, "%s", sha);
  pthread_mutex_unlock(&g_mu);
  ax_tensor_release(old);
  return AX_OK;
}

/* Owner's copy of key on n (a new reference); AX_ENOTFOUND if none. */
static int fetch(ax_node *n, const char *owner, const char *key,
                 ax_tensor **file, size_t *len, char *sha) {
  pthread_mutex_lock(&g_mu);
  mem_entry *e = g_store;
  while (e &&
         !(e->node == n && !strcmp(e->owner, owner) && !strcmp(e->key, key)))
    e = e->next;
  if (e) {
    *file = ax_tensor_retain(e->file);
    *len = e->len;
    snprintf(sha, 2 * AX_SHA256_LEN + 1, "%s", e->sha);
  }
  pthread_mutex_unlock(&g_mu);
  return e ? AX_OK
           : ax_seterr(AX_ENOTFOUND,
                       "%s holds no in-memory checkpoint %s "
                       "of %s",
                       ax_node_name(n), key, owner);
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
    ax_tensor_release(e->file);
    free(e);
  }
}

/* "axon.pipe.mem_keep" [owner, key, size, sha256 hex, file (axi_ck_pack)]: the
 * file is checked (its size and SHA-256) and kept as it came, on the host. */
static int h_keep(ax_call_ctx *cc, const ax_values *args, ax_values *out,
                  void *user) {
  axi_pipe_mem_keep_msg m;
  AX_TRY(axi_pipe_mem_keep_decode(args, &m));
  const char *owner = m.owner, *key = m.key, *sha = m.sha;
  int64_t size = m.size;
  ax_tensor *t = m.file;
  size_t nb = ax_tensor_nbytes(t);
  if (size < 0 || t->dtype != AX_I32 || nb < (size_t)size ||
      nb >= (size_t)size + 4)
    return ax_seterr(AX_EINVAL,
                     "axon.pipe.mem_keep: a file of %lld bytes in a "
                     "tensor of %zu",
                     (long long)size, nb);
  ax_tensor *h = ax_tensor_to(t, AX_CPU); /* t itself when on the host */
  if (!h)
    return AX_ENOMEM;
  char hex[2 * AX_SHA256_LEN + 1];
  int err = ax_sha256_hex(h->data, (size_t)size, hex);
  if (err == AX_OK && strcmp(hex, sha))
    err = ax_seterr(AX_EMALFORMED,
                    "axon.pipe.mem_keep: %s of %s arrived damaged", key, owner);
  if (err != AX_OK) {
    ax_tensor_release(h);
    return err;
  }
  return keep(ax_call_node(cc), owner, key, h, (size_t)size, sha);
}

/* "axon.pipe.mem_fetch" [owner, key] -> [size, sha256 hex, file]. */
static int h_fetch(ax_call_ctx *cc, const ax_values *args, ax_values *out,
                   void *user) {
  axi_pipe_mem_fetch_msg m;
  AX_TRY(axi_pipe_mem_fetch_decode(args, &m));
  axi_pipe_fault_handoff(ax_call_node(cc), -1, m.key);
  char sha[2 * AX_SHA256_LEN + 1];
  axi_pipe_file_msg r = {0, sha, 1, NULL};
  size_t len = 0;
  AX_TRY(fetch(ax_call_node(cc), m.owner, m.key, &r.file, &len, sha));
  r.size = (int64_t)len;
  int err = axi_pipe_file_encode(&r, out);
  ax_tensor_release(r.file);
  return err;
}

/* "axon.pipe.mem_forget" []: the caller's copies on this node go. */
static int h_forget(ax_call_ctx *cc, const ax_values *args, ax_values *out,
                    void *user) {
  AX_TRY(axi_pipe_mem_forget_decode(args));
  const char *owner = ax_call_caller(cc);
  forget(ax_call_node(cc), owner ? owner : ax_node_name(ax_call_node(cc)));
  return AX_OK;
}

static void node_gone(ax_node *n, void *user) {
  (void)user;
  forget(n, NULL);
}

int axi_pipe_mem_store_register(ax_node *n) {
  AX_TRY(ax_node_on_destroy(n, node_gone, NULL));
  AX_TRY(axi_register(n, "axon.pipe.mem_keep", h_keep, NULL));
  AX_TRY(axi_register(n, "axon.pipe.mem_fetch", h_fetch, NULL));
  return axi_register(n, "axon.pipe.mem_forget", h_forget, NULL);
}

/* The caller of a stage method: the coordinator that owns the copies. */
static const char *owner_of(ax_call_ctx *cc) {
  const char *c = ax_call_caller(cc);
  return c ? c : ax_node_name(ax_call_node(cc));
}

/* "ckpt_mem_save" [key, peer]: keeps the stage's file here and on agent
 * peer ("" or this agent: here only); returns [size, sha256 hex]. */
int axi_pipe_host_ckpt_mem_save(ax_call_ctx *cc, void *obj,
                                const ax_values *args, ax_values *out) {
  phost *h = obj;
  ax_node *n = ax_call_node(cc);
  axi_pipe_mem_save_msg m;
  AX_TRY(axi_pipe_mem_save_decode(args, &m));
  const char *key = m.key, *peer = m.peer;
  uint8_t *buf = NULL;
  size_t len = 0;
  char sha[2 * AX_SHA256_LEN + 1];
  AX_TRY(axi_pipe_ckpt_snapshot(h, 0, &buf, &len, sha));
  ax_tensor *file = axi_ck_pack(buf, len); /* kept here and sent as is */
  free(buf);
  if (!file)
    return AX_ENOMEM;
  int err = AX_OK;
  if (*peer && strcmp(peer, ax_node_name(n))) { /* the neighbour's copy */
    ax_values *a = ax_values_new();
    axi_pipe_mem_keep_msg k = {owner_of(cc), key, (int64_t)len, sha, file};
    err = a ? axi_pipe_mem_keep_encode(&k, a) : AX_ENOMEM;
    ax_call_opts o = {.timeout_ms = axi_pipe_wait_ms(cc)};
    if (err == AX_OK)
      err = ax_rpc_sync(n, peer, "axon.pipe.mem_keep", a, &o, NULL);
    ax_values_free(a);
    if (err != AX_OK) {
      ax_tensor_release(file);
      return ax_seterr(err, "axon.pipe.stage %d: its in-memory copy on %s: %s",
                       h->s->index, peer, ax_errmsg());
    }
  }
  AX_TRY(keep(n, owner_of(cc), key, file, len, sha)); /* takes file */
  axi_pipe_file_msg r = {(int64_t)len, sha, 0, NULL};
  return axi_pipe_file_encode(&r, out);
}

/* The caller's copy under key from agent holder's store (this agent's own
 * when it is holder): a new reference in *file. */
static int copy_from(ax_call_ctx *cc, const char *holder, const char *key,
                     ax_tensor **file) {
  ax_node *n = ax_call_node(cc);
  size_t len;
  char sha[2 * AX_SHA256_LEN + 1];
  if (!strcmp(holder, ax_node_name(n)))
    return fetch(n, owner_of(cc), key, file, &len, sha);
  ax_values *a = ax_values_new(), *r = NULL;
  axi_pipe_mem_fetch_msg m = {owner_of(cc), key};
  int err = a ? axi_pipe_mem_fetch_encode(&m, a) : AX_ENOMEM;
  ax_call_opts o = {.timeout_ms = axi_pipe_wait_ms(cc)};
  if (err == AX_OK)
    err = ax_rpc_sync(n, holder, "axon.pipe.mem_fetch", a, &o, &r);
  ax_values_free(a);
  axi_pipe_file_msg f;
  if (err == AX_OK)
    err = axi_pipe_file_decode(r, &f);
  if (err == AX_OK && !f.has_file)
    err = ax_seterr(AX_EMALFORMED, "axon.pipe.mem_fetch: %s sent no file",
                    holder);
  if (err == AX_OK)
    *file = ax_tensor_retain(f.file);
  ax_values_free(r);
  return err;
}

/* "ckpt_mem_load" [key, holder, size, sha256 hex]: the caller's copy under
 * key from agent holder, checked against size and sha (and the stage), then
 * loaded. */
int axi_pipe_host_ckpt_mem_load(ax_call_ctx *cc, void *obj,
                                const ax_values *args, ax_values *out) {
  phost *h = obj;
  axi_pipe_mem_load_msg m;
  AX_TRY(axi_pipe_mem_load_decode(args, &m));
  axi_pipe_fault_handoff(h->s->node, h->s->index, NULL);
  const char *key = m.key, *holder = m.holder, *sha = m.sha;
  int64_t size = m.size; /* >= 0 */
  ax_tensor *file = NULL;
  uint8_t *buf = NULL;
  int err = copy_from(cc, holder, key, &file);
  if (err == AX_OK)
    err = axi_ck_unpack(file, (size_t)size, &buf);
  ax_tensor_release(file);
  if (err != AX_OK)
    return ax_seterr(err, "axon.pipe.stage %d: its in-memory copy from %s: %s",
                     h->s->index, holder, ax_errmsg());
  char name[200];
  snprintf(name, sizeof name, "in-memory %s on %s", key, holder);
  axi_ckr r;
  AX_TRY(axi_ckr_mem(&r, name, buf, (size_t)size, AXI_CK_STAGE, size, sha));
  err = axi_pipe_ckpt_apply(h, &r);
  axi_ckr_close(&r);
  return err;
}
