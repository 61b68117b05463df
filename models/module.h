/* The module interface: layers, blocks and model stages all implement it.
 *
 * A module is a node in a tree. Its trainable parameters and non-trainable
 * buffers (batch-norm running statistics) are NOT owned by the module: they
 * live in flat f32 buffers owned by an ax_net (models/net.h) and every call
 * receives them through an ax_exec. Each module knows only its offset into
 * those buffers. So a stashed weight version (PipeDream), a per-context
 * gradient accumulator (distributed autograd) or an all-reduce is one buffer
 * operation, and one module can run with any weight version.
 *
 * Per-micro-batch saved state lives in an ax_slot the CALLER passes: forward
 * saves into it what backward needs, backward consumes it. Several slots may
 * be in flight through one module at once (pipelining). A module holds no
 * per-call state of its own, so forward/backward on different slots may run
 * from different threads as long as they do not write the same gradient
 * buffer at the same time.
 *
 * The backward may run whole (ax_backward) or as two halves, so that a
 * pipeline schedule can defer the weight gradients (zero bubble, Qi et al.
 * 2024): the input half B (ax_backward_input) computes the input gradients
 * and saves in the slot what the weight half needs; the weight half W
 * (ax_backward_weight) later accumulates the parameter gradients from the
 * slot alone. Several slots may sit between their B and their W at once.
 *
 * Values between modules are tensor lists (ax_tlist): most layers take and
 * return one tensor; transformer blocks carry (hidden, mask).
 *
 * Mixed precision (ax_exec.precision; the one place these rules are
 * written, docs/TRAINING.md shows their use). AX_PREC_FP32, the default,
 * computes and keeps everything in f32. AX_PREC_BF16:
 *  - Compute: every GEMM of the layers (Linear, whole or a tensor-parallel
 *    column or row part, and so the attention's projections and the
 *    feed-forward; the attention's score and context products) takes its
 *    two operands rounded to bf16 (AX_BF16) and runs the backend's
 *    gemm_bf16: bf16 products summed in f32, an f32 result. The weights
 *    stay f32 (ax_exec.params): gemm_bf16 rounds an f32 operand as it
 *    reads it, with no copy (an operand that several GEMMs share, such
 *    as the GPT head's weight, may be rounded once, axi_prec_operand).
 *    The vision layers (convolution, batch norm, pooling, ResNet's basic
 *    block) stay f32 in compute and in what they keep: their GEMMs are
 *    inside the backend's convolution kernels, not behind gemm.
 *  - f32 stays for: layer and batch norm statistics (and the norms'
 *    arithmetic), softmax sums, the loss (the model's logits stay f32:
 *    the last block's outputs are not rounded), every elementwise kernel,
 *    the tensor-parallel sums, and the optimizer's master weights and
 *    state (the flat parameters, gradients and buffers are f32 always).
 *  - Activations are kept in bf16: what a layer saves for its backward (a
 *    Linear's input and its output gradient between the halves, GELU's
 *    input, tanh's and ReLU's outputs, layer norm's input, attention's
 *    Q/K/V and probabilities, the causal attention's packed Q/K/V and
 *    output (its fused kernel takes Q/K/V rounded to bf16 and sums in
 *    f32; its log-sum-exp stays f32), an embedding's output gradient,
 *    a token embedding's too) goes through
 *    ax_slot_put_act, which keeps an f32 tensor as its bf16 rounding, and
 *    comes back through ax_slot_get (a bf16 GEMM operand as it is) or
 *    ax_slot_get_f32 (widened, exactly). Statistics (layer norm's mean and
 *    rstd) and integer state stay as they are.
 *  - Block boundaries: the model's sequential of blocks (ax_blocks_new,
 *    which ax_model_stage builds) rounds every f32 tensor a block outputs
 *    (a mask it passes on too: 0 and 1 are bf16 values) to an AX_BF16
 *    tensor, and every input gradient a block's backward makes likewise,
 *    and widens bf16 tensors back to f32 before each block. So a stage
 *    boundary at any block boundary changes nothing: a pipeline computes
 *    the bits of the same blocks in one process, and what crosses between
 *    stages is AX_BF16, half the bytes of f32. The model's last block (the
 *    logits) is not rounded; its output gradient comes from the f32 loss.
 * bf16 keeps 8 significant bits (a relative rounding error up to 2^-9):
 * a bf16 layer's outputs agree with its f32 outputs to about 1e-2
 * relative (tests/test_precision.c). */
#ifndef AX_MODULE_H
#define AX_MODULE_H

#include <stdint.h>

#include "axon/kernels/rng.h"
#include "axon/kernels/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AX_TLIST_MAX 4

/* A short list of tensor references. Entries may be NULL (e.g. no gradient
 * for an integer input). Who owns the references is stated per call. */
typedef struct ax_tlist {
  int n;
  ax_tensor *t[AX_TLIST_MAX];
} ax_tlist;

/* Releases every entry and sets n = 0. */
void ax_tlist_clear(ax_tlist *l);
/* A list of one tensor (the reference is not retained). */
ax_tlist ax_tlist1(ax_tensor *t);

/* The precision of a forward or backward (ax_exec.precision; the rules
 * are at the top of this file). */
typedef enum ax_precision {
  AX_PREC_FP32 = 0, /* everything f32 (the default) */
  AX_PREC_BF16 = 1  /* bf16 GEMMs and activations, f32 state */
} ax_precision;
#define AX_PREC_COUNT 2

/* "fp32" or "bf16"; NULL for another value. */
const char *ax_precision_name(int precision);
/* Parses "fp32" or "bf16" into *out: AX_OK, or AX_EINVAL with a message
 * naming the allowed values. */
int ax_precision_parse(const char *s, int *out);

/* A softmax cross-entropy that the model's last block may compute inside
 * its training forward (ax_exec.xent; ax_forward_xent in models/loss.h
 * sets it up), so that a language model's head never materialises its
 * (rows, vocab) logits, their probabilities or their gradient. A block that
 * fuses it computes, for its rows r, the loss and the logits' gradient
 * scale * (softmax - onehot(labels[r])) (0 for ignored rows) and from it
 * its input and weight gradients; it returns no outputs, sets done and the
 * sums below, and its backward then takes an empty output gradient; with
 * loss_only it computes only the loss and the sums (and keeps nothing for
 * a backward). Other modules ignore it. */
typedef struct ax_xent_fuse {
  const ax_tensor *labels; /* i32, one per output row, on its device */
  int ignore_index;
  float scale;   /* the gradient's factor: scale / divisor of the mean */
  int loss_only; /* the loss and sums alone: no gradients (a forward that
                    the backward replays) */
  /* Written by the block that fused the loss: */
  int done;
  double loss_sum;        /* summed over the kept rows */
  int64_t count, correct; /* kept rows; rows argmax-equal to label */
} ax_xent_fuse;

/* What one forward or backward call works with. */
typedef struct ax_exec {
  ax_tensor *params;  /* flat f32 parameters to use (current or stashed) */
  ax_tensor *grads;   /* flat f32 gradient accumulator (backward only) */
  ax_tensor *buffers; /* flat f32 buffers (running statistics); may be NULL
                         when the module tree has none */
  int training;       /* batch statistics and dropout active */
  int update_stats;   /* update running statistics (0 in a recompute) */
  int need_dx;        /* backward must produce input gradients */
  uint64_t seed;      /* dropout seed of this micro-batch */
  /* Optional "gradients ready" hook (data-parallel all-reduce overlap). The
   * sequential container calls it after each child finished its backward
   * (whole, or its weight half), with the child's whole parameter range
   * [off, off + n) in the flat gradient buffer, whose gradients are then
   * final for this call. Children run with the hook cleared, so only the
   * outermost sequential reports (ranges arrive in descending order, one per
   * block). It runs on the backward's thread and should return quickly.
   * NULL: not called. */
  void (*grad_ready)(void *user, size_t off, size_t n);
  void *grad_ready_user;
  /* Tensor parallelism (models/layers/parallel.h): sums the f32 tensor t
   * in place over the members of the module's tensor-parallel group, every
   * member getting the same bits, and returns an error code. Layers built
   * for a group of more than one member call it in the forward or the
   * input half of the backward, and fail with AX_ESTATE when it is NULL. */
  int (*tp_allreduce)(void *user, ax_tensor *t);
  void *tp_user;
  int precision; /* ax_precision (0, fp32, in a zeroed exec) */
  /* Incremental decoding with a key/value cache (inference only: training
   * must be 0). 0: an ordinary forward. 1: the inputs are the tokens at
   * positions kv_pos, kv_pos + 1, ... of sequences whose positions 0 ..
   * kv_pos - 1 earlier calls ran with the same slot tree: each causal
   * attention layer keeps the keys and values of those positions in its
   * slot (AX_EINVAL without one), appends the new ones and attends over
   * all of them; position embeddings start at kv_pos, and a position past
   * the model's sequence length fails with AX_EINVAL (no sliding window).
   * kv_pos = 0 starts the sequences anew. The slot keeps the caches until
   * the caller frees or resets it. Layers without positions ignore both
   * fields. */
  int kv_decode;
  int64_t kv_pos;
  /* A training forward's loss for the model's last block to fuse (above);
   * NULL (a zeroed exec): blocks return their outputs. */
  ax_xent_fuse *xent;
} ax_exec;

typedef struct ax_module ax_module;
typedef struct ax_slot ax_slot;

/* The parts of a backward: the whole (fused) backward, its input half B or
 * its weight half W. A composite's walk (below) gets one of them. */
typedef enum ax_bwd_part {
  AX_BWD_FULL = 0,
  AX_BWD_INPUT = 1,
  AX_BWD_WEIGHT = 2
} ax_bwd_part;

typedef struct ax_module_ops {
  const char *kind;
  /* Computes out from in. `in` is borrowed; out receives new references
   * (the caller releases them). May save state into slot (not NULL when
   * ex->training; may be NULL for inference). On error out is empty. */
  int (*forward)(ax_module *m, const ax_exec *ex, ax_slot *slot,
                 const ax_tlist *in, ax_tlist *out);
  /* The fused backward. Consumes the state forward saved in slot.
   * Accumulates (+=) parameter gradients into ex->grads at this module's
   * offsets; when ex->need_dx, din receives new references to the input
   * gradients (NULL entries for inputs without gradient). dout is borrowed.
   * May be NULL when backward_input is given: ax_backward then runs the two
   * halves back to back. A module keeps a fused backward only where it is
   * cheaper than the halves; it must give the same values as the halves.
   * Composites write theirs as the walk's AX_BWD_FULL part (below). */
  int (*backward)(ax_module *m, const ax_exec *ex, ax_slot *slot,
                  const ax_tlist *dout, ax_tlist *din);
  /* Writes initial values of this module's OWN parameters and buffers
   * (host memory, n_params / n_buffers floats each). Children are initialised
   * by ax_module_init after their parent, in order. May be NULL. */
  void (*init)(ax_module *m, float *params, float *buffers, ax_rng *rng);
  /* Frees the module's private data (not its children). May be NULL. */
  void (*destroy)(ax_module *m);
  /* The input half B of the split backward; NULL when the module has a
   * walk (below) or no split backward (ax_backward_input then fails with
   * AX_EUNSUPPORTED).
   * Consumes the state forward saved in slot, computes the input gradients
   * into din exactly as backward does when ex->need_dx (with need_dx = 0 it
   * computes none), and saves into slot what backward_weight needs: the
   * output gradient (B retains dout's tensors), or reductions of it (batch
   * and layer norm keep their per-feature sums). It writes no parameter
   * gradient and never touches ex->grads. */
  int (*backward_input)(ax_module *m, const ax_exec *ex, ax_slot *slot,
                        const ax_tlist *dout, ax_tlist *din);
  /* The weight half W: accumulates (+=) the parameter gradients into
   * ex->grads from what forward and backward_input saved in slot, then
   * drops that state. It depends on nothing but the slot and ex (it may
   * run long after B, with other slots' forwards and backwards between).
   * The built-in layers' weight halves read no parameter, only the slot,
   * and write only ex->grads. NULL: nothing to do (parameter-free layers). */
  int (*backward_weight)(ax_module *m, const ax_exec *ex, ax_slot *slot);
  /* A composite's backward, written once for its three parts: `part` says
   * which (AX_BWD_FULL, the fused backward: each child's whole backward, so
   * each child's state is freed at once; AX_BWD_INPUT, the input half;
   * AX_BWD_WEIGHT, the weight half, with dout and din NULL). It runs that
   * part of each child's backward, last child first, through
   * ax_backward_part or ax_walk_children (below), and does its own work
   * between them; each part keeps the contract of the function above it
   * stands for. When set, ax_backward, ax_backward_input and
   * ax_backward_weight call it and never backward, backward_input or
   * backward_weight (leave those NULL). NULL: those three serve (leaves). */
  int (*walk)(ax_bwd_part part, ax_module *m, const ax_exec *ex, ax_slot *slot,
              const ax_tlist *dout, ax_tlist *din);
} ax_module_ops;

struct ax_module {
  const ax_module_ops *ops;
  size_t n_params;  /* own trainable floats (children excluded) */
  size_t n_buffers; /* own buffer floats (children excluded) */
  size_t param_off; /* set by ax_module_layout */
  size_t buf_off;   /* set by ax_module_layout */
  ax_module **children;
  int n_children;
  void *priv; /* layer-specific configuration */
};

/* Allocates a module with priv_size zeroed bytes of private data. */
ax_module *ax_module_new(const ax_module_ops *ops, size_t priv_size);
/* Appends a child (takes ownership). Returns AX_OK or AX_ENOMEM. */
int ax_module_add(ax_module *m, ax_module *child);
/* Frees the module and its children. NULL-safe. */
void ax_module_free(ax_module *m);

/* Assigns offsets depth-first (own parameters first, then children) from
 * base offsets; returns the totals of the subtree. */
void ax_module_layout(ax_module *m, size_t param_base, size_t buf_base,
                      size_t *n_params, size_t *n_buffers);
/* Calls init for the module then its children. params/buffers point at the
 * START of the flat host buffers (offsets are applied here). */
void ax_module_init(ax_module *m, float *params, float *buffers, ax_rng *rng);

/* Pointers to this module's own parameters / gradients / buffers. */
static inline float *ax_param(const ax_module *m, const ax_exec *ex,
                              size_t off) {
  return (float *)ex->params->data + m->param_off + off;
}
static inline float *ax_grad(const ax_module *m, const ax_exec *ex,
                             size_t off) {
  return (float *)ex->grads->data + m->param_off + off;
}
static inline float *ax_buffer(const ax_module *m, const ax_exec *ex,
                               size_t off) {
  return (float *)ex->buffers->data + m->buf_off + off;
}

/* ---- slots ---- */
#define AX_SLOT_SAVED 8

/* Per-micro-batch saved state: up to AX_SLOT_SAVED tensors, a few integers,
 * and child slots for composite modules. Not thread-safe: one slot is used
 * by one call at a time. */
ax_slot *ax_slot_new(void);
void ax_slot_free(ax_slot *s);  /* NULL-safe; frees children */
void ax_slot_reset(ax_slot *s); /* drops saved state, keeps memory */
/* The i-th child slot, created on first use (NULL on out-of-memory). */
ax_slot *ax_slot_child(ax_slot *s, int i);
/* Saves t in position i (retains it; a previous tensor there is released). */
void ax_slot_put(ax_slot *s, int i, ax_tensor *t);
/* The saved tensor at i (borrowed), or NULL. */
ax_tensor *ax_slot_get(const ax_slot *s, int i);
/* Saves the activation t at position i in ex's precision (the top of this
 * file): t itself in fp32 (as ax_slot_put), and also in bf16 when t is
 * not f32 or is NULL; an f32 t in bf16 as a new AX_BF16 tensor of its
 * rounded values. AX_OK, or an error (AX_ENOMEM, a kernel's) with nothing
 * saved at i. ax_slot_get then gives the saved tensor itself. */
int ax_slot_put_act(ax_slot *s, int i, const ax_exec *ex, ax_tensor *t);
/* The tensor saved at i as f32, in *out: a new reference to it when it is
 * not bf16, else to a new f32 tensor of its values (exact). *out is NULL
 * when nothing is saved there (AX_OK). */
int ax_slot_get_f32(const ax_slot *s, int i, ax_tensor **out);
/* Integer scratch (e.g. a dropout seed, a flag), AX_SLOT_SAVED entries. */
void ax_slot_set_int(ax_slot *s, int i, int64_t v);
int64_t ax_slot_int(const ax_slot *s, int i);
/* Bytes of tensor storage held by a slot tree (saved tensors only). */
size_t ax_slot_bytes(const ax_slot *s);

/* ---- the sequential container ---- */
/* Runs its children in order; backward in reverse. ex->need_dx applies to
 * the first child only (later children always produce input gradients).
 * Its fused backward runs each child's whole backward, last child first,
 * and reports each child's range to ex->grad_ready as it completes. Its
 * input half runs the children's input halves, last child first, threading
 * the gradients; its weight half runs the children's weight halves in the
 * same order (last child first, so gradient ranges still arrive in
 * descending order) and reports each child's range to ex->grad_ready after
 * its weight half. */
ax_module *ax_sequential_new(void);
/* A model's sequential of blocks (what ax_model_stage builds): the
 * sequential container that, in bf16 (ax_exec.precision), rounds at its
 * children's boundaries as the top of this file says. ends: its last
 * child is the model's last block, whose outputs (the logits) are not
 * rounded. In fp32 it is ax_sequential_new's container. */
ax_module *ax_blocks_new(int ends);

/* Calls a module's forward / backward with argument checks. Every tensor
 * a call touches must be on the device of ex->params (inputs, output
 * gradients, ex->grads, ex->buffers): AX_EDEVICE naming both devices
 * otherwise. Callers move data first (ax_tensor_to); nothing is copied
 * implicitly. */
int ax_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
               const ax_tlist *in, ax_tlist *out);
int ax_backward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                const ax_tlist *dout, ax_tlist *din);

/* The split backward (see backward_input / backward_weight above), with
 * the argument and device checks of ax_backward. For one slot the calls go
 * forward, ax_backward_input, ax_backward_weight; both halves get the same
 * ex->params (the weight version the forward used) and, for one unit, the
 * same ex->grads. B retains the dout tensors until W: the caller may
 * release its references but must not write into them before W ran.
 * Errors: AX_EUNSUPPORTED when m has no split backward (a module whose
 * ops have neither backward_input nor walk, or a composite with such a
 * child), AX_ESTATE
 * when the slot holds no state for the half (W before B, B twice, B
 * without a training forward). On error din is empty and the slot's state
 * is unspecified (run a new forward on it). */
int ax_backward_input(ax_module *m, const ax_exec *ex, ax_slot *slot,
                      const ax_tlist *dout, ax_tlist *din);
int ax_backward_weight(ax_module *m, const ax_exec *ex, ax_slot *slot);

/* 1 when m and every module below it implement the split backward (so
 * ax_backward_input cannot fail with AX_EUNSUPPORTED), else 0. */
int ax_module_can_split(const ax_module *m);

/* ---- helpers for composite modules (their walk) ---- */
/* One part of m's backward: ax_backward (AX_BWD_FULL), ax_backward_input
 * (AX_BWD_INPUT) or ax_backward_weight (AX_BWD_WEIGHT, which reads no dout
 * and leaves din, which may then be NULL, empty). */
int ax_backward_part(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                     ax_slot *slot, const ax_tlist *dout, ax_tlist *din);
/* The walk of a chain, for a composite that keeps child i's state in child
 * slot i: runs `part` of every child's backward, last child first, with
 * ex->grad_ready cleared. For AX_BWD_FULL and AX_BWD_INPUT the gradients
 * are threaded through the children as in the sequential container (dout
 * into the last child, the first child's input gradients into din; only
 * the first child gets ex->need_dx, the others produce theirs); for
 * AX_BWD_WEIGHT dout and din are unused (may be NULL). The weight half of
 * a composite whose children keep what their weight halves need is this
 * walk's AX_BWD_WEIGHT part. */
int ax_walk_children(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                     ax_slot *slot, const ax_tlist *dout, ax_tlist *din);

#ifdef __cplusplus
}
#endif
#endif
