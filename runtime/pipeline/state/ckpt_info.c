/* Finding checkpoints and reading their coordinator record (checkpoint.h,
 * ckpt_file-impl.h): below both the pipeline's restore and the mover. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "axon/runtime/pipeline/state/checkpoint.h"
#include "axon/runtime/pipeline/state/ckpt_file-impl.h"

int ax_ckpt_find(const char *path, char *dir, size_t len) {
  char m[1100];
  struct stat st;
  snprintf(m, sizeof m, "%s/" AXI_CK_MANIFEST, path);
  if (stat(m, &st) == 0) {
    snprintf(dir, len, "%s", path);
    return AX_OK;
  }
  long *steps = calloc(4096, sizeof *steps);
  int n = steps ? axi_ckpt_list(path, steps, 4096) : 0;
  if (n > 0)
    axi_ckpt_dirname(path, steps[0], dir, len);
  free(steps);
  if (n < 1)
    return ax_seterr(AX_ENOTFOUND,
                     "checkpoint: %s holds no complete "
                     "checkpoint (no MANIFEST, no ckpt-N/MANIFEST)",
                     path);
  return AX_OK;
}

void ax_ckpt_previous(const char *dir, char *out, size_t len) {
  char root[1024];
  out[0] = 0;
  snprintf(root, sizeof root, "%s", dir);
  char *slash = strrchr(root, '/');
  const char *base = slash ? slash + 1 : root;
  long me;
  if (strncmp(base, "ckpt-", 5) || sscanf(base + 5, "%ld", &me) != 1)
    return;
  if (slash)
    *slash = 0;
  else
    snprintf(root, sizeof root, ".");
  long all[4096];
  int n = axi_ckpt_list(root, all, 4096);
  for (int i = 0; i < n; i++)
    if (all[i] < me) {
      axi_ckpt_dirname(root, all[i], out, len);
      return;
    }
}

int axi_ckpt_read_coord(const char *dir, const axi_manifest *m,
                        ax_ckpt_info *info, axi_ckr *r) {
  int64_t size;
  const char *sha;
  char path[1200];
  snprintf(path, sizeof path, "%s/" AXI_CK_COORD_FILE, dir);
  if (!axi_manifest_find(m, AXI_CK_COORD_FILE, &size, &sha))
    return ax_seterr(AX_EFORMAT,
                     "checkpoint file %s/" AXI_CK_MANIFEST
                     " is damaged: it lists no " AXI_CK_COORD_FILE,
                     dir);
  AX_TRY(axi_ckr_open(r, path, AXI_CK_COORD, size, sha));
  int64_t v[4];
  const char *keys[4] = {"step", "data.epoch", "data.batch", "seed"};
  int err = AX_OK;
  for (int i = 0; i < 4 && err == AX_OK; i++)
    err = axi_ckr_i64(r, keys[i], &v[i]);
  memset(info, 0, sizeof *info);
  info->step = (long)v[0];
  info->data_epoch = (long)v[1];
  info->data_batch = (long)v[2];
  info->seed = (uint64_t)v[3];
  if (err == AX_OK)
    err = axi_ckr_str(r, "model", info->model, sizeof info->model);
  if (err == AX_OK)
    err = axi_ckr_str(r, "model_config", info->model_config,
                      sizeof info->model_config);
  if (err == AX_OK)
    err = axi_ckr_str(r, "dataset", info->dataset, sizeof info->dataset);
  if (err == AX_OK)
    err = axi_ckr_str(r, "data_config", info->data_config,
                      sizeof info->data_config);
  if (err == AX_OK)
    err = axi_ckr_str(r, "config", info->config, sizeof info->config);
  if (err == AX_OK && info->step != m->step)
    err = ax_seterr(AX_EFORMAT,
                    "checkpoint file %s: step %ld, the manifest "
                    "says %ld",
                    path, info->step, m->step);
  if (err != AX_OK)
    axi_ckr_close(r);
  return err;
}

int ax_ckpt_read_info(const char *dir, ax_ckpt_info *info) {
  axi_manifest m;
  axi_ckr r;
  AX_TRY(axi_manifest_read(dir, &m));
  AX_TRY(axi_ckpt_read_coord(dir, &m, info, &r));
  axi_ckr_close(&r);
  return AX_OK;
}
