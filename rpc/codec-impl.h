/* Frame codec: the binary prefix, the protobuf body and the tensor blob.
 *
 * Frame layout (little-endian):
 *   prefix (AXI_PREFIX_LEN bytes): u8 kind, u8 flags, u16 reserved,
 *     u32 hdr_len, u64 call_id, u64 blob_len
 *   hdr: axon.FrameBody (protobuf), hdr_len bytes
 *   blob: the raw bytes of every tensor value, in value order
 * Control-plane messages carry a batch of frames, each preceded by its u32
 * length; the bulk channel carries u32 AXI_BULK_MAGIC then one frame. */
#ifndef AX_RPC_CODEC_IMPL_H
#define AX_RPC_CODEC_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "axon/kernels/device.h"
#include "axon/rpc/value.h"

enum axi_kind {
  AXI_REQUEST = 1,
  AXI_RESPONSE = 2,
  AXI_PING = 3,
  AXI_PONG = 4,
  AXI_HELLO = 5,
  AXI_CHALLENGE = 6, /* authentication: the accepting side's nonce */
};

#define AXI_PREFIX_LEN 24
#define AXI_BULK_MAGIC 0x31425841u /* "AXB1" */
#define AXI_MAX_HDR (16u << 20)    /* a FrameBody larger than this is bad */

typedef struct axi_prefix {
  uint8_t kind, flags;
  uint32_t hdr_len;
  uint64_t call_id;
  uint64_t blob_len;
} axi_prefix;

#define AXI_MAX_META 8
/* A decoded (or to-be-encoded) frame. Strings are malloc'ed when decoded;
 * when encoding they are borrowed from the caller. */
typedef struct axi_msg {
  int kind;
  uint64_t call_id;
  const char *fn;
  int64_t timeout_ms;
  ax_values *values; /* owned when decoded; borrowed when encoding */
  int err;
  const char *errmsg;
  const char *node, *addr, *bulk_addr;
  uint64_t autograd_ctx;
  uint32_t depth;       /* REQUEST: nesting depth (0: not nested) */
  uint64_t incarnation; /* HELLO: the sender's (rpc/node.h) */
  const uint8_t *auth;  /* CHALLENGE: nonce; HELLO: proof (rpc/auth-impl.h) */
  size_t auth_len;
  int nmeta;
  const char *meta_key[AXI_MAX_META];
  int64_t meta_val[AXI_MAX_META];
  void *pb_; /* decoded protobuf body owning the strings */
} axi_msg;

/* What a received frame may hold (from ax_node_opts). */
typedef struct axi_limits {
  size_t max_hdr;    /* header (protobuf body) bytes */
  size_t max_values; /* values in one message */
  size_t max_tensor; /* sum of tensor bytes */
} axi_limits;

void axi_prefix_put(uint8_t *p, const axi_prefix *x);
/* Parses and validates a prefix (kind known, hdr_len within AXI_MAX_HDR).
 * AX_EMALFORMED otherwise. */
int axi_prefix_get(const uint8_t *p, axi_prefix *x);

/* Encodes m into one malloc'ed buffer: `lead` spare bytes at the front
 * (for a batch length or the bulk magic), prefix, body and, when
 * with_blob, the tensor bytes (read with ax_tensor_read: device tensors
 * are copied to the host). Each tensor's descriptor carries its device.
 * *blob_len is the tensor byte count whether or not it was appended. */
int axi_frame_encode(const axi_msg *m, size_t lead, int with_blob,
                     uint8_t **out, size_t *len, size_t *blob_len);

/* Decodes the body of a frame whose prefix is x: fills m (kind, call id,
 * strings, values) checking it against lim (a header over lim->max_hdr or
 * with more than lim->max_values values is refused before protobuf unpacks
 * it) and that tensor sizes add up to x->blob_len, none over
 * lim->max_tensor. With lazy set, tensors get no storage yet: their value
 * slots hold NULL until axi_frame_alloc_tensor; otherwise every tensor is
 * allocated, uninitialised, on ax_device_map_lookup(map, the sender's device
 * of that tensor, dev) (map may be NULL: every tensor on dev).
 * AX_EMALFORMED / AX_ETOOBIG on bad input, with m left empty. Free with
 * axi_msg_clear. */
int axi_frame_decode_body(const axi_prefix *x, const uint8_t *hdr,
                          ax_device dev, const ax_device_map *map,
                          const axi_limits *lim, int lazy, axi_msg *m);
/* Allocates the storage of the lazily decoded tensor value i of m (see
 * axi_frame_decode_body) and stores it in its slot. */
int axi_frame_alloc_tensor(axi_msg *m, size_t i, ax_device dev,
                           const ax_device_map *map);
/* Bytes of the lazily decoded tensor value i of m. */
size_t axi_frame_tensor_bytes(const axi_msg *m, size_t i);

/* Decodes a whole frame held in memory (prefix, body, blob), copying each
 * tensor's bytes to its device. */
int axi_frame_decode(const uint8_t *p, size_t len, ax_device dev,
                     const ax_device_map *map, size_t max_bytes, axi_msg *m);
/* The same with every limit of lim (max_bytes above: the default header and
 * value limits). */
int axi_frame_decode_lim(const uint8_t *p, size_t len, ax_device dev,
                         const ax_device_map *map, const axi_limits *lim,
                         axi_msg *m);

void axi_msg_clear(axi_msg *m);

#endif
