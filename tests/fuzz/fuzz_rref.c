/* libFuzzer harness: the RRef codec (rref/rref_codec.c), the extension
 * codec that turns an RRef payload inside a received value list into a
 * handle (and queues the fork or accept messages the protocol needs).
 *
 * The codec needs the process's RRef context, so LLVMFuzzerInitialize
 * starts one real node ("fuzz", a world of one, on loopback) with
 * ax_rref_init; its protocol thread sends what decoding queues, and
 * messages to owners that are not members fail at once, as they would on
 * an agent.
 *
 * Input: a sequence of records: a tag byte, then the payload, of the wire
 * size (160 bytes) or, when the tag's bit 0 is set, of the length in the
 * next byte. Each payload is decoded as a payload from node "peer"; a
 * handle that decodes must carry the payload's id, owner and type, and
 * when the tag's bit 1 is set it is encoded again (a fork) and that
 * payload decoded too. Every handle is released. */
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/node.h"
#include "axon/rpc/value-impl.h"
#include "axon/rref/rref.h"
#include "tests/fuzz/fuzz_common.h"

#define WIRE_LEN 160 /* sizeof(wire_rref) in rref/rref_codec.c */

static ax_node *g_node;
static const ax_value_ext_ops *g_ops;

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
  g_ops = axi_value_ext_ops(AX_VALUE_EXT_RREF);
  FUZZ_CHECK(g_ops && g_ops->decode && g_ops->encode);
  return 0;
}

static void check(const ax_rref *r, const uint8_t *p, size_t len) {
  uint64_t id;
  uint32_t type;
  char owner[65];
  memcpy(&id, p, 8);
  memcpy(&type, p + 24, 4);
  memcpy(owner, p + 32, 64);
  owner[64] = 0;
  owner[63] = 0;
  FUZZ_CHECK(len == WIRE_LEN);
  FUZZ_CHECK(ax_rref_id(r) == id);
  FUZZ_CHECK((uint32_t)ax_rref_type_of(r) == type);
  FUZZ_CHECK(!strcmp(ax_rref_owner(r), owner));
  FUZZ_CHECK(ax_rref_is_owner(r) == !strcmp(owner, "fuzz"));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_in in = {data, size, 0};
  while (in.off < in.n) {
    uint8_t tag = fuzz_u8(&in);
    size_t len = tag & 1 ? fuzz_u8(&in) : WIRE_LEN, got;
    const uint8_t *p = fuzz_bytes(&in, len, &got);
    void *obj = NULL;
    if (g_ops->decode(p, got, "peer", &obj) != AX_OK) {
      FUZZ_CHECK(!obj);
      continue;
    }
    check(obj, p, got);
    if (tag & 2) { /* forward it: a fork, decoded as its receiver would */
      void *w = NULL, *obj2 = NULL;
      size_t wl = 0;
      FUZZ_CHECK(g_ops->encode(obj, &w, &wl) == AX_OK);
      if (g_ops->decode(w, wl, "fuzz", &obj2) == AX_OK) {
        check(obj2, w, wl);
        g_ops->release(obj2);
      }
      free(w);
    }
    g_ops->release(obj);
  }
  return 0;
}
