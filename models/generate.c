/* Text generation: the sampler, the decoding loop and the decoder of one
 * process (models/generate.h). */
#include "axon/models/generate.h"

#include <math.h>
#include <stdlib.h>

#include "axon/kernels/error.h"

int ax_sampler_init(ax_sampler *s, double temperature, int top_k,
                    uint64_t seed) {
  if (!(temperature >= 0 && isfinite(temperature)) || top_k < 0)
    return ax_seterr(AX_EINVAL,
                     "sampler: temperature %g (finite, >= 0) and top-k %d "
                     "(>= 0)",
                     temperature, top_k);
  s->temperature = temperature;
  s->top_k = top_k;
  ax_rng_seed(&s->rng, seed);
  return AX_OK;
}

typedef struct cand {
  float v;
  int32_t i;
} cand;

/* The candidates' order for top-k: larger logits first, ties to the lower
 * index (a total order, so every qsort gives the same list). */
static int cand_cmp(const void *a, const void *b) {
  const cand *x = a, *y = b;
  if (x->v != y->v)
    return x->v > y->v ? -1 : 1;
  return x->i < y->i ? -1 : x->i > y->i;
}

int ax_sample(ax_sampler *s, const float *logits, int vocab, int32_t *token) {
  if (vocab < 1)
    return ax_seterr(AX_EINVAL, "sampler: no logits");
  if (s->temperature == 0) { /* greedy: no draw */
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; i++)
      if (logits[i] > logits[best])
        best = i;
    *token = best;
    return AX_OK;
  }
  int k = s->top_k > 0 && s->top_k < vocab ? s->top_k : vocab;
  cand *c = malloc((size_t)vocab * sizeof *c);
  if (!c)
    return AX_ENOMEM;
  for (int32_t i = 0; i < vocab; i++)
    c[i] = (cand){logits[i], i};
  if (k < vocab)
    qsort(c, (size_t)vocab, sizeof *c, cand_cmp);
  double max = -INFINITY;
  for (int j = 0; j < k; j++) {
    if (!isfinite(c[j].v)) {
      int32_t bad = c[j].i;
      free(c);
      return ax_seterr(AX_EINVAL, "sampler: logit %d is not finite", bad);
    }
    if (c[j].v > max)
      max = c[j].v;
  }
  double *p = malloc((size_t)k * sizeof *p), sum = 0;
  if (!p) {
    free(c);
    return AX_ENOMEM;
  }
  for (int j = 0; j < k; j++)
    sum += p[j] = exp(((double)c[j].v - max) / s->temperature);
  double u = ax_rng_uniform(&s->rng) * sum, at = 0;
  int pick = k - 1; /* rounding may leave u at the very end */
  for (int j = 0; j < k; j++)
    if (u < (at += p[j])) {
      pick = j;
      break;
    }
  *token = c[pick].i;
  free(p);
  free(c);
  return AX_OK;
}

int ax_generate(ax_decode_fn decode, void *user, const int32_t *prompt,
                int n_prompt, int n_new, ax_sampler *s, int32_t *out,
                ax_token_fn emit, void *emit_user) {
  if (n_prompt < 1 || n_new < 0)
    return ax_seterr(AX_EINVAL, "generate: a prompt of %d tokens, %d new",
                     n_prompt, n_new);
  int64_t pos = 0;
  const int32_t *ids = prompt;
  int n = n_prompt;
  int32_t tok = 0;
  for (int t = 0; t < n_new; t++) {
    ax_tensor *logits = NULL;
    AX_TRY(decode(user, pos, ids, n, &logits));
    int err = ax_sample(s, ax_f32(logits), (int)ax_tensor_numel(logits), &tok);
    ax_tensor_release(logits);
    AX_TRY(err);
    if (out)
      out[t] = tok;
    if (emit)
      emit(emit_user, tok);
    pos += n;
    ids = &tok;
    n = 1;
  }
  return AX_OK;
}

int ax_net_decoder_init(ax_net_decoder *d, ax_net *net) {
  d->net = net;
  d->slot = ax_slot_new();
  return d->slot ? AX_OK : AX_ENOMEM;
}

int ax_net_decode(void *user, int64_t pos, const int32_t *ids, int n,
                  ax_tensor **logits) {
  ax_net_decoder *d = user;
  *logits = NULL;
  if (n < 1)
    return ax_seterr(AX_EINVAL, "decode: no tokens");
  ax_tensor *host = ax_tensor_new_v(AX_I32, AX_CPU, 2, 1, n), *x = NULL;
  if (!host)
    return AX_ENOMEM;
  int err = ax_tensor_write(host, ids, (size_t)n * sizeof *ids);
  if (err == AX_OK && !(x = ax_tensor_to(host, d->net->device)))
    err = AX_ENOMEM;
  ax_tensor_release(host);
  if (pos == 0 && err == AX_OK) /* a new sequence: the old cache goes */
    ax_slot_reset(d->slot);
  ax_exec ex = ax_net_exec(d->net, 0);
  ex.kv_decode = 1;
  ex.kv_pos = pos;
  ax_tlist in = ax_tlist1(x), y = {0};
  if (err == AX_OK)
    err = ax_forward(d->net->root, &ex, d->slot, &in, &y);
  ax_tensor_release(x);
  if (err == AX_OK && (y.n < 1 || y.t[0]->ndim != 2 || y.t[0]->shape[0] != n))
    err = ax_seterr(AX_ESHAPE,
                    "decode: the model's output is not (%d, vocab) "
                    "logits",
                    n);
  ax_tensor *last = err == AX_OK ? ax_tensor_slice0(y.t[0], n - 1, 1) : NULL;
  if (err == AX_OK && !(*logits = ax_tensor_to(last, AX_CPU)))
    err = AX_ENOMEM;
  ax_tensor_release(last);
  ax_tlist_clear(&y);
  return err;
}

void ax_net_decoder_free(ax_net_decoder *d) {
  if (!d)
    return;
  ax_slot_free(d->slot);
  d->slot = NULL;
}
