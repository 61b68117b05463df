/* What the CPU's bf16 casts and GEMM fallback (cpu_bf16.c) share with the
 * AVX512-BF16 GEMM (cpu_bf16_gemm.c): the addressing of an operand that is
 * f32 or bf16, and the AVX-512 form of kernels/bf16.h's f32 -> bf16
 * rounding, so that both give ax_bf16_from_f32's bits. The rounding only on
 * x86-64 under GCC or Clang (AXI_BF16_X86 is 1 there, else 0). */
#ifndef AX_CPU_BF16_X86_IMPL_H
#define AX_CPU_BF16_X86_IMPL_H

/* x advanced by off elements, f32 (f32 != 0) or bf16. */
static inline const void *axi_bf16_elem_at(const void *x, int f32, long off) {
  return (const char *)x + off * (f32 ? 4 : 2);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define AXI_BF16_X86 1

/* 16 f32 bit patterns u, each rounded to bf16 as ax_bf16_from_f32 rounds
 * (nearest even, a NaN kept a quiet NaN): the bf16 value is the upper half
 * of its lane; the lower half is left over and must be dropped (shift,
 * mask or pick the odd 16-bit words). */
__attribute__((target("avx512f"), always_inline)) static inline __m512i
axi_bf16_round_hi512(__m512i u) {
  const __m512i one = _mm512_set1_epi32(1), round = _mm512_set1_epi32(0x7fff);
  const __m512i abs = _mm512_set1_epi32(0x7fffffff);
  const __m512i inf = _mm512_set1_epi32(0x7f800000);
  const __m512i quiet = _mm512_set1_epi32(0x400000);
  __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
  __m512i r = _mm512_add_epi32(
      u,
      _mm512_add_epi32(round, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
  return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, quiet));
}
#else
#define AXI_BF16_X86 0
#endif

#endif
