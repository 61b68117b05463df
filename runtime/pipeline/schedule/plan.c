/* Plans: every rank's action list for a run, and the dependencies derived
 * from them (mode.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/error.h"
#include "axon/runtime/pipeline/schedule/mode.h"

struct ax_pipe_plan {
  int mode, K, S, U; /* ranks, stages, units per mini-batch */
  long n;
  int *stage_rank; /* (S) */
  long *len, *off; /* (K): rank r's list is ops[off[r] .. off[r] + len[r]) */
  ax_pipe_op *ops;
  ax_pipe_op **fwd_prev;    /* (S, n * U): the action before F(s, u) on its
                               rank's list, or NULL */
  unsigned char *grad_kind; /* (S, n * U): the kind that makes unit u's input
                               gradient on stage s (B or I; 0: none) */
};

/* Allocates p's arrays for lists of the given lengths (len already set). */
static int plan_alloc(ax_pipe_plan *p) {
  long total = 0;
  for (int r = 0; r < p->K; r++) {
    p->off[r] = total;
    total += p->len[r];
  }
  size_t units = (size_t)p->n * (size_t)p->U;
  p->ops = malloc(sizeof *p->ops * ((size_t)total + 1));
  p->fwd_prev = calloc((size_t)p->S * units + 1, sizeof *p->fwd_prev);
  p->grad_kind = calloc((size_t)p->S * units + 1, 1);
  return p->ops && p->fwd_prev && p->grad_kind ? AX_OK : AX_ENOMEM;
}

static ax_pipe_plan *plan_shell(int mode, int K, int S, int U, long n) {
  ax_pipe_plan *p = calloc(1, sizeof *p);
  if (!p)
    return NULL;
  *p = (ax_pipe_plan){.mode = mode, .K = K, .S = S, .U = U, .n = n};
  p->stage_rank = calloc((size_t)S, sizeof *p->stage_rank);
  p->len = calloc((size_t)K, sizeof *p->len);
  p->off = calloc((size_t)K, sizeof *p->off);
  if (!p->stage_rank || !p->len || !p->off) {
    ax_pipe_plan_free(p);
    return NULL;
  }
  return p;
}

/* Indexes every rank's forwards (the forward lock's "action before") and
 * which action makes each input gradient (a list may mix B and I). */
static void plan_index(ax_pipe_plan *p) {
  size_t units = (size_t)p->n * (size_t)p->U;
  for (int r = 0; r < p->K; r++) {
    ax_pipe_op *l = p->ops + p->off[r];
    for (long i = 0; i < p->len[r]; i++) {
      size_t at = (size_t)l[i].stage * units + (size_t)l[i].batch * p->U +
                  (size_t)l[i].micro;
      if (i > 0 && l[i].kind == AX_OP_FWD)
        p->fwd_prev[at] = &l[i - 1];
      if (l[i].kind == AX_OP_BWD || l[i].kind == AX_OP_INPUT_GRAD)
        p->grad_kind[at] = (unsigned char)l[i].kind;
    }
  }
}

int ax_pipe_plan_new(int mode, int K, int v, int M, long n,
                     ax_pipe_plan **out) {
  *out = NULL;
  if (!ax_pipe_mode_get(mode))
    return AX_EINVAL;
  if (K < 1 || M < 1 || n < 0)
    return ax_seterr(AX_EINVAL, "plan: bad arguments (K %d, M %d, n %ld)", K, M,
                     n);
  v = ax_pipe_chunks(mode, v);
  ax_pipe_plan *p = plan_shell(mode, K, K * v, ax_pipe_units(mode, M), n);
  if (!p)
    return AX_ENOMEM;
  for (int s = 0; s < p->S; s++)
    p->stage_rank[s] = ax_pipe_stage_rank(mode, K, s);
  for (int r = 0; r < K; r++)
    p->len[r] = ax_pipe_nops_rank(mode, K, v, r, M, n);
  if (plan_alloc(p) != AX_OK) {
    ax_pipe_plan_free(p);
    return AX_ENOMEM;
  }
  for (int r = 0; r < K; r++) {
    int err = ax_pipe_schedule_chunks(mode, K, v, r, M, n, p->ops + p->off[r],
                                      p->len[r]);
    if (err != AX_OK) {
      ax_pipe_plan_free(p);
      return err;
    }
  }
  plan_index(p);
  *out = p;
  return AX_OK;
}

/* Checks rank r's one-batch list against the plan's shape. */
static int check_list(const ax_pipe_plan *p, int r, const ax_pipe_op *l,
                      long len) {
  for (long i = 0; i < len; i++) {
    const ax_pipe_op *o = &l[i];
    if (o->kind < 0 || o->kind >= AX_OP_KINDS)
      return ax_seterr(AX_EINVAL, "plan: rank %d action %ld: kind %d unknown",
                       r, i, o->kind);
    if (o->stage < 0 || o->stage >= p->S || p->stage_rank[o->stage] != r)
      return ax_seterr(AX_EINVAL,
                       "plan: rank %d action %ld: stage %d is not held by "
                       "rank %d",
                       r, i, o->stage, r);
    if (o->micro < 0 || o->micro >= p->U ||
        (o->kind == AX_OP_STEP && o->micro != 0))
      return ax_seterr(AX_EINVAL,
                       "plan: rank %d action %ld: unit %d outside [0, %d)", r,
                       i, o->micro, o->kind == AX_OP_STEP ? 1 : p->U);
    if (o->batch != 0)
      return ax_seterr(AX_EINVAL,
                       "plan: rank %d action %ld: a one-batch list has batch "
                       "0 (got %d)",
                       r, i, o->batch);
    if (o->with_next && (i + 1 == len || o->kind == AX_OP_STEP ||
                         l[i + 1].kind == AX_OP_STEP || l[i + 1].with_next))
      return ax_seterr(AX_EINVAL,
                       "plan: rank %d action %ld: a composite joins two "
                       "actions, neither a STEP",
                       r, i);
  }
  return AX_OK;
}

int ax_pipe_plan_new_lists(int mode, int K, int S, const int *stage_rank, int U,
                           long n, const ax_pipe_op *const *lists,
                           const long *len, ax_pipe_plan **out) {
  *out = NULL;
  if (!ax_pipe_mode_get(mode))
    return AX_EINVAL;
  if (K < 1 || K > AX_PIPE_PLAN_MAX_STAGES || S < K ||
      S > AX_PIPE_PLAN_MAX_STAGES || U < 1 || n < 0 || !stage_rank || !lists ||
      !len)
    return ax_seterr(AX_EINVAL,
                     "plan: bad arguments (%d ranks, %d stages, %d units, "
                     "%ld batches)",
                     K, S, U, n);
  ax_pipe_plan *p = plan_shell(mode, K, S, U, n);
  if (!p)
    return AX_ENOMEM;
  int held[AX_PIPE_PLAN_MAX_STAGES] = {0}, err = AX_OK;
  for (int s = 0; s < S && err == AX_OK; s++) {
    if (stage_rank[s] < 0 || stage_rank[s] >= K)
      err = ax_seterr(AX_EINVAL, "plan: stage %d on rank %d of %d", s,
                      stage_rank[s], K);
    else
      held[stage_rank[s]]++, p->stage_rank[s] = stage_rank[s];
  }
  for (int r = 0; r < K && err == AX_OK; r++) {
    if (!held[r])
      err = ax_seterr(AX_EINVAL, "plan: rank %d holds no stage", r);
    else if (len[r] < 0 || (len[r] > 0 && !lists[r]))
      err = ax_seterr(AX_EINVAL, "plan: rank %d has no list", r);
    else
      err = check_list(p, r, lists[r], len[r]);
    p->len[r] = len[r] * n;
  }
  if (err == AX_OK && plan_alloc(p) != AX_OK)
    err = AX_ENOMEM;
  if (err != AX_OK) {
    ax_pipe_plan_free(p);
    return err;
  }
  for (int r = 0; r < K; r++)
    for (long t = 0; t < n; t++)
      for (long i = 0; i < len[r]; i++) {
        ax_pipe_op *o = p->ops + p->off[r] + t * len[r] + i;
        *o = lists[r][i];
        o->batch = (int)t;
      }
  plan_index(p);
  *out = p;
  return AX_OK;
}

void ax_pipe_plan_free(ax_pipe_plan *p) {
  if (!p)
    return;
  free(p->ops);
  free(p->fwd_prev);
  free(p->grad_kind);
  free(p->stage_rank);
  free(p->len);
  free(p->off);
  free(p);
}

const ax_pipe_op *ax_pipe_plan_actions(const ax_pipe_plan *p, int r, long *n) {
  *n = p->len[r];
  return p->ops + p->off[r];
}

int ax_pipe_plan_stages(const ax_pipe_plan *p) { return p->S; }
int ax_pipe_plan_ranks(const ax_pipe_plan *p) { return p->K; }
int ax_pipe_plan_units(const ax_pipe_plan *p) { return p->U; }
long ax_pipe_plan_batches(const ax_pipe_plan *p) { return p->n; }
int ax_pipe_plan_mode(const ax_pipe_plan *p) { return p->mode; }
int ax_pipe_plan_stage_rank(const ax_pipe_plan *p, int s) {
  return s >= 0 && s < p->S ? p->stage_rank[s] : -1;
}

int ax_pipe_plan_lock_deps(const ax_pipe_plan *p, const ax_pipe_op *o,
                           ax_pipe_op *deps) {
  int nd = 0;
  if (o->kind == AX_OP_FWD && o->stage == 0 && o->batch > 0 &&
      ax_pipe_mode_get(p->mode)->forward_lock) {
    /* The round before is over: every stage finished what its rank's
     * list puts right before its own forward of this unit. */
    size_t units = (size_t)p->n * (size_t)p->U,
           u = (size_t)o->batch * p->U + (size_t)o->micro;
    for (int j = 0; j < p->S; j++) {
      const ax_pipe_op *prev = p->fwd_prev[(size_t)j * units + u];
      if (prev)
        deps[nd++] = *prev;
    }
  }
  return nd;
}

/* op's own dependencies, without a composite partner's. */
static int own_deps(const ax_pipe_plan *p, const ax_pipe_op *o,
                    ax_pipe_op *deps) {
  int nd = 0, s = o->stage, S = p->S;
  switch (o->kind) {
  case AX_OP_FWD: /* the activations */
    if (s > 0)
      deps[nd++] = (ax_pipe_op){AX_OP_FWD, s - 1, o->batch, o->micro};
    break;
  case AX_OP_BWD: /* the output gradient: the next stage's B or I */
  case AX_OP_INPUT_GRAD:
    if (s < S - 1) {
      size_t units = (size_t)p->n * (size_t)p->U, at = (size_t)(s + 1) * units +
                                                       (size_t)o->batch * p->U +
                                                       (size_t)o->micro;
      int kind = p->grad_kind[at] ? p->grad_kind[at] : o->kind;
      deps[nd++] = (ax_pipe_op){kind, s + 1, o->batch, o->micro};
    }
    break;
  default: /* W and STEP follow their own rank's earlier actions only */
    break;
  }
  return nd + ax_pipe_plan_lock_deps(p, o, deps + nd);
}

int ax_pipe_plan_deps(const ax_pipe_plan *p, const ax_pipe_op *o,
                      ax_pipe_op *deps) {
  int nd = own_deps(p, o, deps);
  if (o->with_next) /* a composite starts when both parts could */
    nd += own_deps(p, o + 1, deps + nd);
  return nd;
}

int ax_pipe_deps(int mode, int K, int M, const ax_pipe_op *op,
                 ax_pipe_op *deps) {
  ax_pipe_plan *p = NULL;
  if (!op || op->batch < 0 || op->stage < 0 || op->stage >= K ||
      ax_pipe_plan_new(mode, K, 1, M, (long)op->batch + 1, &p) != AX_OK)
    return -1;
  int nd = ax_pipe_plan_deps(p, op, deps);
  ax_pipe_plan_free(p);
  return nd;
}

int ax_pipe_delay(int mode, int K, int s, int M) {
  const ax_pipe_mode_def *def = ax_pipe_mode_get(mode);
  if (!def)
    return -1;
  if (K < 1 || s < 0 || s >= K || M < 1) {
    ax_seterr(AX_EINVAL, "delay: bad arguments (K %d, stage %d, M %d)", K, s,
              M);
    return -1;
  }
  if (def->chunked) /* chunked modes flush: a forward sees every update */
    return 0;
  /* A steady-state mini-batch t: the version its first forward uses is the
   * number of STEPs before that forward in the stage's list (or t - 1 at
   * most when the forward weights are double-buffered). */
  long t = K + 1, n = t + 1, cap = ax_pipe_nops(mode, M, n), version = 0;
  ax_pipe_op *ops = malloc(sizeof *ops * (size_t)cap);
  if (!ops) {
    ax_seterr(AX_ENOMEM, "delay: out of memory");
    return -1;
  }
  if (ax_pipe_schedule(mode, K, s, M, n, ops, cap) != AX_OK) {
    free(ops);
    return -1;
  }
  for (long i = 0; i < cap; i++) {
    if (ops[i].kind == AX_OP_FWD && ops[i].batch == t)
      break;
    version += ops[i].kind == AX_OP_STEP;
  }
  free(ops);
  if (def->fwd_weights == AX_FWD_DOUBLE_BUFFERED && version > t - 1)
    version = t - 1;
  return (int)(t - version);
}

char *ax_pipe_op_text(const ax_pipe_op *o, int U, char *buf, size_t len) {
  static const char kinds[] = "FBIW";
  long unit = U > 0 ? (long)o->batch * U + o->micro : (long)o->micro;
  if (o->kind == AX_OP_STEP)
    snprintf(buf, len, "STEP%d", o->stage);
  else if (o->kind >= 0 && o->kind < AX_OP_STEP)
    snprintf(buf, len, "%d%c%ld", o->stage, kinds[o->kind], unit);
  else
    snprintf(buf, len, "%d?%ld", o->stage, unit);
  return buf;
}

char *ax_pipe_action_text(const ax_pipe_op *o, int U, char *buf, size_t len) {
  ax_pipe_op_text(o, U, buf, len);
  size_t w = strlen(buf);
  if (o->with_next && w + 1 < len) {
    buf[w] = '+';
    ax_pipe_op_text(o + 1, U, buf + w + 1, len - w - 1);
  }
  return buf;
}
