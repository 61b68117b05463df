/* ax_net: a module tree together with the flat buffers it runs on.
 *
 * The net owns its root module, one flat f32 parameter buffer, one flat
 * gradient buffer of the same size and one flat buffer of non-trainable state
 * (running statistics), all on one device. Parameters are carved out of the
 * flat buffer by offset (llm.c style), so copying, stashing, all-reducing or
 * stepping all parameters is one operation on one tensor.
 *
 * Thread safety: none; the pipeline stage host serialises calls. */
#ifndef AX_NET_H
#define AX_NET_H

#include "axon/models/module.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ax_net {
  ax_module *root;
  ax_device device;
  size_t n_params, n_buffers;
  ax_tensor *params;  /* (n_params) */
  ax_tensor *grads;   /* (n_params), zeroed at creation */
  ax_tensor *buffers; /* (n_buffers), or NULL when there are none */
  int precision;      /* ax_precision of its execs (module.h); 0, fp32,
                         at creation: set it before running the net */
} ax_net;

/* Lays out `root` (takes ownership, also on failure), allocates the buffers
 * on dev and initialises parameters with ax_module_init and an rng seeded
 * with `seed`. Returns NULL on error (ax_errmsg set). */
ax_net *ax_net_new(ax_module *root, ax_device dev, uint64_t seed);
/* Same, but `init` fills the host parameter/buffer arrays instead. */
ax_net *ax_net_new_with_init(ax_module *root, ax_device dev,
                             void (*init)(void *arg, float *params,
                                          float *buffers),
                             void *arg);
void ax_net_free(ax_net *net); /* NULL-safe */

/* An exec over the net's own buffers, in the net's precision. */
ax_exec ax_net_exec(const ax_net *net, int training);

/* Forward/backward with the net's current buffers. */
int ax_net_forward(ax_net *net, ax_slot *slot, int training, uint64_t seed,
                   const ax_tlist *in, ax_tlist *out);
int ax_net_backward(ax_net *net, ax_slot *slot, uint64_t seed, int need_dx,
                    const ax_tlist *dout, ax_tlist *din);
int ax_net_zero_grad(ax_net *net);

#ifdef __cplusplus
}
#endif
#endif
