/* Deterministic random numbers (xoshiro256**), seeded with splitmix64. The
 * same seed gives the same stream on every machine. Not thread-safe: one
 * generator per thread or per purpose. */
#ifndef AX_RNG_H
#define AX_RNG_H

#include <stdint.h>

typedef struct ax_rng {
  uint64_t s[4];
} ax_rng;

void ax_rng_seed(ax_rng *r, uint64_t seed);
/* A generator for a sub-purpose: seed and stream (e.g. model seed and block
 * index) give independent, reproducible streams. */
void ax_rng_seed2(ax_rng *r, uint64_t seed, uint64_t stream);
uint64_t ax_rng_u64(ax_rng *r);
/* Uniform in [0, 1). */
double ax_rng_uniform(ax_rng *r);
/* Uniform integer in [0, n); n > 0. */
uint64_t ax_rng_below(ax_rng *r, uint64_t n);
/* Standard normal (Box-Muller). */
double ax_rng_normal(ax_rng *r);
/* Fisher-Yates shuffle of n int32 values. */
void ax_rng_shuffle_i32(ax_rng *r, int32_t *v, int64_t n);

#endif
