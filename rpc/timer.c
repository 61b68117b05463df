/* The node's timer thread: every AXI_TICK_MS it runs the tick hooks the
 * node's parts registered (axi_node_on_tick), in registration order. It
 * knows none of them by name. */
#include <stdlib.h>

#include "axon/kernels/clock.h"
#include "axon/rpc/node-impl.h"

struct axi_tick {
  axi_tick_fn fn;
  void *arg;
  struct axi_tick *next; /* written once, atomically: the timer reads it
                            without n->mu */
};

int axi_node_on_tick(ax_node *n, axi_tick_fn fn, void *arg) {
  axi_tick *t = calloc(1, sizeof *t);
  if (!t)
    return ax_seterr(AX_ENOMEM, "node: no memory");
  t->fn = fn;
  t->arg = arg;
  pthread_mutex_lock(&n->mu);
  axi_tick **pp = &n->ticks;
  while (*pp)
    pp = &(*pp)->next;
  __atomic_store_n(pp, t, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&n->mu);
  return AX_OK;
}

void axi_node_ticks_free(ax_node *n) {
  for (axi_tick *t = n->ticks, *nx; t; t = nx) {
    nx = t->next;
    free(t);
  }
  n->ticks = NULL;
}

void *axi_timer_main(void *arg) {
  ax_node *n = arg;
  pthread_mutex_lock(&n->mu);
  while (!n->timer_stop) {
    struct timespec ts = ax_clock_after_ms(CLOCK_REALTIME, AXI_TICK_MS);
    pthread_cond_timedwait(&n->cv, &n->mu, &ts);
    if (n->timer_stop)
      break;
    axi_tick *t = n->ticks;
    pthread_mutex_unlock(&n->mu);
    int64_t now = ax_clock_ms();
    for (; t; t = __atomic_load_n(&t->next, __ATOMIC_ACQUIRE))
      t->fn(n, now, t->arg);
    pthread_mutex_lock(&n->mu);
  }
  pthread_mutex_unlock(&n->mu);
  return NULL;
}
