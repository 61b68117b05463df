/* The order of one rank's actions on its agent (stage_line-impl.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/kernels/error.h"
#include "axon/rref/rref.h"
#include "axon/runtime/pipeline/stage/stage_line-impl.h"

typedef struct lentry { /* a sequenced call waiting for its turn */
  int64_t gen, seq;
  ax_call_ctx *cc; /* valid until f completes (rpc.h) */
  void *host;
  axi_pipe_line_fn fn;
  ax_values *args; /* a copy: the call's own list dies with the handler */
  ax_future *f;    /* the deferred reply */
  int err;         /* once run: its outcome, answered by the answerer */
  ax_values *out;
  char *msg;
  struct lentry *next;
} lentry;

struct axi_pipe_line {
  ax_node *node;
  char caller[128];
  uint64_t id;
  int refs; /* hosts joined, and calls using it (g_mu) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int64_t gen, next;  /* the gen being run and its next seq */
  int64_t failed_gen; /* an action of this gen failed: cancel the rest */
  pthread_t th;       /* runs the line's actions */
  pthread_t ath;      /* answers them: a reply's encoding and sending stay
                         off the actions' thread */
  pthread_cond_t acv;
  lentry *answers, **answers_tail; /* run, not yet answered (in order) */
  int alive;                       /* of the two threads */
  int line_done;                   /* the actions' thread has ended */
  int stop;       /* the line is being freed: the threads end */
  int self_free;  /* ... and the last one frees it (its last host left
                     from inside one of them) */
  void *cur_host; /* whose action runs now (NULL: none) */
  lentry *pending;
  int npending;
  axi_pipe_line *link;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static axi_pipe_line *g_lines;

static void *line_main(void *arg);
static void *answer_main(void *arg);
static void line_free(axi_pipe_line *l);

static void entry_end(lentry *e, int err, ax_values *vals, const char *msg) {
  ax_future_complete(e->f, err, vals, msg);
  ax_future_release(e->f);
  ax_values_free(e->args);
  free(e);
}

/* Answers every queued entry that `drop` selects (mu held). */
static void drop_where(axi_pipe_line *l,
                       int (*drop)(const lentry *, const void *),
                       const void *arg, int err, const char *msg) {
  for (lentry **pp = &l->pending; *pp;) {
    lentry *e = *pp;
    if (!drop(e, arg)) {
      pp = &e->next;
      continue;
    }
    *pp = e->next;
    l->npending--;
    entry_end(e, err, NULL, msg);
  }
}

static int older_gen(const lentry *e, const void *gen) {
  return e->gen < *(const int64_t *)gen;
}
static int of_gen(const lentry *e, const void *gen) {
  return e->gen == *(const int64_t *)gen;
}
static int of_host(const lentry *e, const void *host) {
  return e->host == host;
}
static int expired(const lentry *e, const void *unused) {
  (void)unused;
  return ax_call_remaining_ms(e->cc) < 0;
}

/* Finds or makes the line (caller, id) of node n and takes a reference
 * (g_mu held). */
static axi_pipe_line *line_get_locked(ax_node *n, const char *caller,
                                      uint64_t id) {
  axi_pipe_line *l = g_lines;
  while (l && !(l->node == n && l->id == id && !strcmp(l->caller, caller)))
    l = l->link;
  if (!l && (l = calloc(1, sizeof *l))) {
    l->node = n;
    snprintf(l->caller, sizeof l->caller, "%s", caller);
    l->id = id;
    l->gen = -1;
    l->failed_gen = -1;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    pthread_cond_init(&l->acv, NULL);
    l->answers_tail = &l->answers;
    l->alive = 2;
    if (pthread_create(&l->th, NULL, line_main, l) != 0) {
      line_free(l);
      return NULL;
    }
    if (pthread_create(&l->ath, NULL, answer_main, l) != 0) {
      pthread_mutex_lock(&l->mu);
      l->stop = 1;
      pthread_cond_broadcast(&l->cv);
      pthread_mutex_unlock(&l->mu);
      pthread_join(l->th, NULL);
      line_free(l);
      return NULL;
    }
    l->link = g_lines;
    g_lines = l;
  }
  if (l)
    l->refs++;
  return l;
}

/* Drops a reference; the last one frees the line (g_mu not held). Every
 * host joined holds one, and every call while it uses the line. */
static void line_put(axi_pipe_line *l) {
  pthread_mutex_lock(&g_mu);
  int last = --l->refs == 0;
  if (last)
    for (axi_pipe_line **pp = &g_lines; *pp; pp = &(*pp)->link)
      if (*pp == l) {
        *pp = l->link;
        break;
      }
  pthread_mutex_unlock(&g_mu);
  if (!last)
    return;
  /* Every host that queued here has left, dropping its entries. */
  /* The last host may go away inside one of the line's own threads (an
   * action, or a reply's callbacks): they cannot be joined from there. */
  int self = pthread_equal(l->th, pthread_self()) ||
             pthread_equal(l->ath, pthread_self());
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  l->self_free = self;
  pthread_cond_broadcast(&l->cv);
  pthread_cond_broadcast(&l->acv);
  pthread_mutex_unlock(&l->mu);
  if (self) {
    pthread_detach(l->th);
    pthread_detach(l->ath);
    return; /* the last of them frees it */
  }
  pthread_join(l->th, NULL);
  pthread_join(l->ath, NULL);
  line_free(l);
}

/* A line thread ends (mu held; unlocks): the last of the two frees a
 * line whose last host left from inside one of them. */
static void thread_exit(axi_pipe_line *l) {
  int last = --l->alive == 0 && l->self_free;
  pthread_mutex_unlock(&l->mu);
  if (last)
    line_free(l);
}

static void line_free(axi_pipe_line *l) {
  pthread_cond_destroy(&l->acv);
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->cv);
  free(l);
}

void axi_pipe_line_detach(axi_pipe_line **slot, void *host) {
  pthread_mutex_lock(&g_mu);
  axi_pipe_line *l = slot ? *slot : NULL;
  if (slot)
    *slot = NULL;
  pthread_mutex_unlock(&g_mu);
  if (!l)
    return;
  pthread_mutex_lock(&l->mu);
  drop_where(l, of_host, host, AX_ECANCELLED,
             "axon.pipe.stage: the stage was torn down before this action ran");
  while (l->cur_host == host && !pthread_equal(l->th, pthread_self()))
    pthread_cond_wait(&l->cv, &l->mu);
  pthread_mutex_unlock(&l->mu);
  line_put(l);
}

int axi_pipe_line_queued(axi_pipe_line *const *slot) {
  pthread_mutex_lock(&g_mu);
  axi_pipe_line *l = slot ? *slot : NULL;
  if (l)
    l->refs++; /* kept while we look */
  pthread_mutex_unlock(&g_mu);
  if (!l)
    return 0;
  pthread_mutex_lock(&l->mu);
  int n = l->npending;
  pthread_mutex_unlock(&l->mu);
  line_put(l);
  return n;
}

/* The line's thread: runs its actions in order, each once it is queued;
 * answers those whose caller's deadline passed while they waited. */
static void *line_main(void *arg) {
  axi_pipe_line *l = arg;
  pthread_mutex_lock(&l->mu);
  while (!l->stop) {
    lentry **pp = &l->pending;
    while (*pp && !((*pp)->gen == l->gen && (*pp)->seq == l->next))
      pp = &(*pp)->next;
    lentry *e = *pp;
    if (!e) {
      struct timespec ts = ax_clock_after_ms(CLOCK_REALTIME, 1000);
      pthread_cond_timedwait(&l->cv, &l->mu, &ts);
      drop_where(l, expired, NULL, AX_ETIMEOUT,
                 "axon.pipe.stage: the deadline passed while the action waited "
                 "for the rank's earlier ones");
      continue;
    }
    *pp = e->next;
    l->npending--;
    l->next++;
    if (e->gen <= l->failed_gen) {
      entry_end(e, AX_ECANCELLED, NULL,
                "axon.pipe.stage: an earlier action of this rank failed");
      continue;
    }
    l->cur_host = e->host;
    pthread_mutex_unlock(&l->mu);
    ax_values *out = ax_values_new();
    ax_autograd_ctx_set_current(ax_call_autograd_ctx(e->cc));
    ax_clearerr();
    int err = out ? e->fn(e->cc, e->host, e->args, out) : AX_ENOMEM;
    ax_autograd_ctx_set_current(0);
    char msg[512] = "";
    if (err != AX_OK)
      snprintf(msg, sizeof msg, "%s", ax_errmsg());
    pthread_mutex_lock(&l->mu);
    if (err != AX_OK && e->gen > l->failed_gen) {
      l->failed_gen = e->gen;
      drop_where(l, of_gen, &e->gen, AX_ECANCELLED,
                 "axon.pipe.stage: an earlier action of this rank failed");
    }
    l->cur_host = NULL;
    pthread_cond_broadcast(&l->cv);
    /* The answerer replies, in order, while this thread goes on with the
     * next action. */
    e->err = err;
    if (err == AX_OK)
      e->out = out;
    else {
      ax_values_free(out);
      e->msg = strdup(msg);
    }
    e->next = NULL;
    *l->answers_tail = e;
    l->answers_tail = &e->next;
    pthread_cond_signal(&l->acv);
  }
  l->line_done = 1;
  pthread_cond_broadcast(&l->acv);
  thread_exit(l);
  return NULL;
}

/* The answerer: completes the deferred replies of the actions run (the
 * reply's callbacks run here), in order; drains them before it ends. */
static void *answer_main(void *arg) {
  axi_pipe_line *l = arg;
  pthread_mutex_lock(&l->mu);
  for (;;) {
    lentry *e = l->answers;
    if (!e) {
      if (l->stop && l->line_done) /* nothing more can come */
        break;
      pthread_cond_wait(&l->acv, &l->mu);
      continue;
    }
    l->answers = e->next;
    if (!l->answers)
      l->answers_tail = &l->answers;
    pthread_mutex_unlock(&l->mu);
    char *msg = e->msg;
    entry_end(e, e->err, e->out, msg);
    free(msg);
    pthread_mutex_lock(&l->mu);
  }
  thread_exit(l);
  return NULL;
}

/* Queues the call (mu held); AX_OK, or an error for the caller. */
static int line_queue(axi_pipe_line *l, ax_call_ctx *cc, void *host,
                      axi_pipe_line_fn fn, const ax_values *args, int64_t gen,
                      int64_t seq) {
  if (gen < l->gen)
    return ax_seterr(AX_ESTALE,
                     "axon.pipe.stage: an action of train call %lld "
                     "after call %lld began",
                     (long long)gen, (long long)l->gen);
  if (gen > l->gen) { /* a new train call: what the old one left is void */
    drop_where(l, older_gen, &gen, AX_ECANCELLED,
               "axon.pipe.stage: a newer train call began");
    l->gen = gen;
    l->next = 0;
  }
  if (gen <= l->failed_gen)
    return ax_seterr(AX_ECANCELLED,
                     "axon.pipe.stage: an earlier action of this "
                     "rank failed");
  if (seq < l->next || seq - l->next > AXP_LINE_AHEAD_MAX ||
      l->npending >= AXP_LINE_AHEAD_MAX)
    return ax_seterr(AX_EBADARG,
                     "axon.pipe.stage: action %lld out of order "
                     "(next %lld, %d queued)",
                     (long long)seq, (long long)l->next, l->npending);
  for (const lentry *e = l->pending; e; e = e->next)
    if (e->gen == gen && e->seq == seq)
      return ax_seterr(AX_EBADARG, "axon.pipe.stage: action %lld sent twice",
                       (long long)seq);
  lentry *e = calloc(1, sizeof *e);
  if (!e || !(e->args = ax_values_clone(args)) || !(e->f = ax_future_new())) {
    if (e)
      ax_values_free(e->args);
    free(e);
    return AX_ENOMEM;
  }
  int err = ax_robj_defer(cc, e->f);
  if (err != AX_OK) {
    ax_future_release(e->f);
    ax_values_free(e->args);
    free(e);
    return err;
  }
  e->gen = gen;
  e->seq = seq;
  e->cc = cc;
  e->host = host;
  e->fn = fn;
  e->next = l->pending;
  l->pending = e;
  l->npending++;
  return AX_OK;
}

int axi_pipe_line_call(ax_call_ctx *cc, axi_pipe_line **slot, void *host,
                       axi_pipe_line_fn fn, const ax_values *args,
                       ax_values *out) {
  int64_t id, gen, seq;
  if (ax_call_meta(cc, AXP_META_LINE, &id) != AX_OK ||
      ax_call_meta(cc, AXP_META_GEN, &gen) != AX_OK ||
      ax_call_meta(cc, AXP_META_SEQ, &seq) != AX_OK) {
    ax_clearerr();
    return fn(cc, host, args, out);
  }
  if (gen < 0 || seq < 0)
    return ax_seterr(AX_EBADARG, "axon.pipe.stage: negative train call or "
                                 "action number");
  const char *caller = ax_call_caller(cc);
  axi_pipe_line *l = NULL;
  for (;;) { /* join the call's line: a reference for this call, and the
                host's own (in *slot) the first time */
    pthread_mutex_lock(&g_mu);
    l = *slot;
    if (l && (l->id != (uint64_t)id || strcmp(l->caller, caller))) {
      pthread_mutex_unlock(&g_mu);
      axi_pipe_line_detach(slot, host); /* the host moved to another line */
      continue;
    }
    if (!l && (l = line_get_locked(ax_call_node(cc), caller, (uint64_t)id)))
      *slot = l;
    if (l)
      l->refs++;
    pthread_mutex_unlock(&g_mu);
    break;
  }
  if (!l)
    return AX_ENOMEM;
  pthread_mutex_lock(&l->mu);
  int err = line_queue(l, cc, host, fn, args, gen, seq);
  if (err == AX_OK)
    pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
  line_put(l);
  return err;
}
