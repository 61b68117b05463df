/* libFuzzer harness: the value codec (rpc/codec.c), decoding a whole frame
 * held in memory (prefix, protobuf body, tensor bytes) as the control
 * stream does for every frame of a gRPC message (axi_frame_decode_lim).
 *
 * Input: byte 0 selects the limits (bit 0: small ones, so that the limit
 * paths run), the rest is the frame. A frame that decodes is encoded
 * again (axi_frame_encode) and decoded once more: the result must equal
 * the first decoding, so the codec reads back what it writes. */
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/codec-impl.h"
#include "axon/rpc/value-impl.h"
#include "tests/fuzz/fuzz_common.h"

static int same_str(const char *a, const char *b) {
  return !strcmp(a ? a : "", b ? b : "");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  axi_limits lim = {AXI_MAX_HDR, 65536, (size_t)4 << 30};
  if (data[0] & 1)
    lim = (axi_limits){256, 4, 4096};
  axi_msg m;
  int rc = axi_frame_decode_lim(data + 1, size - 1, AX_CPU, NULL, &lim, &m);
  if (rc != AX_OK) {
    FUZZ_CHECK(rc == AX_EMALFORMED || rc == AX_ETOOBIG || rc == AX_ENOMEM);
    FUZZ_CHECK(!m.values && !m.pb_); /* nothing held on error */
    axi_msg_clear(&m);
    return 0;
  }
  uint8_t *buf = NULL;
  size_t len = 0, blob = 0;
  rc = axi_frame_encode(&m, 0, 1, &buf, &len, &blob);
  FUZZ_CHECK(rc == AX_OK);
  axi_msg r;
  rc = axi_frame_decode_lim(buf, len, AX_CPU, NULL, &lim, &r);
  FUZZ_CHECK(rc == AX_OK);
  FUZZ_CHECK(r.kind == m.kind && r.call_id == m.call_id &&
             r.timeout_ms == m.timeout_ms && r.err == m.err &&
             r.autograd_ctx == m.autograd_ctx && r.depth == m.depth &&
             r.nmeta == m.nmeta && r.auth_len == m.auth_len);
  FUZZ_CHECK(same_str(r.fn, m.fn) && same_str(r.errmsg, m.errmsg) &&
             same_str(r.node, m.node) && same_str(r.addr, m.addr) &&
             same_str(r.bulk_addr, m.bulk_addr));
  FUZZ_CHECK(!m.auth_len || !memcmp(r.auth, m.auth, m.auth_len));
  for (int i = 0; i < m.nmeta; i++)
    FUZZ_CHECK(same_str(r.meta_key[i], m.meta_key[i]) &&
               r.meta_val[i] == m.meta_val[i]);
  FUZZ_CHECK(fuzz_values_equal(m.values, r.values));
  axi_msg_clear(&r);
  axi_msg_clear(&m);
  free(buf);
  return 0;
}
