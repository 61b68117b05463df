/* Checkpoint files: records, atomic writes, checked reads (ckpt_file-impl.h).
 */
#include "axon/runtime/pipeline/state/ckpt_file-impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC "AXCKPT01"
#define HDR (8 + 4 + 4)

/* ---- writing ------------------------------------------------------------- */
static void put(axi_ckw *w, const void *p, size_t n) {
  if (w->err)
    return;
  if (w->len + n > w->cap) {
    size_t cap = w->cap ? w->cap : 4096;
    while (cap < w->len + n)
      cap *= 2;
    uint8_t *b = realloc(w->buf, cap);
    if (!b) {
      w->err = ax_seterr(AX_ENOMEM, "checkpoint: no memory for %zu bytes", cap);
      return;
    }
    w->buf = b;
    w->cap = cap;
  }
  if (n && p) /* p NULL: room only */
    memcpy(w->buf + w->len, p, n);
  w->len += n;
}

static void put_u(axi_ckw *w, uint64_t v, int bytes) {
  uint8_t b[8];
  for (int i = 0; i < bytes; i++)
    b[i] = (uint8_t)(v >> (8 * i));
  put(w, b, (size_t)bytes);
}

void axi_ckw_init(axi_ckw *w, int kind) {
  memset(w, 0, sizeof *w);
  put(w, MAGIC, 8);
  put_u(w, (uint64_t)kind, 4);
  put_u(w, 0, 4); /* the record count, set at commit */
}

static void rec_head(axi_ckw *w, const char *name, int type, uint64_t n) {
  size_t l = strlen(name);
  put_u(w, l, 2);
  put(w, name, l);
  put_u(w, (uint64_t)type, 1);
  put_u(w, n, 8);
  w->nrec++;
}

void axi_ckw_i64(axi_ckw *w, const char *name, int64_t v) {
  rec_head(w, name, AXI_CK_I64, 1);
  put_u(w, (uint64_t)v, 8);
}

void axi_ckw_str(axi_ckw *w, const char *name, const char *s) {
  size_t l = s ? strlen(s) : 0;
  rec_head(w, name, AXI_CK_STR, l);
  put(w, s, l);
}

void axi_ckw_f32(axi_ckw *w, const char *name, const float *v, size_t n) {
  rec_head(w, name, AXI_CK_F32, n);
  put(w, v, n * sizeof(float)); /* the hosts are little-endian */
}

void axi_ckw_tensor(axi_ckw *w, const char *name, const ax_tensor *t) {
  size_t n = t ? ax_tensor_numel(t) : 0;
  rec_head(w, name, AXI_CK_F32, n);
  if (w->err || !n)
    return;
  put(w, NULL, n * sizeof(float)); /* room, then read the tensor into it */
  if (!w->err && ax_tensor_read(t, w->buf + w->len - n * sizeof(float),
                                n * sizeof(float)) != AX_OK)
    w->err = ax_seterr(AX_EIO, "checkpoint: cannot read tensor %s: %s", name,
                       ax_errmsg());
}

void axi_ckw_free(axi_ckw *w) {
  free(w->buf);
  w->buf = NULL;
  w->len = w->cap = 0;
}

static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

static void fsync_dir_of(const char *path) {
  char d[1024];
  snprintf(d, sizeof d, "%s", path);
  char *slash = strrchr(d, '/');
  if (slash)
    *slash = 0;
  else
    snprintf(d, sizeof d, ".");
  int fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

int axi_write_atomic(const char *path, const void *buf, size_t len) {
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return ax_seterr(AX_EIO, "checkpoint: cannot create %s: %s", tmp,
                     strerror(errno));
  int bad = write_all(fd, (const uint8_t *)buf, len) != 0 || fsync(fd) != 0;
  int e = errno;
  bad |= close(fd) != 0;
  if (bad || rename(tmp, path) != 0) {
    e = bad ? e : errno;
    unlink(tmp);
    return ax_seterr(AX_EIO, "checkpoint: cannot write %s: %s", path,
                     strerror(e));
  }
  fsync_dir_of(path);
  return AX_OK;
}

int axi_ckw_finish(axi_ckw *w, uint8_t **buf, size_t *len,
                   char sha[2 * AX_SHA256_LEN + 1]) {
  int err = w->err;
  uint8_t d[AX_SHA256_LEN];
  *buf = NULL;
  if (err == AX_OK) {
    for (int i = 0; i < 4; i++)
      w->buf[12 + i] = (uint8_t)(w->nrec >> (8 * i));
    err = ax_sha256(w->buf, w->len, d);
  }
  if (err == AX_OK) {
    put(w, d, sizeof d);
    err = w->err;
  }
  if (err == AX_OK && sha)
    err = ax_sha256_hex(w->buf, w->len, sha);
  if (err != AX_OK) {
    axi_ckw_free(w);
    return err;
  }
  *buf = w->buf;
  *len = w->len;
  w->buf = NULL;
  w->len = w->cap = 0;
  return AX_OK;
}

int axi_ckw_commit(axi_ckw *w, const char *path, int64_t *size,
                   char sha[2 * AX_SHA256_LEN + 1]) {
  uint8_t *buf;
  size_t len;
  AX_TRY(axi_ckw_finish(w, &buf, &len, sha));
  int err = axi_write_atomic(path, buf, len);
  if (err == AX_OK && size)
    *size = (int64_t)len;
  free(buf);
  return err;
}

ax_tensor *axi_ck_pack(const void *buf, size_t len) {
  int64_t n = (int64_t)((len + 3) / 4);
  ax_tensor *t = ax_tensor_zeros(AX_I32, 1, &n, AX_CPU);
  if (t && len)
    memcpy(t->data, buf, len);
  return t;
}

int axi_ck_unpack(const ax_tensor *t, size_t len, uint8_t **out) {
  size_t nb = t ? ax_tensor_nbytes(t) : 0;
  *out = NULL;
  if (!t || t->dtype != AX_I32 || nb < len || nb >= len + 4)
    return ax_seterr(AX_EBADARG,
                     "checkpoint: a file of %zu bytes came in "
                     "a tensor of %zu",
                     len, nb);
  uint8_t *b = malloc(nb + 1);
  if (!b)
    return AX_ENOMEM;
  int err = ax_tensor_read(t, b, nb);
  if (err != AX_OK) {
    free(b);
    return err;
  }
  *out = b;
  return AX_OK;
}

/* ---- reading ------------------------------------------------------------- */
static uint64_t get_u(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static int bad(const axi_ckr *r, const char *what) {
  return ax_seterr(AX_EFORMAT, "checkpoint file %s is damaged: %s", r->path,
                   what);
}

/* Walks the records; with name, stops at it (*at, *type, *n), else checks
 * that they all lie inside the file. */
static int walk(const axi_ckr *r, const char *name, size_t *at, int *type,
                uint64_t *n) {
  size_t end = r->len - AX_SHA256_LEN, p = HDR;
  uint32_t nrec = (uint32_t)get_u(r->buf + 12, 4);
  for (uint32_t i = 0; i < nrec; i++) {
    if (p + 2 > end)
      return bad(r, "a record runs past the end");
    size_t l = (size_t)get_u(r->buf + p, 2);
    if (p + 2 + l + 9 > end)
      return bad(r, "a record runs past the end");
    const char *nm = (const char *)r->buf + p + 2;
    int t = r->buf[p + 2 + l];
    uint64_t cnt = get_u(r->buf + p + 3 + l, 8);
    size_t body = p + 11 + l;
    uint64_t bytes = t == AXI_CK_I64                              ? 8
                     : t == AXI_CK_STR                            ? cnt
                     : t == AXI_CK_F32 && cnt < (UINT64_MAX >> 3) ? cnt * 4
                                                                  : UINT64_MAX;
    if ((t == AXI_CK_I64 && cnt != 1) || bytes > end - body)
      return bad(r, "a record runs past the end or has a bad type");
    if (name && strlen(name) == l && !memcmp(nm, name, l)) {
      *at = body;
      *type = t;
      *n = cnt;
      return AX_OK;
    }
    p = body + (size_t)bytes;
  }
  if (name)
    return ax_seterr(AX_EFORMAT, "checkpoint file %s has no record '%s'",
                     r->path, name);
  return p == end ? AX_OK : bad(r, "bytes after the last record");
}

/* Checks r->buf (r->len bytes) as a file of `kind` (see axi_ckr_open). */
static int check(axi_ckr *r, int kind, int64_t size, const char *sha) {
  int err = AX_OK;
  char hex[2 * AX_SHA256_LEN + 1];
  uint8_t d[AX_SHA256_LEN];
  if (size >= 0 && (int64_t)r->len != size) {
    char m[96];
    snprintf(m, sizeof m, "%zu bytes, the manifest says %lld", r->len,
             (long long)size);
    err = bad(r, m);
  } else if (r->len < HDR + AX_SHA256_LEN || memcmp(r->buf, MAGIC, 8)) {
    err = bad(r, "too short or not a checkpoint file (magic)");
  } else if ((err = ax_sha256(r->buf, r->len - AX_SHA256_LEN, d)) != AX_OK) {
  } else if (memcmp(d, r->buf + r->len - AX_SHA256_LEN, AX_SHA256_LEN)) {
    err = bad(r, "its SHA-256 does not match its content");
  } else if (sha && ((err = ax_sha256_hex(r->buf, r->len, hex)) != AX_OK ||
                     strcmp(hex, sha))) {
    err =
        err != AX_OK ? err : bad(r, "its SHA-256 differs from the manifest's");
  } else if ((int)get_u(r->buf + 8, 4) != kind) {
    err = bad(r, "a file of another kind");
  } else {
    r->kind = kind;
    err = walk(r, NULL, NULL, NULL, NULL);
  }
  if (err != AX_OK)
    axi_ckr_close(r);
  return err;
}

int axi_ckr_open(axi_ckr *r, const char *path, int kind, int64_t size,
                 const char *sha) {
  memset(r, 0, sizeof *r);
  snprintf(r->path, sizeof r->path, "%s", path);
  FILE *f = fopen(path, "rb");
  if (!f)
    return ax_seterr(AX_EIO, "checkpoint file %s: %s", path, strerror(errno));
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0)
    n = ftell(f);
  rewind(f);
  if (n < 0 || !(r->buf = malloc((size_t)n + 1))) {
    fclose(f);
    return ax_seterr(AX_EIO, "checkpoint file %s: cannot read", path);
  }
  r->len = fread(r->buf, 1, (size_t)n, f);
  fclose(f);
  return check(r, kind, size, sha);
}

int axi_ckr_mem(axi_ckr *r, const char *name, uint8_t *buf, size_t len,
                int kind, int64_t size, const char *sha) {
  memset(r, 0, sizeof *r);
  snprintf(r->path, sizeof r->path, "%s", name);
  r->buf = buf;
  r->len = len;
  return check(r, kind, size, sha);
}

void axi_ckr_close(axi_ckr *r) {
  free(r->buf);
  r->buf = NULL;
  r->len = 0;
}

static int find(const axi_ckr *r, const char *name, int type, size_t *at,
                uint64_t *n) {
  int t;
  AX_TRY(walk(r, name, at, &t, n));
  if (t != type)
    return ax_seterr(AX_EFORMAT,
                     "checkpoint file %s: record '%s' has type "
                     "%d, expected %d",
                     r->path, name, t, type);
  return AX_OK;
}

int axi_ckr_i64(const axi_ckr *r, const char *name, int64_t *v) {
  size_t at;
  uint64_t n;
  AX_TRY(find(r, name, AXI_CK_I64, &at, &n));
  *v = (int64_t)get_u(r->buf + at, 8);
  return AX_OK;
}

int axi_ckr_has(const axi_ckr *r, const char *name) {
  size_t at;
  uint64_t n;
  int t;
  return walk(r, name, &at, &t, &n) == AX_OK;
}

int axi_ckr_i64_opt(const axi_ckr *r, const char *name, int64_t dflt,
                    int64_t *v) {
  size_t at;
  uint64_t n;
  int t;
  /* An opened file's records were all walked: failing here means absent. */
  if (walk(r, name, &at, &t, &n) != AX_OK) {
    *v = dflt;
    return AX_OK;
  }
  return axi_ckr_i64(r, name, v);
}

int axi_ckr_str(const axi_ckr *r, const char *name, char *out, size_t cap) {
  size_t at;
  uint64_t n;
  AX_TRY(find(r, name, AXI_CK_STR, &at, &n));
  if (n >= cap)
    return ax_seterr(AX_EFORMAT,
                     "checkpoint file %s: '%s' is %llu bytes "
                     "long, at most %zu expected",
                     r->path, name, (unsigned long long)n, cap - 1);
  memcpy(out, r->buf + at, (size_t)n);
  out[n] = 0;
  return AX_OK;
}

int axi_ckr_f32(const axi_ckr *r, const char *name, const uint8_t **data,
                size_t *n) {
  size_t at;
  uint64_t cnt;
  AX_TRY(find(r, name, AXI_CK_F32, &at, &cnt));
  *data = r->buf + at;
  *n = (size_t)cnt;
  return AX_OK;
}

int axi_ckr_tensor(const axi_ckr *r, const char *name, ax_tensor *t) {
  const uint8_t *d;
  size_t n, want = t ? ax_tensor_numel(t) : 0;
  AX_TRY(axi_ckr_f32(r, name, &d, &n));
  if (n != want)
    return ax_seterr(AX_EFORMAT,
                     "checkpoint file %s: '%s' has %zu values, "
                     "this model needs %zu",
                     r->path, name, n, want);
  return n ? ax_tensor_write(t, d, n * sizeof(float)) : AX_OK;
}
