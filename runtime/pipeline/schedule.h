/* Pipeline schedules: the order in which each stage runs the forwards and
 * backwards of a training run, and what each operation waits for.
 *
 * Pure functions, no state: the coordinator (coordinator.h) walks these
 * lists, the tests check them, and formula.h models their timing.
 *
 * Stages are 0-based here: s in [0, K), d = K - 1 - s (the seed's d_k with
 * k = s + 1). A UNIT is what one forward carries: a micro-batch for gpipe
 * and 1f1b (M per mini-batch), a whole mini-batch for sequential, ddg, fr
 * and pipedream (ax_pipe_units returns 1 for them).
 *
 * Per-stage order for n mini-batches:
 *  - sequential: F(t) B(t) for t = 0 .. n-1 (update after every B).
 *  - gpipe:      per mini-batch F(t,0..M-1) then B(t,M-1..0); update after
 *                the last backward of the mini-batch (gradients summed).
 *  - 1f1b:       per mini-batch min(d, M) warm-up forwards, then pairs
 *                F(t,w+i) B(t,i), then the remaining backwards (cool-down);
 *                update after B(t,M-1) (the flush).
 *  - ddg, fr, pipedream: F(t), and right after it B(t-d) when t >= d; the
 *                remaining backwards at the end. The first d + 1 forwards
 *                are the warm-up; no flush; update after every backward.
 * Dependencies (ax_pipe_deps): F(s,u) needs F(s-1,u); B(s,u) needs B(s+1,u)
 * (and its own F, earlier in the stage's order). ddg and fr add the
 * forward locking of the seed: stage 0's F(t) waits until round t-1 is
 * over (F(K-1,t-1) and every backward of round t-1). */
#ifndef AX_PIPELINE_SCHEDULE_H
#define AX_PIPELINE_SCHEDULE_H

#include "runtime/pipeline/formula.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Modes in AX_PIPE_MODES order (ax_pipe_mode_index). */
typedef enum ax_pipe_mode {
  AX_MODE_SEQUENTIAL = 0,
  AX_MODE_GPIPE = 1,
  AX_MODE_1F1B = 2,
  AX_MODE_DDG = 3,
  AX_MODE_FR = 4,
  AX_MODE_PIPEDREAM = 5,
} ax_pipe_mode;

enum { AX_OP_FWD = 0, AX_OP_BWD = 1 };

typedef struct ax_pipe_op {
  int kind;  /* AX_OP_FWD or AX_OP_BWD */
  int stage; /* 0-based */
  int batch; /* mini-batch t */
  int micro; /* micro-batch within t (0 for modes without) */
  int step;  /* BWD only: update the stage's weights after it */
} ax_pipe_op;

/* The mode's name ("pipedream"), or "?" when out of range. */
const char *ax_pipe_mode_name(int mode);
/* Units per mini-batch: M for gpipe and 1f1b, 1 otherwise. */
int ax_pipe_units(int mode, int M);
/* 1 when the mode updates after every backward (ddg, fr, pipedream). */
int ax_pipe_async_update(int mode);
/* 1 when the mode uses one context per mini-batch (ddg, fr, pipedream),
 * 0 when one per unit (sequential, gpipe, 1f1b). */
int ax_pipe_ctx_per_batch(int mode);

/* Number of operations of one stage for n mini-batches: 2 n units. */
long ax_pipe_nops(int mode, int M, long n);

/* Fills ops[0 .. ax_pipe_nops) with stage s's order. AX_EINVAL on a bad
 * mode, K < 1, s outside [0, K), M < 1, n < 0, or cap too small. */
int ax_pipe_schedule(int mode, int K, int s, int M, long n, ax_pipe_op *ops,
                     long cap);

/* The operations of OTHER stages that op waits for (at most 2 + K), into
 * deps; returns their count (>= 0). Operations of batches < 0 are left
 * out. */
int ax_pipe_deps(int mode, int K, int M, const ax_pipe_op *op,
                 ax_pipe_op *deps);

/* The table's bound on the states stage s keeps at once (units whose
 * forward ran and backward did not): 1, M, min(d + 1, M), d + 1. */
int ax_pipe_live_bound(int mode, int K, int s, int M);

#ifdef __cplusplus
}
#endif
#endif
