/* Typed stage messages: the argument and reply lists of the stage host's
 * methods (stage_host.h), of the agents' store of in-memory checkpoints
 * ("axon.pipe.mem_keep", "mem_fetch", "mem_forget") and of a stage's
 * optimizer on another agent ("axon.pipe.optim"), each a C struct with one
 * encoder and one decoder. Senders (the coordinator, the stages) and
 * receivers (the handlers) use nothing else: each list's layout is written
 * once, in stage_msg.c. Internal to runtime/pipeline/.
 *
 * Encoders append the message to `out` (a call's arguments or a handler's
 * reply). They refuse a struct whose values lie outside the message's
 * ranges with AX_EINVAL, naming the message and the field; `out` may then
 * hold part of the message.
 *
 * Decoders check the whole list before the receiver uses any of it: the
 * number of values, the kind of every value and the range of every
 * number and count. Any mismatch is AX_EBADARG with a message naming the
 * message, the field and the value's index ("axon.pipe.stage fwd: micro
 * (value 1): 9 is str, expected i64"); they never read outside the list.
 * The ranges are those of the wire (counts, flags, the widths the receiver
 * casts to); what a value means (a known mode, a safe path, a file that
 * matches its checksum) the receiver checks. A decoded struct borrows the
 * list's strings, bytes, tensors and RRefs: they are valid while the list
 * lives (retain what must outlive it).
 *
 * Optional parts (has_*) are named: on the wire a present part is its
 * name (a string), then its values; an absent part is simply absent. The
 * lists below write a part as ("name", values...). Parts may be present in
 * any combination but travel in the order the message lists them, each at
 * most once, so a list taken encodes back to the same list; a decoder
 * refuses an unknown name, a repeated one, one out of order and a value
 * that is not a name where a part must start (AX_EBADARG, as above).
 *
 * Threads: every function may be called from any thread. */
#ifndef AX_PIPELINE_STAGE_MSG_IMPL_H
#define AX_PIPELINE_STAGE_MSG_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "axon/models/model.h"
#include "axon/models/module.h"
#include "axon/rpc/digest.h"
#include "axon/rpc/value.h"
#include "axon/rref/rref.h"
#include "axon/runtime/pipeline/coord/coordinator.h"

#define AXP_UNITS_MAX (1 << 20)         /* units (micro-batches) of one batch */
#define AXP_SHA_HEX (2 * AX_SHA256_LEN) /* a SHA-256 in hex */

/* Bytes borrowed from a list. */
typedef struct axi_pipe_bytes {
  const void *p;
  size_t n;
} axi_pipe_bytes;

/* A collective group as setup names it: [n, rank, tag, n member names].
 * rank is the receiving host's place among them (names may repeat: one
 * node hosting several members, collective.h). */
typedef struct axi_pipe_group {
  int64_t n;    /* 1 .. AX_PIPE_MAX_REPLICAS */
  int64_t rank; /* 0 .. n - 1 */
  const char *tag;
  const char *names[AX_PIPE_MAX_REPLICAS];
} axi_pipe_group;

/* A tie whose two copies (models/model.h) sit on this stage and another:
 * [tie, 2, rank, tag, name of block a's stage, name of block b's stage],
 * the model's tie index and the collective group of the two stages (n =
 * 2), rank 0 holding block a. */
typedef struct axi_pipe_tie {
  int64_t tie; /* 0 .. AX_MODEL_MAX_TIES - 1 */
  axi_pipe_group g;
} axi_pipe_tie;
/* setup's ties: [n, n ties]. */
typedef struct axi_pipe_ties {
  int64_t n; /* 0 .. AX_MODEL_MAX_TIES */
  axi_pipe_tie t[AX_MODEL_MAX_TIES];
} axi_pipe_ties;

/* "setup" [mode, recompute, optim config, prev, next, self id, sum order,
 * ("staleness", kind, delay, gamma, warm-up), ("replicas", R, rank, tag,
 * R names), ("zero", zero), ("tp", T, rank, tag, T names), ("precision",
 * precision), ("ties", ties)]; replies []. prev and next are RRefs, or i64
 * 0 at the ends (NULL here). The host checks the mode's table entry, the
 * correction (staleness.h), self id != 0, the groups' members and that the
 * ties are the model's ties that cross its bounds. Each absent part means
 * its default: no staleness correction, one replica, no ZeRO, one member
 * (no tensor parallelism), fp32 (ax_precision, models/module.h), no tie
 * across stages. */
typedef struct axi_pipe_setup_msg {
  int64_t mode;      /* 0 .. AX_MODE_COUNT - 1 */
  int64_t recompute; /* AX_RECOMPUTE_* (informational) */
  const char *optim; /* models/optim.h keys */
  ax_rref *prev, *next;
  int64_t self_id; /* ax_rref_id of the host's own RRef: its consumer key */
  int64_t order;   /* ax_sum_order of the gradient sums (sum_tree.h) */
  int has_stale;
  int64_t stale, delay; /* int range; the host checks them */
  double gamma;         /* < 0: the default */
  int64_t warmup;       /* int range */
  int has_replicas;
  axi_pipe_group replicas;
  int has_zero;
  int64_t zero; /* 0 .. 2 */
  int has_tp;
  axi_pipe_group tp;
  int has_precision;
  int64_t precision; /* 0 .. AX_PREC_COUNT - 1 */
  int has_ties;
  axi_pipe_ties ties;
} axi_pipe_setup_msg;

/* The labels of a last stage's forward: [n, n tensors, n norms]. */
typedef struct axi_pipe_labels {
  ax_tlist t;                 /* 1 .. AX_TLIST_MAX, borrowed */
  int64_t norm[AX_TLIST_MAX]; /* >= 0: the mini-batch's label counts */
} axi_pipe_labels;

/* "fwd" [batch, micro, seed, flags, n_in, inputs..., ("labels", n_lab,
 * labels..., norms...), ("scale", scale)]; replies a report. n_in = 0: the
 * inputs are the activations prev pushed; the labels go to the last stage only.
 */
typedef struct axi_pipe_fwd_msg {
  int64_t batch; /* any (evaluation batches are negative) */
  int64_t micro; /* 0 .. AXP_UNITS_MAX - 1 */
  int64_t seed;  /* the unit's dropout seed, as uint64_t */
  int64_t flags; /* AX_PIPE_FLAG_* (stage_host.h) */
  ax_tlist in;   /* 0 .. AX_TLIST_MAX, borrowed */
  int has_labels;
  axi_pipe_labels lab;
  int has_scale; /* with labels: the loss gradient's scale (the host
                    checks it is finite and > 0; absent: 1) */
  double scale;
} axi_pipe_fwd_msg;

/* "bwd" and "bwdw" [batch, micro, step, units]; reply a report. step = 1
 * runs the STEP of batch over units units after it. */
typedef struct axi_pipe_bwd_msg {
  int64_t batch, micro;
  int64_t step;  /* 0 or 1 */
  int64_t units; /* 1 .. AXP_UNITS_MAX */
} axi_pipe_bwd_msg;
typedef axi_pipe_bwd_msg axi_pipe_bwdw_msg;

/* "bwdi" [batch, micro]: the backward's input half; replies a report. */
typedef struct axi_pipe_bwdi_msg {
  int64_t batch, micro;
} axi_pipe_bwdi_msg;

/* "step" [batch, units]; replies a report. */
typedef struct axi_pipe_step_msg {
  int64_t batch, units;
} axi_pipe_step_msg;

/* The reply of fwd, bwd, bwdi, bwdw and step: [busy_us, cpu_us,
 * live_states, weight_versions, state_bytes, ("loss", loss, correct,
 * count)]: the loss part from a last stage's forward. */
typedef struct axi_pipe_report_msg {
  int64_t busy_us; /* the call's time less its waits for neighbours */
  int64_t cpu_us;  /* the CPU time it used (axi_pipe_host_cpu_us) */
  int64_t live, versions, state_bytes; /* >= 0 */
  int has_loss;
  double loss;
  int64_t correct, count; /* >= 0 */
} axi_pipe_report_msg;

/* "offload" [optimizer RRef, or i64 0 (NULL: refused by the host)]. */
typedef struct axi_pipe_offload_msg {
  ax_rref *optim;
} axi_pipe_offload_msg;

/* The reply of "state_save": [params, buffers (maybe empty)]. */
typedef struct axi_pipe_state_msg {
  ax_tensor *params, *buffers;
} axi_pipe_state_msg;

/* The reply of "trace": [bytes] (ax_trace_encode). */
typedef struct axi_pipe_trace_msg {
  axi_pipe_bytes events;
} axi_pipe_trace_msg;

/* "ckpt_save" and "ckpt_drop" [dir, name, ("send", send), ("async",
 * async), ("optim_only", optim_only)], each absent part 0;
 * ckpt_drop ignores send, async and optim_only. ckpt_save replies a file
 * message. */
typedef struct axi_pipe_ckpt_save_msg {
  const char *dir, *name;
  int has_send;
  int64_t send; /* 0 or 1: the file comes back in the reply */
  int has_async;
  int64_t async; /* 0 or 1: written in the background */
  int has_optim_only;
  int64_t optim_only; /* 0 or 1: a file of the optimizer state only
                         (holds_params = 0, docs/CHECKPOINTS.md) */
} axi_pipe_ckpt_save_msg;

/* "ckpt_wait" [path]. */
typedef struct axi_pipe_ckpt_wait_msg {
  const char *path;
} axi_pipe_ckpt_wait_msg;

/* A checkpoint file's description and maybe the file: [size, sha256 hex,
 * ("file", file)], the file's bytes in an i32 tensor (axi_ck_pack). The reply
 * of ckpt_save, ckpt_mem_save (no file) and axon.pipe.mem_fetch. */
typedef struct axi_pipe_file_msg {
  int64_t size;    /* >= 0 */
  const char *sha; /* AXP_SHA_HEX characters */
  int has_file;
  ax_tensor *file;
} axi_pipe_file_msg;

/* "ckpt_load" [path, size, sha256 hex, ("file", file)]: size and sha as the
 * manifest says (-1 and "" for a file it lacks: the host refuses it). */
typedef struct axi_pipe_ckpt_load_msg {
  const char *path;
  int64_t size;    /* >= -1 */
  const char *sha; /* 0 .. AXP_SHA_HEX characters */
  int has_file;
  ax_tensor *file;
} axi_pipe_ckpt_load_msg;

/* "ckpt_mem_save" [key, peer ("": none)]; replies a file message. */
typedef struct axi_pipe_mem_save_msg {
  const char *key, *peer;
} axi_pipe_mem_save_msg;

/* "ckpt_mem_load" [key, holder, size, sha256 hex]. */
typedef struct axi_pipe_mem_load_msg {
  const char *key, *holder;
  int64_t size;    /* >= 0 */
  const char *sha; /* AXP_SHA_HEX characters */
} axi_pipe_mem_load_msg;

/* "axon.pipe.mem_keep" [owner, key, size, sha256 hex, file]. */
typedef struct axi_pipe_mem_keep_msg {
  const char *owner, *key;
  int64_t size;    /* >= 0 */
  const char *sha; /* AXP_SHA_HEX characters */
  ax_tensor *file;
} axi_pipe_mem_keep_msg;

/* "axon.pipe.mem_fetch" [owner, key]; replies a file message with the
 * file. "axon.pipe.mem_forget" []: no struct. */
typedef struct axi_pipe_mem_fetch_msg {
  const char *owner, *key;
} axi_pipe_mem_fetch_msg;

/* "boundary" [op, batch] (stage_host.h) and its reply [last step, the
 * boundary kept (-1: none)]. */
enum { AXP_BOUNDARY_KEEP, AXP_BOUNDARY_STOP, AXP_BOUNDARY_REWIND };
typedef struct axi_pipe_boundary_msg {
  int64_t op;    /* AXP_BOUNDARY_* */
  int64_t batch; /* >= -1: the boundary of rewind */
} axi_pipe_boundary_msg;
typedef struct axi_pipe_boundary_reply_msg {
  int64_t last_step, kept; /* >= -1 */
} axi_pipe_boundary_reply_msg;

/* "decode" [session, pos, n, n_in, inputs...]: n new positions, from
 * position pos, of the sequences of decoding session `session`
 * (stage_host.h); replies a decode reply. "decode_end" [session] drops the
 * session; replies a decode reply without logits. */
typedef struct axi_pipe_decode_msg {
  int64_t session; /* >= 0: the coordinator's key */
  int64_t pos;     /* 0 .. INT32_MAX */
  int64_t n;       /* 1 .. INT32_MAX */
  ax_tlist in;     /* 0 .. AX_TLIST_MAX, borrowed */
} axi_pipe_decode_msg;
typedef struct axi_pipe_decode_end_msg {
  int64_t session; /* >= 0 */
} axi_pipe_decode_end_msg;
/* The reply of "decode" and "decode_end": [busy_us, cpu_us, sessions,
 * cache bytes, ("logits", logits)]: the sessions the host keeps after the call
 * and the bytes of their slots; the last stage's decode adds the logits of each
 * sequence's last new position (B, vocab). */
typedef struct axi_pipe_decode_reply_msg {
  int64_t busy_us, cpu_us;
  int64_t sessions, cache_bytes; /* >= 0 */
  int has_logits;
  ax_tensor *logits;
} axi_pipe_decode_reply_msg;

/* "axon.pipe.optim": "init" [optim config, params], "step" [grads, lr
 * scale] and the step's reply [params]; "state_get" [] (no struct) and
 * "state_set" take and give its state (below). The lr scale multiplies the
 * step's scheduled learning rate (ax_optim_set_lr_scale: PipeMare's
 * rescheduling, staleness.h; 1 otherwise); the optimizer host refuses one
 * that is not positive and finite. */
typedef struct axi_pipe_optim_init_msg {
  const char *config;
  ax_tensor *params;
} axi_pipe_optim_init_msg;
typedef struct axi_pipe_optim_step_msg {
  ax_tensor *grads;
  double lr_scale;
} axi_pipe_optim_step_msg;
typedef struct axi_pipe_optim_reply_msg {
  ax_tensor *params;
} axi_pipe_optim_reply_msg;
/* The optimizer's state: [m, v, steps, ("params", params)], m and v its state
 * buffers (ax_optim_state 0 and 1; empty f32 tensors when it has none).
 * The reply of "state_get" (no params) and the arguments of "state_set"
 * (params: its copy of the parameters too; absent: kept). */
typedef struct axi_pipe_optim_state_msg {
  ax_tensor *m, *v;
  int64_t steps; /* >= 0 */
  int has_params;
  ax_tensor *params;
} axi_pipe_optim_state_msg;

/* One encoder and one decoder per message (contracts above). */
int axi_pipe_setup_encode(const axi_pipe_setup_msg *m, ax_values *out);
int axi_pipe_setup_decode(const ax_values *v, axi_pipe_setup_msg *m);
int axi_pipe_fwd_encode(const axi_pipe_fwd_msg *m, ax_values *out);
int axi_pipe_fwd_decode(const ax_values *v, axi_pipe_fwd_msg *m);
int axi_pipe_bwd_encode(const axi_pipe_bwd_msg *m, ax_values *out);
int axi_pipe_bwd_decode(const ax_values *v, axi_pipe_bwd_msg *m);
int axi_pipe_bwdi_encode(const axi_pipe_bwdi_msg *m, ax_values *out);
int axi_pipe_bwdi_decode(const ax_values *v, axi_pipe_bwdi_msg *m);
int axi_pipe_bwdw_encode(const axi_pipe_bwdw_msg *m, ax_values *out);
int axi_pipe_bwdw_decode(const ax_values *v, axi_pipe_bwdw_msg *m);
int axi_pipe_step_encode(const axi_pipe_step_msg *m, ax_values *out);
int axi_pipe_step_decode(const ax_values *v, axi_pipe_step_msg *m);
int axi_pipe_report_encode(const axi_pipe_report_msg *m, ax_values *out);
int axi_pipe_report_decode(const ax_values *v, axi_pipe_report_msg *m);
int axi_pipe_offload_encode(const axi_pipe_offload_msg *m, ax_values *out);
int axi_pipe_offload_decode(const ax_values *v, axi_pipe_offload_msg *m);
int axi_pipe_state_encode(const axi_pipe_state_msg *m, ax_values *out);
int axi_pipe_state_decode(const ax_values *v, axi_pipe_state_msg *m);
int axi_pipe_trace_encode(const axi_pipe_trace_msg *m, ax_values *out);
int axi_pipe_trace_decode(const ax_values *v, axi_pipe_trace_msg *m);
int axi_pipe_ckpt_save_encode(const axi_pipe_ckpt_save_msg *m, ax_values *out);
int axi_pipe_ckpt_save_decode(const ax_values *v, axi_pipe_ckpt_save_msg *m);
int axi_pipe_ckpt_wait_encode(const axi_pipe_ckpt_wait_msg *m, ax_values *out);
int axi_pipe_ckpt_wait_decode(const ax_values *v, axi_pipe_ckpt_wait_msg *m);
int axi_pipe_file_encode(const axi_pipe_file_msg *m, ax_values *out);
int axi_pipe_file_decode(const ax_values *v, axi_pipe_file_msg *m);
int axi_pipe_ckpt_load_encode(const axi_pipe_ckpt_load_msg *m, ax_values *out);
int axi_pipe_ckpt_load_decode(const ax_values *v, axi_pipe_ckpt_load_msg *m);
int axi_pipe_mem_save_encode(const axi_pipe_mem_save_msg *m, ax_values *out);
int axi_pipe_mem_save_decode(const ax_values *v, axi_pipe_mem_save_msg *m);
int axi_pipe_mem_load_encode(const axi_pipe_mem_load_msg *m, ax_values *out);
int axi_pipe_mem_load_decode(const ax_values *v, axi_pipe_mem_load_msg *m);
int axi_pipe_mem_keep_encode(const axi_pipe_mem_keep_msg *m, ax_values *out);
int axi_pipe_mem_keep_decode(const ax_values *v, axi_pipe_mem_keep_msg *m);
int axi_pipe_mem_fetch_encode(const axi_pipe_mem_fetch_msg *m, ax_values *out);
int axi_pipe_mem_fetch_decode(const ax_values *v, axi_pipe_mem_fetch_msg *m);
int axi_pipe_optim_init_encode(const axi_pipe_optim_init_msg *m,
                               ax_values *out);
int axi_pipe_optim_init_decode(const ax_values *v, axi_pipe_optim_init_msg *m);
int axi_pipe_optim_step_encode(const axi_pipe_optim_step_msg *m,
                               ax_values *out);
int axi_pipe_optim_step_decode(const ax_values *v, axi_pipe_optim_step_msg *m);
int axi_pipe_optim_reply_encode(const axi_pipe_optim_reply_msg *m,
                                ax_values *out);
int axi_pipe_optim_reply_decode(const ax_values *v,
                                axi_pipe_optim_reply_msg *m);
int axi_pipe_optim_state_encode(const axi_pipe_optim_state_msg *m,
                                ax_values *out);
int axi_pipe_optim_state_decode(const ax_values *v,
                                axi_pipe_optim_state_msg *m);
int axi_pipe_boundary_encode(const axi_pipe_boundary_msg *m, ax_values *out);
int axi_pipe_boundary_decode(const ax_values *v, axi_pipe_boundary_msg *m);
int axi_pipe_boundary_reply_encode(const axi_pipe_boundary_reply_msg *m,
                                   ax_values *out);
int axi_pipe_boundary_reply_decode(const ax_values *v,
                                   axi_pipe_boundary_reply_msg *m);
int axi_pipe_decode_encode(const axi_pipe_decode_msg *m, ax_values *out);
int axi_pipe_decode_decode(const ax_values *v, axi_pipe_decode_msg *m);
int axi_pipe_decode_end_encode(const axi_pipe_decode_end_msg *m,
                               ax_values *out);
int axi_pipe_decode_end_decode(const ax_values *v, axi_pipe_decode_end_msg *m);
int axi_pipe_decode_reply_encode(const axi_pipe_decode_reply_msg *m,
                                 ax_values *out);
int axi_pipe_decode_reply_decode(const ax_values *v,
                                 axi_pipe_decode_reply_msg *m);
/* "axon.pipe.stage settle" [] and "axon.pipe.mem_forget" []: nothing to
 * append; the decoders check that the list is empty. */
int axi_pipe_settle_encode(ax_values *out);
int axi_pipe_settle_decode(const ax_values *v);
int axi_pipe_mem_forget_encode(ax_values *out);
int axi_pipe_mem_forget_decode(const ax_values *v);

/* Every message by number (0 .. axi_pipe_msg_count() - 1, in the order
 * above, settle and mem_forget last), for the tests and the fuzzer: its name,
 * the size of its struct (at most AXP_MSG_MAX) and its encoder and decoder
 * through a pointer to that struct. */
#define AXP_MSG_MAX 2048
int axi_pipe_msg_count(void);
const char *axi_pipe_msg_name(int id);
size_t axi_pipe_msg_size(int id);
int axi_pipe_msg_encode(int id, const void *m, ax_values *out);
int axi_pipe_msg_decode(int id, const ax_values *v, void *m);

#endif
