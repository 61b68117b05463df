/* Pooled receive buffers for incoming tensors.
 *
 * Faulting in a fresh allocation for every received tensor costs more than
 * moving its bytes (a 64 MiB tensor touches 16384 new pages), so tensors
 * that arrive over the wire live in buffers taken from a process-wide,
 * size-classed pool. The tensor's storage hands its buffer back to the
 * pool when its last reference goes (ax_tensor_from_blob), from whatever
 * thread drops it, even after every node is gone. */
#ifndef AX_RPC_POOL_IMPL_H
#define AX_RPC_POOL_IMPL_H

#include <stdint.h>

#include "axon/kernels/tensor.h"

/* Tensors smaller than this come from ax_tensor_new (malloc is cheap). */
#define AXI_POOL_MIN_BYTES ((size_t)64 << 10)

/* A new uninitialised tensor, on a pooled buffer when dev is the CPU and
 * the tensor holds at least AXI_POOL_MIN_BYTES; otherwise ax_tensor_new.
 * NULL (ax_errmsg set) on bad shape or no memory. Thread-safe. */
ax_tensor *axi_pool_tensor(ax_dtype dtype, int ndim, const int64_t *shape,
                           ax_device dev);

/* Frees every cached buffer (buffers still held by tensors come back to
 * the pool later and are cached again). Called when the last node goes. */
void axi_pool_trim(void);

/* Buffers handed out and not yet returned (debug aid). */
long axi_pool_outstanding(void);

#endif
