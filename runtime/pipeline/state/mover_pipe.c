/* The mover and live pipelines (state-impl.h): the layout a pipeline holds
 * its state in and the names of its pieces, its live state gathered from
 * its stages' snapshots, and a state cut for and loaded into every one of
 * its stages. Checkpoints (checkpoint.c) and freezing (freeze.c) go
 * through here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/models/optim.h"
#include "axon/runtime/pipeline/coord/coordinator-impl.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"
#include "axon/runtime/pipeline/state/state-impl.h"

void axi_state_layout_of(const ax_pipe *front, ax_layout *l) {
  const ax_pipe *p = front->nrep ? front->rep[0] : front;
  int T = axi_pipe_members(front);
  memset(l, 0, sizeof *l);
  l->mode = p->o.mode;
  l->stages = p->K;
  memcpy(l->bounds, p->bounds, sizeof l->bounds);
  l->tensor_parallel = T;
  l->replicas = front->nrep ? front->nrep / T : 1;
  l->zero = p->o.zero;
  l->optimizer_host = p->optim_host[0] != 0;
  l->frozen = axi_pipe_frozen_blocks(front->frozen);
}

int axi_state_nparts(const ax_pipe *front) {
  const ax_pipe *p = front->nrep ? front->rep[0] : front;
  return p->o.zero && front->nrep ? front->nrep : axi_pipe_members(front);
}

void axi_state_file_of(const ax_pipe *p, int s, char *out, size_t cap) {
  axi_state_file_name(s, p->members, p->member, p->o.zero ? p->replica : 0, out,
                      cap);
}

/* ---- the live state ------------------------------------------------------ */

/* The pieces of a pipeline's state in memory, a source of the gathering
 * side (axi_state_src): each stage file as it came (axi_ck_pack), with the
 * size and checksum its sender gave. */
typedef struct mem_src {
  int n;
  struct {
    char name[64];
    ax_tensor *file;
    int64_t size;
    char sha[2 * AX_SHA256_LEN + 1];
  } f[AXI_CK_MAX_FILES];
} mem_src;

static void mem_src_free(mem_src *m) {
  for (int i = 0; i < m->n; i++)
    ax_tensor_release(m->f[i].file);
  free(m);
}

static int mem_open(const void *user, const char *name, axi_ckr *r) {
  const mem_src *m = user;
  for (int i = 0; i < m->n; i++) {
    if (strcmp(m->f[i].name, name))
      continue;
    uint8_t *buf;
    if (!m->f[i].file)
      return ax_seterr(AX_EMALFORMED, "state: %s did not arrive", name);
    AX_TRY(axi_ck_unpack(m->f[i].file, (size_t)m->f[i].size, &buf));
    return axi_ckr_mem(r, name, buf, (size_t)m->f[i].size, AXI_CK_STAGE,
                       m->f[i].size, m->f[i].sha);
  }
  return AX_ENOTFOUND;
}

typedef struct snap_args {
  const ax_pipe *p; /* the part whose stages send */
  mem_src *m;       /* its stage s's piece is m->f[first + s] */
  int first;
} snap_args;

/* "ckpt_save" of stage s's piece, sent back (a replica r > 0 of ZeRO
 * sends its optimizer shard only, as in a checkpoint). */
static int snap_args_of(void *user, int s, ax_values **out) {
  snap_args *a = user;
  axi_pipe_ckpt_save_msg m = {
      "memory", a->m->f[a->first + s].name,       1, 1, 1, 0,
      1,        a->p->o.zero && a->p->replica > 0};
  ax_values *v = *out = ax_values_new();
  return v ? axi_pipe_ckpt_save_encode(&m, v) : AX_ENOMEM;
}

static int snap_reply(void *user, int s, const ax_values *r) {
  snap_args *a = user;
  axi_pipe_file_msg m; /* size >= 0, a checksum of the right length */
  AX_TRY(axi_pipe_file_decode(r, &m));
  if (!m.has_file)
    return ax_seterr(AX_EMALFORMED, "state: stage %d sent no file", s);
  a->m->f[a->first + s].size = m.size;
  snprintf(a->m->f[a->first + s].sha, sizeof a->m->f[0].sha, "%s", m.sha);
  a->m->f[a->first + s].file = ax_tensor_retain(m.file);
  return AX_OK;
}

/* The coordinator's frozen prefix as a piece. */
static int snap_prefix(ax_pipe *front, mem_src *m) {
  axi_ckw w;
  uint8_t *buf;
  size_t len;
  int i = m->n++;
  snprintf(m->f[i].name, sizeof m->f[i].name, AXI_CK_PREFIX_FILE);
  axi_state_prefix_file(axi_pipe_frozen_net(front->frozen),
                        axi_pipe_frozen_blocks(front->frozen), &w);
  AX_TRY(axi_ckw_finish(&w, &buf, &len, m->f[i].sha));
  m->f[i].file = axi_ck_pack(buf, len);
  m->f[i].size = (int64_t)len;
  free(buf);
  return m->f[i].file ? AX_OK : AX_ENOMEM;
}

int axi_state_snapshot(ax_pipe *front, ax_train_state *st) {
  ax_pipe *const *parts = front->nrep ? front->rep : &front;
  const ax_pipe *one = parts[0];
  int T = axi_state_nparts(front);
  memset(st, 0, sizeof *st);
  if (T * one->K > AXI_CK_MAX_FILES - 1)
    return ax_seterr(AX_EINVAL, "state: %d stages of %d parts", one->K, T);
  mem_src *m = calloc(1, sizeof *m);
  if (!m)
    return AX_ENOMEM;
  int err = AX_OK;
  for (int t = 0; t < T && err == AX_OK; t++) {
    snap_args a = {parts[t], m, m->n};
    for (int s = 0; s < one->K; s++)
      axi_state_file_of(parts[t], s, m->f[m->n++].name, sizeof m->f[0].name);
    err = axi_pipe_all_stages(parts[t], 0, "ckpt_save", snap_args_of,
                              snap_reply, &a);
  }
  if (err == AX_OK && front->frozen)
    err = snap_prefix(front, m);
  ax_layout l;
  axi_state_layout_of(front, &l);
  axi_state_src src = {"the pipeline's state", mem_open, m};
  if (err == AX_OK)
    err = axi_state_read_src(&src, &l, one->model, one->model_config, st);
  mem_src_free(m);
  return err;
}

/* ---- loading a state ----------------------------------------------------- */

int axi_state_load_msg(const char *path, int64_t size, const char *sha,
                       const uint8_t *file, ax_values **out) {
  axi_pipe_ckpt_load_msg m = {path, size, sha, file != NULL, NULL};
  if (file && !(m.file = axi_ck_pack(file, (size_t)size)))
    return AX_ENOMEM;
  ax_values *v = *out = ax_values_new();
  int err = v ? axi_pipe_ckpt_load_encode(&m, v) : AX_ENOMEM;
  ax_tensor_release(m.file);
  return err;
}

typedef struct load_args {
  const ax_pipe *p;
  const ax_train_state *st;
  const char *where;
} load_args;

/* "ckpt_load" with stage s's file cut from the state by the mover. */
static int load_args_of(void *user, int s, ax_values **out) {
  load_args *a = user;
  const ax_pipe *p = a->p;
  axi_state_slot slot = {s,          p->bounds[s], p->bounds[s + 1],
                         p->members, p->member,    p->o.mode};
  uint8_t *buf;
  size_t len;
  char sha[2 * AX_SHA256_LEN + 1], name[64], path[1200];
  AX_TRY(axi_state_slot_file(a->st, &slot, &buf, &len, sha));
  axi_state_file_of(p, s, name, sizeof name);
  snprintf(path, sizeof path, "%s/%s", a->where, name);
  int err = axi_state_load_msg(path, (int64_t)len, sha, buf, out);
  free(buf);
  return err;
}

int axi_state_load(ax_pipe *front, const ax_train_state *st,
                   const char *where) {
  ax_pipe *const *parts = front->nrep ? front->rep : &front;
  int n = front->nrep ? front->nrep : 1, err = AX_OK;
  if (strcmp(st->model, parts[0]->model))
    return ax_seterr(AX_EINVAL, "the state of %s is of model %s, not %s", where,
                     st->model, parts[0]->model);
  for (int i = 0; i < n && err == AX_OK; i++) {
    load_args a = {parts[i], st, where};
    err = axi_pipe_all_stages(parts[i], 0, "ckpt_load", load_args_of, NULL, &a);
    if (err != AX_OK && n > 1)
      err = ax_seterr(err, "part %d: %s", i, ax_errmsg());
  }
  return err;
}

int ax_state_load_weights(ax_pipe *p, const ax_train_state *st) {
  ax_train_state w = *st; /* the same weights, no optimizer state */
  size_t nb = st->n_blocks > 0 ? (size_t)st->n_blocks : 1;
  long *steps = calloc(nb, sizeof *steps), *last = malloc(nb * sizeof *last);
  int err = steps && last ? AX_OK : AX_ENOMEM;
  for (size_t b = 0; last && b < nb; b++)
    last[b] = -1; /* no update yet */
  w.m = w.v = w.shadow = w.delta = w.pred = NULL;
  w.shadow_for = w.pred_for = -1;
  w.optim_kind = AX_OPT_SGD;
  w.optim_steps = steps;
  w.last_step = last;
  if (err == AX_OK)
    err = axi_state_load(p, &w, "weights");
  free(steps);
  free(last);
  return err;
}
