/* "tokens": language-model windows from pre-tokenized files in llm.c's
 * format (lm-impl.h). A file is a header of 256 little-endian int32 (magic
 * 20240520, version 1 for uint16 GPT-2 tokens, the token count, the rest
 * unused) followed by that many little-endian uint16 tokens. Files are
 * mapped, checked whole at open (every header field, the size against the
 * count, every token below vocab), and never copied. */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "axon/models/data/lm-impl.h"

#define HEADER_INTS 256
#define HEADER_BYTES (HEADER_INTS * 4)
#define MAGIC 20240520
#define VERSION 1
/* The share of the train= tokens held out as the test split without val=. */
#define TAIL_FRAC 0.05

static int32_t le32(const unsigned char *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                   (uint32_t)p[3] << 24);
}

/* Checks the mapped file p (size bytes) named path; its token count in
 * *count. */
static int check_file(const char *path, const unsigned char *p, size_t size,
                      int vocab, int64_t *count) {
  if (size < HEADER_BYTES)
    return ax_seterr(AX_EFORMAT,
                     "%s: %zu bytes, shorter than the %d-byte "
                     "header of an llm.c token file",
                     path, size, HEADER_BYTES);
  int32_t magic = le32(p), version = le32(p + 4), n = le32(p + 8);
  if (magic != MAGIC)
    return ax_seterr(AX_EFORMAT,
                     "%s: bad magic %d (an llm.c token file "
                     "starts with %d)",
                     path, magic, MAGIC);
  if (version != VERSION)
    return ax_seterr(AX_EFORMAT,
                     "%s: bad version %d (only %d, uint16 "
                     "GPT-2 tokens, is read)",
                     path, version, VERSION);
  if (n <= 0)
    return ax_seterr(AX_EFORMAT, "%s: the header counts %d tokens", path, n);
  size_t want = HEADER_BYTES + 2 * (size_t)n;
  if (size < want)
    return ax_seterr(AX_EFORMAT,
                     "%s: truncated: %zu bytes, the header's "
                     "%d tokens need %zu",
                     path, size, n, want);
  if (size > want)
    return ax_seterr(AX_EFORMAT,
                     "%s: %zu bytes do not match the header's "
                     "count of %d tokens (%zu bytes)",
                     path, size, n, want);
  const unsigned char *t = p + HEADER_BYTES;
  for (int64_t k = 0; k < n; k++) {
    int v = t[2 * k] | t[2 * k + 1] << 8;
    if (v >= vocab)
      return ax_seterr(AX_EFORMAT,
                       "%s: token %d at position %lld is out "
                       "of range (vocab=%d)",
                       path, v, (long long)k, vocab);
  }
  *count = n;
  return AX_OK;
}

/* Maps and checks one file, adds it to lm as a piece. */
static int add_file(axi_lm *lm, const char *path, int vocab) {
  int fd = open(path, O_RDONLY);
  if (fd < 0)
    return ax_seterr(errno == ENOENT ? AX_ENOTFOUND : AX_EIO, "%s: %s", path,
                     strerror(errno));
  struct stat st;
  int e = fstat(fd, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR : 0;
  if (e) {
    close(fd);
    return ax_seterr(AX_EIO, "%s: %s", path, strerror(e));
  }
  size_t size = (size_t)st.st_size;
  if (size == 0) {
    close(fd);
    return ax_seterr(AX_EFORMAT, "%s: empty file", path);
  }
  void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    return ax_seterr(AX_EIO, "%s: cannot map: %s", path, strerror(errno));
  void **maps = realloc(lm->maps, sizeof *maps * (size_t)(lm->nmaps + 1));
  size_t *lens =
      maps ? realloc(lm->map_len, sizeof *lens * (size_t)(lm->nmaps + 1))
           : NULL;
  if (maps)
    lm->maps = maps;
  if (lens)
    lm->map_len = lens;
  if (!maps || !lens) {
    munmap(p, size);
    return ax_seterr(AX_ENOMEM, "%s: out of memory", path);
  }
  lm->maps[lm->nmaps] = p;
  lm->map_len[lm->nmaps++] = size;
  int64_t n = 0;
  AX_TRY(check_file(path, p, size, vocab, &n));
  return axi_lm_piece(lm, (const unsigned char *)p + HEADER_BYTES, n);
}

/* Adds every file the pattern names (a path or a glob, in sorted order). */
static int add_files(axi_lm *lm, const char *pattern, int vocab) {
  glob_t g;
  int r = glob(pattern, 0, NULL, &g);
  if (r == GLOB_NOMATCH)
    return ax_seterr(AX_ENOTFOUND, "%s: no such file", pattern);
  if (r != 0)
    return ax_seterr(r == GLOB_NOSPACE ? AX_ENOMEM : AX_EIO,
                     "%s: cannot list the files", pattern);
  int rc = AX_OK;
  for (size_t i = 0; i < g.gl_pathc && rc == AX_OK; i++)
    rc = add_file(lm, g.gl_pathv[i], vocab);
  globfree(&g);
  return rc;
}

static int tokens_open(ax_dataset *ds, const ax_config *cfg, int split) {
  int err = AX_OK;
  const char *train = ax_config_str(cfg, "train", NULL);
  const char *val = ax_config_str(cfg, "val", NULL);
  int64_t seq = ax_config_int(cfg, "seq", 64, &err);
  int64_t vocab = ax_config_int(cfg, "vocab", 50257, &err);
  if (err != AX_OK)
    return err;
  if (!train)
    return ax_seterr(AX_EINVAL, "tokens: train=PATH (a file or a glob of "
                                "llm.c token files) is needed");
  if (seq < 1 || seq > (1 << 20))
    return ax_seterr(AX_EINVAL, "tokens: seq=%lld not in [1, 2^20]",
                     (long long)seq);
  if (vocab < 2 || vocab > 65536)
    return ax_seterr(AX_EINVAL, "tokens: vocab=%lld not in [2, 65536]",
                     (long long)vocab);
  /* Without val= the test split is the tail of the train= tokens. */
  const char *files = split == AX_SPLIT_TEST && val ? val : train;
  axi_lm *lm = axi_lm_new(2, (int)seq, vocab == 256);
  if (!lm)
    return AX_ENOMEM;
  int rc = add_files(lm, files, (int)vocab);
  if (rc == AX_OK)
    rc = axi_lm_finish(ds, lm, val ? 0.0 : TAIL_FRAC, split, files);
  if (rc != AX_OK) {
    axi_lm_free(lm);
    return rc;
  }
  ds->vocab = (int)vocab;
  return AX_OK;
}

const axi_dataset_ops axi_ds_tokens = {
    /* .name = */ "tokens",
    /* .open = */ tokens_open,
    /* .batch = */ axi_lm_batch,
    /* .close = */ axi_lm_close,
};
