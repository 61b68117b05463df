/* A thin layer over cmocka shared by every test program.
 *
 * Include this instead of <cmocka.h>. Asserts print the axon error name,
 * ax_strerror and the thread's detail message. AX_TEST_MAIN runs the tests
 * and then checks that no tensor handle or storage is left alive. */
#ifndef AX_TEST_HARNESS_H
#define AX_TEST_HARNESS_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka must come after the headers above */
#include <cmocka.h>

#include "axon/models/module.h"
#include "axon/models/net.h"

/* Fails the test unless expr returns AX_OK. */
#define AX_ASSERT_OK(expr)                                                     \
  do {                                                                         \
    int ax_rc_ = (expr);                                                       \
    if (ax_rc_ != 0)                                                           \
      fail_msg("%s -> %s (%s): %s", #expr, ax_errname(ax_rc_),                 \
               ax_strerror(ax_rc_), ax_errmsg());                              \
  } while (0)

/* Fails the test unless expr returns the error code `code`. */
#define AX_ASSERT_ERR(expr, code)                                              \
  do {                                                                         \
    int ax_rc_ = (expr);                                                       \
    if (ax_rc_ != (code))                                                      \
      fail_msg("%s -> %s, expected %s (%s)", #expr, ax_errname(ax_rc_),        \
               ax_errname(code), ax_errmsg());                                 \
  } while (0)

/* Fails unless |a - b| <= atol + rtol * |b|. */
#define AX_ASSERT_CLOSE(a, b, atol, rtol)                                      \
  do {                                                                         \
    double ax_a_ = (a), ax_b_ = (b);                                           \
    if (!(fabs(ax_a_ - ax_b_) <= (atol) + (rtol)*fabs(ax_b_)))                 \
      fail_msg("%s = %.9g, expected %s = %.9g", #a, ax_a_, #b, ax_b_);         \
  } while (0)

/* Runs the group, then asserts zero live tensors/storages. Use as:
 *   int main(void) { const struct CMUnitTest t[] = {...};
 *                    return AX_TEST_MAIN(t); } */
int ax_test_run(const char *name, const struct CMUnitTest *tests, size_t n);
#define AX_TEST_MAIN(tests)                                                    \
  ax_test_run(__FILE__, tests, sizeof(tests) / sizeof((tests)[0]))

/* For test_cuda_* programs: exits 77 (ctest reports "skipped") with a
 * message when no CUDA device is present, else runs like AX_TEST_MAIN. */
int ax_test_run_cuda(const char *name, const struct CMUnitTest *tests,
                     size_t n);
#define AX_CUDA_TEST_MAIN(tests)                                               \
  ax_test_run_cuda(__FILE__, tests, sizeof(tests) / sizeof((tests)[0]))

/* A new CPU f32 tensor of the given shape filled with N(0, scale^2) values
 * from seed. */
ax_tensor *ax_test_randn(uint64_t seed, float scale, int ndim,
                         const int64_t *shape);
/* A new CPU tensor (i32) filled with values uniform in [lo, hi). */
ax_tensor *ax_test_randint(uint64_t seed, int32_t lo, int32_t hi, int ndim,
                           const int64_t *shape);

/* A deterministic BERT mini-batch t of B sequences of T tokens (vocab 50):
 * ids, segments, mask (the last `pad` positions of odd sequences padded);
 * MLM labels (B * T) with most positions ignored (-100); NSP labels (B).
 * New references in *in and *lab; AX_ENOMEM. */
int ax_test_bert_batch(long t, int B, int T, int pad, ax_tlist *in,
                       ax_tlist *lab);
/* A deterministic language-model mini-batch t: B random windows of T + 1
 * tokens below vocab, the inputs {ids i32 (B, T)} their first T, the
 * labels {i32 (B T)} the next token at each position. New references in
 * *in and *lab; AX_ENOMEM. */
int ax_test_lm_batch(long t, int B, int T, int vocab, ax_tlist *in,
                     ax_tlist *lab);
/* Max |a - b| / (atol + rtol |b|) over all elements (<= 1 means close). */
double ax_test_close_ratio(const float *a, const float *b, size_t n,
                           double atol, double rtol);

/* Test files. ax_test_mkdtemp makes a new directory /tmp/axon-TAG-XXXXXX
 * and writes its path into dir (at least 64 bytes); ax_test_rmtree removes
 * a directory and everything in it. ax_test_write_file writes n bytes to
 * dir/name, gzip-compressed when gz, and returns the path (a static buffer,
 * valid until its next call). Failures fail the test. */
void ax_test_mkdtemp(char *dir, const char *tag);
void ax_test_rmtree(const char *dir);
const char *ax_test_write_file(const char *dir, const char *name, const void *p,
                               size_t n, int gz);

/* Finite-difference gradient check of module `m` (takes ownership).
 *
 * Builds an ax_net on the CPU (seed 7), runs a training-mode forward with
 * dropout seed 99 on `inputs` (borrowed), uses loss = sum_i <out_i, R_i>
 * with fixed random R_i, runs backward, and compares analytic gradients with
 * central differences (step eps, in f32) on up to `samples` randomly chosen
 * coordinates of (a) the parameters and (b) every f32 input whose bit is set
 * in input_mask. Running statistics are not updated during the probes.
 * A coordinate passes when |analytic - numeric| <= atol + rtol * |numeric|.
 * Fails the test (with the worst coordinate) otherwise. */
void ax_test_gradcheck(ax_module *m, const ax_tlist *inputs,
                       unsigned input_mask, int samples, double eps,
                       double atol, double rtol);
/* The same check with the net, the inputs (copied from the CPU tensors
 * given) and every probe on device dev. */
void ax_test_gradcheck_on(ax_device dev, ax_module *m, const ax_tlist *inputs,
                          unsigned input_mask, int samples, double eps,
                          double atol, double rtol);
/* The same check of the split backward: the analytic input gradients come
 * from ax_backward_input alone, the parameter gradients from
 * ax_backward_weight alone. Also fails when the input half writes any
 * parameter gradient or when the slot still holds tensors after the
 * weight half. */
void ax_test_gradcheck_split(ax_module *m, const ax_tlist *inputs,
                             unsigned input_mask, int samples, double eps,
                             double atol, double rtol);

#endif
