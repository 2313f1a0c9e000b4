// e^x for 8 (AVX2) or 16 (AVX-512) floats at a time, for the softmax of attention and the sigmoid-shaped
// activations of the GEMM epilogue, where libm's expf takes one value at a time; sigmoid and tanh
// of 16 for the epilogue and the recurrent layers' gates.
#pragma once

#include <immintrin.h>

#include <climits>

namespace kiln::cpu {

// x = n ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two parts, so r is exact), e^r by its Taylor
// polynomial of degree 7 (truncation below 1e-8), times 2^n through the exponent bits. Within
// 3 ulp of std::exp over [-87, 88.3]; below, 0 (e^-87 is 1.6e-38, near float32's smallest
// normal: smaller results would be denormals, which the CPU computes in slow microcode, and a
// padding mask of -3.4e38 sends a quarter of BERT's keys there); above, +inf (2^n must stay
// below 2^128, and e^88.8 overflows float32 anyway). NaN stays NaN.
inline __m256 exp8(__m256 x) {
  const __m256 floor = _mm256_set1_ps(-87.f), ceiling = _mm256_set1_ps(88.3f);
  const __m256 below = _mm256_cmp_ps(x, floor, _CMP_LT_OQ), above = _mm256_cmp_ps(x, ceiling, _CMP_GT_OQ);
  x = _mm256_min_ps(ceiling, _mm256_max_ps(floor, x));  // min(c, NaN) and max(c, NaN) are NaN
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723212e-6f), r);
  __m256 p = _mm256_set1_ps(1.f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 e = _mm256_andnot_ps(below, _mm256_mul_ps(p, _mm256_castsi256_ps(scale)));
  return _mm256_blendv_ps(e, _mm256_set1_ps(__builtin_inff()), above);
}

// exp8's steps on 16 floats (AVX-512F): the same operations, so the same values.
__attribute__((target("avx512f"))) inline __m512 exp16(__m512 x) {
  const __m512 floor = _mm512_set1_ps(-87.f), ceiling = _mm512_set1_ps(88.3f);
  const __mmask16 below = _mm512_cmp_ps_mask(x, floor, _CMP_LT_OQ), above = _mm512_cmp_ps_mask(x, ceiling, _CMP_GT_OQ);
  x = _mm512_min_ps(ceiling, _mm512_max_ps(floor, x));  // min(c, NaN) and max(c, NaN) are NaN
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  const __m512i scale = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 e = _mm512_maskz_mul_ps(static_cast<__mmask16>(~below), p, _mm512_castsi512_ps(scale));
  return _mm512_mask_blend_ps(above, e, _mm512_set1_ps(__builtin_inff()));
}

// 1 / d on AVX-512 by vrcp14ps and a Newton step (within 2 ulp) instead of a division, whose
// throughput bounds Sigmoid and SiLU otherwise; d = +inf (e^-x overflowed) gives 0 as the
// division does.
__attribute__((target("avx512f"))) inline __m512 reciprocal16(__m512 d) {
  const __m512 r = _mm512_rcp14_ps(d);
  const __m512 refined = _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.f)), r);
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(d, _mm512_set1_ps(__builtin_inff()), _CMP_EQ_OQ), refined,
                              _mm512_setzero_ps());
}

// 1 / (1 + e^-x), 16 at a time.
__attribute__((target("avx512f"))) inline __m512 sigmoid16(__m512 x) {
  const __m512 minus_x = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)));
  return reciprocal16(_mm512_add_ps(_mm512_set1_ps(1.f), exp16(minus_x)));
}

// tanh of 16 floats: x (1 + x^2 P(x^2)) (Taylor to x^9) below |x| = 0.25, where 1 - 2 / (e^2|x| + 1)
// would cancel, that form above it, the sign restored; within a few ulp of std::tanh.
__attribute__((target("avx512f"))) inline __m512 tanh16(__m512 x) {
  const __m512 a = _mm512_abs_ps(x);
  const __m512 x2 = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(62.f / 2835);
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-17.f / 315));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.f / 15));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1.f / 3));
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 small = _mm512_mul_ps(x, _mm512_fmadd_ps(p, x2, one));  // x (1 + x^2 P): -0 stays -0
  const __m512 e = exp16(_mm512_add_ps(a, a));  // +inf past 44: 2 / inf = 0, tanh = 1
  const __m512 large = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.f), _mm512_add_ps(e, one)));
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
  const __m512 signed_large = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(large), sign));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(0.25f), _CMP_LT_OQ), signed_large, small);
}

}  // namespace kiln::cpu
