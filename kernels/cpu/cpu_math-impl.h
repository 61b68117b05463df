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
 * vectorising), and leaves a NaN of either sign a NaN. x a few ulp above
 * 0, as rounding can give, is fine. */
static inline float axi_exp_nonpos(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  u = u < 0xc2ae0000u || u > 0xff800000u ? u : 0xc2ae0000u; /* -87.0f */
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

#endif
