/* Futures (see rpc/future.h). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/future-impl.h"

typedef struct cb_node {
  ax_future_cb cb;
  void *user;
  struct cb_node *next;
} cb_node;

struct ax_future {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs; /* atomic */
  int done;
  int err;
  char *msg;
  ax_values *vals;
  cb_node *cbs, **tail;
};

static long g_live;

long ax_future_live_count(void) {
  return __atomic_load_n(&g_live, __ATOMIC_RELAXED);
}

ax_future *ax_future_new(void) {
  ax_future *f = calloc(1, sizeof *f);
  if (!f)
    return NULL;
  pthread_mutex_init(&f->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&f->cv, &ca);
  pthread_condattr_destroy(&ca);
  f->refs = 1;
  f->tail = &f->cbs;
  __atomic_add_fetch(&g_live, 1, __ATOMIC_RELAXED);
  return f;
}

ax_future *ax_future_retain(ax_future *f) {
  if (f)
    __atomic_add_fetch(&f->refs, 1, __ATOMIC_RELAXED);
  return f;
}

void ax_future_release(ax_future *f) {
  if (!f || __atomic_sub_fetch(&f->refs, 1, __ATOMIC_ACQ_REL) != 0)
    return;
  /* A pending future dropped by everyone has no callbacks left to honour
   * except ones whose owners hold no reference; they are simply freed. */
  for (cb_node *c = f->cbs, *n; c; c = n) {
    n = c->next;
    free(c);
  }
  ax_values_free(f->vals);
  free(f->msg);
  pthread_mutex_destroy(&f->mu);
  pthread_cond_destroy(&f->cv);
  free(f);
  __atomic_sub_fetch(&g_live, 1, __ATOMIC_RELAXED);
}

int ax_future_complete(ax_future *f, int err, ax_values *vals,
                       const char *msg) {
  if (!f) {
    ax_values_free(vals);
    return ax_seterr(AX_EINVAL, "future: NULL");
  }
  char *m = (err != AX_OK && msg) ? strdup(msg) : NULL;
  if (err != AX_OK) {
    ax_values_free(vals);
    vals = NULL;
  }
  pthread_mutex_lock(&f->mu);
  if (f->done) {
    pthread_mutex_unlock(&f->mu);
    ax_values_free(vals);
    free(m);
    return ax_seterr(AX_ESTATE, "future: already complete");
  }
  f->done = 1;
  f->err = err;
  f->msg = m;
  f->vals = vals;
  cb_node *list = f->cbs;
  f->cbs = NULL;
  f->tail = &f->cbs;
  pthread_cond_broadcast(&f->cv);
  ax_future_retain(f); /* callbacks may drop the last external reference */
  pthread_mutex_unlock(&f->mu);
  for (cb_node *c = list, *n; c; c = n) {
    n = c->next;
    c->cb(f, c->user);
    free(c);
  }
  ax_future_release(f);
  return AX_OK;
}

int ax_future_wait(ax_future *f, int64_t timeout_ms) {
  if (!f)
    return ax_seterr(AX_EINVAL, "future: NULL");
  if (timeout_ms < 0)
    timeout_ms = 0;
  /* f->cv waits on CLOCK_MONOTONIC (ax_future_new). */
  struct timespec ts = ax_clock_after_ms(CLOCK_MONOTONIC, timeout_ms);
  pthread_mutex_lock(&f->mu);
  while (!f->done)
    if (pthread_cond_timedwait(&f->cv, &f->mu, &ts) == ETIMEDOUT)
      break;
  int rc = f->done ? f->err : AX_ETIMEOUT;
  const char *m = f->msg;
  int done = f->done;
  pthread_mutex_unlock(&f->mu);
  if (!done)
    return ax_seterr(AX_ETIMEOUT, "future: not complete after %lld ms",
                     (long long)timeout_ms);
  if (rc != AX_OK)
    ax_seterr(rc, "%s", m ? m : "");
  return rc;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

int axi_future_wait_spin(ax_future *f, int64_t spin_us, int64_t timeout_ms) {
  if (f && spin_us > 0 && !__atomic_load_n(&f->done, __ATOMIC_ACQUIRE)) {
    int64_t t0 = ax_clock_us();
    do {
      cpu_relax(); /* sched_yield measured worse on a loaded machine */
      if (__atomic_load_n(&f->done, __ATOMIC_ACQUIRE))
        break;
    } while (ax_clock_us() - t0 < spin_us);
  }
  return ax_future_wait(f, timeout_ms);
}

int ax_future_is_done(const ax_future *f) {
  return f && __atomic_load_n(&f->done, __ATOMIC_ACQUIRE);
}

int ax_future_err(const ax_future *f) {
  return ax_future_is_done(f) ? f->err : AX_ESTATE;
}

const char *ax_future_errmsg(const ax_future *f) {
  return (ax_future_is_done(f) && f->msg) ? f->msg : "";
}

const ax_values *ax_future_values(const ax_future *f) {
  return ax_future_is_done(f) ? f->vals : NULL;
}

ax_values *ax_future_take_values(ax_future *f) {
  if (!ax_future_is_done(f))
    return NULL;
  pthread_mutex_lock(&f->mu);
  ax_values *v = f->vals;
  f->vals = NULL;
  pthread_mutex_unlock(&f->mu);
  return v;
}

int ax_future_on_done(ax_future *f, ax_future_cb cb, void *user) {
  if (!f || !cb)
    return ax_seterr(AX_EINVAL, "future: NULL");
  cb_node *c = malloc(sizeof *c);
  if (!c)
    return ax_seterr(AX_ENOMEM, "future: no memory");
  c->cb = cb;
  c->user = user;
  c->next = NULL;
  pthread_mutex_lock(&f->mu);
  if (!f->done) {
    *f->tail = c;
    f->tail = &c->next;
    pthread_mutex_unlock(&f->mu);
    return AX_OK;
  }
  pthread_mutex_unlock(&f->mu);
  free(c);
  cb(f, user);
  return AX_OK;
}

static void follow_cb(ax_future *src, void *user) {
  ax_future *dst = user;
  ax_future_complete(dst, ax_future_err(src),
                     ax_future_err(src) == AX_OK
                         ? ax_values_clone(ax_future_values(src))
                         : NULL,
                     ax_future_errmsg(src));
  ax_future_release(dst);
}

ax_future *ax_future_follow(ax_future *src) {
  ax_future *dst = ax_future_new();
  if (!dst)
    return NULL;
  ax_future_retain(dst);
  if (ax_future_on_done(src, follow_cb, dst) != AX_OK) {
    ax_future_release(dst);
    ax_future_release(dst);
    return NULL;
  }
  return dst;
}
