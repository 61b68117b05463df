/* Staleness corrections for the asynchronous pipeline modes (--staleness).
 *
 * In a mode that does not flush (ddg, fr, pipedream, 2bw), a unit's
 * gradient goes into an update `delay` updates after the version its
 * forward used (ax_pipe_delay in mode.h, derived from the mode's action
 * lists: K - 1 - s for ddg, fr and pipedream on stage s, 1 for 2bw). A
 * correction changes which weights a forward or a backward uses and the
 * stage's step size; it never changes the schedule.
 *
 *  - AX_STALE_NONE: the mode as it is (bit for bit).
 *  - AX_STALE_PREDICT (weight prediction, SpecTrain / PipeOptim): a
 *    training forward of mini-batch t uses the weights the mode gives it,
 *    w, extrapolated over the delay along the optimizer's last update u
 *    (the update that produced w): w_hat = w + delay * u. For SGD with
 *    momentum (no Nesterov) u = -lr v, v the momentum buffer, so
 *    w_hat = w - delay * lr * v; for AdamW u is its update direction times
 *    the step size. Every unit of one mini-batch uses the same w_hat. The
 *    backward uses the same w_hat in the modes that stash the forward's
 *    weights (ddg, pipedream, 2bw: w_hat is the stash); fr keeps its rule
 *    and replays with the latest weights, the version the prediction aims
 *    at. Memory: one more weight version per stage than the mode's bound
 *    (ax_pipe_version_bound), the live one besides the predicted ones
 *    (2bw then keeps no shadow: the prediction of mini-batch t + 1 is made
 *    from the live weights before update t).
 *  - AX_STALE_PIPEMARE (PipeMare, Yang et al. 2021), two parts:
 *    learning-rate rescheduling: stage i steps with lr * tau^-p(k) at its
 *    k-th update (0-based), tau = max(delay, 1), p(k) = 1 - min(k / W, 1)
 *    for a warm-up of W > 0 updates (the paper's form: 1 / tau at first,
 *    the plain learning rate after W updates) and p = 1 for W = 0 (1 / tau
 *    throughout); discrepancy correction: the backward of a unit (fr: its
 *    replay) uses w_bkwd = w - tau_u * delta instead of a stashed version,
 *    w the live weights, tau_u = min(delay, updates so far) and delta the
 *    exponential moving average of the stage's updates,
 *    delta <- gamma delta + (1 - gamma) (w_new - w_old), delta = 0 before
 *    the first update (gamma: AX_PIPEMARE_GAMMA by default). No version is
 *    stashed for the backward (2bw keeps its shadow for the forwards).
 *
 * The flushed modes have delay 0 and nothing to correct: ax_pipe_new
 * refuses anything but AX_STALE_NONE there (AX_EINVAL, naming the modes).
 * A correction reads no optimizer state: it takes the optimizer's update
 * count and gives it PipeMare's learning-rate scale, and sees the update
 * as the whole weights after it minus before. So it runs unchanged with
 * ZeRO (each shard's optimizer takes the scale; the update is read from
 * the all-gathered weights) and with an optimizer host (the scale travels
 * with the offloaded step; the update is read once its weights are back).
 * The math lives in staleness.c, called by the stage host
 * (stage_host.c, stage_host_bwd.c). Thread safety: the functions here are
 * reentrant. */
#ifndef AX_PIPELINE_STALENESS_H
#define AX_PIPELINE_STALENESS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ax_staleness {
  AX_STALE_NONE = 0,
  AX_STALE_PREDICT = 1,
  AX_STALE_PIPEMARE = 2,
  AX_STALE_COUNT
} ax_staleness;

/* PipeMare's default decay of the update average. */
#define AX_PIPEMARE_GAMMA 0.9

/* Parses "none|predict|pipemare" into AX_STALE_* (AX_EINVAL otherwise,
 * with a message listing them; *out unchanged). */
int ax_staleness_parse(const char *s, int *out);
/* The name of a correction, or "?" when out of range. */
const char *ax_staleness_name(int kind);
/* AX_OK when mode can run correction `kind` with PipeMare's gamma in
 * [0, 1) and warm-up >= 0; AX_EINVAL with a message otherwise (a flushed
 * mode with anything but none, a bad kind, gamma or warm-up). */
int ax_staleness_check(int mode, int kind, double gamma, int warmup);

#ifdef __cplusplus
}
#endif
#endif
