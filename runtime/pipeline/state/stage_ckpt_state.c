/* A stage's state as a checkpoint file and back (the records of
 * docs/CHECKPOINTS.md; contract in stage_host-impl.h). A checkpoint is
 * taken at a consistent cut: no unit in flight on the stage, so its state
 * is the weights, buffers, optimizer and update position (and for 2bw the
 * shadow weights the next batch's forwards use). The optimizer state is
 * the range [optim.off, optim.off + optim.len) of the flat parameters its
 * optimizer keeps: its ZeRO shard, or all of them; an optimizer on another
 * agent is asked for its state, so the file is the same as with a local
 * one. */
#include <string.h>

#include "axon/runtime/pipeline/stage/stage_host-impl.h"

static int mode_index(const ax_pipe_mode_def *def) {
  for (int i = 0; i < AX_MODE_COUNT; i++)
    if (ax_pipe_mode_get(i) == def)
      return i;
  return -1;
}

/* The optimizer's state: the local optimizer's, or the optimizer host's
 * (m and v then borrow its reply). m or v NULL: none. */
typedef struct ostate {
  ax_tensor *m, *v;
  long steps;
  ax_values *reply;
} ostate;

static int ostate_get(phost *h, ostate *st) {
  memset(st, 0, sizeof *st);
  if (!h->offload) {
    st->m = ax_optim_state(h->s->opt, 0);
    st->v = ax_optim_state(h->s->opt, 1);
    st->steps = ax_optim_steps(h->s->opt);
    return AX_OK;
  }
  axi_pipe_optim_state_msg m;
  AX_TRY(axi_pipe_offload_state_get(h, &st->reply, &m));
  st->m = m.m;
  st->v = m.v;
  st->steps = (long)m.steps;
  return AX_OK;
}

/* The state into w (s->mu held, no unit in flight); with optim_only, the
 * optimizer's only. */
static void put_state(phost *h, int optim_only, const ostate *o, axi_ckw *w) {
  axi_ag_stage *s = h->s;
  int full = !optim_only, shadow = full && h->shadow;
  axi_ckw_i64(w, "stage", s->index);
  axi_ckw_i64(w, "blocks.first", s->first);
  axi_ckw_i64(w, "blocks.last", s->last);
  axi_ckw_i64(w, "mode", mode_index(h->def));
  axi_ckw_i64(w, "tp.members", h->tp_members);
  axi_ckw_i64(w, "tp.member", h->tp_member);
  axi_ckw_i64(w, "holds_params", full);
  axi_ckw_tensor(w, "params", full ? s->net->params : NULL);
  axi_ckw_tensor(w, "buffers", full ? s->net->buffers : NULL);
  axi_ckw_i64(w, "optim.kind", h->optim_kind);
  axi_ckw_i64(w, "optim.steps", o->steps);
  axi_ckw_i64(w, "optim.off", (int64_t)h->zero_off);
  axi_ckw_i64(w, "optim.len", (int64_t)h->zero_len);
  axi_ckw_tensor(w, "optim.m", o->m);
  axi_ckw_tensor(w, "optim.v", o->v);
  axi_ckw_i64(w, "last_step", h->last_step);
  axi_ckw_i64(w, "shadow_for", shadow ? h->shadow_for : -1);
  axi_ckw_tensor(w, "shadow", shadow ? h->shadow : NULL);
  /* The staleness correction's history (staleness-impl.h): its average
   * update and the prediction the next batch's forwards use. */
  int pred = full && h->stale.pred && h->stale.pred_for >= 0;
  axi_ckw_tensor(w, "stale.delta", full ? h->stale.delta : NULL);
  axi_ckw_i64(w, "stale.pred_for", pred ? h->stale.pred_for : -1);
  axi_ckw_tensor(w, "stale.pred", pred ? h->stale.pred : NULL);
}

/* A consistent cut of a set-up stage; the last STEP's pending update and
 * the update in flight on its optimizer host, if any, are in (s->mu
 * held). */
static int quiet_stage(phost *h) {
  if (h->states || h->grads || (h->acc && !h->update_pending))
    return ax_seterr(AX_ESTATE,
                     "axon.pipe.stage %d: a checkpoint needs a "
                     "consistent cut (no unit in flight)",
                     h->s->index);
  if (!h->s->opt && !h->offload)
    return ax_seterr(AX_ESTATE, "axon.pipe.stage %d: not set up", h->s->index);
  return axi_pipe_host_settle(h); /* a STEP's pending update is in */
}

int axi_pipe_ckpt_snapshot(phost *h, int optim_only, uint8_t **buf, size_t *len,
                           char sha[2 * AX_SHA256_LEN + 1]) {
  axi_ckw w;
  ostate o = {0};
  axi_ckw_init(&w, AXI_CK_STAGE);
  pthread_mutex_lock(&h->s->mu);
  int err = quiet_stage(h);
  if (err == AX_OK)
    err = ostate_get(h, &o);
  if (err == AX_OK)
    put_state(h, optim_only, &o, &w);
  pthread_mutex_unlock(&h->s->mu);
  ax_values_free(o.reply);
  if (err != AX_OK) {
    axi_ckw_free(&w);
    return err;
  }
  return axi_ckw_finish(&w, buf, len, sha);
}

static int want_i64(const axi_ckr *r, const char *name, int64_t v) {
  int64_t got;
  AX_TRY(axi_ckr_i64(r, name, &got));
  if (got != v)
    return ax_seterr(AX_EINVAL,
                     "checkpoint file %s: %s is %lld, this stage "
                     "has %lld (a checkpoint of another run or split)",
                     r->path, name, (long long)got, (long long)v);
  return AX_OK;
}

/* An optional record: dflt when the file has none (written before it). */
static int64_t opt_i64(const axi_ckr *r, const char *name, int64_t dflt) {
  int64_t v;
  return axi_ckr_i64_opt(r, name, dflt, &v) == AX_OK ? v : dflt;
}

/* What check_state read for load_state. */
typedef struct plan {
  int holds;          /* holds_params */
  int64_t at, len;    /* this stage's optimizer values: [at, at + zero_len)
                         of the file's len (a file of the whole stage's
                         optimizer state covers every replica's shard) */
  int64_t shadow_for; /* -1: none */
  int64_t steps, last;
} plan;

/* The optimizer's range: this stage's (its shard, or all its parameters),
 * or one that covers it (a file the mover cut for the whole stage). */
static int check_range(phost *h, const axi_ckr *r, plan *p) {
  int64_t off = opt_i64(r, "optim.off", 0),
          len = opt_i64(r, "optim.len", (int64_t)h->s->net->n_params);
  int64_t zo = (int64_t)h->zero_off, zl = (int64_t)h->zero_len;
  p->at = zo - off;
  p->len = len;
  if (off >= 0 && len >= 0 && off <= zo && off + len >= zo + zl)
    return AX_OK;
  return ax_seterr(AX_EINVAL,
                   "checkpoint file %s: its optimizer state (optim.off %lld, "
                   "optim.len %lld) is not this stage's (optim.off %zu, "
                   "optim.len %zu of %zu parameters; a ZeRO shard of another "
                   "replica or layout)",
                   r->path, (long long)off, (long long)len, h->zero_off,
                   h->zero_len, h->s->net->n_params);
}

/* The f32 record `name` has `want` values; want < 0: 0 or -want. */
static int want_f32(const axi_ckr *r, const char *name, int64_t want) {
  const uint8_t *d;
  size_t n;
  AX_TRY(axi_ckr_f32(r, name, &d, &n));
  if ((int64_t)n == want || (want < 0 && (n == 0 || (int64_t)n == -want)))
    return AX_OK;
  return ax_seterr(AX_EINVAL,
                   "checkpoint file %s: '%s' has %zu values, "
                   "this stage needs %lld",
                   r->path, name, n, (long long)(want < 0 ? -want : want));
}

/* Checks everything before changing anything (s->mu held). An optimizer
 * host checks the sizes of its state itself. */
static int check_state(phost *h, const axi_ckr *r, plan *p) {
  axi_ag_stage *s = h->s;
  AX_TRY(want_i64(r, "stage", s->index));
  AX_TRY(want_i64(r, "blocks.first", s->first));
  AX_TRY(want_i64(r, "blocks.last", s->last));
  AX_TRY(want_i64(r, "mode", mode_index(h->def)));
  /* Files before tensor parallelism's records: the coordinator's names. */
  if (opt_i64(r, "tp.members", h->tp_members) != h->tp_members ||
      opt_i64(r, "tp.member", h->tp_member) != h->tp_member)
    return ax_seterr(AX_EINVAL,
                     "checkpoint file %s: of tensor-parallel member %lld of "
                     "%lld, this stage is member %d of %d",
                     r->path, (long long)opt_i64(r, "tp.member", 0),
                     (long long)opt_i64(r, "tp.members", 1), h->tp_member,
                     h->tp_members);
  AX_TRY(want_i64(r, "optim.kind", h->optim_kind));
  AX_TRY(check_range(h, r, p));
  int64_t holds = opt_i64(r, "holds_params", 1);
  if (holds != 0 && holds != 1)
    return ax_seterr(AX_EFORMAT, "checkpoint file %s: holds_params is %lld",
                     r->path, (long long)holds);
  p->holds = (int)holds;
  AX_TRY(axi_ckr_i64(r, "shadow_for", &p->shadow_for));
  AX_TRY(axi_ckr_i64(r, "optim.steps", &p->steps));
  AX_TRY(axi_ckr_i64(r, "last_step", &p->last));
  if (p->steps < 0)
    return ax_seterr(AX_EFORMAT, "checkpoint file %s: optim.steps is %lld",
                     r->path, (long long)p->steps);
  if (p->holds) {
    AX_TRY(want_f32(r, "params", (int64_t)s->net->n_params));
    AX_TRY(want_f32(r, "buffers", (int64_t)s->net->n_buffers));
    AX_TRY(want_f32(r, "shadow",
                    p->shadow_for >= 0 ? (int64_t)s->net->n_params : 0));
    if (axi_ckr_has(r, "stale.delta")) { /* older files have none */
      AX_TRY(want_f32(r, "stale.delta", -(int64_t)s->net->n_params));
      AX_TRY(want_f32(r, "stale.pred", -(int64_t)s->net->n_params));
    }
  }
  const char *mv[2] = {"optim.m", "optim.v"};
  for (int i = 0; i < 2; i++) {
    ax_tensor *t = h->offload ? NULL : ax_optim_state(s->opt, i);
    AX_TRY(want_f32(r, mv[i], h->offload ? -p->len : t ? p->len : 0));
  }
  return AX_OK;
}

/* Record `name` in a new tensor like `like`. */
static int read_like(const axi_ckr *r, const char *name, const ax_tensor *like,
                     ax_tensor **out) {
  if (!(*out = ax_tensor_like(like)))
    return AX_ENOMEM;
  return axi_ckr_tensor(r, name, *out);
}

/* This stage's optimizer values of record `name` (plan p) into t (NULL:
 * a new vector on the stage's device into *out). */
static int read_shard(phost *h, const axi_ckr *r, const char *name,
                      const plan *p, ax_tensor *t, ax_tensor **out) {
  const uint8_t *d;
  size_t n;
  AX_TRY(axi_ckr_f32(r, name, &d, &n));
  int64_t len = n ? (int64_t)h->zero_len : 0;
  if (!t && !(t = *out = ax_tensor_new(AX_F32, 1, &len, h->s->dev)))
    return AX_ENOMEM;
  if (!n || !len)
    return AX_OK;
  return ax_tensor_write(t, d + (size_t)p->at * sizeof(float),
                         (size_t)len * sizeof(float));
}

/* The optimizer host's state from the file (its parameters too when the
 * file holds them): the first change, refused whole there. */
static int load_offloaded(phost *h, const axi_ckr *r, const plan *p) {
  axi_pipe_optim_state_msg m = {NULL, NULL, p->steps, p->holds, NULL};
  int err = read_shard(h, r, "optim.m", p, NULL, &m.m);
  if (err == AX_OK)
    err = read_shard(h, r, "optim.v", p, NULL, &m.v);
  if (err == AX_OK && p->holds)
    err = read_like(r, "params", h->s->net->params, &m.params);
  if (err == AX_OK)
    err = axi_pipe_offload_state_set(h, &m);
  if (err == AX_OK) /* the step count of its updates from now on */
    h->offload_steps = (long)p->steps;
  ax_tensor_release(m.m);
  ax_tensor_release(m.v);
  ax_tensor_release(m.params);
  return err;
}

/* Record name into *t: a new tensor like the parameters, or NULL when the
 * record is empty. */
static int read_opt(phost *h, const axi_ckr *r, const char *name,
                    ax_tensor **t) {
  const uint8_t *d;
  size_t n;
  ax_tensor_release(*t);
  *t = NULL;
  AX_TRY(axi_ckr_f32(r, name, &d, &n));
  if (!n)
    return AX_OK;
  if (!(*t = ax_tensor_like(h->s->net->params)))
    return AX_ENOMEM;
  return axi_ckr_tensor(r, name, *t);
}

/* The staleness correction's history (a file without it: none kept). */
static int load_stale(phost *h, const axi_ckr *r) {
  axi_stale *z = &h->stale;
  int64_t pred_for = -1;
  if (!axi_ckr_has(r, "stale.delta")) {
    ax_tensor_release(z->delta), ax_tensor_release(z->pred);
    z->delta = z->pred = NULL;
    z->pred_for = -1;
    return AX_OK;
  }
  AX_TRY(axi_ckr_i64(r, "stale.pred_for", &pred_for));
  AX_TRY(read_opt(h, r, "stale.delta", &z->delta));
  AX_TRY(read_opt(h, r, "stale.pred", &z->pred));
  z->pred_for = z->pred ? (long)pred_for : -1;
  return AX_OK;
}

static int load_state(phost *h, const axi_ckr *r, const plan *p) {
  axi_ag_stage *s = h->s;
  if (h->offload) {
    AX_TRY(load_offloaded(h, r, p));
  } else {
    for (int i = 0; i < 2; i++) {
      ax_tensor *t = ax_optim_state(s->opt, i);
      if (t)
        AX_TRY(read_shard(h, r, i ? "optim.v" : "optim.m", p, t, NULL));
    }
    ax_optim_set_steps(s->opt, (long)p->steps);
  }
  if (!p->holds) /* the optimizer state only */
    return AX_OK;
  AX_TRY(axi_ckr_tensor(r, "params", s->net->params));
  AX_TRY(axi_ckr_tensor(r, "buffers", s->net->buffers));
  h->last_step = (long)p->last;
  ax_tensor_release(h->shadow);
  h->shadow = NULL;
  if (p->shadow_for >= 0) {
    if (!(h->shadow = ax_tensor_like(s->net->params)))
      return AX_ENOMEM;
    h->shadow_for = (long)p->shadow_for;
    AX_TRY(axi_ckr_tensor(r, "shadow", h->shadow));
  }
  return load_stale(h, r);
}

int axi_pipe_ckpt_apply(phost *h, const axi_ckr *r) {
  pthread_mutex_lock(&h->s->mu);
  plan p;
  int err = quiet_stage(h);
  if (err == AX_OK)
    err = check_state(h, r, &p);
  if (err == AX_OK)
    err = load_state(h, r, &p);
  pthread_mutex_unlock(&h->s->mu);
  return err;
}
