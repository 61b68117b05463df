#include "axon/models/net.h"

#include <stdlib.h>

static void rng_init(void *arg, float *params, float *buffers) {
  (void)arg;
  (void)params;
  (void)buffers;
}

struct seeded {
  ax_module *root;
  uint64_t seed;
};

static void seeded_init(void *arg, float *params, float *buffers) {
  struct seeded *s = arg;
  ax_rng rng;
  ax_rng_seed(&rng, s->seed);
  ax_module_init(s->root, params, buffers, &rng);
}

ax_net *ax_net_new(ax_module *root, ax_device dev, uint64_t seed) {
  struct seeded s = {root, seed};
  return ax_net_new_with_init(root, dev, seeded_init, &s);
}

ax_net *ax_net_new_with_init(ax_module *root, ax_device dev,
                             void (*init)(void *arg, float *params,
                                          float *buffers),
                             void *arg) {
  if (!root)
    return NULL;
  if (!init)
    init = rng_init;
  ax_net *net = calloc(1, sizeof *net);
  if (!net) {
    ax_module_free(root);
    return NULL;
  }
  net->root = root;
  net->device = dev;
  ax_module_layout(root, 0, 0, &net->n_params, &net->n_buffers);
  int64_t np = (int64_t)net->n_params, nb = (int64_t)net->n_buffers;
  float *hp = calloc(net->n_params + 1, sizeof(float));
  float *hb = calloc(net->n_buffers + 1, sizeof(float));
  net->params = ax_tensor_new(AX_F32, 1, &np, dev);
  net->grads = ax_tensor_zeros(AX_F32, 1, &np, dev);
  if (nb)
    net->buffers = ax_tensor_new(AX_F32, 1, &nb, dev);
  int ok = hp && hb && net->params && net->grads && (!nb || net->buffers);
  if (ok) {
    init(arg, hp, hb);
    ok =
        ax_tensor_write(net->params, hp, net->n_params * 4) == AX_OK &&
        (!nb || ax_tensor_write(net->buffers, hb, net->n_buffers * 4) == AX_OK);
  }
  free(hp);
  free(hb);
  if (!ok) {
    ax_net_free(net);
    return NULL;
  }
  return net;
}

void ax_net_free(ax_net *net) {
  if (!net)
    return;
  ax_module_free(net->root);
  ax_tensor_release(net->params);
  ax_tensor_release(net->grads);
  ax_tensor_release(net->buffers);
  free(net);
}

ax_exec ax_net_exec(const ax_net *net, int training) {
  ax_exec ex = {0};
  ex.params = net->params;
  ex.grads = net->grads;
  ex.buffers = net->buffers;
  ex.training = training;
  ex.update_stats = training;
  ex.need_dx = 1;
  ex.precision = net->precision;
  return ex;
}

int ax_net_forward(ax_net *net, ax_slot *slot, int training, uint64_t seed,
                   const ax_tlist *in, ax_tlist *out) {
  ax_exec ex = ax_net_exec(net, training);
  ex.seed = seed;
  return ax_forward(net->root, &ex, slot, in, out);
}

int ax_net_backward(ax_net *net, ax_slot *slot, uint64_t seed, int need_dx,
                    const ax_tlist *dout, ax_tlist *din) {
  ax_exec ex = ax_net_exec(net, 1);
  ex.seed = seed;
  ex.need_dx = need_dx;
  return ax_backward(net->root, &ex, slot, dout, din);
}

int ax_net_zero_grad(ax_net *net) { return ax_tensor_fill(net->grads, 0.0f); }
