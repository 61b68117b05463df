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

/* CUDA ordinals axon can address: cuda:0 .. cuda:(AX_MAX_CUDA_DEVICES-1). */
#define AX_MAX_CUDA_DEVICES 16

/* Parses "cpu", "cuda" (= cuda:0) or "cuda:N". Returns AX_OK or AX_EINVAL. */
int ax_device_parse(const char *s, ax_device *out);

/* Writes "cpu" or "cuda:N" into buf (at least 16 bytes); returns buf. */
char *ax_device_str(ax_device d, char *buf, size_t len);

int ax_device_eq(ax_device a, ax_device b);

/* AX_OK when d exists on this machine (the CPU always does; cuda:N when
 * N < ax_cuda_device_count()), else AX_ENODEV naming d. Touches the CUDA
 * runtime only for a CUDA device. */
int ax_device_check(ax_device d);

/* ---- device maps ----------------------------------------------------------
 * Where a tensor received from another node lands, by the device the sender
 * had it on (PyTorch's RPC device maps, kept by the receiver). Text form:
 *   SRC=DST[,SRC=DST...]      e.g. "cuda:0=cpu,cpu=cuda:1"
 * SRC and DST are ax_device_parse names (cpu, cuda, cuda:N); ':' may stand
 * for '=' ("cuda:0:cpu,cpu:cuda:1" is the same map: a device name ends
 * before a ':' that is not followed by a digit). No spaces; each SRC at
 * most once; "" is the empty map. A sender device that is not listed lands
 * on the node's own device (ax_node_opts.device). */
typedef struct ax_device_map {
  int n;
  ax_device src[AX_MAX_CUDA_DEVICES + 1];
  ax_device dst[AX_MAX_CUDA_DEVICES + 1];
} ax_device_map;

/* Parses the text form into *out (NULL or "" gives the empty map). AX_EINVAL
 * with a message naming the bad entry; *out is then empty. Only the syntax
 * is checked here: see ax_device_map_check for the local devices. */
int ax_device_map_parse(const char *s, ax_device_map *out);
/* AX_OK when every DST exists here (ax_device_check), else AX_ENODEV naming
 * the entry. SRC devices are the senders' and are not checked. */
int ax_device_map_check(const ax_device_map *m);
/* The device a tensor the sender had on src lands on: the mapped device,
 * or dflt when src is not listed (or m is NULL). */
ax_device ax_device_map_lookup(const ax_device_map *m, ax_device src,
                               ax_device dflt);
/* The text form ("SRC=DST,..."; "" when empty) into buf; returns buf. */
char *ax_device_map_str(const ax_device_map *m, char *buf, size_t len);

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
