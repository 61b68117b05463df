/* Helpers shared by the CUDA parity tests (test_cuda_blas, _elem, _dnn,
 * _nlp): the two backends, device copies, random host data and the
 * GPU-versus-CPU comparisons. Every helper fails the running cmocka test
 * (it does not return) when something it needs goes wrong. */
#ifndef AX_CUDA_TESTUTIL_H
#define AX_CUDA_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "axon/kernels/backend-impl.h"

/* The CPU backend. */
ax_backend *ct_cpu(void);
/* The backend of cuda:0; asserts that it can be had. */
ax_backend *ct_gpu(void);

/* A new device buffer of `bytes` bytes (4 when bytes is 0, so that the
 * pointer is never NULL), a copy of `host` unless host is NULL (then left
 * uninitialised). Asserts the allocation and the copy. Free with ct_free. */
void *ct_up(const void *host, size_t bytes);
/* Synchronises cuda:0, then copies `bytes` bytes of `dev` to `host`. */
void ct_down(void *host, const void *dev, size_t bytes);
/* Returns a buffer from ct_up (or NULL) to cuda:0's allocator. */
void ct_free(void *dev);

/* n floats scale * N(0, 1) from ax_rng seeded with `seed` (the same values
 * for the same seed at any n), malloc'd with one spare float so that n = 0
 * gives a non-NULL pointer; caller frees. */
float *ct_randn(uint64_t seed, size_t n, float scale);

/* Fails with `what` and the worst ratio unless every
 * |got[i] - ref[i]| <= atol + rtol * |ref[i]| (NaN fails; see
 * ax_test_close_ratio). Both arrays on the host. */
void ct_expect_close(const char *what, const float *got, const float *ref,
                     size_t n, double atol, double rtol);
/* ct_expect_close of n floats of device memory `dev` against host `ref`. */
void ct_check(const char *what, const void *dev, const float *ref, size_t n,
              double atol, double rtol);
/* Fails with `what` unless `bytes` bytes at device `dev` equal host `ref`. */
void ct_check_exact(const char *what, const void *dev, const void *ref,
                    size_t bytes);

#endif
