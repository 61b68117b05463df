/* The one wait of a take (autograd-impl.h, axi_ag_wait): a gradient's take
 * (engine.c, ax_dist_take_grads) and a pushed list's (push.c, ax_dist_take)
 * wait under the same deadline and peer-down rules. */
#include <pthread.h>

#include "axon/kernels/clock.h"
#include "axon/runtime/autograd/autograd-impl.h"

/* The predicate's answer as the wait's result (r != 0). */
static int verdict(int r) { return r > 0 ? AX_OK : -r; }

int axi_ag_wait(axi_ag_state *d, int64_t end_ms, const char *peer,
                axi_ag_ready_fn ready, void *arg) {
  for (;;) {
    int r = ready(d, arg);
    if (r != 0)
      return verdict(r);
    int64_t ms = ax_clock_ms();
    if (ms >= end_ms)
      return AX_ETIMEOUT;
    if (peer && peer[0]) { /* the node that owes the data may be gone */
      pthread_mutex_unlock(&d->mu);
      int down = ax_node_peer_is_down(d->node, peer);
      pthread_mutex_lock(&d->mu);
      /* What arrived while the lock was free woke nobody: look again
       * before giving up or waiting. */
      if ((r = ready(d, arg)) != 0)
        return verdict(r);
      if (down)
        return AX_EPEERDOWN;
    }
    /* Deliveries broadcast d->cv; the 100 ms bound re-checks the peer. */
    int64_t wait = end_ms - ms < 100 ? end_ms - ms : 100;
    struct timespec ts = ax_clock_after_ms(CLOCK_REALTIME, wait);
    pthread_cond_timedwait(&d->cv, &d->mu, &ts);
  }
}
