/* Checkpoint files (docs/CHECKPOINTS.md): a checked list of named records,
 * written atomically, and the manifest that makes a checkpoint directory
 * valid. Internal to the checkpoint code (checkpoint.c, stage_ckpt.c,
 * ckpt_model.c).
 *
 * A file is "AXCKPT01", u32 kind, u32 record count, the records (u16 name
 * length, the name, u8 type, u64 count, the payload: an i64, `count` bytes
 * of a string, or `count` f32), then the SHA-256 of everything before it.
 * All integers and floats little-endian.
 *
 * Writing: axi_ckw_* build the file in memory; axi_ckw_commit writes it to
 * PATH.tmp, fsyncs, renames it to PATH and fsyncs the directory, so PATH
 * is either absent, the old file, or the whole new one.
 * Reading: axi_ckr_open reads the whole file and refuses (AX_EFORMAT, the
 * message naming the file and what is wrong) a short file, a bad magic or
 * kind, a checksum that does not match its content or the manifest's, or
 * a record running past the end; nothing of it is used then.
 * Not thread-safe per object; distinct objects are independent. */
#ifndef AX_PIPELINE_CKPT_FILE_H
#define AX_PIPELINE_CKPT_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "axon/kernels/tensor.h"
#include "axon/rpc/digest.h"

enum {
  AXI_CK_STAGE = 1, /* a stage's state: stage-SS.axck */
  AXI_CK_COORD = 2, /* the coordinator's: coordinator.axck */
  AXI_CK_MODEL = 3  /* a whole model's parameters: axon-run export */
};
enum { AXI_CK_I64 = 1, AXI_CK_STR = 2, AXI_CK_F32 = 3 };

typedef struct axi_ckw {
  uint8_t *buf;
  size_t len, cap;
  uint32_t nrec;
  int err; /* the first error; every call after it is a no-op */
} axi_ckw;

void axi_ckw_init(axi_ckw *w, int kind);
void axi_ckw_i64(axi_ckw *w, const char *name, int64_t v);
void axi_ckw_str(axi_ckw *w, const char *name, const char *s);
/* n floats from host memory. */
void axi_ckw_f32(axi_ckw *w, const char *name, const float *v, size_t n);
/* Appends the floats of tensor t (any device; NULL: an empty record). */
void axi_ckw_tensor(axi_ckw *w, const char *name, const ax_tensor *t);
/* Finishes the file and writes it atomically to path (see above); its size
 * and SHA-256 (hex) into *size and sha (either may be NULL). Frees the
 * buffer in every case. AX_EIO naming the path on a failed write. */
int axi_ckw_commit(axi_ckw *w, const char *path, int64_t *size,
                   char sha[2 * AX_SHA256_LEN + 1]);
void axi_ckw_free(axi_ckw *w);
/* The same without writing: the finished file in *buf (malloc'd, the
 * caller frees) and *len. */
int axi_ckw_finish(axi_ckw *w, uint8_t **buf, size_t *len,
                   char sha[2 * AX_SHA256_LEN + 1]);
/* buf to path through path.tmp, fsync, rename and a directory fsync. */
int axi_write_atomic(const char *path, const void *buf, size_t len);
/* A file's bytes as a tensor (i32, zero-padded to 4 bytes; tensors travel
 * on the data channel, unlike bytes values), and back: *out malloc'd,
 * AX_EBADARG unless t holds len bytes. */
ax_tensor *axi_ck_pack(const void *buf, size_t len);
int axi_ck_unpack(const ax_tensor *t, size_t len, uint8_t **out);

typedef struct axi_ckr {
  uint8_t *buf;
  size_t len;
  char path[1024];
  int kind;
} axi_ckr;

/* Reads and checks path (kind: the expected AXI_CK_*; size >= 0 and sha
 * non-NULL: what the manifest says). */
int axi_ckr_open(axi_ckr *r, const char *path, int kind, int64_t size,
                 const char *sha);
/* The same checks on a file held in memory (name for messages); takes buf
 * (malloc'd) in every case. */
int axi_ckr_mem(axi_ckr *r, const char *name, uint8_t *buf, size_t len,
                int kind, int64_t size, const char *sha);
void axi_ckr_close(axi_ckr *r);
/* A record by name: AX_EFORMAT naming the file when it is missing or of
 * another type. f32 pointers borrow the reader's buffer (f32 data may be
 * unaligned: copy with memcpy or axi_ckr_tensor). */
int axi_ckr_i64(const axi_ckr *r, const char *name, int64_t *v);
/* 1 when r has a record `name` (of any type). */
int axi_ckr_has(const axi_ckr *r, const char *name);
/* An i64 record that older files may lack: dflt when absent. */
int axi_ckr_i64_opt(const axi_ckr *r, const char *name, int64_t dflt,
                    int64_t *v);
/* A string record copied into out (cap bytes with its NUL). */
int axi_ckr_str(const axi_ckr *r, const char *name, char *out, size_t cap);
int axi_ckr_f32(const axi_ckr *r, const char *name, const uint8_t **data,
                size_t *n);
/* Copies record `name` into tensor t (any device; NULL t: the record must
 * be empty). AX_EFORMAT naming the file when the sizes differ. */
int axi_ckr_tensor(const axi_ckr *r, const char *name, ax_tensor *t);

/* ---- directories and the manifest ---------------------------------------- */
#define AXI_CK_MANIFEST "MANIFEST"
#define AXI_CK_COORD_FILE "coordinator.axck"
#define AXI_CK_MAX_FILES 256

typedef struct axi_manifest {
  long step;
  char layout[512]; /* "key=value ..." of the layout that wrote it, or "" */
  int nfiles;
  struct {
    char name[64];
    int64_t size;
    char sha[2 * AX_SHA256_LEN + 1];
  } f[AXI_CK_MAX_FILES];
} axi_manifest;

/* dir's coordinator record (listed in m) checked and open in *r (the
 * caller closes it), its step, data position, seed, model, data set and
 * configuration in *info (ckpt_info.c). */
struct ax_ckpt_info;
int axi_ckpt_read_coord(const char *dir, const axi_manifest *m,
                        struct ax_ckpt_info *info, axi_ckr *r);
/* mkdir -p. AX_EIO naming the path. */
int axi_mkdirs(const char *path);
/* Writes dir/MANIFEST atomically (the last file of a checkpoint). */
int axi_manifest_write(const char *dir, const axi_manifest *m);
/* Reads and checks dir/MANIFEST (its own checksum line). */
int axi_manifest_read(const char *dir, axi_manifest *m);
/* The entry of file `name`, or NULL. */
const void *axi_manifest_find(const axi_manifest *m, const char *name,
                              int64_t *size, const char **sha);
/* "ckpt-%08ld" of step under root into out. */
void axi_ckpt_dirname(const char *root, long step, char *out, size_t len);
/* Removes a checkpoint directory: its files, then itself (best effort). */
void axi_ckpt_remove(const char *dir);
/* The steps of root's checkpoint directories that have a MANIFEST file,
 * newest first, into steps (at most cap); returns their count (0 when root
 * has none or does not exist). */
int axi_ckpt_list(const char *root, long *steps, int cap);

#endif
