/* Process-wide counters of the rpc layer: calls alive (incoming and
 * outgoing, across every node of the process). */
#include "axon/rpc/node-impl.h"

static long g_live_calls;

long ax_rpc_live_calls(void) {
  return __atomic_load_n(&g_live_calls, __ATOMIC_RELAXED);
}

void axi_live_calls_add(long d) {
  __atomic_add_fetch(&g_live_calls, d, __ATOMIC_RELAXED);
}
