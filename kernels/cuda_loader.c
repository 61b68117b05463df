/* The CUDA backend on demand: libaxon carries no CUDA code and needs no
 * CUDA library. The backend is its own shared object (libaxon_cuda.so.N,
 * built from kernels/cuda/ wherever nvcc and cuDNN are found, packaged as
 * libaxon-cuda), loaded the first time a CUDA device is asked for:
 *
 * - from $AXON_CUDA_LIB when set (a path; nothing else is tried),
 * - else next to libaxon (the directory of the loaded libaxon.so),
 * - else by name through the dynamic linker's search path.
 *
 * If it or a CUDA library it needs cannot be loaded, CUDA requests fail
 * with AX_ENODEV and the loader's message, and the device count is 0; CPU
 * work never gets here. Loading happens once per process (pthread_once). */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "axon/kernels/error.h"

#ifndef AXON_CUDA_SONAME
#define AXON_CUDA_SONAME "libaxon_cuda.so.0"
#endif

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void *g_lib;
static char g_why[768];
static int (*g_init)(ax_backend *, int);
static int (*g_count)(void);
static int (*g_bench)(int, int, int, int, double *);

static void *try_open(const char *path) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(g_why, sizeof g_why, "%.700s", e ? e : path);
  }
  return h;
}

static void load(void) {
  const char *env = getenv("AXON_CUDA_LIB");
  if (env && *env) {
    g_lib = try_open(env);
  } else {
    Dl_info di;
    char path[PATH_MAX];
    if (dladdr((void *)&axi_cuda_device_count, &di) && di.dli_fname) {
      const char *slash = strrchr(di.dli_fname, '/');
      int dir = slash ? (int)(slash - di.dli_fname) : 0;
      if (dir > 0 && snprintf(path, sizeof path, "%.*s/%s", dir, di.dli_fname,
                              AXON_CUDA_SONAME) < (int)sizeof path)
        g_lib = try_open(path);
    }
    if (!g_lib)
      g_lib = try_open(AXON_CUDA_SONAME);
  }
  if (!g_lib)
    return;
  g_init = (int (*)(ax_backend *, int))dlsym(g_lib, "axi_cudalib_backend_init");
  g_count = (int (*)(void))dlsym(g_lib, "axi_cudalib_device_count");
  g_bench = (int (*)(int, int, int, int, double *))dlsym(
      g_lib, "axi_cudalib_bench_cublas");
  if (!g_init || !g_count || !g_bench) {
    snprintf(g_why, sizeof g_why,
             "%s does not export the axon CUDA backend's entry points",
             env && *env ? env : AXON_CUDA_SONAME);
    g_init = NULL;
    g_count = NULL;
    g_bench = NULL;
  }
}

static int loaded(void) {
  pthread_once(&g_once, load);
  return g_init != NULL;
}

const char *axi_cuda_load_error(void) { return loaded() ? NULL : g_why; }

void *axi_cuda_sym(const char *name) {
  return loaded() ? dlsym(g_lib, name) : NULL;
}

static int unavailable(int ordinal) {
  return ax_seterr(AX_ENODEV,
                   "cuda:%d: the CUDA backend (%s) cannot be loaded: %s "
                   "(it is built where nvcc and cuDNN are found and packaged "
                   "as libaxon-cuda; AXON_CUDA_LIB names another file)",
                   ordinal, AXON_CUDA_SONAME, g_why);
}

int axi_cuda_backend_init(ax_backend *be, int ordinal) {
  return loaded() ? g_init(be, ordinal) : unavailable(ordinal);
}

int axi_cuda_device_count(void) { return loaded() ? g_count() : 0; }

int axi_cuda_bench_cublas(int ordinal, int n, int iters, int tf32,
                          double *seconds) {
  return loaded() ? g_bench(ordinal, n, iters, tf32, seconds)
                  : unavailable(ordinal);
}
