/* Devices and the kernel backend that serves each one.
 *
 * A device is a value (type + index). Every device has one backend: a vtable
 * of memory, copy and compute kernels (kernels/backend-impl.h). The CPU
 * backend always exists; the CUDA backend exists when axon was built with
 * nvcc, and reports AX_ENODEV at run time when no GPU is present. */
#ifndef AX_DEVICE_H
#define AX_DEVICE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ax_device_type { AX_DEV_CPU = 0, AX_DEV_CUDA = 1 } ax_device_type;

typedef struct ax_device {
  ax_device_type type;
  int index; /* 0 for the CPU; the CUDA ordinal otherwise */
} ax_device;

#define AX_CPU ((ax_device){AX_DEV_CPU, 0})

/* Parses "cpu", "cuda" (= cuda:0) or "cuda:N". Returns AX_OK or AX_EINVAL. */
int ax_device_parse(const char *s, ax_device *out);

/* Writes "cpu" or "cuda:N" into buf (at least 16 bytes); returns buf. */
char *ax_device_str(ax_device d, char *buf, size_t len);

int ax_device_eq(ax_device a, ax_device b);

typedef struct ax_backend ax_backend;

/* The backend for a device, initialising it on first use. Returns AX_OK, or
 * AX_ENODEV (no such device / CUDA not compiled in / no GPU present).
 * Thread-safe; backends live until process exit. */
int ax_backend_get(ax_device d, ax_backend **out);

/* Like ax_backend_get but for callers that already know the device works
 * (a tensor exists on it): returns NULL only on a programming error. */
ax_backend *ax_backend_of(ax_device d);

/* Waits until every kernel queued on the device has finished. */
int ax_device_synchronize(ax_device d);

/* Number of CUDA devices usable now (0 when CUDA is absent or not built). */
int ax_cuda_device_count(void);

/* Sets the thread count used by the CPU kernels (OpenMP and OpenBLAS).
 * n <= 0 selects the number of online cores. */
void ax_cpu_set_threads(int n);
int ax_cpu_threads(void);

#ifdef __cplusplus
}
#endif
#endif
