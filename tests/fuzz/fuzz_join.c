/* libFuzzer harness: join and membership decoding (rpc/rendezvous.c).
 *
 * A bare master node (fuzz_common.h) of a world of 1..8 receives a
 * sequence of frames, each decoded by the real codec
 * (axi_frame_decode_lim, as the control stream does):
 *  - a REQUEST runs the handler the node registered under its function
 *    name ("axon.rendezvous.join", "axon.rendezvous.stats"), as a worker would;
 *  - a RESPONSE is a membership list as a joiner receives it from its
 *    master, applied with axi_rendezvous_apply (what ax_node_join does).
 *
 * Input: byte 0 gives the world size (1 + b % 8), byte 1 the master's own
 * rank (b % (world + 1) - 1, so -1 included), then frames, each preceded
 * by a little-endian u16 length. */
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/codec-impl.h"
#include "axon/rpc/future.h"
#include "tests/fuzz/fuzz_common.h"

static void run_request(ax_node *n, axi_msg *m) {
  axi_fn *f = n->fns;
  while (f && strcmp(f->name, m->fn ? m->fn : ""))
    f = f->next;
  if (!f)
    return;
  ax_call_ctx *ctx = calloc(1, sizeof *ctx);
  ax_values *out = ax_values_new();
  FUZZ_CHECK(ctx && out);
  ctx->node = n;
  ctx->fn = f;
  ax_values *args = m->values ? m->values : ax_values_new();
  int rc = f->h(ctx, args, out, f->user);
  if (args != m->values)
    ax_values_free(args);
  if (rc != AX_OK)
    FUZZ_CHECK(!ctx->deferred); /* a failed handler defers nothing */
  ax_future_release(ctx->deferred);
  ax_values_free(out);
  free(ctx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_in in = {data, size, 0};
  int world = 1 + fuzz_u8(&in) % 8;
  int rank = fuzz_u8(&in) % (world + 1) - 1;
  ax_node *n = fuzz_node_new("master", world, rank, 0);
  FUZZ_CHECK(axi_rendezvous_init(n) == AX_OK);
  while (in.off + 2 <= in.n) {
    size_t len = fuzz_u8(&in);
    len |= (size_t)fuzz_u8(&in) << 8;
    size_t got;
    const uint8_t *p = fuzz_bytes(&in, len, &got);
    axi_msg m;
    if (axi_frame_decode_lim(p, got, AX_CPU, NULL, NULL, &m) != AX_OK) {
      axi_msg_clear(&m);
      continue;
    }
    if (m.kind == AXI_REQUEST)
      run_request(n, &m);
    else if (m.kind == AXI_RESPONSE && m.values)
      axi_rendezvous_apply(n, m.values);
    axi_msg_clear(&m);
    FUZZ_CHECK(n->world_size == n->nmembers);
  }
  fuzz_node_free(n);
  return 0;
}
