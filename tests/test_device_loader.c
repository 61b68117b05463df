/* The CUDA backend is loaded on demand (kernels/cuda_loader.c). With its
 * file unavailable (AXON_CUDA_LIB naming a path that does not exist, set
 * before anything asks for CUDA), CPU work runs, the device count is 0, and
 * every CUDA request fails with AX_ENODEV and a message naming the file
 * and what to install. Where the backend was built and the machine has a
 * GPU, the same requests would succeed; this program checks only the
 * missing case, which holds on every machine. ctest also runs CPU tests
 * with the backend made unavailable (tests/CMakeLists.txt). */
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "harness.h"

#define MISSING "/nonexistent/axon/libaxon_cuda.so.0"

/* dl_iterate_phdr callback: counts loaded CUDA libraries, naming them. */
static int cuda_lib(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  const char *n = info->dlpi_name ? info->dlpi_name : "";
  if (strstr(n, "libcudart") || strstr(n, "libcublas") ||
      strstr(n, "libcudnn") || strstr(n, "libaxon_cuda")) {
    fprintf(stderr, "loaded: %s\n", n);
    ++*(int *)data;
  }
  return 0;
}

/* No CUDA library is in this process: libaxon does not link one (it did
 * when the backend was inside it, which fails this), and a failed load
 * leaves none behind. */
static void assert_no_cuda_loaded(void) {
  int k = 0;
  dl_iterate_phdr(cuda_lib, &k);
  assert_int_equal(k, 0);
}

static void test_cpu_works(void **state) {
  assert_no_cuda_loaded();
  ax_tensor *t = ax_tensor_new_v(AX_F32, AX_CPU, 2, 3, 4);
  assert_non_null(t);
  AX_ASSERT_OK(ax_tensor_fill(t, 1.5f));
  assert_true(((float *)t->data)[11] == 1.5f);
  ax_tensor_release(t);
}

static void test_cuda_requests_fail_clearly(void **state) {
  assert_int_equal(ax_cuda_device_count(), 0);
  ax_backend *be = NULL;
  assert_int_equal(ax_backend_get((ax_device){AX_DEV_CUDA, 0}, &be), AX_ENODEV);
  assert_null(be);
  fprintf(stderr, "cuda:0: %s\n", ax_errmsg());
  assert_non_null(strstr(ax_errmsg(), "cannot be loaded"));
  assert_non_null(strstr(ax_errmsg(), MISSING));
  assert_non_null(strstr(ax_errmsg(), "libaxon-cuda"));
  assert_int_equal(ax_device_check((ax_device){AX_DEV_CUDA, 1}), AX_ENODEV);
  fprintf(stderr, "cuda:1: %s\n", ax_errmsg());
  assert_non_null(strstr(ax_errmsg(), "no such device"));
  assert_non_null(strstr(ax_errmsg(), "cannot be loaded"));
  assert_null(axi_cuda_sym("axi_cuda_alloc_stats"));
  assert_non_null(axi_cuda_load_error());
  ax_tensor *t = ax_tensor_new_v(AX_F32, (ax_device){AX_DEV_CUDA, 0}, 1, 8);
  assert_null(t);
  assert_no_cuda_loaded();
}

int main(void) {
  setenv("AXON_CUDA_LIB", MISSING, 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpu_works),
      cmocka_unit_test(test_cuda_requests_fail_clearly),
  };
  return AX_TEST_MAIN(tests);
}
