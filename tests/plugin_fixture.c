/* A plugin for the tests (runtime/autograd/plugin.h), built four times by
 * tests/CMakeLists.txt: FIXTURE_GOOD, FIXTURE_BADABI (declares the next ABI),
 * FIXTURE_NOINIT (no entry point) and FIXTURE_FAILINIT (its init fails).
 *
 * The good one registers, when loaded, the model "fixture_early" (before any
 * node exists, so before ax_dist_init), and on each node the model
 * "fixture_late" (after ax_dist_init; once per process), the function
 * "fixture.ping" [x] -> [x + 1, node name] and the object kind
 * "fixture.counter" (config start=N; method "add" [x] -> [running total]).
 * Both models are the MLP with widths=6/5/4/3. */
#include <stdlib.h>

#include "axon/runtime/autograd/plugin.h"

#ifdef FIXTURE_BADABI
AX_PLUGIN_EXPORT const uint32_t axon_plugin_abi = AX_PLUGIN_ABI + 1;
#else
AX_PLUGIN_EXPORT const uint32_t axon_plugin_abi = AX_PLUGIN_ABI;
#endif

#ifndef FIXTURE_NOINIT
static int describe(const ax_config *cfg, ax_model_info *info) {
  return ax_model_mlp.describe(cfg, info);
}

static int build_block(const ax_config *cfg, int index, ax_module **out) {
  return ax_model_mlp.build_block(cfg, index, out);
}

static const ax_model_def g_early = {"fixture_early", "widths=6/5/4/3",
                                     describe, build_block};
static const ax_model_def g_late = {"fixture_late", "widths=6/5/4/3", describe,
                                    build_block};

static int ping(ax_call_ctx *ctx, const ax_values *args, ax_values *out,
                void *user) {
  int64_t x;
  AX_TRY(ax_values_get_i64(args, 0, &x));
  AX_TRY(ax_values_add_i64(out, x + 1));
  return ax_values_add_str(out, ax_node_name(ax_call_node(ctx)));
}

static int counter_create(ax_node *n, const char *config, ax_device dev,
                          void **obj) {
  ax_config c;
  int err = AX_OK;
  AX_TRY(ax_config_parse(&c, config));
  int64_t *total = malloc(sizeof *total);
  if (!total)
    return AX_ENOMEM;
  *total = ax_config_int(&c, "start", 0, &err);
  *obj = total;
  return err;
}

static int counter_add(ax_call_ctx *ctx, void *obj, const ax_values *args,
                       ax_values *out) {
  int64_t x, *total = obj;
  AX_TRY(ax_values_get_i64(args, 0, &x));
  return ax_values_add_i64(out, __atomic_add_fetch(total, x, __ATOMIC_RELAXED));
}

static const ax_robj_method_def g_counter_methods[] = {{"add", counter_add},
                                                       {NULL, NULL}};
static const ax_robj_kind g_counter = {"fixture.counter", counter_create, free,
                                       g_counter_methods};

AX_PLUGIN_EXPORT int axon_plugin_init(ax_node *node) {
#ifdef FIXTURE_FAILINIT
  return ax_seterr(AX_EINVAL, "fixture refuses to start");
#endif
  if (!node)
    return ax_model_register(&g_early);
  AX_TRY(ax_model_register(&g_late));
  AX_TRY(ax_rpc_register(node, "fixture.ping", ping, NULL));
  return ax_robj_register(node, &g_counter);
}
#endif
