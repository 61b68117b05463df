/* Plugins: shared objects that add models, remote object kinds and remote
 * functions to a stock program (axon-agent --plugin FILE.so, axon-run
 * --plugin FILE.so, or any program calling ax_plugin_load).
 *
 * What a plugin may register, by floor: models (models/model.h,
 * ax_model_register), remote object kinds (rref/rref.h, ax_robj_register)
 * and remote functions (rpc/rpc.h, ax_rpc_register). This header includes
 * all three.
 *
 * The ABI. A plugin is a shared object built against these headers and
 * linked against libaxon (the process's own copy is used). It exports, with
 * C linkage and default visibility:
 *
 *   AX_PLUGIN_EXPORT const uint32_t axon_plugin_abi = AX_PLUGIN_ABI;
 *   AX_PLUGIN_EXPORT int axon_plugin_init(ax_node *node);
 *
 * axon_plugin_abi is the plugin ABI the plugin was built for; a loader
 * refuses a plugin whose value differs from its own AX_PLUGIN_ABI. The ABI
 * number changes whenever something a plugin relies on changes layout or
 * meaning: this entry point, ax_model_def / ax_model_info, ax_module_ops /
 * ax_module / ax_exec, ax_robj_kind, ax_rpc_handler, ax_values, ax_tensor,
 * the kernel table (kernels/backend-impl.h).
 *
 * axon_plugin_init is called in two phases:
 *  - once with node == NULL, when the plugin is loaded (ax_plugin_load),
 *    before the program creates any node: register process-wide things,
 *    i.e. models;
 *  - then once with each node the program sets up (ax_plugin_attach, after
 *    ax_dist_init or ax_pipe_init and before ax_node_join): register that
 *    node's object kinds and functions.
 * It returns AX_OK, or an error code with a message (ax_seterr), which the
 * loader reports prefixed with the file's path. It runs on the loading
 * thread, under the loader's lock: it must not call the loader
 * (ax_plugin_*), create nodes or threads that outlive it, or block.
 *
 * Plugins are never unloaded: what they register (defs, kinds, handlers)
 * may be used until the process exits.
 *
 * Thread safety: every function here is thread-safe. */
#ifndef AX_DIST_PLUGIN_H
#define AX_DIST_PLUGIN_H

#include <stdint.h>

#include "axon/models/model.h"
#include "axon/rpc/rpc.h"
#include "axon/rref/rref.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The plugin ABI of this axon (see above). */
#define AX_PLUGIN_ABI                                                          \
  4u /* 2: ax_exec.tp_allreduce, dropout kernels' first counter; 3:            \
         ax_module_ops.walk; 4: ax_model_info's ties */

/* Marks the two exported symbols of a plugin. */
#define AX_PLUGIN_EXPORT __attribute__((visibility("default")))

/* The entry point's type and the symbols the loader looks up. */
typedef int (*ax_plugin_init_fn)(ax_node *node);
#define AX_PLUGIN_INIT_SYMBOL "axon_plugin_init"
#define AX_PLUGIN_ABI_SYMBOL "axon_plugin_abi"

/* Most plugins one process loads. */
#define AX_PLUGIN_MAX 16

/* Loads the plugin at path (a path without '/' is taken relative to the
 * current directory, not searched for like a library name), checks its ABI
 * and runs axon_plugin_init(NULL). Loading a file that is already loaded
 * does nothing and returns AX_OK. Errors name the file: AX_ENOTFOUND when
 * it does not exist, AX_EIO when dlopen fails (with dlerror's text),
 * AX_EINVAL when a symbol is missing (not an axon plugin), AX_EUNSUPPORTED
 * on an ABI mismatch ("plugin P: built for plugin ABI 7, this axon has ABI
 * 1: rebuild it"), AX_ENOMEM past AX_PLUGIN_MAX plugins, and the plugin's
 * own error when its init fails (the file then stays mapped, since it may
 * have registered something, but is not attached to nodes). */
int ax_plugin_load(const char *path);

/* Runs axon_plugin_init(n) for every loaded plugin, in load order; stops at
 * the first error, which names the plugin and the node. Call once per node,
 * after ax_dist_init/ax_pipe_init and before ax_node_join (kinds and
 * functions must exist before peers can call). */
int ax_plugin_attach(ax_node *n);

/* Number of plugins loaded (successfully) in this process. */
int ax_plugin_count(void);

#ifdef __cplusplus
}
#endif
#endif
