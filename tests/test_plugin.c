/* Users' own models and plugins in one process: finite-difference checks of
 * the custom_model example's PReLU layer and of its whole fmcnn model
 * (loaded from custom_model.so), the loader's errors (missing file, not a
 * shared object, ABI mismatch, no entry point, failing init), the model
 * registry's contract (errors, thread safety), and "NAME.stage" for models
 * registered before and after ax_dist_init. */
#include <pthread.h>
#include <string.h>

#include "axon/runtime/autograd/plugin.h"
#include "examples/custom_model/plugin/custom.h"
#include "tests/harness.h"
#include "tests/mp_testutil.h"

static void plugin_path(const char *name, char *buf, size_t len) {
  mt_bin_path(name, buf, len);
}

/* Fails unless msg contains every NULL-terminated needle. */
static void assert_msg_has(int rc, int want, const char *msg, ...) {
  if (rc != want)
    fail_msg("got %s, want %s: %s", ax_errname(rc), ax_errname(want), msg);
  va_list ap;
  va_start(ap, msg);
  for (const char *s; (s = va_arg(ap, const char *));)
    if (!strstr(msg, s))
      fail_msg("'%s' does not contain '%s'", msg, s);
  va_end(ap);
}

/* ---- the example's layer and model --------------------------------------- */
static void prelu_gradcheck(void **state) {
  int64_t s4[4] = {2, 3, 4, 5}, s2[2] = {6, 3};
  ax_tensor *x = ax_test_randn(11, 1.0f, 4, s4);
  ax_tlist in = ax_tlist1(x);
  ax_test_gradcheck(cm_prelu_new(3), &in, 1, 60, 1e-3, 1e-3, 1e-2);
  /* the layer's split backward: each half against finite differences */
  ax_test_gradcheck_split(cm_prelu_new(3), &in, 1, 60, 1e-3, 1e-3, 1e-2);
  ax_tensor_release(x);
  x = ax_test_randn(12, 1.0f, 2, s2);
  in = ax_tlist1(x);
  ax_test_gradcheck(cm_prelu_new(3), &in, 1, 40, 1e-3, 1e-3, 1e-2);
  ax_tensor_release(x);
  assert_null(cm_prelu_new(0));
}

/* The layer's forward against its definition, slopes at their init 0.25. */
static void prelu_forward_values(void **state) {
  ax_module *m = cm_prelu_new(2);
  ax_net *net = ax_net_new(m, AX_CPU, 1);
  assert_non_null(net);
  int64_t shape[2] = {2, 2};
  ax_tensor *x = ax_tensor_new(AX_F32, 2, shape, AX_CPU);
  float v[4] = {1.5f, -2.0f, -0.5f, 3.0f},
        want[4] = {1.5f, -0.5f, -0.125f, 3.0f};
  memcpy(x->data, v, sizeof v);
  ax_tlist in = ax_tlist1(x), out = {0};
  AX_ASSERT_OK(ax_net_forward(net, NULL, 0, 0, &in, &out));
  for (int i = 0; i < 4; i++)
    assert_float_equal(ax_f32(out.t[0])[i], want[i], 1e-7);
  ax_tlist_clear(&out);
  ax_tensor_release(x);
  ax_net_free(net);
}

static void fmcnn_gradcheck(void **state) {
  char path[4200];
  plugin_path("custom_model.so", path, sizeof path);
  AX_ASSERT_OK(ax_plugin_load(path));
  const ax_model_def *def = ax_model_find("fmcnn");
  assert_non_null(def);
  ax_config cfg;
  AX_ASSERT_OK(ax_model_config(def, "channels=2/3/4,classes=5", &cfg));
  ax_model_info info;
  AX_ASSERT_OK(def->describe(&cfg, &info));
  assert_int_equal(info.n_blocks, 4);
  assert_string_equal(info.block_names[3], "head");
  ax_module *root = ax_sequential_new();
  for (int i = 0; i < info.n_blocks; i++) {
    ax_module *b;
    AX_ASSERT_OK(def->build_block(&cfg, i, &b));
    AX_ASSERT_OK(ax_module_add(root, b));
  }
  int64_t shape[4] = {3, 1, 8, 8};
  ax_tensor *x = ax_test_randn(5, 1.0f, 4, shape);
  ax_tlist in = ax_tlist1(x);
  ax_test_gradcheck(root, &in, 1, 80, 1e-3, 1e-2, 5e-2);
  ax_tensor_release(x);
  ax_module *b;
  assert_int_equal(def->build_block(&cfg, 4, &b), AX_EINVAL);
  AX_ASSERT_OK(ax_config_parse(&cfg, "channels=2/0/4"));
  assert_int_equal(def->describe(&cfg, &info), AX_EINVAL);
}

/* ---- the loader ---------------------------------------------------------- */
static void loader_errors(void **state) {
  char path[4200];
  plugin_path("no_such_plugin.so", path, sizeof path);
  assert_msg_has(ax_plugin_load(path), AX_ENOTFOUND, ax_errmsg(), path,
                 "no such file", NULL);
  plugin_path("test_plugin_badabi.so", path, sizeof path);
  char want[64];
  snprintf(want, sizeof want, "built for plugin ABI %u", AX_PLUGIN_ABI + 1);
  assert_msg_has(ax_plugin_load(path), AX_EUNSUPPORTED, ax_errmsg(), path, want,
                 "rebuild", NULL);
  plugin_path("test_plugin_noinit.so", path, sizeof path);
  assert_msg_has(ax_plugin_load(path), AX_EINVAL, ax_errmsg(), path,
                 "axon_plugin_init", "not an axon plugin", NULL);
  plugin_path("test_plugin_failinit.so", path, sizeof path);
  assert_msg_has(ax_plugin_load(path), AX_EINVAL, ax_errmsg(), path,
                 "fixture refuses to start", NULL);
  /* A file that is no shared object: dlopen's error, with the file. */
  char src[4200];
  snprintf(src, sizeof src, "%s/tests/plugin_fixture.c",
           getenv("AXON_SOURCE_DIR") ? getenv("AXON_SOURCE_DIR") : "..");
  assert_msg_has(ax_plugin_load(src), AX_EIO, ax_errmsg(), src, "cannot load",
                 NULL);
  /* None of them counts as loaded; a good one loads once. */
  int before = ax_plugin_count();
  plugin_path("test_plugin_good.so", path, sizeof path);
  AX_ASSERT_OK(ax_plugin_load(path));
  AX_ASSERT_OK(ax_plugin_load(path));
  assert_int_equal(ax_plugin_count(), before + 1);
  assert_non_null(ax_model_find("fixture_early"));
  assert_null(ax_model_find("fixture_late")); /* node phase only */
  assert_int_equal(ax_plugin_attach(NULL), AX_EINVAL);
}

/* ---- the registry -------------------------------------------------------- */
static int mlp_describe(const ax_config *c, ax_model_info *i) {
  return ax_model_mlp.describe(c, i);
}
static int mlp_build(const ax_config *c, int k, ax_module **out) {
  return ax_model_mlp.build_block(c, k, out);
}

static void registry_errors(void **state) {
  ax_model_def d = {"unit_a", "widths=4/3/2", mlp_describe, mlp_build};
  AX_ASSERT_OK(ax_model_register(&d));
  assert_ptr_equal(ax_model_find("unit_a"), &d);
  assert_msg_has(ax_model_register(&d), AX_ESTATE, ax_errmsg(), "unit_a",
                 "already registered", NULL);
  ax_model_def dup = d;
  assert_msg_has(ax_model_register(&dup), AX_ESTATE, ax_errmsg(), "unit_a",
                 NULL);
  ax_model_def bad = d;
  bad.name = "mlp";
  assert_msg_has(ax_model_register(&bad), AX_ESTATE, ax_errmsg(), "built-in",
                 NULL);
  const char *names[] = {"",          "a,b",
                         "a=b",       "x.stage",
                         "has space", "a_name_that_is_longer_than_31_chars"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    bad.name = names[i];
    assert_msg_has(ax_model_register(&bad), AX_EINVAL, ax_errmsg(), "bad name",
                   NULL);
  }
  bad.name = "unit_b";
  bad.build_block = NULL;
  assert_msg_has(ax_model_register(&bad), AX_EINVAL, ax_errmsg(), "unit_b",
                 "build_block", NULL);
  bad.build_block = mlp_build;
  bad.default_config = "widths";
  assert_msg_has(ax_model_register(&bad), AX_EINVAL, ax_errmsg(), "unit_b",
                 "default_config", NULL);
  assert_int_equal(ax_model_register(NULL), AX_EINVAL);
  assert_null(ax_model_find("unit_b")); /* nothing changed on error */
  assert_null(ax_model_find("nope"));
  assert_msg_has(AX_ENOTFOUND, AX_ENOTFOUND, ax_errmsg(), "mlp", "unit_a",
                 NULL);
  const char *all[128];
  int n = ax_model_names(all, 128), found = 0;
  for (int i = 0; i < n && i < 128; i++)
    found += !strcmp(all[i], "unit_a") || !strcmp(all[i], "resnet20");
  assert_int_equal(found, 2);
  assert_int_equal(ax_model_unregister("mlp"), AX_EINVAL);
  AX_ASSERT_OK(ax_model_unregister("unit_a"));
  assert_null(ax_model_find("unit_a"));
  assert_int_equal(ax_model_unregister("unit_a"), AX_ENOTFOUND);
}

#define NTHREADS 8
#define PER_THREAD 4
static ax_model_def g_defs[NTHREADS][PER_THREAD];
static char g_names[NTHREADS][PER_THREAD][16];

/* Registers its models while finding and listing the others'. */
static void *reg_thread(void *arg) {
  intptr_t t = (intptr_t)arg;
  intptr_t bad = 0;
  for (int i = 0; i < PER_THREAD; i++) {
    snprintf(g_names[t][i], sizeof g_names[t][i], "thr%d_%d", (int)t, i);
    g_defs[t][i] = (ax_model_def){g_names[t][i], NULL, mlp_describe, mlp_build};
    bad += ax_model_register(&g_defs[t][i]) != AX_OK;
    bad += ax_model_find(g_names[t][i]) != &g_defs[t][i];
    bad += ax_model_names(NULL, 0) < 4 + i + 1;
  }
  return (void *)bad;
}

static void registry_threads(void **state) {
  pthread_t th[NTHREADS];
  for (intptr_t t = 0; t < NTHREADS; t++)
    pthread_create(&th[t], NULL, reg_thread, (void *)t);
  for (int t = 0; t < NTHREADS; t++) {
    void *bad;
    pthread_join(th[t], &bad);
    assert_int_equal((intptr_t)bad, 0);
  }
  for (int t = 0; t < NTHREADS; t++)
    for (int i = 0; i < PER_THREAD; i++) {
      assert_ptr_equal(ax_model_find(g_names[t][i]), &g_defs[t][i]);
      AX_ASSERT_OK(ax_model_unregister(g_names[t][i]));
    }
}

/* ---- NAME.stage for registered models, before and after ax_dist_init -- */
static int stage_forward(ax_node *n, const char *kind, const char *cfg,
                         int64_t classes) {
  ax_rref *r = NULL;
  AX_TRY(ax_remote_module(n, "unit", kind, cfg, AX_CPU, &r));
  int64_t shape[2] = {5, 4}, hdr[2] = {7, 0};
  ax_tensor *x = ax_test_randn(1, 1.0f, 2, shape);
  ax_values *a = dt_i64s(2, hdr), *out = NULL;
  ax_values_add_tensor(a, x);
  int rc = ax_rmod_forward(n, r, a, &out);
  ax_tensor *y = NULL;
  if (rc == AX_OK)
    rc = ax_values_get_tensor(out, 0, &y);
  if (rc == AX_OK &&
      (y->ndim != 2 || y->shape[0] != 5 || y->shape[1] != classes))
    rc = ax_seterr(AX_ESHAPE, "%s: wrong output shape", kind);
  ax_values_free(out);
  ax_values_free(a);
  ax_tensor_release(x);
  ax_rref_release(r);
  return rc;
}

static void stage_kinds(void **state) {
  ax_model_def early = {"unit_early", "widths=4/3/2", mlp_describe, mlp_build};
  ax_model_def late = {"unit_late", "widths=4/6/3", mlp_describe, mlp_build};
  AX_ASSERT_OK(ax_model_register(&early)); /* before ax_dist_init */
  ax_node *n = NULL;
  AX_ASSERT_OK(dt_driver("unit", rt_free_port(), 1, &n));
  AX_ASSERT_OK(ax_model_register(&late)); /* after */
  AX_ASSERT_OK(stage_forward(n, "unit_early.stage", "", 2));
  AX_ASSERT_OK(stage_forward(n, "unit_late.stage", "nstages=2,stage=0", 6));
  AX_ASSERT_OK(stage_forward(n, "unit_late.stage", "", 3));
  AX_ASSERT_OK(stage_forward(n, "mlp.stage", "widths=4/5/2", 2));
  /* An unregistered model can no longer be created; unknown kinds fail. */
  AX_ASSERT_OK(ax_model_unregister("unit_late"));
  int rc = stage_forward(n, "unit_late.stage", "", 3);
  assert_msg_has(rc, AX_ENOTFOUND, ax_errmsg(), "unit_late", NULL);
  rc = stage_forward(n, "nomodel.stage", "", 3);
  assert_msg_has(rc, AX_ENOTFOUND, ax_errmsg(), "nomodel.stage", NULL);
  AX_ASSERT_OK(ax_model_unregister("unit_early"));
  AX_ASSERT_OK(dt_all_zero(n, NULL, 0));
  dt_driver_end(n);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(prelu_gradcheck), cmocka_unit_test(prelu_forward_values),
      cmocka_unit_test(fmcnn_gradcheck), cmocka_unit_test(loader_errors),
      cmocka_unit_test(registry_errors), cmocka_unit_test(registry_threads),
      cmocka_unit_test(stage_kinds),
  };
  return AX_TEST_MAIN(tests);
}
