/* The stage host's decoding sessions ("decode", "decode_end"; contract in
 * stage_host.h): each session keeps the slot tree of its sequences, in
 * which the stage's causal attention layers keep their keys and values
 * (models/module.h, ax_exec.kv_decode), from its first decode until
 * "decode_end" or the host's teardown. A decode takes its input as a
 * forward does (the coordinator's ids on the first stage, else what prev
 * pushed under the call's context) and pushes its output to next; the last
 * stage answers the logits of each sequence's last new position. */
#include <stdlib.h>

#include "axon/kernels/clock.h"
#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/pipeline/stage/stage_host-impl.h"

/* Sessions one host keeps at most (each holds caches of its model's
 * sequence length). */
#define AXP_SESSIONS_MAX 64

struct axi_pipe_session {
  uint64_t id;
  ax_slot *slot;
  int64_t pos; /* positions its caches hold; -1 after a failed decode */
  struct axi_pipe_session *next;
};

static axi_pipe_session *find(phost *h, uint64_t id, axi_pipe_session ***at) {
  axi_pipe_session **pp = &h->sessions;
  for (; *pp && (*pp)->id != id; pp = &(*pp)->next)
    ;
  if (at)
    *at = pp;
  return *pp;
}

static int count(const phost *h, int64_t *bytes) {
  int n = 0;
  *bytes = 0;
  for (const axi_pipe_session *x = h->sessions; x; x = x->next, n++)
    *bytes += (int64_t)ax_slot_bytes(x->slot);
  return n;
}

static void session_free(axi_pipe_session *x) {
  ax_slot_free(x->slot);
  free(x);
}

void axi_pipe_sessions_clear(phost *h) {
  for (axi_pipe_session *x = h->sessions, *nx; x; x = nx) {
    nx = x->next;
    session_free(x);
  }
  h->sessions = NULL;
}

/* The session of a decode at pos (s->mu held): at 0 a new one, or the
 * old one with its caches dropped; else the one holding pos positions. */
static int session_at(phost *h, uint64_t id, int64_t pos,
                      axi_pipe_session **out) {
  axi_pipe_session *x = find(h, id, NULL);
  int64_t bytes;
  if (!x && pos == 0) {
    if (count(h, &bytes) >= AXP_SESSIONS_MAX)
      return ax_seterr(AX_ESTATE,
                       "axon.pipe.stage %d: %d decoding sessions are open "
                       "(end one first)",
                       h->s->index, AXP_SESSIONS_MAX);
    if (!(x = calloc(1, sizeof *x)) || !(x->slot = ax_slot_new())) {
      free(x);
      return AX_ENOMEM;
    }
    x->id = id;
    x->next = h->sessions;
    h->sessions = x;
  } else if (pos > 0 && (!x || x->pos != pos)) {
    return ax_seterr(AX_ESTATE,
                     "axon.pipe.stage %d: decoding session %llu holds %lld "
                     "positions, not %lld%s",
                     h->s->index, (unsigned long long)id,
                     (long long)(x ? x->pos : 0), (long long)pos,
                     x && x->pos < 0 ? " (a decode of it failed)" : "");
  } else if (pos == 0) {
    ax_slot_reset(x->slot);
  }
  *out = x;
  return AX_OK;
}

/* The rows of each sequence's last new position of logits y (B n, V). */
static int last_rows(const ax_tensor *y, int64_t n, ax_tensor **out) {
  if (y->ndim != 2 || y->shape[0] % n)
    return ax_seterr(AX_ESHAPE,
                     "decode: the model's output is not (B * %lld, vocab) "
                     "logits",
                     (long long)n);
  int64_t B = y->shape[0] / n, V = y->shape[1];
  if (B == 1)
    return (*out = ax_tensor_slice0(y, n - 1, 1)) ? AX_OK : AX_ENOMEM;
  ax_tensor *l = ax_tensor_new_v(AX_F32, y->device, 2, B, V);
  if (!l)
    return AX_ENOMEM;
  for (int64_t b = 0; b < B; b++) {
    ax_tensor *src = ax_tensor_slice0(y, b * n + n - 1, 1),
              *dst = ax_tensor_slice0(l, b, 1);
    int err = src && dst ? ax_tensor_copy(dst, src) : AX_ENOMEM;
    ax_tensor_release(src);
    ax_tensor_release(dst);
    if (err != AX_OK) {
      ax_tensor_release(l);
      return err;
    }
  }
  *out = l;
  return AX_OK;
}

int axi_pipe_host_decode(ax_call_ctx *cc, void *obj, const ax_values *args,
                         ax_values *out) {
  phost *h = obj;
  axi_ag_stage *s = h->s;
  int64_t t0 = ax_clock_us(), c0 = axi_pipe_host_cpu_us();
  axi_pipe_decode_msg m;
  AX_TRY(axi_pipe_decode_decode(args, &m));
  uint64_t ctx = 0;
  ax_tlist in = {0}, y = {0};
  int err = axi_pipe_host_inputs(cc, h, &m.in, -1, 0, 0,
                                 "a decode that takes or pushes activations "
                                 "runs under a distributed autograd context",
                                 &ctx, &in, &t0);
  axi_pipe_decode_reply_msg r = {0};
  pthread_mutex_lock(&s->mu);
  axi_pipe_session *x = NULL;
  if (err == AX_OK) /* the last update's parameters */
    err = axi_pipe_host_settle(h);
  if (err == AX_OK)
    err = session_at(h, (uint64_t)m.session, m.pos, &x);
  if (err == AX_OK) {
    ax_exec ex = axi_pipe_host_exec(h, 0);
    ex.kv_decode = 1;
    ex.kv_pos = m.pos;
    err = ax_forward(s->net->root, &ex, x->slot, &in, &y);
    x->pos = err == AX_OK ? m.pos + m.n : -1;
  }
  if (err == AX_OK && h->is_last && y.n >= 1) {
    ax_tensor *l = NULL;
    err = last_rows(y.t[0], m.n, &l);
    if (err == AX_OK && !(r.logits = ax_tensor_to(l, AX_CPU)))
      err = AX_ENOMEM;
    ax_tensor_release(l);
    r.has_logits = err == AX_OK;
  }
  r.sessions = count(h, &r.cache_bytes);
  pthread_mutex_unlock(&s->mu);
  if (err == AX_OK && !h->is_last)
    err = axi_pipe_push_output(h, ctx, -1, 0, &y);
  r.busy_us = ax_clock_us() - t0;
  r.cpu_us = axi_pipe_host_cpu_us() - c0;
  if (err == AX_OK)
    err = axi_pipe_decode_reply_encode(&r, out);
  ax_tensor_release(r.logits);
  ax_tlist_clear(&in);
  ax_tlist_clear(&y);
  return err;
}

int axi_pipe_host_decode_end(ax_call_ctx *cc, void *obj, const ax_values *args,
                             ax_values *out) {
  phost *h = obj;
  axi_pipe_decode_end_msg m;
  AX_TRY(axi_pipe_decode_end_decode(args, &m));
  axi_pipe_decode_reply_msg r = {0};
  pthread_mutex_lock(&h->s->mu);
  axi_pipe_session **at, *x = find(h, (uint64_t)m.session, &at);
  if (x) {
    *at = x->next;
    session_free(x);
  }
  r.sessions = count(h, &r.cache_bytes);
  pthread_mutex_unlock(&h->s->mu);
  return axi_pipe_decode_reply_encode(&r, out);
}
