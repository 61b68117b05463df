/* Staleness corrections (staleness.h): weight prediction and PipeMare's
 * learning-rate rescheduling and discrepancy correction, on the stage's
 * device through the backend's axpby. */
#include "axon/runtime/pipeline/stage/staleness.h"

#include <math.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "axon/runtime/pipeline/schedule/mode.h"
#include "axon/runtime/pipeline/stage/staleness-impl.h"

static const char *const g_names[AX_STALE_COUNT] = {"none", "predict",
                                                    "pipemare"};

int ax_staleness_parse(const char *s, int *out) {
  for (int i = 0; s && i < AX_STALE_COUNT; i++)
    if (strcmp(s, g_names[i]) == 0) {
      *out = i;
      return AX_OK;
    }
  return ax_seterr(AX_EINVAL,
                   "staleness '%s': expected none, predict or "
                   "pipemare",
                   s ? s : "(null)");
}

const char *ax_staleness_name(int kind) {
  return kind >= 0 && kind < AX_STALE_COUNT ? g_names[kind] : "?";
}

int ax_staleness_check(int mode, int kind, double gamma, int warmup) {
  const ax_pipe_mode_def *def = ax_pipe_mode_get(mode);
  if (!def)
    return AX_EINVAL;
  if (kind < 0 || kind >= AX_STALE_COUNT)
    return ax_seterr(AX_EINVAL,
                     "staleness %d: expected none, predict or "
                     "pipemare",
                     kind);
  if (kind != AX_STALE_NONE && def->flush)
    return ax_seterr(AX_EINVAL,
                     "--staleness %s applies to the asynchronous "
                     "modes (ddg, fr, pipedream, 2bw); %s flushes the "
                     "pipeline before each update, so its gradients are "
                     "not stale",
                     g_names[kind], def->name);
  if (!(gamma >= 0.0 && gamma < 1.0) || warmup < 0)
    return ax_seterr(AX_EINVAL,
                     "staleness: PipeMare's gamma %g must be in "
                     "[0, 1) and its warm-up %d >= 0",
                     gamma, warmup);
  return AX_OK;
}

int axi_stale_init(axi_stale *z, int kind, int delay, double gamma,
                   int warmup) {
  if (gamma < 0)
    gamma = AX_PIPEMARE_GAMMA;
  if (kind < 0 || kind >= AX_STALE_COUNT || delay < 0 || delay > 1 << 20 ||
      !(gamma < 1.0) || warmup < 0)
    return ax_seterr(AX_EINVAL,
                     "staleness: bad correction %d (delay %d, "
                     "gamma %g, warm-up %d)",
                     kind, delay, gamma, warmup);
  z->kind = kind;
  z->delay = delay;
  z->warmup = warmup;
  z->gamma = kind == AX_STALE_PIPEMARE ? (float)gamma : 0.0f;
  return AX_OK;
}

void axi_stale_clear(axi_stale *z) {
  ax_tensor_release(z->delta);
  ax_tensor_release(z->before);
  ax_tensor_release(z->pred);
  memset(z, 0, sizeof *z);
  z->pred_for = -1;
  z->lr_scale = 1.0f;
}

int axi_stale_stashes(const axi_stale *z) {
  return z->kind != AX_STALE_PIPEMARE;
}

/* out = w + c * delta (delta NULL: w), a new tensor. */
static int extrapolate(const ax_tensor *w, float c, const ax_tensor *delta,
                       ax_tensor **out) {
  ax_tensor *r = ax_tensor_like(w);
  if (!r)
    return AX_ENOMEM;
  int err = ax_tensor_copy(r, w);
  if (err == AX_OK && delta)
    err = AX_K(ax_backend_of(w->device), axpby, ax_tensor_numel(w), c,
               ax_f32(delta), 1.0f, ax_f32(r));
  if (err != AX_OK) {
    ax_tensor_release(r);
    return err;
  }
  *out = r;
  return AX_OK;
}

int axi_stale_forward(axi_stale *z, ax_tensor *w, long batch, ax_tensor **out) {
  if (z->kind != AX_STALE_PREDICT) {
    *out = ax_tensor_retain(w);
    return AX_OK;
  }
  if (!z->pred || z->pred_for != batch) {
    ax_tensor *p = NULL;
    if (!z->delta || z->delay == 0)
      p = ax_tensor_retain(w); /* nothing to extrapolate yet */
    else
      AX_TRY(extrapolate(w, (float)z->delay, z->delta, &p));
    ax_tensor_release(z->pred);
    z->pred = p;
    z->pred_for = batch;
  }
  *out = ax_tensor_retain(z->pred);
  return AX_OK;
}

int axi_stale_backward(axi_stale *z, ax_tensor *live, long steps,
                       ax_tensor **out) {
  *out = NULL;
  if (z->kind != AX_STALE_PIPEMARE)
    return AX_OK;
  long tau = steps < z->delay ? steps : z->delay;
  if (!z->delta || tau == 0) {
    *out = ax_tensor_retain(live);
    return AX_OK;
  }
  return extrapolate(live, -(float)tau, z->delta, out);
}

float axi_stale_lr_scale(int delay, int warmup, long k) {
  if (delay <= 1)
    return 1.0f;
  double p = warmup > 0 ? 1.0 - (k >= warmup ? 1.0 : (double)k / warmup) : 1.0;
  return (float)pow((double)delay, -p);
}

/* A copy of w in a new tensor. */
static int copy_of(const ax_tensor *w, ax_tensor **out) {
  return extrapolate(w, 0.0f, NULL, out);
}

int axi_stale_before_step(axi_stale *z, long steps, ax_tensor *w, long next) {
  z->lr_scale = z->kind == AX_STALE_PIPEMARE
                    ? axi_stale_lr_scale(z->delay, z->warmup, steps)
                    : 1.0f;
  if (z->kind == AX_STALE_NONE)
    return AX_OK;
  if (z->kind == AX_STALE_PREDICT) {
    ax_tensor *p = NULL;
    if (next >= 0 && z->pred_for != next) { /* next's prediction, from w */
      AX_TRY(z->delta && z->delay > 0
                 ? extrapolate(w, (float)z->delay, z->delta, &p)
                 : copy_of(w, &p));
      z->pred_for = next;
    } else if (z->pred == w && next >= 0) { /* w changes in place */
      AX_TRY(copy_of(w, &p));
    } else if (z->pred == w) { /* every forward of its batch ran */
      z->pred_for = -1;
    } else {
      p = ax_tensor_retain(z->pred);
    }
    ax_tensor_release(z->pred);
    z->pred = p;
  }
  if (!z->before && !(z->before = ax_tensor_like(w)))
    return AX_ENOMEM;
  return ax_tensor_copy(z->before, w);
}

int axi_stale_after_step(axi_stale *z, const ax_tensor *w, long t) {
  if (z->kind == AX_STALE_NONE)
    return AX_OK;
  ax_backend *be = ax_backend_of(w->device);
  size_t n = ax_tensor_numel(w);
  /* before <- w - before: this update */
  AX_TRY(AX_K(be, axpby, n, 1.0f, ax_f32(w), -1.0f, ax_f32(z->before)));
  if (z->gamma == 0.0f || !z->delta) { /* the first update, or predict */
    ax_tensor *u = z->before;
    z->before = z->delta;
    z->delta = u;
    if (z->gamma != 0.0f) /* the average starts from zero */
      AX_TRY(AX_K(be, axpby, n, 0.0f, ax_f32(u), 1.0f - z->gamma,
                  ax_f32(z->delta)));
  } else {
    AX_TRY(AX_K(be, axpby, n, 1.0f - z->gamma, ax_f32(z->before), z->gamma,
                ax_f32(z->delta)));
  }
  if (z->pred && z->pred_for <= t) { /* every forward of it ran */
    ax_tensor_release(z->pred);
    z->pred = NULL;
    z->pred_for = -1;
  }
  return AX_OK;
}
