#include "cpu/int8_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace kiln::cpu {

namespace {

std::atomic<int> forced_isa{-1};

// Four rows of 32 bytes become 32 columns of 4 bytes (each column's four rows side by side),
// with the sign bit flipped: int8 b becomes the unsigned byte b + 128.
__attribute__((target("avx2"))) void interleave_rows(const int8_t* r0, const int8_t* r1, const int8_t* r2,
                                                     const int8_t* r3, uint8_t* dst) {
  const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0));
  const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1));
  const __m256i a2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r2));
  const __m256i a3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r3));
  // Within each 128-bit lane: pairs of rows 0-1 and 2-3, then quads.
  const __m256i lo01 = _mm256_unpacklo_epi8(a0, a1), hi01 = _mm256_unpackhi_epi8(a0, a1);
  const __m256i lo23 = _mm256_unpacklo_epi8(a2, a3), hi23 = _mm256_unpackhi_epi8(a2, a3);
  const __m256i q0 = _mm256_unpacklo_epi16(lo01, lo23);  // columns 0-3 | 16-19
  const __m256i q1 = _mm256_unpackhi_epi16(lo01, lo23);  // columns 4-7 | 20-23
  const __m256i q2 = _mm256_unpacklo_epi16(hi01, hi23);  // columns 8-11 | 24-27
  const __m256i q3 = _mm256_unpackhi_epi16(hi01, hi23);  // columns 12-15 | 28-31
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256i* out = reinterpret_cast<__m256i*>(dst);
  _mm256_storeu_si256(out + 0, _mm256_xor_si256(_mm256_permute2x128_si256(q0, q1, 0x20), flip));
  _mm256_storeu_si256(out + 1, _mm256_xor_si256(_mm256_permute2x128_si256(q2, q3, 0x20), flip));
  _mm256_storeu_si256(out + 2, _mm256_xor_si256(_mm256_permute2x128_si256(q0, q1, 0x31), flip));
  _mm256_storeu_si256(out + 3, _mm256_xor_si256(_mm256_permute2x128_si256(q2, q3, 0x31), flip));
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) void tile_vnni(const int8_t* a, const int32_t* shift,
                                                                       int64_t k4, const uint8_t* b, int32_t* c) {
  __m512i acc[kInt8GemmRows][2];
  for (int r = 0; r < kInt8GemmRows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
  const int32_t* a32 = reinterpret_cast<const int32_t*>(a);
  for (int64_t q = 0; q < k4 / 4; ++q) {
    const __m512i b0 = _mm512_loadu_si512(b + q * 128);
    const __m512i b1 = _mm512_loadu_si512(b + q * 128 + 64);
    const int32_t* aq = a32 + q * kInt8GemmRows;
    for (int r = 0; r < kInt8GemmRows; ++r) {
      const __m512i w = _mm512_set1_epi32(aq[r]);
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], b0, w);
      acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], b1, w);
    }
  }
  for (int r = 0; r < kInt8GemmRows; ++r) {
    const __m512i s = _mm512_set1_epi32(shift[r]);
    _mm512_storeu_si512(c + r * kInt8GemmCols, _mm512_sub_epi32(acc[r][0], s));
    _mm512_storeu_si512(c + r * kInt8GemmCols + 16, _mm512_sub_epi32(acc[r][1], s));
  }
}

}  // namespace

const char* int8_gemm_isa_name(Int8GemmIsa isa) {
  return isa == Int8GemmIsa::kAvx512Vnni ? "avx512-vnni" : "none";
}

Int8GemmIsa int8_gemm_best_isa() {
  static const Int8GemmIsa best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx2"))
      return Int8GemmIsa::kAvx512Vnni;
    return Int8GemmIsa::kNone;
  }();
  return best;
}

Int8GemmIsa int8_gemm_isa() {
  const int f = forced_isa.load();
  const Int8GemmIsa best = int8_gemm_best_isa();
  if (f < 0) return best;
  return static_cast<Int8GemmIsa>(std::min(f, static_cast<int>(best)));
}

void int8_gemm_force_isa(Int8GemmIsa isa) { forced_isa = static_cast<int>(isa); }
void int8_gemm_reset_isa() { forced_isa = -1; }

Int8PackedA int8_pack_a(const int8_t* a, int64_t m, int64_t k, int64_t lda) {
  Int8PackedA p;
  p.m = m;
  p.k = k;
  p.k4 = int8_gemm_round_k(k);
  const int64_t panels = p.panel_count();
  p.panels.assign(static_cast<size_t>(panels * p.k4 * kInt8GemmRows), 0);
  p.shift.assign(static_cast<size_t>(panels * kInt8GemmRows), 0);
  for (int64_t row = 0; row < m; ++row) {
    int8_t* panel = p.panels.data() + (row / kInt8GemmRows) * p.k4 * kInt8GemmRows;
    const int64_t r = row % kInt8GemmRows;
    int32_t sum = 0;
    for (int64_t i = 0; i < k; ++i) {
      const int8_t v = a[row * lda + i];
      panel[(i / 4) * kInt8GemmRows * 4 + r * 4 + i % 4] = v;
      sum += v;
    }
    p.shift[static_cast<size_t>(row)] = 128 * sum;
  }
  return p;
}

void int8_pack_b_panel(const int8_t* b, int64_t ldb, int64_t k, int64_t n0, int64_t cols, uint8_t* dst) {
  alignas(64) int8_t tail[4][kInt8GemmCols];
  static const int8_t zeros[kInt8GemmCols] = {};
  const int64_t k4 = int8_gemm_round_k(k);
  for (int64_t q = 0; q < k4; q += 4) {
    const int8_t* rows[4];
    for (int i = 0; i < 4; ++i) {
      const int64_t row = q + i;
      if (row >= k) {
        rows[i] = zeros;  // A is 0 there: any value gives 0
      } else if (cols == kInt8GemmCols) {
        rows[i] = b + row * ldb + n0;
      } else {
        std::memcpy(tail[i], b + row * ldb + n0, static_cast<size_t>(cols));
        std::memset(tail[i] + cols, 0, static_cast<size_t>(kInt8GemmCols - cols));
        rows[i] = tail[i];
      }
    }
    interleave_rows(rows[0], rows[1], rows[2], rows[3], dst + q * kInt8GemmCols);
  }
}

void int8_tile(const Int8PackedA& a, int64_t a_panel, const uint8_t* b_panel, int32_t* c) {
  tile_vnni(a.panel(a_panel), a.shift.data() + a_panel * kInt8GemmRows, a.k4, b_panel, c);
}

}  // namespace kiln::cpu
