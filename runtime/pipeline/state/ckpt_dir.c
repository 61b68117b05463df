/* Checkpoint directories and their manifest (ckpt_file-impl.h). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "axon/runtime/pipeline/state/ckpt_file-impl.h"

#define HEAD "axon-checkpoint 1\n"

int axi_mkdirs(const char *path) {
  char p[1024];
  snprintf(p, sizeof p, "%s", path);
  for (char *s = p + 1;; s++) {
    char c = *s;
    if (c != '/' && c != 0)
      continue;
    *s = 0;
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
      return ax_seterr(AX_EIO, "checkpoint: cannot create directory %s: %s", p,
                       strerror(errno));
    *s = c;
    if (!c)
      break;
  }
  return AX_OK;
}

void axi_ckpt_dirname(const char *root, long step, char *out, size_t len) {
  snprintf(out, len, "%s/ckpt-%08ld", root, step);
}

int axi_manifest_write(const char *dir, const axi_manifest *m) {
  char text[AXI_CK_MAX_FILES * 180 + 256], path[1100], tmp[1110];
  size_t n = (size_t)snprintf(text, sizeof text, HEAD "step %ld\n", m->step);
  if (m->layout[0]) /* the layout that wrote it (state.h) */
    n += (size_t)snprintf(text + n, sizeof text - n, "layout %s\n", m->layout);
  for (int i = 0; i < m->nfiles && n < sizeof text; i++)
    n += (size_t)snprintf(text + n, sizeof text - n, "file %s %lld %s\n",
                          m->f[i].name, (long long)m->f[i].size, m->f[i].sha);
  char hex[2 * AX_SHA256_LEN + 1];
  AX_TRY(ax_sha256_hex(text, n, hex));
  n += (size_t)snprintf(text + n, sizeof text - n, "sha256 %s\n", hex);
  if (n >= sizeof text)
    return ax_seterr(AX_EINVAL, "checkpoint: manifest too long");
  snprintf(path, sizeof path, "%s/" AXI_CK_MANIFEST, dir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  int ok = f && fwrite(text, 1, n, f) == n && fflush(f) == 0 &&
           fsync(fileno(f)) == 0;
  int e = errno;
  if (f && fclose(f) != 0)
    ok = 0;
  if (!ok || rename(tmp, path) != 0) {
    e = ok ? errno : e;
    unlink(tmp);
    return ax_seterr(AX_EIO, "checkpoint: cannot write %s: %s", path,
                     strerror(e));
  }
  FILE *d = fopen(dir, "r"); /* the rename reaches the disk */
  if (d) {
    fsync(fileno(d));
    fclose(d);
  }
  return AX_OK;
}

static int mbad(const char *path, const char *what) {
  return ax_seterr(AX_EFORMAT, "checkpoint file %s is damaged: %s", path, what);
}

int axi_manifest_read(const char *dir, axi_manifest *m) {
  char path[1100], text[AXI_CK_MAX_FILES * 180 + 256];
  snprintf(path, sizeof path, "%s/" AXI_CK_MANIFEST, dir);
  memset(m, 0, sizeof *m);
  FILE *f = fopen(path, "rb");
  if (!f)
    return ax_seterr(AX_ENOTFOUND,
                     "checkpoint %s: no %s (%s): not a "
                     "complete checkpoint",
                     dir, path, strerror(errno));
  size_t n = fread(text, 1, sizeof text - 1, f);
  int more = fgetc(f) != EOF;
  fclose(f);
  text[n] = 0;
  if (more || strlen(text) != n)
    return mbad(path, "too long or not text");
  char *last = NULL;
  for (char *p = text; p < text + n; p = strchr(p, '\n') + 1) {
    if (!strchr(p, '\n'))
      return mbad(path, "its last line is cut");
    if (!strncmp(p, "sha256 ", 7))
      last = p;
  }
  char hex[2 * AX_SHA256_LEN + 1], want[2 * AX_SHA256_LEN + 2];
  if (!last || sscanf(last, "sha256 %65s", want) != 1 ||
      strlen(last) != 7 + 2 * AX_SHA256_LEN + 1)
    return mbad(path, "no checksum line at its end");
  AX_TRY(ax_sha256_hex(text, (size_t)(last - text), hex));
  if (strcmp(hex, want))
    return mbad(path, "its SHA-256 line does not match its content");
  if (strncmp(text, HEAD, strlen(HEAD)))
    return mbad(path, "not an axon checkpoint manifest (version 1)");
  char *p = text + strlen(HEAD);
  if (sscanf(p, "step %ld\n", &m->step) != 1 || m->step < 0)
    return mbad(path, "no step line");
  p = strchr(p, '\n') + 1;
  if (!strncmp(p, "layout ", 7)) { /* absent in older checkpoints */
    size_t l = strcspn(p + 7, "\n");
    if (l >= sizeof m->layout)
      return mbad(path, "a layout line too long");
    memcpy(m->layout, p + 7, l);
    m->layout[l] = 0;
    p = strchr(p, '\n') + 1;
  }
  for (; p < last; p = strchr(p, '\n') + 1) {
    if (m->nfiles == AXI_CK_MAX_FILES)
      return mbad(path, "too many files");
    long long size;
    int i = m->nfiles;
    if (sscanf(p, "file %63s %lld %64s\n", m->f[i].name, &size, m->f[i].sha) !=
            3 ||
        strlen(m->f[i].sha) != 2 * AX_SHA256_LEN || size < 0)
      return mbad(path, "a bad file line");
    m->f[i].size = size;
    m->nfiles++;
  }
  return AX_OK;
}

const void *axi_manifest_find(const axi_manifest *m, const char *name,
                              int64_t *size, const char **sha) {
  for (int i = 0; i < m->nfiles; i++)
    if (!strcmp(m->f[i].name, name)) {
      *size = m->f[i].size;
      *sha = m->f[i].sha;
      return &m->f[i];
    }
  return NULL;
}

void axi_ckpt_remove(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char path[1400];
  /* The manifest first: from then on the directory is not a checkpoint. */
  snprintf(path, sizeof path, "%s/" AXI_CK_MANIFEST, dir);
  unlink(path);
  while (d && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
      continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  if (d)
    closedir(d);
  rmdir(dir);
}

static int by_step_desc(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

int axi_ckpt_list(const char *root, long *steps, int cap) {
  DIR *d = opendir(root);
  struct dirent *e;
  int n = 0;
  while (d && (e = readdir(d)) && n < cap) {
    char *end;
    if (strncmp(e->d_name, "ckpt-", 5))
      continue;
    long s = strtol(e->d_name + 5, &end, 10);
    if (*end || end == e->d_name + 5)
      continue;
    char path[1400];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s/" AXI_CK_MANIFEST, root, e->d_name);
    if (stat(path, &st) == 0)
      steps[n++] = s;
  }
  if (d)
    closedir(d);
  qsort(steps, (size_t)n, sizeof *steps, by_step_desc);
  return n;
}
