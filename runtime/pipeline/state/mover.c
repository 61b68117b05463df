/* The mover's cutting side and the layouts (state.h, state-impl.h): the
 * piece of a layout-free state one slot holds, as its stage file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/models/layers/parallel.h"
#include "axon/runtime/pipeline/schedule/mode.h"
#include "axon/runtime/pipeline/state/state-impl.h"

int axi_state_nets(const ax_train_state *st, int first, int last, int members,
                   int member, ax_net **whole, ax_net **part) {
  const ax_model_def *def = ax_model_find(st->model);
  *whole = NULL;
  if (part)
    *part = NULL;
  if (!def)
    return AX_ENOTFOUND;
  ax_config wc, pc;
  AX_TRY(ax_model_config(def, st->model_config, &wc));
  AX_TRY(ax_model_stage(def, &wc, first, last, AX_CPU, 0, whole));
  if (members <= 1 || !part)
    return AX_OK;
  char cfg[700];
  snprintf(cfg, sizeof cfg, "%s%stp=%d,tp_rank=%d", st->model_config,
           st->model_config[0] ? "," : "", members, member);
  int err = ax_model_config(def, cfg, &pc);
  if (err == AX_OK)
    err = ax_model_stage(def, &pc, first, last, AX_CPU, 0, part);
  if (err != AX_OK) {
    ax_net_free(*whole);
    *whole = NULL;
  }
  return err;
}

/* Writes f32 record `name`: n values of src from `at` (NULL src: empty), as
 * member part's slice when part is not NULL. */
static int put_slice(axi_ckw *w, const char *name, const float *src, size_t at,
                     size_t n, const ax_net *whole, const ax_net *part) {
  if (!src) {
    axi_ckw_f32(w, name, NULL, 0);
    return AX_OK;
  }
  if (!part) {
    axi_ckw_f32(w, name, src + at, n);
    return AX_OK;
  }
  float *mine = malloc((part->n_params + 1) * sizeof(float));
  if (!mine)
    return AX_ENOMEM;
  int err = ax_tp_slice_params(part->root, whole->root, src + at, mine);
  if (err == AX_OK)
    axi_ckw_f32(w, name, mine, part->n_params);
  free(mine);
  return err;
}

int axi_state_slot_file(const ax_train_state *st, const axi_state_slot *sl,
                        uint8_t **buf, size_t *len,
                        char sha[2 * AX_SHA256_LEN + 1]) {
  int f = sl->first, l = sl->last;
  if (f < 0 || l <= f || l > st->n_blocks)
    return ax_seterr(AX_EINVAL, "state: blocks [%d, %d) of %s's %d", f, l,
                     st->model, st->n_blocks);
  for (int b = f + 1; b < l; b++)
    if (st->optim_steps[b] != st->optim_steps[f] ||
        st->last_step[b] != st->last_step[f])
      return ax_seterr(AX_EINVAL,
                       "state: blocks %d and %d made different numbers of "
                       "updates (%ld, %ld): they cannot share a stage",
                       f, b, st->optim_steps[f], st->optim_steps[b]);
  const ax_pipe_mode_def *def = ax_pipe_mode_get(sl->mode);
  if (!def)
    return AX_EINVAL;
  int shadow = st->shadow && st->shadow_for >= 0 &&
               def->fwd_weights == AX_FWD_DOUBLE_BUFFERED;
  ax_net *whole = NULL, *part = NULL;
  if (sl->members > 1)
    AX_TRY(axi_state_nets(st, f, l, sl->members, sl->member, &whole, &part));
  size_t at = st->param_at[f], n = st->param_at[l] - at;
  size_t np = part ? part->n_params : n;
  if (part && part->n_buffers != st->buffer_at[l] - st->buffer_at[f]) {
    ax_net_free(whole);
    ax_net_free(part);
    return ax_seterr(AX_EINVAL, "state: a member's buffers are not the "
                                "stage's");
  }
  axi_ckw w;
  axi_ckw_init(&w, AXI_CK_STAGE);
  axi_ckw_i64(&w, "stage", sl->stage);
  axi_ckw_i64(&w, "blocks.first", f);
  axi_ckw_i64(&w, "blocks.last", l);
  axi_ckw_i64(&w, "mode", sl->mode);
  axi_ckw_i64(&w, "tp.members", sl->members > 1 ? sl->members : 1);
  axi_ckw_i64(&w, "tp.member", sl->members > 1 ? sl->member : 0);
  axi_ckw_i64(&w, "holds_params", 1);
  axi_ckw_i64(&w, "optim.off", 0);
  axi_ckw_i64(&w, "optim.len", (int64_t)np);
  int err = put_slice(&w, "params", st->params, at, n, whole, part);
  axi_ckw_f32(&w, "buffers", st->buffers + st->buffer_at[f],
              st->buffer_at[l] - st->buffer_at[f]);
  axi_ckw_i64(&w, "optim.kind", st->optim_kind);
  axi_ckw_i64(&w, "optim.steps", st->optim_steps[f]);
  if (err == AX_OK)
    err = put_slice(&w, "optim.m", st->m, at, n, whole, part);
  if (err == AX_OK)
    err = put_slice(&w, "optim.v", st->v, at, n, whole, part);
  axi_ckw_i64(&w, "last_step", st->last_step[f]);
  axi_ckw_i64(&w, "shadow_for", shadow ? st->shadow_for : -1);
  if (err == AX_OK)
    err =
        put_slice(&w, "shadow", shadow ? st->shadow : NULL, at, n, whole, part);
  /* The staleness correction's history: its average update, and (2bw, as
   * the shadow) the next batch's prediction. */
  int pred = st->pred && st->pred_for >= 0 &&
             def->fwd_weights == AX_FWD_DOUBLE_BUFFERED;
  if (err == AX_OK)
    err = put_slice(&w, "stale.delta", st->delta, at, n, whole, part);
  axi_ckw_i64(&w, "stale.pred_for", pred ? st->pred_for : -1);
  if (err == AX_OK)
    err =
        put_slice(&w, "stale.pred", pred ? st->pred : NULL, at, n, whole, part);
  ax_net_free(whole);
  ax_net_free(part);
  if (err != AX_OK) {
    axi_ckw_free(&w);
    return err;
  }
  return axi_ckw_finish(&w, buf, len, sha);
}

void axi_state_file_name(int s, int T, int t, int r, char *out, size_t cap) {
  int n = T > 1 ? snprintf(out, cap, "stage-%02d-t%d", s, t)
                : snprintf(out, cap, "stage-%02d", s);
  if (r > 0 && n > 0 && (size_t)n < cap)
    n += snprintf(out + n, cap - (size_t)n, "-r%d", r);
  if (n > 0 && (size_t)n < cap)
    snprintf(out + n, cap - (size_t)n, ".axck");
}

void axi_state_prefix_file(const ax_net *net, int f, axi_ckw *w) {
  axi_ckw_init(w, AXI_CK_STAGE);
  axi_ckw_i64(w, "stage", -1);
  axi_ckw_i64(w, "blocks.first", 0);
  axi_ckw_i64(w, "blocks.last", f);
  axi_ckw_tensor(w, "params", net->params);
  axi_ckw_tensor(w, "buffers", net->buffers);
}

/* ---- layouts -------------------------------------------------------------
 * In a manifest: "mode=M stages=K bounds=b0,b1,... tp=T replicas=R zero=Z
 * optimizer_host=O frozen=F". */

int axi_layout_format(const ax_layout *l, char *out, size_t cap) {
  size_t n = (size_t)snprintf(out, cap, "mode=%s stages=%d bounds=",
                              ax_pipe_mode_name(l->mode), l->stages);
  for (int s = 0; s <= l->stages && n < cap; s++)
    n += (size_t)snprintf(out + n, cap - n, "%s%d", s ? "," : "", l->bounds[s]);
  if (n < cap)
    n += (size_t)snprintf(out + n, cap - n,
                          " tp=%d replicas=%d zero=%d optimizer_host=%d "
                          "frozen=%d",
                          l->tensor_parallel, l->replicas, l->zero,
                          l->optimizer_host, l->frozen);
  return n < cap ? AX_OK : ax_seterr(AX_EINVAL, "layout: too many stages");
}

/* The coordinator's records of an older checkpoint (no layout line). */
static int layout_of_coord(const char *dir, ax_layout *l) {
  axi_manifest m;
  int64_t size, v;
  const char *sha;
  char path[1200];
  AX_TRY(axi_manifest_read(dir, &m));
  if (!axi_manifest_find(&m, AXI_CK_COORD_FILE, &size, &sha))
    return ax_seterr(AX_EFORMAT, "checkpoint %s lists no " AXI_CK_COORD_FILE,
                     dir);
  snprintf(path, sizeof path, "%s/" AXI_CK_COORD_FILE, dir);
  axi_ckr r;
  AX_TRY(axi_ckr_open(&r, path, AXI_CK_COORD, size, sha));
  int err = axi_ckr_i64(&r, "mode", &v);
  l->mode = (int)v;
  if (err == AX_OK)
    err = axi_ckr_i64(&r, "stages", &v);
  l->stages = (int)v;
  if (err == AX_OK)
    err = axi_ckr_i64_opt(&r, "tensor_parallel", 1, &v);
  l->tensor_parallel = (int)v;
  if (err == AX_OK)
    err = axi_ckr_i64_opt(&r, "frozen_blocks", 0, &v);
  l->frozen = (int)v;
  axi_ckr_close(&r);
  l->replicas = 1;
  l->bounds[0] = l->frozen;
  return err;
}

static int parse(const char *dir, const char *text, ax_layout *l) {
  char mode[32], bounds[400];
  if (sscanf(text,
             "mode=%31s stages=%d bounds=%399s tp=%d replicas=%d zero=%d "
             "optimizer_host=%d frozen=%d",
             mode, &l->stages, bounds, &l->tensor_parallel, &l->replicas,
             &l->zero, &l->optimizer_host, &l->frozen) != 8 ||
      (l->mode = ax_pipe_mode_index(mode)) < 0 || l->stages < 1 ||
      l->stages > AX_PIPE_MAX_STAGES || l->tensor_parallel < 1 ||
      l->replicas < 1 || l->zero < 0 || l->zero > 2 || l->frozen < 0)
    return ax_seterr(AX_EFORMAT, "checkpoint %s: a bad layout line '%s'", dir,
                     text);
  const char *p = bounds;
  for (int s = 0; s <= l->stages; s++) {
    char *end;
    long b = strtol(p, &end, 10);
    if (end == p || (s < l->stages && *end != ',') || b < 0 ||
        (s && b <= l->bounds[s - 1]))
      return ax_seterr(AX_EFORMAT, "checkpoint %s: bad bounds in '%s'", dir,
                       text);
    l->bounds[s] = (int)b;
    p = end + 1;
  }
  return AX_OK;
}

int ax_layout_read(const char *dir, ax_layout *l) {
  axi_manifest m;
  memset(l, 0, sizeof *l);
  AX_TRY(axi_manifest_read(dir, &m));
  return m.layout[0] ? parse(dir, m.layout, l) : layout_of_coord(dir, l);
}

int ax_layout_same_files(const ax_layout *a, const ax_layout *b) {
  if (a->mode != b->mode || a->stages != b->stages ||
      a->tensor_parallel != b->tensor_parallel || a->frozen != b->frozen ||
      a->zero || b->zero)
    return 0;
  if (!a->bounds[a->stages] || !b->bounds[b->stages])
    return 1; /* an older checkpoint: each stage checks its blocks */
  for (int s = 0; s <= a->stages; s++)
    if (a->bounds[s] != b->bounds[s])
      return 0;
  return 1;
}
