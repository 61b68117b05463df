/* Internal future helpers shared inside rpc/. */
#ifndef AX_RPC_FUTURE_IMPL_H
#define AX_RPC_FUTURE_IMPL_H

#include "axon/rpc/future.h"

/* Like ax_future_wait, but first polls f for up to spin_us microseconds
 * (a busy poll with a pause instruction) before sleeping on its condition
 * variable. A reply that arrives within the spin then costs no futex
 * wake-up of the waiting thread, which is most of a small call's latency
 * on a machine with few cores. spin_us <= 0 is ax_future_wait. */
int axi_future_wait_spin(ax_future *f, int64_t spin_us, int64_t timeout_ms);

#endif
