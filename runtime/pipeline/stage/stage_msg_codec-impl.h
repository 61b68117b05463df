/* The engine of the typed stage messages (stage_msg-impl.h): a message is
 * a table of fields, and one encoder and one bounds-checked decoder walk
 * any table (stage_msg_codec.c). stage_msg.c holds the tables. Internal to
 * runtime/pipeline/stage/. */
#ifndef AX_PIPELINE_STAGE_MSG_CODEC_IMPL_H
#define AX_PIPELINE_STAGE_MSG_CODEC_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "axon/rpc/value.h"

/* How a field of a message travels. */
enum {
  AXP_K_I64,     /* an i64 in [lo, hi] */
  AXP_K_F64,     /* an f64 */
  AXP_K_STR,     /* a string of lo .. hi characters */
  AXP_K_BYTES,   /* bytes, at most hi */
  AXP_K_TENSOR,  /* a tensor */
  AXP_K_RREF,    /* an RRef, or i64 0 for none (NULL) */
  AXP_K_TLIST,   /* [n in lo .. hi, n tensors] (ax_tlist) */
  AXP_K_LABELS,  /* [n in lo .. hi, n tensors, n i64 >= 0] (axi_pipe_labels) */
  AXP_K_MEMBERS, /* [n in lo .. hi, rank in 0 .. n - 1, tag, n names]
                  * (axi_pipe_group) */
  AXP_K_TIES,    /* [n in lo .. hi, n x (tie, a group of 2 as AXP_K_MEMBERS)]
                  * (axi_pipe_ties) */
  AXP_K_OPT,     /* an optional part starts: its int has_ flag at off; on the
                  * wire its name (a string, the field's name), then the fields
                  * up to the next AXP_K_OPT */
};

/* One field of a message's table: its name (for errors; an optional
 * part's name on the wire), kind, offset in the message's struct and
 * range. */
typedef struct axi_pipe_field {
  const char *name;
  int kind;
  size_t off;
  int64_t lo, hi;
} axi_pipe_field;

/* A message: its name, its struct's size and its table of fields. */
typedef struct axi_pipe_msgdef {
  const char *name;
  size_t size; /* of its struct */
  const axi_pipe_field *f;
  int nf;
} axi_pipe_msgdef;

/* m's decoder and encoder, with the contracts of stage_msg-impl.h's: the
 * struct is m->size bytes (NULL for a message without fields); the decoder
 * zeroes it first. */
int axi_pipe_msgdef_decode(const axi_pipe_msgdef *m, const ax_values *v,
                           void *out);
int axi_pipe_msgdef_encode(const axi_pipe_msgdef *m, const void *in,
                           ax_values *out);

#endif
