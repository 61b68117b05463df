/* The stage host's checkpoint methods ("ckpt_save", "ckpt_load",
 * "ckpt_drop"; contract in stage_host.h, file in docs/CHECKPOINTS.md). A
 * checkpoint is taken at a consistent cut: no unit in flight on the stage,
 * so its state is the weights, buffers, optimizer and update position (and
 * for 2bw the shadow weights the next batch's forwards use). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "axon/kernels/clock.h"
#include "axon/runtime/pipeline/stage/stage_host-impl.h"
#include "axon/runtime/pipeline/state/ckpt_file-impl.h"

static int mode_index(const ax_pipe_mode_def *def) {
  for (int i = 0; i < AX_MODE_COUNT; i++)
    if (ax_pipe_mode_get(i) == def)
      return i;
  return -1;
}

/* A path of a message into out, unless it is empty, too long or climbs. */
static int path_arg(const char *s, char *out, size_t cap) {
  if (!*s || strlen(s) >= cap || strstr(s, ".."))
    return ax_seterr(AX_EINVAL, "axon.pipe.stage: bad checkpoint path '%s'", s);
  snprintf(out, cap, "%s", s);
  return AX_OK;
}

/* The state into w (s->mu held, no unit in flight). */
static void put_state(phost *h, axi_ckw *w) {
  axi_ag_stage *s = h->s;
  ax_optim *o = s->opt;
  axi_ckw_i64(w, "stage", s->index);
  axi_ckw_i64(w, "blocks.first", s->first);
  axi_ckw_i64(w, "blocks.last", s->last);
  axi_ckw_i64(w, "mode", mode_index(h->def));
  axi_ckw_tensor(w, "params", s->net->params);
  axi_ckw_tensor(w, "buffers", s->net->buffers);
  axi_ckw_i64(w, "optim.kind", o ? (int)ax_optim_config(o)->kind : -1);
  axi_ckw_i64(w, "optim.steps", o ? ax_optim_steps(o) : 0);
  axi_ckw_tensor(w, "optim.m", o ? ax_optim_state(o, 0) : NULL);
  axi_ckw_tensor(w, "optim.v", o ? ax_optim_state(o, 1) : NULL);
  axi_ckw_i64(w, "last_step", h->last_step);
  axi_ckw_i64(w, "shadow_for", h->shadow ? h->shadow_for : -1);
  axi_ckw_tensor(w, "shadow", h->shadow);
}

static int quiet_stage(phost *h) {
  if (h->states || h->grads || h->acc)
    return ax_seterr(AX_ESTATE,
                     "axon.pipe.stage %d: a checkpoint needs a "
                     "consistent cut (no unit in flight)",
                     h->s->index);
  if (!h->s->opt || h->zero || h->offload)
    return ax_seterr(AX_ESTATE,
                     "axon.pipe.stage %d: not set up, or its optimizer "
                     "is sharded or on another agent (no checkpoints yet)",
                     h->s->index);
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

/* "ckpt_save" [dir, file name, send (optional), async (optional)]: writes
 * dir/name on this host (creating dir), in the background with async, or
 * with send = 1 returns the file instead; returns [size, sha256 hex] and
 * then the file's bytes (axi_ck_pack). */
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
  int err = axi_pipe_ckpt_snapshot(h, &buf, &len, sha);
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

int axi_pipe_ckpt_snapshot(phost *h, uint8_t **buf, size_t *len,
                           char sha[2 * AX_SHA256_LEN + 1]) {
  axi_ckw w;
  axi_ckw_init(&w, AXI_CK_STAGE);
  pthread_mutex_lock(&h->s->mu);
  int err = quiet_stage(h);
  if (err == AX_OK)
    put_state(h, &w);
  pthread_mutex_unlock(&h->s->mu);
  if (err != AX_OK) {
    axi_ckw_free(&w);
    return err;
  }
  return axi_ckw_finish(&w, buf, len, sha);
}

static int want_i64(const axi_ckr *r, const char *name, int64_t v) {
  int64_t got;
  AX_TRY(axi_ckr_i64(r, name, &got));
  if (got != v)
    return ax_seterr(AX_EINVAL,
                     "checkpoint file %s: %s is %lld, this stage "
                     "has %lld (a checkpoint of another run or split)",
                     r->path, name, (long long)got, (long long)v);
  return AX_OK;
}

/* Checks everything before changing anything (s->mu held). */
static int check_state(phost *h, const axi_ckr *r, int64_t *shadow_for) {
  axi_ag_stage *s = h->s;
  ax_optim *o = s->opt;
  if (!o || h->zero || h->offload)
    return ax_seterr(AX_ESTATE,
                     "axon.pipe.stage %d: not set up, or its optimizer "
                     "is sharded or on another agent (no checkpoints yet)",
                     s->index);
  AX_TRY(want_i64(r, "stage", s->index));
  AX_TRY(want_i64(r, "blocks.first", s->first));
  AX_TRY(want_i64(r, "blocks.last", s->last));
  AX_TRY(want_i64(r, "mode", mode_index(h->def)));
  AX_TRY(want_i64(r, "optim.kind", (int)ax_optim_config(o)->kind));
  const char *f32[] = {"params", "buffers", "optim.m", "optim.v", "shadow"};
  size_t want[] = {s->net->n_params, s->net->n_buffers,
                   ax_optim_state(o, 0) ? s->net->n_params : 0,
                   ax_optim_state(o, 1) ? s->net->n_params : 0, 0};
  AX_TRY(axi_ckr_i64(r, "shadow_for", shadow_for));
  if (*shadow_for >= 0)
    want[4] = s->net->n_params;
  for (int i = 0; i < 5; i++) {
    const uint8_t *d;
    size_t n;
    AX_TRY(axi_ckr_f32(r, f32[i], &d, &n));
    if (n != want[i])
      return ax_seterr(AX_EINVAL,
                       "checkpoint file %s: '%s' has %zu values, "
                       "this stage needs %zu",
                       r->path, f32[i], n, want[i]);
  }
  int64_t v;
  AX_TRY(axi_ckr_i64(r, "optim.steps", &v));
  return axi_ckr_i64(r, "last_step", &v);
}

static int load_state(phost *h, const axi_ckr *r, int64_t shadow_for) {
  axi_ag_stage *s = h->s;
  int64_t steps, last;
  AX_TRY(axi_ckr_i64(r, "optim.steps", &steps));
  AX_TRY(axi_ckr_i64(r, "last_step", &last));
  AX_TRY(axi_ckr_tensor(r, "params", s->net->params));
  AX_TRY(axi_ckr_tensor(r, "buffers", s->net->buffers));
  AX_TRY(axi_ckr_tensor(r, "optim.m", ax_optim_state(s->opt, 0)));
  AX_TRY(axi_ckr_tensor(r, "optim.v", ax_optim_state(s->opt, 1)));
  ax_optim_set_steps(s->opt, (long)steps);
  h->last_step = (long)last;
  ax_tensor_release(h->shadow);
  h->shadow = NULL;
  if (shadow_for >= 0) {
    if (!(h->shadow = ax_tensor_like(s->net->params)))
      return AX_ENOMEM;
    h->shadow_for = (long)shadow_for;
    AX_TRY(axi_ckr_tensor(r, "shadow", h->shadow));
  }
  return AX_OK;
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

int axi_pipe_ckpt_apply(phost *h, const axi_ckr *r) {
  pthread_mutex_lock(&h->s->mu);
  int64_t shadow_for = -1;
  int err = quiet_stage(h);
  if (err == AX_OK)
    err = check_state(h, r, &shadow_for);
  if (err == AX_OK)
    err = load_state(h, r, shadow_for);
  pthread_mutex_unlock(&h->s->mu);
  return err;
}

/* "ckpt_drop" [dir, file name, ...]: removes this host's file of an old
 * checkpoint and the directory once empty (missing files are fine). */
int axi_pipe_host_ckpt_drop(ax_call_ctx *cc, void *obj, const ax_values *args,
                            ax_values *out) {
  char dir[900], name[64], path[1000];
  axi_pipe_ckpt_save_msg m; /* ckpt_save's message; send and async unused */
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
