/* Typed stage messages (stage_msg-impl.h): one table of fields per
 * message, walked by the encoder and the decoder of stage_msg_codec.c, and
 * the messages by number. */
#include <string.h>

#include "axon/runtime/pipeline/schedule/mode.h"
#include "axon/runtime/pipeline/stage/stage_host.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"
#include "axon/runtime/pipeline/stage/stage_msg_codec-impl.h"

/* The messages: each one's table, encoder and decoder. A field names its
 * message's struct by its short name (fwd: axi_pipe_fwd_msg). */
#define F(msg, m, name, kind, ...)                                             \
  { name, kind, offsetof(axi_pipe_##msg##_msg, m), __VA_ARGS__ }
#define ANY INT64_MIN, INT64_MAX
#define NONNEG 0, INT64_MAX
#define INT INT32_MIN, INT32_MAX
#define MICRO 0, AXP_UNITS_MAX - 1
#define I64(msg, m, name, ...) F(msg, m, name, AXP_K_I64, __VA_ARGS__)
#define STR(msg, m, name) F(msg, m, name, AXP_K_STR, NONNEG)
#define SHA(msg, m) F(msg, m, "sha256", AXP_K_STR, AXP_SHA_HEX, AXP_SHA_HEX)
#define ONE(msg, m, name, kind) F(msg, m, name, kind, 0, 0)
#define MSG(msg, name, ...)                                                    \
  _Static_assert(sizeof(axi_pipe_##msg##_msg) <= AXP_MSG_MAX, #msg);           \
  static const axi_pipe_field g_##msg##_f[] = {__VA_ARGS__};                   \
  _Static_assert(sizeof g_##msg##_f / sizeof g_##msg##_f[0] <= 64, #msg);      \
  static const axi_pipe_msgdef g_##msg = {                                     \
      name, sizeof(axi_pipe_##msg##_msg), g_##msg##_f,                         \
      (int)(sizeof g_##msg##_f / sizeof g_##msg##_f[0])};                      \
  int axi_pipe_##msg##_encode(const axi_pipe_##msg##_msg *m, ax_values *out) { \
    return axi_pipe_msgdef_encode(&g_##msg, m, out);                           \
  }                                                                            \
  int axi_pipe_##msg##_decode(const ax_values *v, axi_pipe_##msg##_msg *m) {   \
    return axi_pipe_msgdef_decode(&g_##msg, v, m);                             \
  }

MSG(setup, "axon.pipe.stage setup",
    I64(setup, mode, "mode", 0, AX_MODE_COUNT - 1),
    I64(setup, recompute, "recompute", AX_RECOMPUTE_NEVER,
        AX_RECOMPUTE_EXCEPT_LAST),
    STR(setup, optim, "optim config"), ONE(setup, prev, "prev", AXP_K_RREF),
    ONE(setup, next, "next", AXP_K_RREF), I64(setup, self_id, "self id", ANY),
    I64(setup, order, "sum order", 0, AX_SUM_ORDERS - 1),
    ONE(setup, has_stale, "staleness", AXP_K_OPT),
    I64(setup, stale, "staleness", INT), I64(setup, delay, "delay", INT),
    ONE(setup, gamma, "gamma", AXP_K_F64), I64(setup, warmup, "warm-up", INT),
    ONE(setup, has_replicas, "replicas", AXP_K_OPT),
    F(setup, replicas, "replicas", AXP_K_MEMBERS, 1, AX_PIPE_MAX_REPLICAS),
    ONE(setup, has_zero, "zero", AXP_K_OPT), I64(setup, zero, "zero", 0, 2),
    ONE(setup, has_tp, "tp", AXP_K_OPT),
    F(setup, tp, "tensor-parallel members", AXP_K_MEMBERS, 1,
      AX_PIPE_MAX_REPLICAS),
    ONE(setup, has_precision, "precision", AXP_K_OPT),
    I64(setup, precision, "precision", 0, AX_PREC_COUNT - 1),
    ONE(setup, has_ties, "ties", AXP_K_OPT),
    F(setup, ties, "ties", AXP_K_TIES, 0, AX_MODEL_MAX_TIES))
MSG(fwd, "axon.pipe.stage fwd", I64(fwd, batch, "batch", ANY),
    I64(fwd, micro, "micro", MICRO), I64(fwd, seed, "seed", ANY),
    I64(fwd, flags, "flags", 0, AX_PIPE_FLAG_TRAIN | AX_PIPE_FLAG_RECOMPUTE),
    F(fwd, in, "inputs", AXP_K_TLIST, 0, AX_TLIST_MAX),
    ONE(fwd, has_labels, "labels", AXP_K_OPT),
    F(fwd, lab, "labels", AXP_K_LABELS, 1, AX_TLIST_MAX),
    ONE(fwd, has_scale, "scale", AXP_K_OPT),
    ONE(fwd, scale, "scale", AXP_K_F64))
#define BWD(msg)                                                               \
  I64(msg, batch, "batch", ANY), I64(msg, micro, "micro", MICRO),              \
      I64(msg, step, "step", 0, 1), I64(msg, units, "units", 1, AXP_UNITS_MAX)
MSG(bwd, "axon.pipe.stage bwd", BWD(bwd))
MSG(bwdw, "axon.pipe.stage bwdw", BWD(bwdw))
MSG(bwdi, "axon.pipe.stage bwdi", I64(bwdi, batch, "batch", ANY),
    I64(bwdi, micro, "micro", MICRO))
MSG(step, "axon.pipe.stage step", I64(step, batch, "batch", ANY),
    I64(step, units, "units", 1, AXP_UNITS_MAX))
MSG(report, "stage report", I64(report, busy_us, "busy_us", ANY),
    I64(report, cpu_us, "cpu_us", ANY),
    I64(report, live, "live states", NONNEG),
    I64(report, versions, "weight versions", NONNEG),
    I64(report, state_bytes, "state bytes", NONNEG),
    ONE(report, has_loss, "loss", AXP_K_OPT),
    ONE(report, loss, "loss", AXP_K_F64),
    I64(report, correct, "correct", NONNEG),
    I64(report, count, "count", NONNEG))
MSG(offload, "axon.pipe.stage offload",
    ONE(offload, optim, "optimizer", AXP_K_RREF))
MSG(state, "axon.pipe.stage state_save reply",
    ONE(state, params, "params", AXP_K_TENSOR),
    ONE(state, buffers, "buffers", AXP_K_TENSOR))
MSG(trace, "axon.pipe.stage trace reply",
    F(trace, events, "events", AXP_K_BYTES, NONNEG))
MSG(ckpt_save, "axon.pipe.stage ckpt_save", STR(ckpt_save, dir, "dir"),
    STR(ckpt_save, name, "name"), ONE(ckpt_save, has_send, "send", AXP_K_OPT),
    I64(ckpt_save, send, "send", 0, 1),
    ONE(ckpt_save, has_async, "async", AXP_K_OPT),
    I64(ckpt_save, async, "async", 0, 1),
    ONE(ckpt_save, has_optim_only, "optim_only", AXP_K_OPT),
    I64(ckpt_save, optim_only, "optim_only", 0, 1))
MSG(ckpt_wait, "axon.pipe.stage ckpt_wait", STR(ckpt_wait, path, "path"))
MSG(file, "checkpoint file reply", I64(file, size, "size", NONNEG),
    SHA(file, sha), ONE(file, has_file, "file", AXP_K_OPT),
    ONE(file, file, "file", AXP_K_TENSOR))
MSG(ckpt_load, "axon.pipe.stage ckpt_load", STR(ckpt_load, path, "path"),
    I64(ckpt_load, size, "size", -1, INT64_MAX),
    F(ckpt_load, sha, "sha256", AXP_K_STR, 0, AXP_SHA_HEX),
    ONE(ckpt_load, has_file, "file", AXP_K_OPT),
    ONE(ckpt_load, file, "file", AXP_K_TENSOR))
MSG(mem_save, "axon.pipe.stage ckpt_mem_save", STR(mem_save, key, "key"),
    STR(mem_save, peer, "peer"))
MSG(mem_load, "axon.pipe.stage ckpt_mem_load", STR(mem_load, key, "key"),
    STR(mem_load, holder, "holder"), I64(mem_load, size, "size", NONNEG),
    SHA(mem_load, sha))
MSG(mem_keep, "axon.pipe.mem_keep", STR(mem_keep, owner, "owner"),
    STR(mem_keep, key, "key"), I64(mem_keep, size, "size", NONNEG),
    SHA(mem_keep, sha), ONE(mem_keep, file, "file", AXP_K_TENSOR))
MSG(mem_fetch, "axon.pipe.mem_fetch", STR(mem_fetch, owner, "owner"),
    STR(mem_fetch, key, "key"))
MSG(optim_init, "axon.pipe.optim init", STR(optim_init, config, "optim config"),
    ONE(optim_init, params, "params", AXP_K_TENSOR))
MSG(optim_step, "axon.pipe.optim step",
    ONE(optim_step, grads, "grads", AXP_K_TENSOR),
    ONE(optim_step, lr_scale, "lr scale", AXP_K_F64))
MSG(optim_reply, "axon.pipe.optim step reply",
    ONE(optim_reply, params, "params", AXP_K_TENSOR))
MSG(optim_state, "axon.pipe.optim state",
    ONE(optim_state, m, "m", AXP_K_TENSOR),
    ONE(optim_state, v, "v", AXP_K_TENSOR),
    I64(optim_state, steps, "steps", NONNEG),
    ONE(optim_state, has_params, "params", AXP_K_OPT),
    ONE(optim_state, params, "params", AXP_K_TENSOR))
MSG(boundary, "axon.pipe.stage boundary",
    I64(boundary, op, "op", AXP_BOUNDARY_KEEP, AXP_BOUNDARY_REWIND),
    I64(boundary, batch, "batch", -1, INT64_MAX))
MSG(boundary_reply, "axon.pipe.stage boundary reply",
    I64(boundary_reply, last_step, "last step", -1, INT64_MAX),
    I64(boundary_reply, kept, "kept", -1, INT64_MAX))
MSG(decode, "axon.pipe.stage decode", I64(decode, session, "session", NONNEG),
    I64(decode, pos, "pos", 0, INT32_MAX), I64(decode, n, "n", 1, INT32_MAX),
    F(decode, in, "inputs", AXP_K_TLIST, 0, AX_TLIST_MAX))
MSG(decode_end, "axon.pipe.stage decode_end",
    I64(decode_end, session, "session", NONNEG))
MSG(decode_reply, "axon.pipe.stage decode reply",
    I64(decode_reply, busy_us, "busy_us", ANY),
    I64(decode_reply, cpu_us, "cpu_us", ANY),
    I64(decode_reply, sessions, "sessions", NONNEG),
    I64(decode_reply, cache_bytes, "cache bytes", NONNEG),
    ONE(decode_reply, has_logits, "logits", AXP_K_OPT),
    ONE(decode_reply, logits, "logits", AXP_K_TENSOR))
/* The messages without fields: an encoder that appends nothing and a
 * decoder that checks the list is empty. */
#define EMPTY(msg, name)                                                       \
  static const axi_pipe_msgdef g_##msg = {name, 0, NULL, 0};                   \
  int axi_pipe_##msg##_encode(ax_values *out) {                                \
    return axi_pipe_msgdef_encode(&g_##msg, NULL, out);                        \
  }                                                                            \
  int axi_pipe_##msg##_decode(const ax_values *v) {                            \
    return axi_pipe_msgdef_decode(&g_##msg, v, NULL);                          \
  }
EMPTY(settle, "axon.pipe.stage settle")
EMPTY(mem_forget, "axon.pipe.mem_forget")

/* Every message by number. */
static const axi_pipe_msgdef *const g_all[] = {
    &g_setup,       &g_fwd,         &g_bwd,          &g_bwdi,
    &g_bwdw,        &g_step,        &g_report,       &g_offload,
    &g_state,       &g_trace,       &g_ckpt_save,    &g_ckpt_wait,
    &g_file,        &g_ckpt_load,   &g_mem_save,     &g_mem_load,
    &g_mem_keep,    &g_mem_fetch,   &g_optim_init,   &g_optim_step,
    &g_optim_reply, &g_optim_state, &g_boundary,     &g_boundary_reply,
    &g_decode,      &g_decode_end,  &g_decode_reply, &g_settle,
    &g_mem_forget};
#define N_MSG ((int)(sizeof g_all / sizeof g_all[0]))

static const axi_pipe_msgdef *msg_at(int id) {
  return id >= 0 && id < N_MSG ? g_all[id] : NULL;
}

int axi_pipe_msg_count(void) { return N_MSG; }

const char *axi_pipe_msg_name(int id) {
  return msg_at(id) ? msg_at(id)->name : NULL;
}

size_t axi_pipe_msg_size(int id) { return msg_at(id) ? msg_at(id)->size : 0; }

int axi_pipe_msg_encode(int id, const void *m, ax_values *out) {
  if (!msg_at(id))
    return ax_seterr(AX_EINVAL, "stage messages: no message %d", id);
  return axi_pipe_msgdef_encode(msg_at(id), m, out);
}

int axi_pipe_msg_decode(int id, const ax_values *v, void *m) {
  if (!msg_at(id))
    return ax_seterr(AX_EINVAL, "stage messages: no message %d", id);
  return axi_pipe_msgdef_decode(msg_at(id), v, m);
}
