/* Elementwise math that the CPU kernels' loops share, written without
 * library calls so that the loops around them vectorise (each call site's
 * loop is cloned for x86-64-v4 through AXI_CPU_CLONES). Internal to
 * kernels/cpu/. */
#ifndef AX_CPU_MATH_IMPL_H
#define AX_CPU_MATH_IMPL_H

#include <stdint.h>
#include <string.h>

/* exp(x) for x <= 0 (a value minus its row's maximum or log-sum-exp),
 * within 2 ulp: x = n ln2 + r with |r| <= ln2 / 2, e^r by Cephes'
 * polynomial, 2^n through the exponent bits. x is first raised to -87 (so
 * the result is 1.6e-38 there, not less, far below what a softmax sum can
 * see); the clamp compares the bit patterns as unsigned integers, which
 * grow with the magnitude below zero (a float max would keep the loop from
 * vectorising; so would a condition joined by ||, hence two selects),
 * and leaves a NaN of either sign a NaN. x a few ulp above
 * 0, as rounding can give, is fine. */
static inline float axi_exp_nonpos(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  const uint32_t lo = u < 0xc2ae0000u ? u : 0xc2ae0000u; /* -87.0f */
  u = u > 0xff800000u ? u : lo; /* NaNs with the sign bit set */
  float xc;
  memcpy(&xc, &u, sizeof xc);
  int n = (int)(xc * 1.44269504f - 0.5f); /* round to nearest for xc <= 0 */
  float r = xc - (float)n * 0.693359375f + (float)n * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  uint32_t bits = (uint32_t)(n + 127) << 23;
  float two_n;
  memcpy(&two_n, &bits, sizeof two_n);
  return y * two_n;
}

/* Phi(x), the standard normal CDF, as 0.5 erfc(-x / sqrt 2) with erfc(a)
 * for a >= 0 as t exp(-a^2 + P(t)), t = 1 / (1 + a / 2) (Numerical
 * Recipes' erfcc, relative error under 1.2e-7 for every a): so Phi keeps
 * its relative accuracy (about 3e-7 with the exp's) in both tails, where
 * 0.5 (1 + erf(x / sqrt 2)) loses it below 0. Below x = -13.2 it is the
 * exp's floor times t / 2, under 1e-39, not 0. A NaN stays a NaN. */
static inline float axi_normal_cdf(float x) {
  const float u = x * 0.70710678118654752f;
  const float a = u < 0.0f ? -u : u;
  const float t = 1.0f / (1.0f + 0.5f * a);
  float q = 0.17087277f;
  q = q * t - 0.82215223f;
  q = q * t + 1.48851587f;
  q = q * t - 1.13520398f;
  q = q * t + 0.27886807f;
  q = q * t - 0.18628806f;
  q = q * t + 0.09678418f;
  q = q * t + 0.37409196f;
  q = q * t + 1.00002368f;
  q = q * t - 1.26551223f;
  const float half_erfc = 0.5f * t * axi_exp_nonpos(q - a * a);
  return u > 0.0f ? 1.0f - half_erfc : half_erfc;
}

#endif
