/* "text": byte-level language-model windows (vocab 256) from any file,
 * gzip or plain, read as bytes (lm-impl.h). The train split is the head of
 * the file, the test split its held-out tail. */
#include <stdio.h>
#include <stdlib.h>

#include "axon/models/data/lm-impl.h"
#include "axon/models/data/text-impl.h"

/* Decompressed bytes read by default, as for "gcide": the first 16 MiB of
 * the 40 MB dictionary. */
#define DEFAULT_MAX_BYTES (16ll << 20)

static int text_open(ax_dataset *ds, const ax_config *cfg, int split) {
  int err = AX_OK;
  const char *path =
      ax_config_str(cfg, "file", "/usr/share/dictd/gcide.dict.dz");
  int64_t seq = ax_config_int(cfg, "seq", 64, &err);
  int64_t max_bytes =
      axi_config_bytes(cfg, "max_bytes", DEFAULT_MAX_BYTES, &err);
  double val = ax_config_float(cfg, "val", 0.05, &err);
  int64_t clean = ax_config_int(cfg, "clean", 0, &err);
  if (err != AX_OK)
    return err;
  if (seq < 1 || seq > (1 << 20))
    return ax_seterr(AX_EINVAL, "text: seq=%lld not in [1, 2^20]",
                     (long long)seq);
  if (!(val > 0 && val < 1))
    return ax_seterr(AX_EINVAL, "text: val=%g not in (0, 1)", val);
  if (clean != 0 && clean != 1)
    return ax_seterr(AX_EINVAL, "text: clean=%lld is not 0 or 1",
                     (long long)clean);
  unsigned char *buf;
  size_t len;
  AX_TRY(axi_read_file(path, (size_t)max_bytes, &buf, &len));
  if (len == 0) {
    free(buf);
    return ax_seterr(AX_EFORMAT, "%s: empty file", path);
  }
  if (clean) { /* dictionary markup out (text-impl.h) */
    char *text = axi_text_clean((const char *)buf, len, &len);
    free(buf);
    if (!text)
      return ax_seterr(AX_ENOMEM, "%s: out of memory", path);
    buf = (unsigned char *)text;
  }
  axi_lm *lm = axi_lm_new(1, (int)seq, 1);
  if (!lm) {
    free(buf);
    return AX_ENOMEM;
  }
  lm->buf = buf;
  int rc = axi_lm_piece(lm, buf, (int64_t)len);
  if (rc == AX_OK)
    rc = axi_lm_finish(ds, lm, val, split, path);
  if (rc != AX_OK) {
    axi_lm_free(lm);
    return rc;
  }
  ds->vocab = 256;
  return AX_OK;
}

const axi_dataset_ops axi_ds_text = {
    /* .name = */ "text",
    /* .open = */ text_open,
    /* .batch = */ axi_lm_batch,
    /* .close = */ axi_lm_close,
};
