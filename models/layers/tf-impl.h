/* Helpers shared by the transformer layers (models/layers/tf_*.c). Not a
 * public header: nothing outside models/ includes it. */
#ifndef AX_LAYERS_TF_IMPL_H
#define AX_LAYERS_TF_IMPL_H

#include "axon/kernels/backend-impl.h"
#include "axon/kernels/rng.h"
#include "axon/models/layers/basic.h"
#include "axon/models/layers/parallel.h"
#include "axon/models/layers/transformer.h"

/* Fills n floats with N(0, std^2) values from rng. */
void axi_tf_normal(float *p, size_t n, float std, ax_rng *rng);

/* Checks that `in` holds at least n tensors and that the first is f32;
 * AX_EINVAL / AX_EDTYPE with a message naming `kind` otherwise. */
int axi_tf_check_in(const char *kind, const ax_tlist *in, int n);

/* The backward of `kind` found no state from a forward: AX_ESTATE. */
int axi_tf_no_state(const char *kind);

/* A new f32 tensor with shape `shape` (ndim dims) on dev; NULL with
 * AX_ENOMEM set on failure (the caller returns AX_ENOMEM). */
ax_tensor *axi_tf_new(int ndim, const int64_t *shape, ax_device dev);

/* A new tensor holding a + b (same element count, f32). */
int axi_tf_add(const ax_tensor *a, const ax_tensor *b, ax_tensor **out);

/* Runs child `i` of m forward on the single tensor x; *y receives a new
 * reference to the first output. slot is the parent's slot (may be NULL
 * outside training). */
int axi_tf_child_fwd(ax_module *m, int i, const ax_exec *ex, ax_slot *slot,
                     ax_tensor *x, ax_tensor **y);

/* Runs child `i` of m backward on dy, whole or only its input half
 * (`part`); *dx receives a new reference to the first input gradient when
 * need_dx (else NULL). */
int axi_tf_child_bwd(ax_bwd_part part, ax_module *m, int i, const ax_exec *ex,
                     ax_slot *slot, int need_dx, ax_tensor *dy, ax_tensor **dx);

/* Releases the n temporaries t[0..n-1] of one call and clears them. */
void axi_tf_tmp_free(ax_tensor **t, int n);

/* Runs children [first, last] of m forward in a chain from x: t[i]
 * receives a new reference to child i's output, which is child i+1's
 * input. On failure the outputs made so far stay in t; the caller frees
 * t (axi_tf_tmp_free) on every path. */
int axi_tf_chain_fwd(ax_module *m, const ax_exec *ex, ax_slot *slot, int first,
                     int last, ax_tensor *x, ax_tensor **t);

/* Runs children [first, last] of m backward in a chain, last first, from
 * dy, each whole or only its input half (`part`): g[i] receives a new
 * reference to child i's input gradient, which is child i-1's output
 * gradient. The first child produces one only when need_dx. The caller
 * frees g as for axi_tf_chain_fwd. */
int axi_tf_chain_bwd(ax_bwd_part part, ax_module *m, const ax_exec *ex,
                     ax_slot *slot, int first, int last, int need_dx,
                     ax_tensor *dy, ax_tensor **g);

/* Appends parts[0..n-1] to m in order as its children (a NULL part is
 * AX_ENOMEM). m owns each part added; on failure the parts not added are
 * freed, and the caller frees m. */
int axi_tf_add_parts(ax_module *m, ax_module **parts, int n);

/* ax_causal_attn_new_tp with its output projection's weights drawn from
 * N(0, proj_std^2) (the decoder layer's residual projection). */
ax_module *axi_tf_causal_new(int hidden, int heads, float dropout,
                             uint64_t salt, float proj_std, ax_tp tp);

/* The dropout seed of one layer: the micro-batch seed mixed with the salt. */
static inline uint64_t axi_tf_dropout_seed(uint64_t seed, uint64_t salt) {
  return ax_mix64(seed ^ ax_mix64(salt ^ 0x5bd1e9955bd1e995ull));
}

#endif
