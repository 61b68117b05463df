/* "sleep": a synthetic model whose blocks take a fixed time, for measuring
 * the pipeline runtime's own overhead against the schedule formulas
 * (runtime/pipeline/schedule/formula.h).
 *
 * Config: blocks=4 (K), fwd_ms=20, bwd_ms=40 (per block), w_ms (the part
 * of bwd_ms that is the weight half; default bwd_ms / 2), width=16,
 * classes=10. Every block is a "sleep" module: its forward waits fwd_ms and
 * returns a copy of its input (any shape, any device); its backward waits
 * bwd_ms and, when input gradients are wanted, returns a copy of the output
 * gradient. Split, its input half waits bwd_ms - w_ms and returns the copy,
 * its weight half waits w_ms. The last block is followed (inside the same
 * block) by Flatten + Linear(width, classes), so the cross-entropy loss works:
 * inputs are (B, width), or any (B, ...) with width elements per row (the
 * "synthetic" data set with shape=16 fits the defaults). The time of that head
 * is negligible next to the sleeps for small widths.
 *
 * Why nanosleep and not a busy-wait: the pipeline benchmark runs K stage
 * agents on a machine with few (here 2) shared cores. A spinning stage
 * would steal the CPU from the stages it is meant to overlap with and
 * measure the scheduler instead of the runtime. A sleep frees the core; it
 * would oversleep by the thread's timer slack (50 us by default), so the
 * first sleep of a thread sets that thread's slack to 1 ns (prctl): a
 * block then ends at its deadline plus the wake-up latency, as a device's
 * kernel would. The wait is clock_nanosleep on an absolute
 * CLOCK_MONOTONIC deadline, so a signal cannot shorten it.
 *
 * The forward saves its input in the slot (a reference, no copy), so a
 * stage's saved bytes grow with the number of stashed micro-batches as
 * they would for a real layer. */
#include <errno.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/models/layers/basic.h"
#include "axon/models/model.h"

typedef struct sleep_cfg {
  int blocks, width, classes;
  double fwd_ms, bwd_ms, w_ms;
} sleep_cfg;

typedef struct sleep_priv {
  double fwd_ms, bwd_ms, w_ms;
} sleep_priv;

static int sleep_parse(const ax_config *cfg, sleep_cfg *c) {
  int err = AX_OK;
  c->blocks = (int)ax_config_int(cfg, "blocks", 4, &err);
  c->width = (int)ax_config_int(cfg, "width", 16, &err);
  c->classes = (int)ax_config_int(cfg, "classes", 10, &err);
  c->fwd_ms = ax_config_float(cfg, "fwd_ms", 20, &err);
  c->bwd_ms = ax_config_float(cfg, "bwd_ms", 40, &err);
  c->w_ms = ax_config_float(cfg, "w_ms", c->bwd_ms / 2, &err);
  if (err != AX_OK)
    return ax_seterr(AX_EINVAL, "sleep: a configuration value does not parse");
  if (c->blocks < 1 || c->blocks > AX_MODEL_MAX_BLOCKS)
    return ax_seterr(AX_EINVAL, "sleep: blocks=%d outside [1, %d]", c->blocks,
                     AX_MODEL_MAX_BLOCKS);
  if (c->width < 1 || c->classes < 1)
    return ax_seterr(AX_EINVAL, "sleep: width=%d and classes=%d must be > 0",
                     c->width, c->classes);
  if (!(c->fwd_ms >= 0 && c->fwd_ms <= 60000) ||
      !(c->bwd_ms >= 0 && c->bwd_ms <= 60000))
    return ax_seterr(AX_EINVAL,
                     "sleep: fwd_ms=%g and bwd_ms=%g must be in [0, 60000]",
                     c->fwd_ms, c->bwd_ms);
  if (!(c->w_ms >= 0 && c->w_ms <= c->bwd_ms))
    return ax_seterr(AX_EINVAL, "sleep: w_ms=%g must be in [0, bwd_ms=%g]",
                     c->w_ms, c->bwd_ms);
  return AX_OK;
}

/* Sleeps until now + ms on CLOCK_MONOTONIC, resuming after signals. */
static void sleep_ms(double ms) {
  static __thread int slack_set;
  if (ms <= 0)
    return;
  if (!slack_set) {
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    slack_set = 1;
  }
  struct timespec t = ax_clock_after_us(CLOCK_MONOTONIC, (int64_t)(ms * 1e3));
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR)
    ;
}

/* A new tensor with the contents of t (same device). */
static ax_tensor *copy_of(const ax_tensor *t) {
  ax_tensor *c = ax_tensor_like(t);
  if (c && ax_tensor_copy(c, t) != AX_OK) {
    ax_tensor_release(c);
    return NULL;
  }
  return c;
}

static int copy_list(const ax_tlist *in, ax_tlist *out) {
  out->n = in->n;
  for (int i = 0; i < in->n; i++) {
    out->t[i] = NULL;
    if (in->t[i] && !(out->t[i] = copy_of(in->t[i]))) {
      ax_tlist_clear(out);
      return ax_seterr(AX_ENOMEM, "sleep: cannot copy a tensor: %s",
                       ax_errmsg());
    }
  }
  return AX_OK;
}

static int sleep_forward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                         const ax_tlist *in, ax_tlist *out) {
  sleep_priv *p = m->priv;
  if (in->n < 1 || !in->t[0])
    return ax_seterr(AX_EINVAL, "sleep: expected one input tensor");
  sleep_ms(p->fwd_ms);
  if (slot)
    ax_slot_put(slot, 0, in->t[0]);
  return copy_list(in, out);
}

/* A backward (whole or its input half) that waits ms. */
static int sleep_bwd(double ms, const ax_exec *ex, ax_slot *slot,
                     const ax_tlist *dout, ax_tlist *din) {
  sleep_ms(ms);
  if (slot)
    ax_slot_reset(slot);
  if (!ex->need_dx) {
    din->n = 0;
    return AX_OK;
  }
  return copy_list(dout, din);
}

static int sleep_backward(ax_module *m, const ax_exec *ex, ax_slot *slot,
                          const ax_tlist *dout, ax_tlist *din) {
  return sleep_bwd(((sleep_priv *)m->priv)->bwd_ms, ex, slot, dout, din);
}

static int sleep_backward_input(ax_module *m, const ax_exec *ex, ax_slot *slot,
                                const ax_tlist *dout, ax_tlist *din) {
  sleep_priv *p = m->priv;
  return sleep_bwd(p->bwd_ms - p->w_ms, ex, slot, dout, din);
}

static int sleep_backward_weight(ax_module *m, const ax_exec *ex,
                                 ax_slot *slot) {
  sleep_ms(((sleep_priv *)m->priv)->w_ms);
  return AX_OK;
}

static const ax_module_ops sleep_ops = {
    /* .kind = */ "sleep",
    /* .forward = */ sleep_forward,
    /* .backward = */ sleep_backward,
    /* .init = */ NULL,
    /* .destroy = */ NULL,
    /* .backward_input = */ sleep_backward_input,
    /* .backward_weight = */ sleep_backward_weight,
};

static int sleep_describe(const ax_config *cfg, ax_model_info *info) {
  sleep_cfg c;
  AX_TRY(sleep_parse(cfg, &c));
  info->n_blocks = c.blocks;
  for (int i = 0; i < c.blocks; i++)
    snprintf(info->block_names[i], sizeof info->block_names[i],
             i == c.blocks - 1 ? "head" : "sleep%d", i);
  info->n_outputs = 1;
  info->ignore_index = -100;
  return AX_OK;
}

static int sleep_build_block(const ax_config *cfg, int index, ax_module **out) {
  sleep_cfg c;
  *out = NULL;
  AX_TRY(sleep_parse(cfg, &c));
  if (index < 0 || index >= c.blocks)
    return ax_seterr(AX_EINVAL, "sleep: no block %d (it has %d)", index,
                     c.blocks);
  ax_module *s = ax_module_new(&sleep_ops, sizeof(sleep_priv));
  if (!s)
    return ax_seterr(AX_ENOMEM, "sleep: out of memory");
  sleep_priv *p = s->priv;
  p->fwd_ms = c.fwd_ms;
  p->bwd_ms = c.bwd_ms;
  p->w_ms = c.w_ms;
  if (index < c.blocks - 1) {
    *out = s;
    return AX_OK;
  }
  ax_module *seq = ax_sequential_new();
  int rc = seq ? ax_module_add(seq, s) : AX_ENOMEM;
  if (rc != AX_OK)
    ax_module_free(s);
  ax_module *parts[2] = {ax_flatten_new(),
                         ax_linear_new(c.width, c.classes, 1)};
  for (int i = 0; i < 2; i++) {
    if (rc == AX_OK && !parts[i])
      rc = AX_ENOMEM;
    if (rc == AX_OK)
      rc = ax_module_add(seq, parts[i]);
    else
      ax_module_free(parts[i]);
  }
  if (rc != AX_OK) {
    ax_module_free(seq);
    return ax_seterr(rc, "sleep: cannot build the head");
  }
  *out = seq;
  return AX_OK;
}

const ax_model_def ax_model_sleep = {
    /* .name = */ "sleep",
    /* .default_config = */ "blocks=4,fwd_ms=20,bwd_ms=40,width=16,classes=10",
    /* .describe = */ sleep_describe,
    /* .build_block = */ sleep_build_block,
};
