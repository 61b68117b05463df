/* Shared helpers of the libFuzzer harnesses (tests/fuzz/fuzz_*.c).
 *
 * A harness that needs a node without its transports gets a bare one from
 * fuzz_node_new: the struct a real node has (rpc/node-impl.h), its options
 * from ax_node_opts_init, its locks initialised, and nothing started (no
 * gRPC server, no bulk listener, no worker threads), so that the parsers
 * under test run their real code and nothing leaves the process. */
#ifndef AX_FUZZ_COMMON_H
#define AX_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "axon/rpc/node-impl.h"

/* The shared secret of the harnesses' authenticated mode and the fixed
 * challenge they answer to (tests/fuzz/fuzz_seeds.c writes seeds with it). */
#define FUZZ_TOKEN "axon-fuzz-token-0123456789abcdef"

/* A bare node named `name`, master of a world of `world` (rank `rank`),
 * with the shared secret FUZZ_TOKEN when `auth` is set. Aborts on no
 * memory. */
ax_node *fuzz_node_new(const char *name, int world, int rank, int auth);
/* Frees everything fuzz_node_new and the code under test attached to n
 * (peers, functions, rendezvous state, member names). */
void fuzz_node_free(ax_node *n);

/* A cursor over the fuzzer's bytes: reads past the end give zeros. */
typedef struct fuzz_in {
  const uint8_t *p;
  size_t n, off;
} fuzz_in;

uint8_t fuzz_u8(fuzz_in *in);
uint32_t fuzz_u32(fuzz_in *in);
/* Lends up to want bytes (fewer at the end); *got says how many. */
const uint8_t *fuzz_bytes(fuzz_in *in, size_t want, size_t *got);

/* 1 if a and b hold the same values: types, numbers (bit for bit),
 * strings, bytes, tensor dtypes, shapes and bytes. Extension values
 * compare by kind only. */
int fuzz_values_equal(const ax_values *a, const ax_values *b);

/* Aborts with a message when an invariant of the code under test fails
 * (the fuzzer records the input as a crash). */
#define FUZZ_CHECK(cond)                                                       \
  do {                                                                         \
    if (!(cond))                                                               \
      fuzz_fail(__FILE__, __LINE__, #cond);                                    \
  } while (0)
void fuzz_fail(const char *file, int line, const char *what);

#endif
