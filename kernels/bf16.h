/* bfloat16 as uint16_t bit patterns: the upper half of an IEEE f32. A leaf
 * header every layer may include; the conversions are exact inverses on
 * bf16 values (f32 -> bf16 rounds to nearest even, NaN stays a quiet NaN).
 * Under nvcc they are host and device functions, so the CUDA casts
 * (kernels/cuda/) run this very code. */
#ifndef AX_BF16_H
#define AX_BF16_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__CUDACC__)
#define AX_BF16_FN __host__ __device__ static inline
#else
#define AX_BF16_FN static inline
#endif

AX_BF16_FN uint16_t ax_bf16_from_f32(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN */
    return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
  return (uint16_t)(u >> 16);
}

AX_BF16_FN float ax_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* f rounded to the nearest bf16 value, kept as f32. */
AX_BF16_FN float ax_bf16_round(float f) {
  return ax_bf16_to_f32(ax_bf16_from_f32(f));
}

#ifdef __cplusplus
}
#endif
#endif
