/* Using a checkpoint without the pipeline (checkpoint.h): the stages'
 * files joined into the whole model, and the exported model file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "axon/models/layers/parallel.h"
#include "axon/models/model.h"
#include "axon/runtime/pipeline/state/checkpoint.h"
#include "axon/runtime/pipeline/state/ckpt_file-impl.h"

typedef struct whole { /* the whole model's flat buffers, on the host */
  float *params, *buffers;
  size_t np, nb;
  int blocks; /* blocks covered so far */
} whole;

static void whole_free(whole *w) {
  free(w->params);
  free(w->buffers);
  memset(w, 0, sizeof *w);
}

/* Appends record `name` of r to *dst (n floats so far). */
static int append(const axi_ckr *r, const char *name, float **dst, size_t *n) {
  const uint8_t *d;
  size_t k;
  AX_TRY(axi_ckr_f32(r, name, &d, &k));
  float *b = realloc(*dst, (*n + k + 1) * sizeof(float));
  if (!b)
    return AX_ENOMEM;
  memcpy(b + *n, d, k * sizeof(float));
  *dst = b;
  *n += k;
  return AX_OK;
}

/* The members' parameters of stage s (stage-SS-tT.axck, T = 0, 1, ...:
 * every file the manifest lists) joined into the whole stage's, blocks
 * [first, last) of the checkpoint's model (parallel.h); appended to w with
 * member 0's buffers. */
static int join_members(const char *dir, const axi_manifest *m,
                        const ax_ckpt_info *info, int s, int64_t first,
                        int64_t last, whole *w) {
  const ax_model_def *def = ax_model_find(info->model);
  if (!def)
    return AX_ENOTFOUND;
  ax_config wc;
  AX_TRY(ax_model_config(def, info->model_config, &wc));
  ax_net *stage = NULL;
  AX_TRY(ax_model_stage(def, &wc, (int)first, (int)last, AX_CPU, 0, &stage));
  int members = 0, err = AX_OK; /* the files say how many */
  char name[64];
  int64_t size;
  const char *sha;
  for (; members < AXI_CK_MAX_FILES; members++) {
    snprintf(name, sizeof name, "stage-%02d-t%d.axck", s, members);
    if (!axi_manifest_find(m, name, &size, &sha))
      break;
  }
  float *joined = ax_f32(stage->params);
  int T = 0;
  for (; T < members; T++) {
    char path[1200], cfg[1100];
    snprintf(name, sizeof name, "stage-%02d-t%d.axck", s, T);
    axi_manifest_find(m, name, &size, &sha);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    axi_ckr r;
    if ((err = axi_ckr_open(&r, path, AXI_CK_STAGE, size, sha)) != AX_OK)
      break;
    ax_config pc;
    ax_net *part = NULL;
    const uint8_t *d;
    size_t n;
    snprintf(cfg, sizeof cfg, "%s%stp=%d,tp_rank=%d", info->model_config,
             info->model_config[0] ? "," : "", members, T);
    err = ax_model_config(def, cfg, &pc);
    if (err == AX_OK)
      err = ax_model_stage(def, &pc, (int)first, (int)last, AX_CPU, 0, &part);
    if (err == AX_OK)
      err = axi_ckr_f32(&r, "params", &d, &n);
    if (err == AX_OK && n != part->n_params)
      err = ax_seterr(AX_EFORMAT,
                      "checkpoint file %s: %zu parameters, "
                      "member %d of the stage has %zu",
                      path, n, T, part->n_params);
    if (err == AX_OK) {
      memcpy(part->params->data, d, n * sizeof(float)); /* aligned copy */
      err = ax_tp_join_params(part->root, stage->root, ax_f32(part->params),
                              joined);
    }
    if (err == AX_OK && T == 0)
      err = append(&r, "buffers", &w->buffers, &w->nb);
    ax_net_free(part);
    axi_ckr_close(&r);
    if (err != AX_OK)
      break;
  }
  if (err == AX_OK && T == 0)
    err = ax_seterr(AX_EFORMAT, "checkpoint %s lists no member of stage %d",
                    dir, s);
  if (err == AX_OK) {
    float *p =
        realloc(w->params, (w->np + stage->n_params + 1) * sizeof(float));
    err = p ? AX_OK : AX_ENOMEM;
    if (p) {
      memcpy(p + w->np, joined, stage->n_params * sizeof(float));
      w->params = p;
      w->np += stage->n_params;
    }
  }
  ax_net_free(stage);
  return err;
}

/* Joins the stage files of checkpoint dir in stage order; their blocks
 * must follow each other from block 0. The files of a tensor-parallel
 * checkpoint (stage-SS-tT.axck) are joined member by member first. */
static int join_stages(const char *dir, ax_ckpt_info *info, whole *w) {
  axi_manifest m;
  AX_TRY(axi_manifest_read(dir, &m));
  AX_TRY(ax_ckpt_read_info(dir, info));
  int64_t tsize;
  const char *tsha;
  int tp = axi_manifest_find(&m, "stage-00-t0.axck", &tsize, &tsha) != NULL;
  if (axi_manifest_find(&m, "prefix.axck", &tsize, &tsha)) {
    /* A frozen prefix (freeze.h): blocks [0, f) from the coordinator. */
    char path[1200];
    int64_t first, last;
    snprintf(path, sizeof path, "%s/prefix.axck", dir);
    axi_ckr r;
    AX_TRY(axi_ckr_open(&r, path, AXI_CK_STAGE, tsize, tsha));
    int err = axi_ckr_i64(&r, "blocks.first", &first);
    if (err == AX_OK)
      err = axi_ckr_i64(&r, "blocks.last", &last);
    if (err == AX_OK && (first != 0 || last < 1))
      err = ax_seterr(AX_EFORMAT, "checkpoint file %s: blocks [%lld, %lld)",
                      path, (long long)first, (long long)last);
    if (err == AX_OK)
      err = append(&r, "params", &w->params, &w->np);
    if (err == AX_OK)
      err = append(&r, "buffers", &w->buffers, &w->nb);
    axi_ckr_close(&r);
    AX_TRY(err);
    w->blocks = (int)last;
  }
  for (int s = 0;; s++) {
    char name[64], path[1200];
    int64_t size, first, last;
    const char *sha;
    snprintf(name, sizeof name, tp ? "stage-%02d-t0.axck" : "stage-%02d.axck",
             s);
    if (!axi_manifest_find(&m, name, &size, &sha))
      return s > 0 ? AX_OK
                   : ax_seterr(AX_EFORMAT,
                               "checkpoint %s lists no stage "
                               "file",
                               dir);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    axi_ckr r;
    AX_TRY(axi_ckr_open(&r, path, AXI_CK_STAGE, size, sha));
    int err = axi_ckr_i64(&r, "blocks.first", &first);
    if (err == AX_OK)
      err = axi_ckr_i64(&r, "blocks.last", &last);
    if (err == AX_OK && (first != w->blocks || last <= first))
      err = ax_seterr(AX_EFORMAT,
                      "checkpoint file %s: blocks [%lld, %lld) "
                      "do not follow block %d",
                      path, (long long)first, (long long)last, w->blocks);
    if (err == AX_OK && tp)
      err = join_members(dir, &m, info, s, first, last, w);
    if (err == AX_OK && !tp)
      err = append(&r, "params", &w->params, &w->np);
    if (err == AX_OK && !tp)
      err = append(&r, "buffers", &w->buffers, &w->nb);
    axi_ckr_close(&r);
    AX_TRY(err);
    w->blocks = (int)last;
  }
}

static int read_model_file(const char *path, ax_ckpt_info *info, whole *w) {
  axi_ckr r;
  AX_TRY(axi_ckr_open(&r, path, AXI_CK_MODEL, -1, NULL));
  memset(info, 0, sizeof *info);
  int64_t step = 0, blocks = 0;
  int err = axi_ckr_i64(&r, "step", &step);
  if (err == AX_OK)
    err = axi_ckr_i64(&r, "blocks", &blocks);
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
  if (err == AX_OK)
    err = append(&r, "params", &w->params, &w->np);
  if (err == AX_OK)
    err = append(&r, "buffers", &w->buffers, &w->nb);
  info->step = (long)step;
  w->blocks = (int)blocks;
  axi_ckr_close(&r);
  return err;
}

/* The whole model of a checkpoint directory (or root) or a model file,
 * checked against the model's own layout (sizes, blocks). */
static int gather(const char *path, ax_ckpt_info *info, whole *w) {
  struct stat st;
  memset(w, 0, sizeof *w);
  int err;
  if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
    err = read_model_file(path, info, w);
  } else {
    char dir[1024];
    err = ax_ckpt_find(path, dir, sizeof dir);
    if (err == AX_OK)
      err = join_stages(dir, info, w);
  }
  if (err != AX_OK)
    whole_free(w);
  return err;
}

static int build(const ax_ckpt_info *info, const whole *w, ax_device dev,
                 ax_net **out) {
  const ax_model_def *def = ax_model_find(info->model);
  if (!def)
    return AX_ENOTFOUND;
  ax_config cfg;
  ax_model_info mi;
  AX_TRY(ax_model_config(def, info->model_config, &cfg));
  AX_TRY(def->describe(&cfg, &mi));
  if (w->blocks != mi.n_blocks)
    return ax_seterr(AX_EFORMAT,
                     "checkpoint: %d blocks of %s, the model has "
                     "%d",
                     w->blocks, info->model, mi.n_blocks);
  ax_net *net;
  AX_TRY(ax_model_stage(def, &cfg, 0, mi.n_blocks, dev, 0, &net));
  int err = AX_OK;
  if (w->np != net->n_params || w->nb != net->n_buffers)
    err = ax_seterr(AX_EFORMAT,
                    "checkpoint: %zu parameters and %zu buffer "
                    "values, %s (%s) has %zu and %zu",
                    w->np, w->nb, info->model, info->model_config,
                    net->n_params, net->n_buffers);
  if (err == AX_OK)
    err = ax_tensor_write(net->params, w->params, w->np * sizeof(float));
  if (err == AX_OK && w->nb)
    err = ax_tensor_write(net->buffers, w->buffers, w->nb * sizeof(float));
  if (err != AX_OK) {
    ax_net_free(net);
    return err;
  }
  *out = net;
  return AX_OK;
}

int ax_ckpt_load_net(const char *path, ax_device dev, ax_net **net,
                     ax_ckpt_info *info) {
  whole w;
  *net = NULL;
  AX_TRY(gather(path, info, &w));
  int err = build(info, &w, dev, net);
  whole_free(&w);
  return err;
}

int ax_ckpt_export(const char *path, const char *out) {
  ax_ckpt_info info;
  whole w;
  ax_net *net = NULL;
  AX_TRY(gather(path, &info, &w));
  int err = build(&info, &w, AX_CPU, &net); /* checks the layout */
  ax_net_free(net);
  if (err == AX_OK) {
    axi_ckw f;
    axi_ckw_init(&f, AXI_CK_MODEL);
    axi_ckw_str(&f, "model", info.model);
    axi_ckw_str(&f, "model_config", info.model_config);
    axi_ckw_str(&f, "dataset", info.dataset);
    axi_ckw_str(&f, "data_config", info.data_config);
    axi_ckw_i64(&f, "step", info.step);
    axi_ckw_i64(&f, "blocks", w.blocks);
    axi_ckw_f32(&f, "params", w.params, w.np);
    axi_ckw_f32(&f, "buffers", w.buffers, w.nb);
    err = axi_ckw_commit(&f, out, NULL, NULL);
  }
  whole_free(&w);
  return err;
}
