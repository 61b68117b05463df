/* The mover's gathering side (state.h, state-impl.h): the pieces any
 * layout wrote, from a checkpoint directory or any other source (the live
 * stages' snapshots: mover_pipe.c), or an exported model file, read into
 * the layout-free state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "axon/models/layers/parallel.h"
#include "axon/runtime/pipeline/state/state-impl.h"

void ax_state_free(ax_train_state *st) {
  if (!st)
    return;
  free(st->param_at);
  free(st->buffer_at);
  free(st->params);
  free(st->buffers);
  free(st->m);
  free(st->v);
  free(st->shadow);
  free(st->delta);
  free(st->pred);
  free(st->optim_steps);
  free(st->last_step);
  memset(st, 0, sizeof *st);
}

static void no_init(void *arg, float *params, float *buffers) {
  (void)arg, (void)params, (void)buffers;
}

/* The model's blocks and where each starts in the flat arrays. */
static int lay_out(ax_train_state *st) {
  const ax_model_def *def = ax_model_find(st->model);
  if (!def)
    return AX_ENOTFOUND;
  ax_config cfg;
  ax_model_info mi;
  AX_TRY(ax_model_config(def, st->model_config, &cfg));
  AX_TRY(ax_model_describe(def, &cfg, &mi));
  int n = st->n_blocks = mi.n_blocks;
  st->param_at = calloc((size_t)n + 1, sizeof *st->param_at);
  st->buffer_at = calloc((size_t)n + 1, sizeof *st->buffer_at);
  st->optim_steps = calloc((size_t)n, sizeof *st->optim_steps);
  st->last_step = calloc((size_t)n, sizeof *st->last_step);
  if (!st->param_at || !st->buffer_at || !st->optim_steps || !st->last_step)
    return AX_ENOMEM;
  for (int b = 0; b < n; b++) { /* laid out, not initialised */
    ax_module *mod = NULL;
    AX_TRY(def->build_block(&cfg, b, &mod));
    ax_net *net = ax_net_new_with_init(mod, AX_CPU, no_init, NULL);
    if (!net)
      return AX_ENOMEM;
    st->param_at[b + 1] = st->param_at[b] + net->n_params;
    st->buffer_at[b + 1] = st->buffer_at[b] + net->n_buffers;
    ax_net_free(net);
  }
  st->n_params = st->param_at[n];
  st->n_buffers = st->buffer_at[n];
  st->params = calloc(st->n_params + 1, sizeof(float));
  st->buffers = calloc(st->n_buffers + 1, sizeof(float));
  st->shadow_for = -1;
  st->pred_for = -1;
  st->optim_kind = -1;
  return st->params && st->buffers ? AX_OK : AX_ENOMEM;
}

/* Copies f32 record `name` of r (want values, or an empty record when
 * may_be_empty) to dst; *got: whether it held values. */
static int take(const axi_ckr *r, const char *name, float *dst, size_t want,
                int may_be_empty, int *got) {
  const uint8_t *d;
  size_t n;
  AX_TRY(axi_ckr_f32(r, name, &d, &n));
  if (got)
    *got = n > 0;
  if (n == 0 && may_be_empty)
    return AX_OK;
  if (n != want)
    return ax_seterr(AX_EFORMAT,
                     "checkpoint file %s: '%s' has %zu values, the "
                     "model's blocks there have %zu",
                     r->path, name, n, want);
  memcpy(dst, d, n * sizeof(float));
  return AX_OK;
}

static int alloc_like(float **a, size_t n) {
  if (!*a && !(*a = calloc(n + 1, sizeof(float))))
    return AX_ENOMEM;
  return AX_OK;
}

/* One member's arrays of one stage, put together from its files. */
typedef struct member {
  size_t n, nb;
  float *params, *buffers, *m, *v, *shadow, *delta, *pred;
  size_t covered[2]; /* optimizer values of m and v seen (shards add up) */
  int have_params;
} member;

static void member_free(member *x) {
  free(x->params);
  free(x->buffers);
  free(x->m);
  free(x->v);
  free(x->shadow);
  free(x->delta);
  free(x->pred);
}

/* File r (a piece of member x: blocks first..last) into x. */
static int read_piece(ax_train_state *st, const axi_ckr *r, member *x,
                      int first, int last) {
  int64_t holds, off, len, kind, steps, last_step, shadow_for;
  AX_TRY(axi_ckr_i64_opt(r, "holds_params", 1, &holds));
  AX_TRY(axi_ckr_i64_opt(r, "optim.off", 0, &off));
  AX_TRY(axi_ckr_i64_opt(r, "optim.len", (int64_t)x->n, &len));
  AX_TRY(axi_ckr_i64(r, "optim.kind", &kind));
  AX_TRY(axi_ckr_i64(r, "optim.steps", &steps));
  AX_TRY(axi_ckr_i64(r, "last_step", &last_step));
  AX_TRY(axi_ckr_i64(r, "shadow_for", &shadow_for));
  if (off < 0 || len < 0 || (size_t)(off + len) > x->n)
    return ax_seterr(AX_EFORMAT,
                     "checkpoint file %s: optimizer range [%lld, +%lld) "
                     "outside the stage's %zu parameters",
                     r->path, (long long)off, (long long)len, x->n);
  if (st->optim_kind >= 0 && kind != st->optim_kind)
    return ax_seterr(AX_EFORMAT,
                     "checkpoint file %s: optimizer kind %lld, "
                     "other files have %d",
                     r->path, (long long)kind, st->optim_kind);
  st->optim_kind = (int)kind;
  for (int b = first; b < last; b++) {
    st->optim_steps[b] = (long)steps;
    st->last_step[b] = (long)last_step;
  }
  if (holds) {
    int got;
    AX_TRY(alloc_like(&x->params, x->n));
    AX_TRY(alloc_like(&x->buffers, x->nb));
    AX_TRY(take(r, "params", x->params, x->n, 0, NULL));
    AX_TRY(take(r, "buffers", x->buffers, x->nb, x->nb == 0, NULL));
    AX_TRY(alloc_like(&x->shadow, x->n));
    AX_TRY(take(r, "shadow", x->shadow, x->n, 1, &got));
    if (got)
      st->shadow_for = (long)shadow_for;
    if (axi_ckr_has(r, "stale.delta")) { /* older files have none */
      int64_t pred_for;
      AX_TRY(axi_ckr_i64(r, "stale.pred_for", &pred_for));
      AX_TRY(alloc_like(&x->delta, x->n));
      AX_TRY(take(r, "stale.delta", x->delta, x->n, 1, &got));
      if (!got)
        free(x->delta), x->delta = NULL;
      AX_TRY(alloc_like(&x->pred, x->n));
      AX_TRY(take(r, "stale.pred", x->pred, x->n, 1, &got));
      if (!got)
        free(x->pred), x->pred = NULL;
      else
        st->pred_for = (long)pred_for;
    }
    x->have_params = 1;
  }
  const char *opt[2] = {"optim.m", "optim.v"};
  float **dst[2] = {&x->m, &x->v};
  for (int i = 0; i < 2; i++) {
    int got;
    AX_TRY(alloc_like(dst[i], x->n));
    AX_TRY(take(r, opt[i], *dst[i] + off, (size_t)len, 1, &got));
    if (got)
      x->covered[i] += (size_t)len;
  }
  return AX_OK;
}

/* Member t's arrays written into the whole model's (its slice of the split
 * layers; a copy of the rest). */
static int place(ax_train_state *st, const member *x, int first, int last,
                 int T, int t) {
  size_t at = st->param_at[first];
  ax_net *whole = NULL, *part = NULL;
  if (T > 1)
    AX_TRY(axi_state_nets(st, first, last, T, t, &whole, &part));
  float *src[6] = {x->params, x->m, x->v, x->shadow, x->delta, x->pred};
  float **dst[6] = {&st->params, &st->m,     &st->v,
                    &st->shadow, &st->delta, &st->pred};
  int err = AX_OK;
  for (int i = 0; i < 6 && err == AX_OK; i++) {
    if (!src[i] || (i > 0 && i < 3 && !x->covered[i - 1]) ||
        (i == 3 && st->shadow_for < 0))
      continue;
    err = alloc_like(dst[i], st->n_params);
    if (err == AX_OK && T > 1)
      err = ax_tp_join_params(part->root, whole->root, src[i], *dst[i] + at);
    else if (err == AX_OK)
      memcpy(*dst[i] + at, src[i], x->n * sizeof(float));
  }
  if (err == AX_OK && t == 0 && x->nb) /* every member's are the stage's */
    memcpy(st->buffers + st->buffer_at[first], x->buffers,
           x->nb * sizeof(float));
  ax_net_free(whole);
  ax_net_free(part);
  return err;
}

/* Opens piece `name` of src, or fails naming what lacks it. */
static int open_piece(const axi_state_src *src, const char *name, axi_ckr *r) {
  int err = src->open(src->user, name, r);
  if (err == AX_ENOTFOUND)
    return ax_seterr(AX_EFORMAT, "%s lists no %s", src->what, name);
  return err;
}

/* Stage s (blocks [first, last)) of layout l from src's pieces: each
 * member's file and, under ZeRO, every other replica's optimizer shard. */
static int read_stage(ax_train_state *st, const axi_state_src *src,
                      const ax_layout *l, int s, int first, int last) {
  int err = AX_OK, T = l->tensor_parallel, R = l->zero ? l->replicas : 1;
  for (int t = 0; t < T && err == AX_OK; t++) {
    member x = {0};
    if (T > 1) {
      ax_net *whole = NULL, *part = NULL;
      AX_TRY(axi_state_nets(st, first, last, T, t, &whole, &part));
      x.n = part->n_params;
      x.nb = part->n_buffers;
      ax_net_free(whole);
      ax_net_free(part);
    } else {
      x.n = st->param_at[last] - st->param_at[first];
      x.nb = st->buffer_at[last] - st->buffer_at[first];
    }
    for (int r = 0; r < R && err == AX_OK; r++) {
      char name[64];
      axi_ckr rd;
      axi_state_file_name(s, T, t, r, name, sizeof name);
      err = src->open(src->user, name, &rd);
      if (err == AX_ENOTFOUND && r > 0) { /* the shards' sum says */
        err = AX_OK;
        continue;
      }
      if (err == AX_ENOTFOUND)
        err = ax_seterr(AX_EFORMAT,
                        "%s lists no parameters of stage %d (member %d)",
                        src->what, s, t);
      if (err == AX_OK) {
        err = read_piece(st, &rd, &x, first, last);
        axi_ckr_close(&rd);
      }
    }
    if (err == AX_OK && !x.have_params)
      err = ax_seterr(AX_EFORMAT,
                      "%s lists no parameters of stage %d (member %d)",
                      src->what, s, t);
    for (int i = 0; i < 2 && err == AX_OK; i++)
      if (x.covered[i] && x.covered[i] != x.n)
        err = ax_seterr(AX_EFORMAT,
                        "%s: the optimizer shards of stage %d "
                        "cover %zu of its %zu parameters",
                        src->what, s, x.covered[i], x.n);
    if (err == AX_OK)
      err = place(st, &x, first, last, T, t);
    member_free(&x);
  }
  return err;
}

/* The frozen prefix's piece: blocks [0, f), no optimizer state. */
static int read_prefix(ax_train_state *st, const axi_state_src *src, int f) {
  axi_ckr r;
  AX_TRY(open_piece(src, AXI_CK_PREFIX_FILE, &r));
  int err = take(&r, "params", st->params, st->param_at[f], 0, NULL);
  if (err == AX_OK)
    err = take(&r, "buffers", st->buffers, st->buffer_at[f],
               st->buffer_at[f] == 0, NULL);
  axi_ckr_close(&r);
  return err;
}

/* Every stage of the layout, in block order after the frozen prefix. */
static int read_stages(ax_train_state *st, const axi_state_src *src) {
  ax_layout *l = &st->written_by;
  if (l->frozen)
    AX_TRY(read_prefix(st, src, l->frozen));
  int first = l->frozen;
  for (int s = 0;; s++) {
    char name[64];
    int64_t f, e;
    axi_ckr r;
    axi_state_file_name(s, l->tensor_parallel, 0, 0, name, sizeof name);
    int err = src->open(src->user, name, &r);
    if (err == AX_ENOTFOUND)
      break;
    AX_TRY(err);
    err = axi_ckr_i64(&r, "blocks.first", &f);
    if (err == AX_OK)
      err = axi_ckr_i64(&r, "blocks.last", &e);
    axi_ckr_close(&r);
    AX_TRY(err);
    if (f != first || e <= f || e > st->n_blocks)
      return ax_seterr(AX_EFORMAT,
                       "%s: %s holds blocks [%lld, %lld), which do not "
                       "follow block %d of %d",
                       src->what, name, (long long)f, (long long)e, first,
                       st->n_blocks);
    AX_TRY(read_stage(st, src, l, s, (int)f, (int)e));
    if (s < AX_PIPE_MAX_STAGES)
      l->bounds[s + 1] = (int)e;
    first = (int)e;
  }
  if (first != st->n_blocks)
    return ax_seterr(AX_EFORMAT,
                     "%s: its stages hold blocks up to %d of %s's %d",
                     src->what, first, st->model, st->n_blocks);
  return AX_OK;
}

int axi_state_read_src(const axi_state_src *src, const ax_layout *l,
                       const char *model, const char *model_config,
                       ax_train_state *st) {
  memset(st, 0, sizeof *st);
  snprintf(st->model, sizeof st->model, "%s", model);
  snprintf(st->model_config, sizeof st->model_config, "%s", model_config);
  st->written_by = *l;
  int err = lay_out(st);
  if (err == AX_OK)
    err = read_stages(st, src);
  if (err != AX_OK)
    ax_state_free(st);
  return err;
}

/* A checkpoint directory as a source: its manifest's files, each checked
 * against the manifest. */
typedef struct dir_src {
  const char *dir;
  const axi_manifest *m;
} dir_src;

static int dir_open(const void *user, const char *name, axi_ckr *r) {
  const dir_src *d = user;
  int64_t size;
  const char *sha;
  char path[1200];
  if (!axi_manifest_find(d->m, name, &size, &sha))
    return AX_ENOTFOUND;
  snprintf(path, sizeof path, "%s/%s", d->dir, name);
  return axi_ckr_open(r, path, AXI_CK_STAGE, size, sha);
}

/* Checkpoint directory dir, whatever layout wrote it. */
static int read_dir(ax_train_state *st, const char *dir,
                    const ax_ckpt_info *info) {
  axi_manifest m;
  ax_layout l;
  char what[1100];
  AX_TRY(axi_manifest_read(dir, &m));
  AX_TRY(ax_layout_read(dir, &l));
  snprintf(what, sizeof what, "checkpoint %s", dir);
  dir_src d = {dir, &m};
  axi_state_src src = {what, dir_open, &d};
  return axi_state_read_src(&src, &l, info->model, info->model_config, st);
}

/* An exported model file: the whole parameters and buffers. */
static int read_model_file(ax_train_state *st, const char *path,
                           ax_ckpt_info *info) {
  axi_ckr r;
  AX_TRY(axi_ckr_open(&r, path, AXI_CK_MODEL, -1, NULL));
  int64_t step = 0;
  int err = axi_ckr_i64(&r, "step", &step);
  if (err == AX_OK)
    err = axi_ckr_str(&r, "model", info->model, sizeof info->model);
  if (err == AX_OK)
    err = axi_ckr_str(&r, "model_config", info->model_config,
                      sizeof info->model_config);
  if (err == AX_OK)
    err = axi_ckr_str(&r, "dataset", info->dataset, sizeof info->dataset);
  if (err == AX_OK)
    err = axi_ckr_str(&r, "data_config", info->data_config,
                      sizeof info->data_config);
  info->step = (long)step;
  snprintf(st->model, sizeof st->model, "%s", info->model);
  snprintf(st->model_config, sizeof st->model_config, "%s", info->model_config);
  if (err == AX_OK)
    err = lay_out(st);
  if (err == AX_OK)
    err = take(&r, "params", st->params, st->n_params, 0, NULL);
  if (err == AX_OK)
    err = take(&r, "buffers", st->buffers, st->n_buffers, st->n_buffers == 0,
               NULL);
  axi_ckr_close(&r);
  return err;
}

int ax_state_read(const char *path, ax_train_state *st, ax_ckpt_info *info) {
  ax_ckpt_info mine;
  struct stat sb;
  info = info ? info : &mine;
  memset(st, 0, sizeof *st);
  memset(info, 0, sizeof *info);
  int err;
  if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
    err = read_model_file(st, path, info);
    if (err != AX_OK)
      ax_state_free(st);
    return err;
  }
  char dir[1024];
  err = ax_ckpt_find(path, dir, sizeof dir);
  if (err == AX_OK)
    err = ax_ckpt_read_info(dir, info);
  return err == AX_OK ? read_dir(st, dir, info) : err;
}
