#include "axon/kernels/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void ax_rng_seed(ax_rng *r, uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++)
    r->s[i] = splitmix64(&x);
}

void ax_rng_seed2(ax_rng *r, uint64_t seed, uint64_t stream) {
  uint64_t x = seed ^ (stream * 0xd1b54a32d192ed03ull + 0x632be59bd9b4e019ull);
  ax_rng_seed(r, splitmix64(&x));
}

static inline uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

uint64_t ax_rng_u64(ax_rng *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double ax_rng_uniform(ax_rng *r) {
  return (double)(ax_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
}

uint64_t ax_rng_below(ax_rng *r, uint64_t n) {
  /* Lemire's nearly divisionless method would do; modulo bias is < 2^-40
   * for the sizes used here. */
  return ax_rng_u64(r) % n;
}

double ax_rng_normal(ax_rng *r) {
  double u1 = ax_rng_uniform(r), u2 = ax_rng_uniform(r);
  if (u1 < 1e-300)
    u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void ax_rng_shuffle_i32(ax_rng *r, int32_t *v, int64_t n) {
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)ax_rng_below(r, (uint64_t)i + 1);
    int32_t t = v[i];
    v[i] = v[j];
    v[j] = t;
  }
}
