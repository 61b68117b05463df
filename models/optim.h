/* Optimizers over a flat parameter buffer: SGD (momentum, Nesterov, weight
 * decay) and AdamW, with constant, step or cosine learning-rate schedules and
 * linear warm-up. One ax_optim owns its state buffers (momentum, Adam
 * moments) on the parameters' device. Not thread-safe: callers serialise
 * steps on one optimizer (the distributed optimizer holds a lock per owner). */
#ifndef AX_OPTIM_H
#define AX_OPTIM_H

#include "axon/kernels/tensor.h"
#include "axon/models/config.h"

typedef enum ax_optim_kind { AX_OPT_SGD = 0, AX_OPT_ADAMW = 1 } ax_optim_kind;
typedef enum ax_lr_sched {
  AX_LR_CONST = 0,
  AX_LR_STEP = 1,   /* lr * gamma^(floor(step / step_size)) */
  AX_LR_COSINE = 2, /* min_lr + (lr - min_lr) (1 + cos(pi t / T)) / 2 */
} ax_lr_sched;

typedef struct ax_optim_cfg {
  ax_optim_kind kind;
  float lr;
  float momentum, dampening, weight_decay;
  int nesterov;
  float beta1, beta2, eps;
  ax_lr_sched sched;
  int warmup;    /* steps of linear warm-up from lr / warmup to lr */
  int total;     /* steps of the cosine schedule (after warm-up) */
  int step_size; /* step schedule period */
  float gamma;   /* step schedule factor */
  float min_lr;  /* cosine floor */
} ax_optim_cfg;

/* Defaults: SGD lr 0.1, no momentum; AdamW betas 0.9/0.999, eps 1e-8. */
ax_optim_cfg ax_optim_defaults(ax_optim_kind kind);
/* From a config: opt=sgd|adamw, lr, momentum, dampening, wd, nesterov,
 * beta1, beta2, eps, sched=const|step|cosine, warmup, total, step_size,
 * gamma, min_lr. AX_EINVAL on unknown values. */
int ax_optim_cfg_parse(const ax_config *c, ax_optim_cfg *out);

/* The learning rate used at 0-based step `step`. */
float ax_lr_at(const ax_optim_cfg *cfg, long step);

typedef struct ax_optim ax_optim;

/* An optimizer for n parameters on device dev. NULL on error. */
ax_optim *ax_optim_new(const ax_optim_cfg *cfg, size_t n, ax_device dev);
void ax_optim_free(ax_optim *o);
/* One update of params with grads (both (n) f32 on the optimizer's device)
 * at the scheduled learning rate; advances the step counter. */
int ax_optim_step(ax_optim *o, ax_tensor *params, const ax_tensor *grads);
long ax_optim_steps(const ax_optim *o);
/* Multiplies the scheduled learning rate of the following steps by scale
 * (> 0, finite; 1 when created): a per-stage step size such as PipeMare's
 * learning-rate rescheduling (runtime/pipeline/stage/staleness.h). AX_EINVAL on
 * a bad scale, which leaves the optimizer unchanged. */
int ax_optim_set_lr_scale(ax_optim *o, float scale);
/* Checkpoints: the optimizer's state buffer i (0: SGD momentum or AdamW
 * first moment, 1: AdamW second moment), borrowed, or NULL when it has none;
 * and setting the step counter (the learning-rate schedule's position, and
 * whether the next SGD step initialises its momentum). */
ax_tensor *ax_optim_state(ax_optim *o, int i);
void ax_optim_set_steps(ax_optim *o, long steps);
const ax_optim_cfg *ax_optim_config(const ax_optim *o);

#endif
