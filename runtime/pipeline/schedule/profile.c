/* Per-block profiling for the balanced partitioner (partition.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/kernels/error.h"
#include "axon/kernels/rng.h"
#include "axon/runtime/pipeline/schedule/partition.h"

#define MAX_REPS 64

static size_t tlist_bytes(const ax_tlist *l) {
  size_t b = 0;
  for (int i = 0; i < l->n; i++)
    if (l->t[i])
      b += ax_tensor_nbytes(l->t[i]);
  return b;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Random output gradients for the f32 entries of `out` (NULL for others),
 * scaled by 1 / rows like a mean loss would. */
static int make_dout(const ax_tlist *out, uint64_t seed, ax_tlist *dout) {
  ax_rng rng;
  ax_rng_seed2(&rng, seed, 0xd0u);
  memset(dout, 0, sizeof *dout);
  dout->n = out->n;
  for (int i = 0; i < out->n; i++) {
    const ax_tensor *t = out->t[i];
    if (!t || t->dtype != AX_F32)
      continue;
    size_t n = ax_tensor_numel(t);
    float *host = malloc(n * sizeof(float) + 1);
    ax_tensor *g = ax_tensor_like(t);
    if (!host || !g) {
      free(host);
      ax_tensor_release(g);
      ax_tlist_clear(dout);
      return ax_seterr(AX_ENOMEM, "profile: out of memory");
    }
    float scale =
        t->ndim > 0 && t->shape[0] > 0 ? 1.0f / (float)t->shape[0] : 1.0f;
    for (size_t j = 0; j < n; j++)
      host[j] = scale * (float)ax_rng_normal(&rng);
    int rc = ax_tensor_write(g, host, n * sizeof(float));
    free(host);
    dout->t[i] = g;
    if (rc != AX_OK) {
      ax_tlist_clear(dout);
      return rc;
    }
  }
  return AX_OK;
}

typedef struct prof_ctx {
  int n;
  ax_net *nets[AX_MODEL_MAX_BLOCKS];
  ax_slot *slots[AX_MODEL_MAX_BLOCKS];
  ax_tlist outs[AX_MODEL_MAX_BLOCKS];
  ax_tlist input, dout;
  double fwd[AX_MODEL_MAX_BLOCKS][MAX_REPS], bwd[AX_MODEL_MAX_BLOCKS][MAX_REPS];
} prof_ctx;

/* One forward pass over every block then one backward pass; times go to
 * column r when r >= 0 (a timed repetition). */
static int one_pass(prof_ctx *c, ax_device dev, uint64_t seed, int r,
                    ax_block_profile *out) {
  const ax_tlist *cur = &c->input;
  int rc = AX_OK;
  for (int i = 0; i < c->n && rc == AX_OK; i++) {
    ax_slot_reset(c->slots[i]);
    double t0 = ax_clock_s();
    rc = ax_net_forward(c->nets[i], c->slots[i], 1, seed, cur, &c->outs[i]);
    if (rc == AX_OK)
      rc = ax_device_synchronize(dev);
    if (r >= 0)
      c->fwd[i][r] = ax_clock_s() - t0;
    out[i].in_bytes = tlist_bytes(cur);
    out[i].out_bytes = tlist_bytes(&c->outs[i]);
    out[i].saved_bytes = ax_slot_bytes(c->slots[i]);
    cur = &c->outs[i];
  }
  if (rc == AX_OK && c->dout.n == 0)
    rc = make_dout(&c->outs[c->n - 1], seed, &c->dout);
  ax_tlist g = {0}, din = {0};
  for (int i = c->n - 1; i >= 0 && rc == AX_OK; i--) {
    double t0 = ax_clock_s();
    rc = ax_net_backward(c->nets[i], c->slots[i], seed, i > 0,
                         i == c->n - 1 ? &c->dout : &g, &din);
    if (rc == AX_OK)
      rc = ax_device_synchronize(dev);
    if (r >= 0)
      c->bwd[i][r] = ax_clock_s() - t0;
    ax_tlist_clear(&g);
    g = din;
    memset(&din, 0, sizeof din);
  }
  ax_tlist_clear(&g);
  for (int i = 0; i < c->n; i++)
    ax_tlist_clear(&c->outs[i]);
  return rc;
}

int ax_profile_blocks(const ax_model_def *def, const ax_config *cfg,
                      ax_device dev, const ax_tlist *input,
                      const ax_profile_opts *o, ax_block_profile *out,
                      int *n_blocks) {
  ax_profile_opts opt = {1, 3, 1};
  if (o)
    opt = *o;
  if (!def || !cfg || !input || !out || !n_blocks)
    return ax_seterr(AX_EINVAL, "profile: NULL argument");
  if (input->n < 1 || input->n > AX_TLIST_MAX)
    return ax_seterr(AX_EINVAL, "profile: the input list has %d entries",
                     input->n);
  if (opt.reps < 1 || opt.reps > MAX_REPS || opt.warmup < 0)
    return ax_seterr(AX_EINVAL,
                     "profile: need 1 <= reps <= %d and warmup >= 0 (got %d, "
                     "%d)",
                     MAX_REPS, opt.reps, opt.warmup);
  ax_model_info info;
  AX_TRY(ax_model_describe(def, cfg, &info));
  prof_ctx *c = calloc(1, sizeof *c);
  if (!c)
    return ax_seterr(AX_ENOMEM, "profile: out of memory");
  c->n = info.n_blocks;
  int rc = AX_OK;
  c->input.n = input->n;
  for (int i = 0; i < input->n && rc == AX_OK; i++)
    if (input->t[i] && !(c->input.t[i] = ax_tensor_to(input->t[i], dev)))
      rc = ax_seterr(AX_EDEVICE, "profile: cannot move input %d: %s", i,
                     ax_errmsg());
  for (int i = 0; i < c->n && rc == AX_OK; i++) {
    rc = ax_model_stage(def, cfg, i, i + 1, dev, opt.seed, &c->nets[i]);
    if (rc == AX_OK && !(c->slots[i] = ax_slot_new()))
      rc = ax_seterr(AX_ENOMEM, "profile: out of memory");
  }
  memset(out, 0, sizeof *out * (size_t)c->n);
  for (int r = -opt.warmup; r < opt.reps && rc == AX_OK; r++)
    rc = one_pass(c, dev, opt.seed, r, out);
  if (rc != AX_OK && !strstr(ax_errmsg(), "profile")) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s", ax_errmsg());
    ax_seterr(rc, "profile: %s: %s", def->name, msg);
  }
  for (int i = 0; i < c->n; i++) {
    if (rc == AX_OK) {
      out[i].fwd_s = median(c->fwd[i], opt.reps);
      out[i].bwd_s = median(c->bwd[i], opt.reps);
      out[i].param_bytes = c->nets[i]->n_params * sizeof(float);
      out[i].buffer_bytes = c->nets[i]->n_buffers * sizeof(float);
    }
    ax_slot_free(c->slots[i]);
    ax_net_free(c->nets[i]);
  }
  ax_tlist_clear(&c->input);
  ax_tlist_clear(&c->dout);
  if (rc == AX_OK)
    *n_blocks = c->n;
  free(c);
  return rc;
}
