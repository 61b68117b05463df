/* Saving and restoring a pipeline's checkpoint (checkpoint.h): the
 * coordinator's side. The stages' side is stage_ckpt.c, the file format
 * ckpt_file.c and ckpt_dir.c. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "axon/runtime/pipeline/coord/coordinator-impl.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"
#include "axon/runtime/pipeline/state/checkpoint.h"
#include "axon/runtime/pipeline/state/ckpt_file-impl.h"
#include "axon/runtime/pipeline/state/state-impl.h"

typedef struct save_args {
  char dir[1024];
  const ax_pipe *p; /* the part whose stages save */
  axi_manifest *m;  /* file first + s is stage s's */
  int first;
  int send;  /* the stages send their files here */
  int async; /* the stages write them in the background */
} save_args;

/* Writes the file stage s sent (after checking it is what it says). */
static int save_here(save_args *a, int s, const axi_pipe_file_msg *r) {
  uint8_t *buf;
  char hex[2 * AX_SHA256_LEN + 1], path[1200];
  size_t len = (size_t)a->m->f[a->first + s].size;
  if (!r->has_file)
    return ax_seterr(AX_EMALFORMED, "checkpoint: stage %d sent no file", s);
  AX_TRY(axi_ck_unpack(r->file, len, &buf));
  int err = ax_sha256_hex(buf, len, hex);
  if (err == AX_OK && strcmp(hex, a->m->f[a->first + s].sha))
    err = ax_seterr(AX_EMALFORMED,
                    "checkpoint: the file of stage %d "
                    "arrived damaged",
                    s);
  snprintf(path, sizeof path, "%s/%s", a->dir, a->m->f[a->first + s].name);
  if (err == AX_OK)
    err = axi_write_atomic(path, buf, len);
  free(buf);
  return err;
}

static int save_reply(void *user, int s, const ax_values *r) {
  save_args *a = user;
  axi_pipe_file_msg m; /* size >= 0, a checksum of the right length */
  AX_TRY(axi_pipe_file_decode(r, &m));
  a->m->f[a->first + s].size = m.size;
  snprintf(a->m->f[a->first + s].sha, sizeof a->m->f[a->first + s].sha, "%s",
           m.sha);
  return a->send ? save_here(a, s, &m) : AX_OK;
}

/* "ckpt_save" (and "ckpt_drop") of stage s's file. */
static int save_args_of(void *user, int s, ax_values **out) {
  save_args *a = user;
  char name[64];
  axi_state_file_of(a->p, s, name, sizeof name);
  axi_pipe_ckpt_save_msg m = {a->dir, name,     1, a->send,
                              1,      a->async, 1, a->p->replica > 0};
  ax_values *v = *out = ax_values_new();
  return v ? axi_pipe_ckpt_save_encode(&m, v) : AX_ENOMEM;
}

/* "ckpt_wait" [dir/name of stage s's file]. */
static int wait_args_of(void *user, int s, ax_values **out) {
  save_args *a = user;
  char name[64], path[1200];
  axi_state_file_of(a->p, s, name, sizeof name);
  snprintf(path, sizeof path, "%s/%s", a->dir, name);
  axi_pipe_ckpt_wait_msg m = {path};
  ax_values *v = *out = ax_values_new();
  return v ? axi_pipe_ckpt_wait_encode(&m, v) : AX_ENOMEM;
}

/* The frozen prefix's file (freeze.h), listed in the manifest. */
static int save_prefix(axi_pipe_frozen *f, const char *dir, axi_manifest *m) {
  axi_ckw w;
  axi_state_prefix_file(axi_pipe_frozen_net(f), axi_pipe_frozen_blocks(f), &w);
  char path[1200];
  snprintf(path, sizeof path, "%s/" AXI_CK_PREFIX_FILE, dir);
  int i = m->nfiles++;
  snprintf(m->f[i].name, sizeof m->f[i].name, AXI_CK_PREFIX_FILE);
  return axi_ckw_commit(&w, path, &m->f[i].size, m->f[i].sha);
}

/* Loads the prefix's file into f's net (checked: blocks and sizes) and
 * drops the cache, whose outputs came from other values. */
static int load_prefix(axi_pipe_frozen *f, const char *dir,
                       const axi_manifest *m) {
  int64_t size, first, last;
  const char *sha;
  char path[1200];
  snprintf(path, sizeof path, "%s/" AXI_CK_PREFIX_FILE, dir);
  if (!axi_manifest_find(m, AXI_CK_PREFIX_FILE, &size, &sha))
    return ax_seterr(AX_EFORMAT,
                     "checkpoint %s/" AXI_CK_MANIFEST " lists "
                     "no " AXI_CK_PREFIX_FILE,
                     dir);
  axi_ckr r;
  AX_TRY(axi_ckr_open(&r, path, AXI_CK_STAGE, size, sha));
  ax_net *net = axi_pipe_frozen_net(f);
  int err = axi_ckr_i64(&r, "blocks.first", &first);
  if (err == AX_OK)
    err = axi_ckr_i64(&r, "blocks.last", &last);
  if (err == AX_OK && (first != 0 || last != axi_pipe_frozen_blocks(f)))
    err = ax_seterr(AX_EINVAL,
                    "checkpoint file %s: blocks [%lld, %lld), "
                    "the frozen prefix is [0, %d)",
                    path, (long long)first, (long long)last,
                    axi_pipe_frozen_blocks(f));
  if (err == AX_OK)
    err = axi_ckr_tensor(&r, "params", net->params);
  if (err == AX_OK)
    err = axi_ckr_tensor(&r, "buffers", net->buffers);
  axi_ckr_close(&r);
  if (err == AX_OK)
    axi_pipe_frozen_clear_cache(f);
  return err;
}

static void coord_records(const ax_pipe *p, const ax_ckpt_info *in, int flags,
                          int frozen, axi_ckw *w) {
  axi_ckw_i64(w, "stage_files", (flags & AX_CKPT_TO_COORDINATOR) != 0);
  axi_ckw_i64(w, "step", in->step);
  axi_ckw_i64(w, "lr_step", in->step); /* one update per mini-batch */
  axi_ckw_i64(w, "data.epoch", in->data_epoch);
  axi_ckw_i64(w, "data.batch", in->data_batch);
  axi_ckw_i64(w, "seed", (int64_t)in->seed);
  axi_ckw_i64(w, "mode", p->o.mode);
  axi_ckw_i64(w, "stages", p->K);
  axi_ckw_i64(w, "tensor_parallel", p->members);
  axi_ckw_i64(w, "frozen_blocks", frozen);
  axi_ckw_i64(w, "units", p->U);
  /* The pipeline's own model: the mover builds it to cut the state. */
  axi_ckw_str(w, "model", p->model);
  axi_ckw_str(w, "model_config", p->model_config);
  axi_ckw_str(w, "dataset", in->dataset);
  axi_ckw_str(w, "data_config", in->data_config);
  axi_ckw_str(w, "config", in->config);
}

/* Drops all but the newest `keep` complete checkpoints (each stage's file
 * on its agent, then this host's directory). */
static void prune(ax_pipe *const *parts, int n_parts, const char *root,
                  int keep) {
  long steps[256];
  int n = axi_ckpt_list(root, steps, 256);
  for (int i = keep; i < n; i++) {
    save_args a = {.m = NULL};
    axi_ckpt_dirname(root, steps[i], a.dir, sizeof a.dir);
    for (int t = 0; t < n_parts; t++) {
      a.p = parts[t];
      axi_pipe_all_stages(parts[t], 0, "ckpt_drop", save_args_of, NULL, &a);
    }
    axi_ckpt_remove(a.dir);
  }
}

/* A checkpoint whose stage files are still being written (AX_CKPT_ASYNC):
 * its finisher collects the writes, then writes the manifest (which makes
 * the checkpoint valid) and prunes the old ones. */
typedef struct axi_pipe_ckpt_job {
  ax_pipe *parts[AX_PIPE_MAX_REPLICAS];
  int T, keep;
  save_args a;
  axi_manifest m;
  char root[1024];
  int err;
  char msg[512];
  pthread_t th;
} axi_pipe_ckpt_job;

static void *finish_main(void *arg) {
  axi_pipe_ckpt_job *j = arg;
  int err = AX_OK;
  for (int t = 0; t < j->T && err == AX_OK; t++) {
    j->a.p = j->parts[t];
    err = axi_pipe_all_stages(j->parts[t], 0, "ckpt_wait", wait_args_of, NULL,
                              &j->a);
  }
  if (err == AX_OK)
    err = axi_manifest_write(j->a.dir, &j->m);
  if (err == AX_OK)
    prune(j->parts, j->T, j->root, j->keep);
  j->err = err;
  if (err != AX_OK)
    snprintf(j->msg, sizeof j->msg, "%s", ax_errmsg());
  return NULL;
}

int ax_pipe_checkpoint_wait(ax_pipe *p) {
  axi_pipe_ckpt_job *j = p ? p->ckpt_job : NULL;
  if (!j)
    return AX_OK;
  pthread_join(j->th, NULL);
  p->ckpt_job = NULL;
  int err = j->err == AX_OK
                ? AX_OK
                : ax_seterr(j->err, "checkpoint %s: %s", j->a.dir, j->msg);
  free(j);
  return err;
}

/* Hands the rest of an asynchronous checkpoint to its finisher. */
static int finish_later(ax_pipe *front, ax_pipe *const *parts, int T,
                        const save_args *a, const axi_manifest *m,
                        const char *root, int keep) {
  axi_pipe_ckpt_job *j = calloc(1, sizeof *j);
  if (!j)
    return AX_ENOMEM;
  for (int t = 0; t < T; t++)
    j->parts[t] = parts[t];
  j->T = T;
  j->keep = keep;
  j->a = *a;
  j->m = *m;
  j->a.m = &j->m;
  snprintf(j->root, sizeof j->root, "%s", root);
  if (pthread_create(&j->th, NULL, finish_main, j) != 0) {
    free(j);
    return ax_seterr(AX_ENOMEM, "checkpoint: cannot start its finisher");
  }
  front->ckpt_job = j;
  return AX_OK;
}

int ax_pipe_checkpoint(ax_pipe *p, const char *root, const ax_ckpt_info *in,
                       int keep, int flags) {
  if (!p || !root || !*root || !in || in->step < 0)
    return ax_seterr(AX_EINVAL, "checkpoint: bad arguments");
  AX_TRY(ax_pipe_checkpoint_wait(p)); /* the previous one's outcome */
  /* The replicas hold the same weights and optimizer state: replica 0's
   * members (one part without tensor parallelism) are saved; under ZeRO
   * every other replica's members save their optimizer shards too (parts
   * are replica-major: part r T + t is replica r's member t). */
  ax_pipe *front = p;
  ax_pipe *const *parts = p->nrep ? p->rep : &front;
  p = parts[0];
  int T = axi_state_nparts(front);
  if (p->plan)
    return ax_seterr(AX_ESTATE, "checkpoint: only between ax_pipe_train "
                                "calls");
  if (T * p->K > AXI_CK_MAX_FILES - 1)
    return ax_seterr(AX_EINVAL, "checkpoint: %d stages of %d parts", p->K, T);
  axi_manifest m;
  memset(&m, 0, sizeof m);
  m.step = in->step;
  ax_layout lay;
  axi_state_layout_of(front, &lay);
  AX_TRY(axi_layout_format(&lay, m.layout, sizeof m.layout));
  save_args a = {.m = &m, .send = (flags & AX_CKPT_TO_COORDINATOR) != 0};
  a.async = !a.send && (flags & AX_CKPT_ASYNC);
  axi_ckpt_dirname(root, in->step, a.dir, sizeof a.dir);
  AX_TRY(axi_mkdirs(a.dir));
  /* An earlier attempt at this step (or a run that got this far before a
   * resume) is not a checkpoint while it is rewritten. */
  char mpath[1100];
  snprintf(mpath, sizeof mpath, "%s/" AXI_CK_MANIFEST, a.dir);
  remove(mpath);
  axi_ckw w;
  axi_ckw_init(&w, AXI_CK_COORD);
  coord_records(p, in, flags, axi_pipe_frozen_blocks(front->frozen), &w);
  char path[1200];
  snprintf(path, sizeof path, "%s/" AXI_CK_COORD_FILE, a.dir);
  snprintf(m.f[0].name, sizeof m.f[0].name, AXI_CK_COORD_FILE);
  AX_TRY(axi_ckw_commit(&w, path, &m.f[0].size, m.f[0].sha));
  int err = AX_OK;
  for (int t = 0; t < T && err == AX_OK; t++) { /* part t's stages */
    a.p = parts[t];
    a.first = 1 + t * p->K;
    for (int s = 0; s < p->K; s++)
      axi_state_file_of(parts[t], s, m.f[a.first + s].name, sizeof m.f[0].name);
    err = axi_pipe_all_stages(parts[t], 0, "ckpt_save", save_args_of,
                              save_reply, &a);
  }
  m.nfiles = 1 + T * p->K;
  if (err == AX_OK && front->frozen) /* the coordinator's own blocks */
    err = save_prefix(front->frozen, a.dir, &m);
  if (err == AX_OK && a.async) /* the files are still being written */
    return finish_later(front, parts, T, &a, &m, root, keep < 2 ? 2 : keep);
  if (err == AX_OK)
    err = axi_manifest_write(a.dir, &m);
  if (err == AX_OK)
    prune(parts, T, root, keep < 2 ? 2 : keep);
  return err;
}

typedef struct load_args {
  const ax_pipe *p;
  const char *dir;
  const axi_manifest *m;
  int here; /* the stage files are on this host: send them */
} load_args;

static int load_args_of(void *user, int s, ax_values **out) {
  load_args *a = user;
  char name[64], path[1200];
  int64_t size = -1;
  const char *sha = "";
  axi_state_file_of(a->p, s, name, sizeof name);
  axi_manifest_find(a->m, name, &size, &sha);
  snprintf(path, sizeof path, "%s/%s", a->dir, name);
  if (!a->here) /* the stage reads it from its own disk */
    return axi_state_load_msg(path, size, sha, NULL, out);
  axi_ckr r; /* the stage checks it again */
  AX_TRY(axi_ckr_open(&r, path, AXI_CK_STAGE, size, sha));
  int err = axi_state_load_msg(path, size, sha, r.buf, out);
  axi_ckr_close(&r);
  return err;
}

/* The checkpoint's frozen prefix must be p's (as many blocks; a pipeline
 * re-packed the same way: freeze.h), and is loaded into it. */
static int restore_prefix(ax_pipe *p, const char *path) {
  char dir[1024];
  AX_TRY(ax_ckpt_find(path, dir, sizeof dir));
  axi_manifest m;
  axi_ckr r;
  ax_ckpt_info info;
  AX_TRY(axi_manifest_read(dir, &m));
  AX_TRY(axi_ckpt_read_coord(dir, &m, &info, &r));
  int64_t f = 0;
  if (axi_ckr_i64(&r, "frozen_blocks", &f) != AX_OK)
    f = 0; /* written before freezing */
  axi_ckr_close(&r);
  if (f != axi_pipe_frozen_blocks(p->frozen))
    return ax_seterr(AX_EINVAL,
                     "checkpoint %s has %lld frozen blocks, this "
                     "pipeline %d (freeze it the same way first)",
                     dir, (long long)f, axi_pipe_frozen_blocks(p->frozen));
  return f ? load_prefix(p->frozen, dir, &m) : AX_OK;
}

/* One part's stages each load their own file of dir (the layout that wrote
 * it holds the state in the same files: state.h). */
static int restore_files(ax_pipe *p, const char *dir, const axi_manifest *m,
                         int here) {
  for (int s = 0; s < p->K; s++) {
    char name[64];
    int64_t size;
    const char *sha;
    axi_state_file_of(p, s, name, sizeof name);
    if (!axi_manifest_find(m, name, &size, &sha))
      return ax_seterr(AX_EFORMAT,
                       "checkpoint file %s/" AXI_CK_MANIFEST
                       " is damaged: it lists no %s",
                       dir, name);
  }
  load_args a = {p, dir, m, here};
  return axi_pipe_all_stages(p, 0, "ckpt_load", load_args_of, NULL, &a);
}

/* The checkpoint's state, read here whatever layout wrote it, cut for
 * every stage of every part of front. */
static int restore_moved(ax_pipe *front, const char *dir) {
  ax_train_state st;
  int err = ax_state_read(dir, &st, NULL);
  if (err != AX_OK)
    return ax_seterr(err,
                     "%s (a resume on another layout reads every file of "
                     "the checkpoint on the coordinator's host: copy them "
                     "here or use a shared directory)",
                     ax_errmsg());
  err = axi_state_load(front, &st, dir);
  ax_state_free(&st);
  return err;
}

int ax_pipe_restore(ax_pipe *p, const char *path, ax_ckpt_info *info) {
  AX_TRY(ax_pipe_checkpoint_wait(p));
  char dir[1024];
  AX_TRY(ax_ckpt_find(path, dir, sizeof dir));
  axi_manifest m;
  axi_ckr r;
  AX_TRY(axi_manifest_read(dir, &m));
  AX_TRY(axi_ckpt_read_coord(dir, &m, info, &r));
  int64_t here = 0;
  int err = axi_ckr_i64(&r, "stage_files", &here);
  axi_ckr_close(&r);
  AX_TRY(err);
  ax_layout was, now;
  AX_TRY(ax_layout_read(dir, &was));
  axi_state_layout_of(p, &now);
  ax_pipe *const *parts = p->nrep ? p->rep : &p;
  int n = p->nrep ? p->nrep : 1;
  for (int i = 0; i < n; i++)
    if (parts[i]->plan)
      return ax_seterr(AX_ESTATE, "checkpoint: only between ax_pipe_train "
                                  "calls");
  AX_TRY(restore_prefix(p, dir));
  if (!ax_layout_same_files(&was, &now)) {
    err = restore_moved(p, dir);
  } else {
    for (int i = 0; i < n && err == AX_OK; i++) {
      err = restore_files(parts[i], dir, &m, here != 0);
      if (err != AX_OK && n > 1)
        err = ax_seterr(err, "part %d: %s", i, ax_errmsg());
    }
  }
  for (int i = 0; i < n && err == AX_OK; i++)
    parts[i]->base = info->step;
  return err;
}
