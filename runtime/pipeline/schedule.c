/* Per-stage operation orders and dependencies of the pipeline modes. */
#include "runtime/pipeline/schedule.h"

#include "kernels/error.h"

static const char *const g_names[] = {"sequential", "gpipe", "1f1b",
                                      "ddg",        "fr",    "pipedream"};

const char *ax_pipe_mode_name(int mode) {
  return mode >= 0 && mode < 6 ? g_names[mode] : "?";
}

int ax_pipe_units(int mode, int M) {
  return (mode == AX_MODE_GPIPE || mode == AX_MODE_1F1B) && M > 1 ? M : 1;
}

int ax_pipe_async_update(int mode) {
  return mode == AX_MODE_DDG || mode == AX_MODE_FR ||
         mode == AX_MODE_PIPEDREAM;
}

int ax_pipe_ctx_per_batch(int mode) { return ax_pipe_async_update(mode); }

long ax_pipe_nops(int mode, int M, long n) {
  return 2 * n * ax_pipe_units(mode, M);
}

static ax_pipe_op op_make(int kind, int s, long t, int m, int step) {
  ax_pipe_op o = {kind, s, (int)t, m, step};
  return o;
}

int ax_pipe_schedule(int mode, int K, int s, int M, long n, ax_pipe_op *ops,
                     long cap) {
  if (mode < 0 || mode > AX_MODE_PIPEDREAM || K < 1 || s < 0 || s >= K ||
      M < 1 || n < 0)
    return ax_seterr(AX_EINVAL, "schedule: bad arguments (mode %d, K %d, "
                     "stage %d, M %d, n %ld)", mode, K, s, M, n);
  if (cap < ax_pipe_nops(mode, M, n))
    return ax_seterr(AX_EINVAL, "schedule: %ld operations do not fit in %ld",
                     ax_pipe_nops(mode, M, n), cap);
  int U = ax_pipe_units(mode, M), d = K - 1 - s;
  long k = 0;
  switch (mode) {
  case AX_MODE_SEQUENTIAL:
    for (long t = 0; t < n; t++) {
      ops[k++] = op_make(AX_OP_FWD, s, t, 0, 0);
      ops[k++] = op_make(AX_OP_BWD, s, t, 0, 1);
    }
    break;
  case AX_MODE_GPIPE:
    for (long t = 0; t < n; t++) {
      for (int m = 0; m < U; m++)
        ops[k++] = op_make(AX_OP_FWD, s, t, m, 0);
      for (int m = U - 1; m >= 0; m--)
        ops[k++] = op_make(AX_OP_BWD, s, t, m, m == 0);
    }
    break;
  case AX_MODE_1F1B:
    for (long t = 0; t < n; t++) {
      int w = d < U ? d : U;
      for (int m = 0; m < w; m++)
        ops[k++] = op_make(AX_OP_FWD, s, t, m, 0);
      for (int i = 0; i < U - w; i++) {
        ops[k++] = op_make(AX_OP_FWD, s, t, w + i, 0);
        ops[k++] = op_make(AX_OP_BWD, s, t, i, i == U - 1);
      }
      for (int m = U - w; m < U; m++)
        ops[k++] = op_make(AX_OP_BWD, s, t, m, m == U - 1);
    }
    break;
  default: /* ddg, fr, pipedream */
    for (long t = 0; t < n; t++) {
      ops[k++] = op_make(AX_OP_FWD, s, t, 0, 0);
      if (t - d >= 0)
        ops[k++] = op_make(AX_OP_BWD, s, t - d, 0, 1);
    }
    for (long t = n - d > 0 ? n - d : 0; t < n; t++)
      ops[k++] = op_make(AX_OP_BWD, s, t, 0, 1);
    break;
  }
  return AX_OK;
}

int ax_pipe_deps(int mode, int K, int M, const ax_pipe_op *op,
                 ax_pipe_op *deps) {
  int n = 0, s = op->stage;
  if (op->kind == AX_OP_FWD) {
    if (s > 0)
      deps[n++] = op_make(AX_OP_FWD, s - 1, op->batch, op->micro, 0);
    if ((mode == AX_MODE_DDG || mode == AX_MODE_FR) && s == 0 &&
        op->batch > 0) {
      long r = op->batch - 1; /* the previous round must be over */
      deps[n++] = op_make(AX_OP_FWD, K - 1, r, 0, 0);
      for (int j = 0; j < K; j++) {
        long b = r - (K - 1 - j);
        if (b >= 0)
          deps[n++] = op_make(AX_OP_BWD, j, b, 0, 1);
      }
    }
  } else if (s < K - 1) {
    deps[n++] = op_make(AX_OP_BWD, s + 1, op->batch, op->micro, 0);
  }
  return n;
}

int ax_pipe_live_bound(int mode, int K, int s, int M) {
  int d = K - 1 - s, U = ax_pipe_units(mode, M);
  switch (mode) {
  case AX_MODE_SEQUENTIAL:
    return 1;
  case AX_MODE_GPIPE:
    return U;
  case AX_MODE_1F1B:
    return d + 1 < U ? d + 1 : U;
  default:
    return d + 1;
  }
}
