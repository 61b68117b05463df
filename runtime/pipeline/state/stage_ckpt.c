/* The stage host's checkpoint methods ("ckpt_save", "ckpt_load",
 * "ckpt_drop", "ckpt_wait"; contract in stage_host.h, file in
 * docs/CHECKPOINTS.md): paths, files written in the background, and the
 * calls that take the stage's state into a file and back
 * (stage_ckpt_state.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "axon/kernels/clock.h"
#include "axon/runtime/pipeline/stage/stage_host-impl.h"
#include "axon/runtime/pipeline/state/ckpt_file-impl.h"

/* A path of a message into out, unless it is empty, too long or climbs. */
static int path_arg(const char *s, char *out, size_t cap) {
  if (!*s || strlen(s) >= cap || strstr(s, ".."))
    return ax_seterr(AX_EINVAL, "axon.pipe.stage: bad checkpoint path '%s'", s);
  snprintf(out, cap, "%s", s);
  return AX_OK;
}

/* A file written in the background ("ckpt_save" with async). */
typedef struct axi_pipe_ckpt_write {
  struct axi_pipe_ckpt_write *next;
  phost *h;
  char path[1000];
  uint8_t *buf;
  size_t len;
  int done, err;
  char msg[256];
  pthread_t th;
} axi_pipe_ckpt_write;

/* Writes the stage's file path (in the background or not). */
static int write_file(phost *h, const char *path, const uint8_t *buf,
                      size_t len) {
  axi_pipe_fault_ckpt_write(h->s->node, h->s->index, path, buf, len);
  return axi_write_atomic(path, buf, len);
}

static void *write_main(void *arg) {
  axi_pipe_ckpt_write *w = arg;
  int err = write_file(w->h, w->path, w->buf, w->len);
  free(w->buf);
  w->buf = NULL;
  pthread_mutex_lock(&w->h->ckpt_mu);
  w->err = err;
  if (err != AX_OK)
    snprintf(w->msg, sizeof w->msg, "%s", ax_errmsg());
  w->done = 1;
  pthread_cond_broadcast(&w->h->ckpt_cv);
  pthread_mutex_unlock(&w->h->ckpt_mu);
  return NULL;
}

/* Starts writing buf (taken) to path in the background. */
static int write_async(phost *h, const char *path, uint8_t *buf, size_t len) {
  axi_pipe_ckpt_write *w = calloc(1, sizeof *w);
  if (!w) {
    free(buf);
    return AX_ENOMEM;
  }
  w->h = h;
  snprintf(w->path, sizeof w->path, "%s", path);
  w->buf = buf;
  w->len = len;
  pthread_mutex_lock(&h->ckpt_mu);
  if (pthread_create(&w->th, NULL, write_main, w) != 0) {
    pthread_mutex_unlock(&h->ckpt_mu);
    free(w->buf);
    free(w);
    return ax_seterr(AX_ENOMEM, "axon.pipe.stage: cannot start a writer");
  }
  w->next = h->writes;
  h->writes = w;
  pthread_mutex_unlock(&h->ckpt_mu);
  return AX_OK;
}

/* Takes path's write out of the list once it is done (ckpt_mu held). */
static axi_pipe_ckpt_write *take_done(phost *h, const char *path, int *found) {
  *found = 0;
  for (axi_pipe_ckpt_write **pp = &h->writes; *pp; pp = &(*pp)->next) {
    axi_pipe_ckpt_write *w = *pp;
    if (strcmp(w->path, path))
      continue;
    *found = 1;
    if (!w->done)
      return NULL;
    *pp = w->next;
    return w;
  }
  return NULL;
}

int axi_pipe_host_ckpt_wait(ax_call_ctx *cc, void *obj, const ax_values *args,
                            ax_values *out) {
  phost *h = obj;
  axi_pipe_ckpt_wait_msg m;
  AX_TRY(axi_pipe_ckpt_wait_decode(args, &m));
  const char *path = m.path;
  int64_t end = ax_clock_us() / 1000 + axi_pipe_wait_ms(cc);
  int found = 0;
  axi_pipe_ckpt_write *w = NULL;
  pthread_mutex_lock(&h->ckpt_mu);
  while (!(w = take_done(h, path, &found)) && found &&
         ax_clock_us() / 1000 < end) {
    struct timespec ts = ax_clock_after_ms(CLOCK_REALTIME, 50);
    pthread_cond_timedwait(&h->ckpt_cv, &h->ckpt_mu, &ts);
  }
  pthread_mutex_unlock(&h->ckpt_mu);
  if (!w)
    return found ? ax_seterr(AX_ETIMEOUT,
                             "axon.pipe.stage: %s not written in "
                             "time",
                             path)
                 : ax_seterr(AX_ENOTFOUND, "axon.pipe.stage: no write of %s",
                             path);
  pthread_join(w->th, NULL);
  int err = w->err == AX_OK ? AX_OK : ax_seterr(w->err, "%s", w->msg);
  free(w);
  return err;
}

void axi_pipe_ckpt_writes_drain(phost *h) {
  pthread_mutex_lock(&h->ckpt_mu);
  axi_pipe_ckpt_write *all = h->writes;
  h->writes = NULL;
  pthread_mutex_unlock(&h->ckpt_mu);
  for (axi_pipe_ckpt_write *w = all, *nx; w; w = nx) {
    nx = w->next;
    pthread_join(w->th, NULL); /* a local disk write: it ends */
    free(w);
  }
}

/* "ckpt_save" [dir, file name, send (optional), async (optional),
 * optim_only (optional)]: writes dir/name on this host (creating dir), in
 * the background with async, or with send = 1 returns the file instead;
 * with optim_only, a file of the optimizer state only. Returns [size,
 * sha256 hex] and then the file's bytes (axi_ck_pack). */
int axi_pipe_host_ckpt_save(ax_call_ctx *cc, void *obj, const ax_values *args,
                            ax_values *out) {
  phost *h = obj;
  char dir[900], name[64], path[1000];
  axi_pipe_ckpt_save_msg m;
  AX_TRY(axi_pipe_ckpt_save_decode(args, &m));
  int64_t send = m.send, async = m.async; /* 0 when absent */
  AX_TRY(path_arg(m.dir, dir, sizeof dir));
  AX_TRY(path_arg(m.name, name, sizeof name));
  if (strchr(name, '/'))
    return ax_seterr(AX_EINVAL, "axon.pipe.stage: bad file name '%s'", name);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (!send)
    AX_TRY(axi_mkdirs(dir));
  char sha[2 * AX_SHA256_LEN + 1];
  uint8_t *buf = NULL;
  size_t len = 0;
  int err = axi_pipe_ckpt_snapshot(h, (int)m.optim_only, &buf, &len, sha);
  if (err == AX_OK && !send && async) {
    err = write_async(h, path, buf, len); /* takes buf */
    buf = NULL;
  } else if (err == AX_OK && !send) {
    err = write_file(h, path, buf, len);
  }
  axi_pipe_file_msg r = {(int64_t)len, sha, (int)send, NULL};
  if (err == AX_OK && send && !(r.file = axi_ck_pack(buf, len)))
    err = AX_ENOMEM;
  if (err == AX_OK)
    err = axi_pipe_file_encode(&r, out);
  ax_tensor_release(r.file);
  free(buf);
  return err;
}

/* "ckpt_load" [path, size, sha256 hex, file (optional)]: the file at path on
 * this host, or the one given (axi_ck_pack; path names it). Checks it (its
 * checksum and the manifest's, this stage's split, mode and optimizer) and only
 * then loads it. */
int axi_pipe_host_ckpt_load(ax_call_ctx *cc, void *obj, const ax_values *args,
                            ax_values *out) {
  phost *h = obj;
  char path[1000];
  axi_pipe_ckpt_load_msg m;
  AX_TRY(axi_pipe_ckpt_load_decode(args, &m));
  axi_pipe_fault_handoff(h->s->node, h->s->index, NULL);
  const char *sha = m.sha;
  int64_t size = m.size;
  AX_TRY(path_arg(m.path, path, sizeof path));
  axi_ckr r;
  if (m.has_file) { /* the file itself, from the caller */
    uint8_t *buf;
    AX_TRY(axi_ck_unpack(m.file, size < 0 ? 0 : (size_t)size, &buf));
    AX_TRY(axi_ckr_mem(&r, path, buf, (size_t)size, AXI_CK_STAGE, size, sha));
  } else {
    AX_TRY(axi_ckr_open(&r, path, AXI_CK_STAGE, size, sha));
  }
  int err = axi_pipe_ckpt_apply(h, &r);
  axi_ckr_close(&r);
  return err;
}

/* "ckpt_drop" [dir, file name, ...]: removes this host's file of an old
 * checkpoint and the directory once empty (missing files are fine). */
int axi_pipe_host_ckpt_drop(ax_call_ctx *cc, void *obj, const ax_values *args,
                            ax_values *out) {
  char dir[900], name[64], path[1000];
  axi_pipe_ckpt_save_msg m; /* ckpt_save's message; only dir and name */
  AX_TRY(axi_pipe_ckpt_save_decode(args, &m));
  AX_TRY(path_arg(m.dir, dir, sizeof dir));
  AX_TRY(path_arg(m.name, name, sizeof name));
  if (strchr(name, '/'))
    return ax_seterr(AX_EINVAL, "axon.pipe.stage: bad file name '%s'", name);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  unlink(path);
  rmdir(dir); /* fails while other files are left: fine */
  return AX_OK;
}
