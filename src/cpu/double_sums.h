// Sums of float rows in double on AVX-512, 8 floats a step into four accumulators: one chain of
// double additions takes 4 cycles an element (BERT-base's LayerNorms, rows of 768, ran at about
// 3 GB/s that way; docs/design/cpu-gemm.md, "Transformers on the CPU"). The partial sums change
// the order of the additions, not their precision. Callers check for AVX-512 first.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace kiln::cpu {

// Floats [i, i + 8) of x[0, n) widened to double; those past n read 0. Whole groups of 8 load
// unmasked: a masked load takes nothing from a store still in flight and waits for it to reach
// the cache (attention's softmax reads each row right after writing it).
__attribute__((target("avx512f"), always_inline)) inline __m512d load8_as_double(const float* x, int64_t i, int64_t n) {
  if (i + 8 <= n) return _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
  const __mmask16 lanes = static_cast<__mmask16>((1u << std::clamp<int64_t>(n - i, 0, 8)) - 1);
  return _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_maskz_loadu_ps(lanes, x + i)));
}

// The sum of x[0, n) in double.
__attribute__((target("avx512f"))) inline double row_sum_avx512(const float* x, int64_t n) {
  __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
  for (int64_t i = 0; i < n; i += 32)
    for (int q = 0; q < 4; ++q) acc[q] = _mm512_add_pd(acc[q], load8_as_double(x, i + 8 * q, n));
  return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(acc[0], acc[1]), _mm512_add_pd(acc[2], acc[3])));
}

}  // namespace kiln::cpu
