// Probe: does HardSwish computed with x / 6 as one multiply-add of two parts of 1/6 (the CPU
// engine's vector forms, src/cpu/gemm_util.cc) give the division's bits for every float?
//
//     g++ -O2 -mavx512f -mfma bench/probes/hardswish_sixth.cc -o /tmp/hardswish_sixth && /tmp/hardswish_sixth
//
// Runs all 2^32 bit patterns, 16 at a time (a few seconds), and prints how many HardSwish results
// and how many quotients differ (NaN inputs left out: both forms multiply them by 0) and the
// largest exponent field among the differing quotients.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

int main() {
  const __m512 high = _mm512_set1_ps(0x1.555554p-3f), low = _mm512_set1_ps(0x1.555556p-27f);
  const __m512 six = _mm512_set1_ps(6.f), half = _mm512_set1_ps(0.5f), zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.f);
  uint64_t hardswish_differ = 0, quotient_differ = 0;
  uint32_t largest_exponent = 0;
  alignas(64) uint32_t bits[16];
  for (uint64_t base = 0; base < (uint64_t{1} << 32); base += 16) {
    for (int j = 0; j < 16; ++j) bits[j] = static_cast<uint32_t>(base + j);
    const __m512 x = _mm512_castsi512_ps(_mm512_load_si512(bits));
    const __m512 divided = _mm512_div_ps(x, six), multiplied = _mm512_fmadd_ps(x, high, _mm512_mul_ps(x, low));
    auto hardswish = [&](__m512 q) { return _mm512_mul_ps(x, _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(q, half), zero), one)); };
    const __mmask16 numbers = static_cast<__mmask16>(~_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q));
    const __mmask16 h = _mm512_cmpneq_epi32_mask(_mm512_castps_si512(hardswish(divided)), _mm512_castps_si512(hardswish(multiplied))) & numbers;
    const __mmask16 q = _mm512_cmpneq_epi32_mask(_mm512_castps_si512(divided), _mm512_castps_si512(multiplied)) & numbers;
    hardswish_differ += static_cast<uint64_t>(__builtin_popcount(h));
    quotient_differ += static_cast<uint64_t>(__builtin_popcount(q));
    for (int j = 0; j < 16; ++j)
      if ((q >> j) & 1) largest_exponent = std::max(largest_exponent, (bits[j] >> 23) & 0xFFu);
  }
  std::printf("HardSwish results that differ: %llu; quotients that differ: %llu (largest exponent field %u)\n",
              static_cast<unsigned long long>(hardswish_differ), static_cast<unsigned long long>(quotient_differ), largest_exponent);
  return hardswish_differ == 0 ? 0 : 1;
}
