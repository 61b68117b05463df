/* libFuzzer harness: the decoders of the typed stage messages
 * (runtime/pipeline/stage/stage_msg-impl.h: the stage host's methods and
 * replies, the push between stages, the in-memory checkpoint store, the
 * optimizer on another agent), which read lists other nodes send.
 *
 * Input: byte 0 (low 3 bits) says from which value on the decoders see the
 * list (a view of its tail, ax_values_view_range); the rest is one frame,
 * decoded by the value codec (axi_frame_decode_lim) as a received call
 * would be. Every decoder gets the list. One that refuses it must answer
 * AX_EBADARG naming its message; one that takes it must hand back a struct
 * that encodes to the same list and decodes again. RRefs in the list need
 * the process's RRef context: LLVMFuzzerInitialize starts one real node
 * ("fuzz", a world of one, on loopback) with ax_rref_init, as fuzz_rref
 * does. */
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/codec-impl.h"
#include "axon/rpc/node.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"
#include "tests/fuzz/fuzz_common.h"

static ax_node *g_node;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  ax_node_opts o;
  ax_node_opts_init(&o);
  o.name = "fuzz";
  o.listen = "127.0.0.1:0";
  o.world_size = 1;
  o.token_file = NULL;
  if (ax_node_create(&o, &g_node) != AX_OK ||
      ax_node_join(g_node, 10000) != AX_OK || ax_rref_init(g_node) != AX_OK)
    fuzz_fail(__FILE__, __LINE__, "a node with RRefs");
  return 0;
}

/* A buffer for any message's struct. */
typedef union any {
  unsigned char b[AXP_MSG_MAX];
  int64_t align_i;
  double align_d;
  void *align_p;
} any;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  axi_limits lim = {AXI_MAX_HDR, 4096, (size_t)1 << 24};
  axi_msg m;
  if (axi_frame_decode_lim(data + 1, size - 1, AX_CPU, NULL, &lim, &m) !=
      AX_OK) {
    axi_msg_clear(&m);
    return 0;
  }
  size_t n = ax_values_count(m.values), from = data[0] & 7;
  ax_values_view view;
  const ax_values *v =
      ax_values_view_range(m.values, from < n ? from : n, n, &view);
  for (int id = 0; id < axi_pipe_msg_count(); id++) {
    any d, again;
    int rc = axi_pipe_msg_decode(id, v, &d);
    if (rc != AX_OK) {
      FUZZ_CHECK(rc == AX_EBADARG);
      FUZZ_CHECK(strstr(ax_errmsg(), axi_pipe_msg_name(id)));
      continue;
    }
    ax_values *w = ax_values_new();
    FUZZ_CHECK(w && axi_pipe_msg_encode(id, &d, w) == AX_OK);
    FUZZ_CHECK(fuzz_values_equal(v, w));
    FUZZ_CHECK(axi_pipe_msg_decode(id, w, &again) == AX_OK);
    ax_values_free(w);
  }
  axi_msg_clear(&m);
  return 0;
}
