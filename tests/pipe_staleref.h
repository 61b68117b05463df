/* The staleness corrections' side of the single-process pipeline
 * reference (tests/pipe_testutil.h, pt_reference_ex with
 * pt_ref_opts.staleness): its own SGD step and, per stage and weight
 * version, the momentum buffer, the step size and the average of the
 * updates. Written from the formulas of runtime/pipeline/stage/staleness.h, not
 * from staleness.c. Header-only. */
#ifndef AX_PIPE_STALEREF_H
#define AX_PIPE_STALEREF_H

#include <math.h>

#include "axon/models/optim.h"
#include "harness.h"

/* Per-stage history of the corrections' reference (see the top). */
typedef struct pt_stale_hist {
  float **mom, **avg; /* [v] (n) momentum buffer and update average */
  float *lr;          /* [v] step size of the update that produced v */
  size_t n;
} pt_stale_hist;

static inline float *pt_vec(const ax_tensor *t) { return ax_f32(t); }

/* out = w(v) + c x, element by element (a new CPU tensor). */
static inline ax_tensor *pt_shift(const ax_tensor *w, double c,
                                  const float *x) {
  ax_tensor *r = ax_tensor_like(w);
  assert_non_null(r);
  size_t n = ax_tensor_numel(w);
  for (size_t i = 0; i < n; i++)
    pt_vec(r)[i] = (float)(pt_vec(w)[i] + c * x[i]);
  return r;
}

/* The reference's own SGD step of stage k: version t + 1 from t. */
static inline void pt_stale_step(const ax_optim_cfg *oc, pt_stale_hist *h,
                                 const ax_tensor *w, const ax_tensor *g, int t,
                                 double scale, double gamma, ax_tensor *out) {
  assert_int_equal(oc->kind, AX_OPT_SGD);
  assert_false(oc->nesterov);
  size_t n = h->n;
  float lr = (float)(ax_lr_at(oc, t) * scale);
  h->mom[t + 1] = calloc(n, sizeof(float));
  h->avg[t + 1] = calloc(n, sizeof(float));
  h->lr[t + 1] = lr;
  for (size_t i = 0; i < n; i++) {
    float d = pt_vec(g)[i] + oc->weight_decay * pt_vec(w)[i];
    float m = oc->momentum == 0.0f ? d
              : t == 0
                  ? d
                  : oc->momentum * h->mom[t][i] + (1.0f - oc->dampening) * d;
    h->mom[t + 1][i] = m;
    pt_vec(out)[i] = pt_vec(w)[i] - lr * m;
    h->avg[t + 1][i] =
        (float)(gamma * h->avg[t][i] +
                (1.0 - gamma) * ((double)pt_vec(out)[i] - pt_vec(w)[i]));
  }
}

#endif
