/* The coordinator's evaluation: every batch's forward through the stages
 * as in training, its loss and accuracy from the last stage, the replicas'
 * or tensor-parallel members' shares summed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/pipeline/coord/coordinator-impl.h"
#include "axon/runtime/pipeline/stage/stage_msg-impl.h"

/* ---- evaluation: forward stage to stage, like training ------------------- */
/* Issues the forward of one evaluation batch on every stage at once: stage
 * 0 gets the inputs, the last stage the labels, and the activations flow
 * from stage to stage under the batch's own distributed autograd context
 * (each stage takes its input there, as in training, and nothing is
 * recorded); the coordinator only waits for the answers, then releases
 * the context. */
typedef struct eval_fwd {
  long id;
  int last; /* the last stage's index */
  const ax_tlist *in, *lab;
  axi_pipe_report_msg rep; /* the last stage's */
} eval_fwd;

static int eval_args(void *user, int s, ax_values **out) {
  eval_fwd *e = user;
  axi_pipe_fwd_msg m; /* batch id, micro 0, seed 0, no flags */
  memset(&m, 0, sizeof m);
  m.batch = e->id;
  if (s == 0)
    m.in = *e->in;
  m.has_labels = s == e->last;
  if (m.has_labels)
    m.lab.t = *e->lab; /* norms 0 */
  if (!(*out = ax_values_new()))
    return AX_ENOMEM;
  return axi_pipe_fwd_encode(&m, *out);
}

static int eval_reply(void *user, int s, const ax_values *r) {
  eval_fwd *e = user;
  if (s != e->last)
    return AX_OK;
  AX_TRY(axi_pipe_report_decode(r, &e->rep));
  return e->rep.has_loss ? AX_OK
                         : ax_seterr(AX_EBADARG, "stage report: no loss from "
                                                 "the last stage");
}

static int eval_batch(ax_pipe *p, const ax_tlist *in, const ax_tlist *lab,
                      double *loss, int64_t *correct, int64_t *count) {
  eval_fwd e = {.id = -(++p->eval_ids), .last = p->K - 1, .in = in, .lab = lab};
  uint64_t ctx = 0;
  int err = ax_dist_context_new(p->node, &ctx);
  ax_autograd_ctx_set_current(0);
  if (err != AX_OK)
    return err;
  err = axi_pipe_all_stages(p, ctx, "fwd", eval_args, eval_reply, &e);
  if (err == AX_OK) {
    *loss = e.rep.loss;
    *correct = e.rep.correct;
    *count = e.rep.count;
  }
  char msg[512];
  snprintf(msg, sizeof msg, "%s", err != AX_OK ? ax_errmsg() : "");
  ax_dist_context_release(p->node, ctx, 10000);
  return err == AX_OK ? AX_OK : ax_seterr(err, "%s", msg);
}

/* One evaluation batch on parts[0 .. T - 1], the members of one replica,
 * at once (their split layers sum over all of them); member 0's answer. */
typedef struct eval_part {
  ax_pipe *p;
  const ax_tlist *in, *lab;
  double loss;
  int64_t correct, count;
  int err;
  char msg[512];
} eval_part;

static void *eval_part_main(void *arg) {
  eval_part *e = arg;
  e->err = eval_batch(e->p, e->in, e->lab, &e->loss, &e->correct, &e->count);
  if (e->err != AX_OK)
    snprintf(e->msg, sizeof e->msg, "%s", ax_errmsg());
  return NULL;
}

static int eval_members(ax_pipe *const *parts, int T, const ax_tlist *in,
                        const ax_tlist *lab, double *loss, int64_t *correct,
                        int64_t *count) {
  if (T <= 1)
    return eval_batch(parts[0], in, lab, loss, correct, count);
  eval_part e[AX_PIPE_MAX_REPLICAS];
  pthread_t th[AX_PIPE_MAX_REPLICAS];
  int started = 0;
  for (int t = 0; t < T; t++) {
    e[t] = (eval_part){parts[t], in, lab, 0, 0, 0, AX_OK, ""};
    if (t && pthread_create(&th[t], NULL, eval_part_main, &e[t]) != 0) {
      e[t].err = ax_seterr(AX_ENOMEM, "evaluate: cannot start a thread");
      snprintf(e[t].msg, sizeof e[t].msg, "%s", ax_errmsg());
      break; /* member 0's forwards then time out */
    }
    started = t + 1;
  }
  eval_part_main(&e[0]);
  for (int t = 1; t < started; t++)
    pthread_join(th[t], NULL);
  for (int t = 0; t < T; t++)
    if (e[t].err != AX_OK)
      return ax_seterr(e[t].err, "member %d: %s", t, e[t].msg);
  *loss = e[0].loss;
  *correct = e[0].correct;
  *count = e[0].count;
  return AX_OK;
}

static int eval_call(ax_pipe *p, long n, ax_pipe_batch_fn batch, void *user,
                     double *accuracy, double *loss);

int ax_pipe_evaluate(ax_pipe *p, long n, ax_pipe_batch_fn batch, void *user,
                     double *accuracy, double *loss) {
  if (!p->frozen)
    return eval_call(p, n, batch, user, accuracy, loss);
  axi_pipe_frozen_feed w = {p->frozen, batch, NULL, user}; /* freeze.h */
  return eval_call(p, n, axi_pipe_frozen_batch, &w, accuracy, loss);
}

static int eval_call(ax_pipe *p, long n, ax_pipe_batch_fn batch, void *user,
                     double *accuracy, double *loss) {
  if (p->nrep && axi_pipe_members(p) <= 1)
    return eval_call(p->rep[0], n, batch, user, accuracy, loss);
  ax_pipe *const *parts = p->nrep ? p->rep : &p;
  int T = axi_pipe_members(p);
  int64_t correct = 0, count = 0;
  double lsum = 0;
  long done = 0;
  int err = AX_OK;
  for (long i = 0; i < n; i++) {
    ax_tlist in = {0}, lab = {0};
    err = batch(user, i, &in, &lab);
    if (err == AX_ECLOSED) {
      err = AX_OK;
      break;
    }
    double l = 0;
    int64_t c = 0, k = 0;
    if (err == AX_OK)
      err = eval_members(parts, T, &in, &lab, &l, &c, &k);
    ax_tlist_clear(&in);
    ax_tlist_clear(&lab);
    if (err != AX_OK)
      return err;
    lsum += l;
    correct += c;
    count += k;
    done++;
  }
  *accuracy = count ? (double)correct / (double)count : 0.0;
  if (loss)
    *loss = done ? lsum / (double)done : 0.0;
  return err;
}
