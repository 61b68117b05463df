/* The plugin's entry points (runtime/autograd/plugin.h): the model registers
 * when the plugin is loaded, before any node exists; the node phase has
 * nothing to add (the model's "fmcnn.stage" kind and the pipeline host
 * "axon.pipe.stage" with model=fmcnn come with the model). */
#include "custom.h"
#include <axon/runtime/autograd/plugin.h>

AX_PLUGIN_EXPORT const uint32_t axon_plugin_abi = AX_PLUGIN_ABI;

AX_PLUGIN_EXPORT int axon_plugin_init(ax_node *node) {
  if (node)
    return AX_OK;
  return ax_model_register(&cm_fmcnn);
}
