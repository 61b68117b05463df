/* Built-in remote functions, for the layers above rpc/ that register their
 * own (rref/, runtime/): the namespace and the registration that may use it.
 * Internal: not installed. */
#ifndef AX_RPC_BUILTIN_IMPL_H
#define AX_RPC_BUILTIN_IMPL_H

#include "axon/rpc/rpc.h"

/* Built-in remote functions are named "axon.<subsystem>.<name>"; programs
 * cannot register a name in that namespace (ax_rpc_register). The
 * rendezvous built-ins are answered before this node has joined; every
 * other call waits for the membership. */
#define AXI_BUILTIN_PREFIX "axon."
#define AXI_RENDEZVOUS_PREFIX "axon.rendezvous."
/* Registers a built-in without the reserved-namespace check. */
int axi_register(ax_node *n, const char *fn, ax_rpc_handler h, void *user);
/* Same, with the handler run on the receiving thread when inline_ is set. */
int axi_register_ex(ax_node *n, const char *fn, ax_rpc_handler h, void *user,
                    int inline_);

#endif
