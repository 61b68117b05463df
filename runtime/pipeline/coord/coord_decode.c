/* Incremental decoding through a pipeline's stages (decode.h): one call to
 * every stage at once per decoder call, as an evaluation batch goes, under
 * a context of its own. */
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "axon/kernels/clock.h"
#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/pipeline/coord/coordinator-impl.h"
#include "axon/runtime/pipeline/coord/decode.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"

static int usable(const ax_pipe *p) {
  if (p->nrep || p->frozen)
    return ax_seterr(AX_EUNSUPPORTED,
                     "decoding: one pipeline without replicas, "
                     "tensor-parallel members or a frozen prefix");
  if (p->plan)
    return ax_seterr(AX_ESTATE, "decoding: only between ax_pipe_train calls");
  return AX_OK;
}

int ax_pipe_decoder_init(ax_pipe_decoder *d, ax_pipe *p) {
  memset(d, 0, sizeof *d);
  AX_TRY(usable(p));
  d->p = p;
  if (getrandom(&d->session, sizeof d->session, 0) != sizeof d->session)
    d->session = (uint64_t)(uintptr_t)d ^ (uint64_t)ax_clock_us(); /* rare */
  d->session &= INT64_MAX; /* the stage messages' range */
  return AX_OK;
}

/* One call of a decoder to every stage. */
typedef struct dcall {
  ax_pipe_decoder *d;
  const axi_pipe_decode_msg *m; /* decode, or NULL: decode_end */
  int last;
  ax_tensor *logits; /* the last stage's (a new reference) */
  int64_t sessions, bytes, busy_us;
} dcall;

static int dcall_args(void *user, int s, ax_values **out) {
  dcall *c = user;
  if (!(*out = ax_values_new()))
    return AX_ENOMEM;
  if (!c->m) {
    axi_pipe_decode_end_msg e = {(int64_t)c->d->session};
    return axi_pipe_decode_end_encode(&e, *out);
  }
  axi_pipe_decode_msg m = *c->m;
  if (s > 0) /* the later stages take what their prev pushed */
    m.in.n = 0;
  return axi_pipe_decode_encode(&m, *out);
}

static int dcall_reply(void *user, int s, const ax_values *v) {
  dcall *c = user;
  axi_pipe_decode_reply_msg r;
  AX_TRY(axi_pipe_decode_reply_decode(v, &r));
  c->sessions += r.sessions;
  c->bytes += r.cache_bytes;
  c->busy_us += r.busy_us;
  if (!c->m || s != c->last)
    return AX_OK;
  if (!r.has_logits || r.logits->dtype != AX_F32 || r.logits->ndim != 2 ||
      r.logits->shape[0] != 1)
    return ax_seterr(AX_EBADARG, "decode reply: no (1, vocab) logits from "
                                 "the last stage");
  c->logits = ax_tensor_retain(r.logits);
  return AX_OK;
}

static int run(ax_pipe_decoder *d, dcall *c) {
  ax_pipe *p = d->p;
  uint64_t ctx = 0;
  AX_TRY(usable(p));
  if (c->m) { /* activations travel under a context; decode_end needs none */
    int err = ax_dist_context_new(p->node, &ctx);
    ax_autograd_ctx_set_current(0);
    AX_TRY(err);
  }
  c->last = p->K - 1;
  int err = axi_pipe_all_stages(p, ctx, c->m ? "decode" : "decode_end",
                                dcall_args, dcall_reply, c);
  d->sessions = c->sessions;
  d->cache_bytes = c->bytes;
  d->busy_s += (double)c->busy_us * 1e-6;
  if (!ctx)
    return err;
  char msg[700];
  snprintf(msg, sizeof msg, "%s", err != AX_OK ? ax_errmsg() : "");
  ax_dist_context_release(p->node, ctx, 10000);
  return err == AX_OK ? AX_OK : ax_seterr(err, "%s", msg);
}

int ax_pipe_decode(void *user, int64_t pos, const int32_t *ids, int n,
                   ax_tensor **logits) {
  ax_pipe_decoder *d = user;
  *logits = NULL;
  if (n < 1 || pos < 0)
    return ax_seterr(AX_EINVAL, "decode: %d tokens at position %lld", n,
                     (long long)pos);
  if (pos && pos != d->pos)
    return ax_seterr(AX_ESTATE,
                     "decode: the session holds %lld positions, not %lld%s",
                     (long long)(d->pos > 0 ? d->pos : 0), (long long)pos,
                     d->pos < 0 ? " (a call failed: start again at 0)" : "");
  ax_tensor *x = ax_tensor_new_v(AX_I32, AX_CPU, 2, 1, n);
  if (!x)
    return AX_ENOMEM;
  int err = ax_tensor_write(x, ids, (size_t)n * sizeof *ids);
  axi_pipe_decode_msg m = {(int64_t)d->session, pos, n, {1, {x}}};
  dcall c = {d, &m};
  if (err == AX_OK)
    err = run(d, &c);
  ax_tensor_release(x);
  d->pos = err == AX_OK ? pos + n : -1;
  if (err == AX_OK)
    *logits = c.logits;
  else
    ax_tensor_release(c.logits);
  return err;
}

int ax_pipe_decoder_end(ax_pipe_decoder *d) {
  if (!d->p)
    return AX_OK;
  dcall c = {d, NULL};
  return run(d, &c);
}
