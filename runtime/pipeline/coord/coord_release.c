/* The coordinator's background context releaser: releasing a finished
 * unit's distributed autograd context costs one round trip to every node
 * that saw it, which used to run on stage 0's driver thread between two of
 * its operations (on the pipeline's critical path). Here one thread per
 * ax_pipe_train drains a queue of finished contexts instead. Contract in
 * coordinator-impl.h. */
#include <stdlib.h>
#include <time.h>

#include "axon/kernels/clock.h"
#include "axon/runtime/autograd/autograd.h"
#include "axon/runtime/pipeline/coord/coordinator-impl.h"

#define REL_POLL_MS 100

static int64_t rel_timeout(const ax_pipe *p) {
  int64_t t = p->o.timeout_ms > 0 ? p->o.timeout_ms : 60000;
  /* After a failure (a peer may be down) the run must end quickly. */
  int64_t cap =
      __atomic_load_n(&p->err, __ATOMIC_ACQUIRE) != AX_OK ? 2000 : 10000;
  return t < cap ? t : cap;
}

static void *rel_main(void *arg) {
  ax_pipe *p = arg;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    if (p->rel_head == p->rel_tail) {
      if (p->rel_stop)
        break;
      struct timespec ts = ax_clock_after_ms(CLOCK_REALTIME, REL_POLL_MS);
      pthread_cond_timedwait(&p->rel_cv, &p->mu, &ts);
      continue;
    }
    uint64_t ctx = p->relq[p->rel_head++];
    pthread_mutex_unlock(&p->mu);
    int err = ax_dist_context_release(p->node, ctx, rel_timeout(p));
    pthread_mutex_lock(&p->mu);
    if (err != AX_OK)
      p->rel_failed++;
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

int axi_pipe_release_start(ax_pipe *p, size_t units) {
  p->rel_head = p->rel_tail = 0;
  p->rel_stop = 0;
  p->rel_running = 0;
  p->rel_failed = 0;
  if (!(p->relq = calloc(units + 1, sizeof *p->relq)))
    return AX_ENOMEM;
  pthread_cond_init(&p->rel_cv, NULL);
  if (pthread_create(&p->rel_thread, NULL, rel_main, p) != 0) {
    pthread_cond_destroy(&p->rel_cv);
    free(p->relq);
    p->relq = NULL;
    return ax_seterr(AX_ENOMEM, "pipeline: cannot start the releaser");
  }
  p->rel_running = 1;
  return AX_OK;
}

int axi_pipe_release_push(ax_pipe *p, uint64_t ctx) {
  if (!p->rel_running || !ctx)
    return 0;
  p->relq[p->rel_tail++] = ctx; /* each context is queued at most once */
  pthread_cond_signal(&p->rel_cv);
  return 1;
}

void axi_pipe_release_stop(ax_pipe *p) {
  if (!p->rel_running)
    return;
  pthread_mutex_lock(&p->mu);
  p->rel_stop = 1;
  pthread_cond_signal(&p->rel_cv);
  pthread_mutex_unlock(&p->mu);
  pthread_join(p->rel_thread, NULL); /* each release is bounded */
  p->rel_running = 0;
  pthread_cond_destroy(&p->rel_cv);
  free(p->relq);
  p->relq = NULL;
}
