#include "cpu/int8_gemm.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "cpu/amx.h"

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

__attribute__((target("avx512f,avx512bw,avx512vnni"))) void tile_vnni(const int8_t* a, int64_t k_padded,
                                                                       const uint8_t* b, int32_t* c) {
  constexpr int kRows = 8;
  __m512i acc[kRows][2];
  for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
  for (int64_t q = 0; q < k_padded / 4; ++q) {
    const __m512i b0 = _mm512_loadu_si512(b + q * 128);
    const __m512i b1 = _mm512_loadu_si512(b + q * 128 + 64);
    const int8_t* aq = a + q * kRows * 4;
    for (int r = 0; r < kRows; ++r) {
      int32_t four;  // row r's four bytes of this step (memcpy: the panel is int8 storage)
      std::memcpy(&four, aq + r * 4, 4);
      const __m512i w = _mm512_set1_epi32(four);
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], b0, w);
      acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], b1, w);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    _mm512_storeu_si512(c + r * kInt8GemmCols, acc[r][0]);
    _mm512_storeu_si512(c + r * kInt8GemmCols + 16, acc[r][1]);
  }
}

// The VNNI kernel's tile on ymm registers, for CPUs without AVX-512: four forms of the step
// that adds four products of an unsigned byte b and a signed byte w to an int32 lane.
//
// Without VNNI, summed exactly: vpmaddubsw would add pairs of products into int16 and saturate
// (2 * 255 * 128 > 2^15). Two exact forms, on (u, v) made from b:
// - kSplit, any A: b split as (b & 127) + 128 * (b >> 7), u = b & 127, v = b >> 7: the pairs of
//   u * w stay inside int16 (2 * 127 * 128 < 2^15), as do those of v * w, and vpmaddwd adds each
//   pair of pairs into int32, the second times 128.
// - kSymmetric, A without -128 (as kiln's calibration makes weights): with x = b - 128 (the
//   input's own int8 value), each product is |x| * (w * sign(x)), an unsigned byte of at most 128
//   by a signed one of at most 127 in magnitude, whose pairs stay inside int16
//   (2 * 128 * 127 < 2^15); u = |x|, v = x: one vpsignb, one vpmaddubsw and one vpmaddwd a step.
//   The sums are of A x; adding row r's shift (128 sum A) at the store gives sums of A (x + 128),
//   as the other kernels' tiles hold.
// With vpdpbusd on ymm, one instruction a step. AVX-VNNI CPUs (Alder Lake and later clients,
// Sierra Forest) have it in the VEX encoding only (kVnniVex); AVX-512 VNNI CPUs in the EVEX
// encoding only (kVnniEvex), which is how a CPU without AVX-VNNI runs (and tests) that kernel.
enum class YmmStep { kSplit, kSymmetric, kVnniVex, kVnniEvex };

template <YmmStep kStep>
__attribute__((target("avx2"), always_inline)) inline void step_operands(__m256i b, __m256i& u, __m256i& v) {
  if constexpr (kStep == YmmStep::kSymmetric) {
    v = _mm256_xor_si256(b, _mm256_set1_epi8(static_cast<char>(0x80)));
    u = _mm256_abs_epi8(v);  // -128 reads as the unsigned 128
  } else if constexpr (kStep == YmmStep::kSplit) {
    u = _mm256_and_si256(b, _mm256_set1_epi8(0x7F));
    v = _mm256_and_si256(_mm256_srli_epi16(b, 7), _mm256_set1_epi8(1));
  } else {
    u = v = b;
  }
}

// acc plus, per 32-bit lane (a column), the sum of its four products with w's four bytes. The
// vpdpbusd forms are written out because the two intrinsics need different target attributes,
// which a template parameter cannot choose; "x" operands are ymm0-15, which both encodings reach.
template <YmmStep kStep>
__attribute__((target("avx2"), always_inline)) inline __m256i add_four_products(__m256i acc, __m256i u, __m256i v,
                                                                                __m256i w) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (kStep == YmmStep::kSymmetric) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(w, v)), ones));
  } else if constexpr (kStep == YmmStep::kSplit) {
    return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(u, w), ones),
                                                  _mm256_madd_epi16(_mm256_maddubs_epi16(v, w), _mm256_set1_epi16(128))));
  } else if constexpr (kStep == YmmStep::kVnniVex) {
    asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(w));
    return acc;
  } else {
    asm("%{evex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(w));
    return acc;
  }
}

// 16 ymm registers hold a quarter of the 8 x 32 tile's sums with their operands, so each quarter
// (4 rows, 16 columns) is one pass over K. shift: the panel's rows' (kSymmetric only).
template <YmmStep kStep>
__attribute__((target("avx2"))) void tile_ymm(const int8_t* a, int64_t k_padded, const uint8_t* b, const int32_t* shift,
                                            int32_t* c) {
  constexpr int kRows = 8, kPassRows = 4;
  for (int half = 0; half < 2; ++half)
    for (int r0 = 0; r0 < kRows; r0 += kPassRows) {
      __m256i acc[kPassRows][2];
      for (int r = 0; r < kPassRows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
      for (int64_t q = 0; q < k_padded / 4; ++q) {
        // Columns 16 * half .. + 7 and + 8 .. + 15: eight columns of four bytes per register.
        const uint8_t* bq = b + q * 128 + half * 64;
        __m256i u0, v0, u1, v1;
        step_operands<kStep>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bq)), u0, v0);
        step_operands<kStep>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bq + 32)), u1, v1);
        const int8_t* aq = a + (q * kRows + r0) * 4;
        for (int r = 0; r < kPassRows; ++r) {
          int32_t four;
          std::memcpy(&four, aq + r * 4, 4);
          const __m256i w = _mm256_set1_epi32(four);
          acc[r][0] = add_four_products<kStep>(acc[r][0], u0, v0, w);
          acc[r][1] = add_four_products<kStep>(acc[r][1], u1, v1, w);
        }
      }
      for (int r = 0; r < kPassRows; ++r) {
        const __m256i back = _mm256_set1_epi32(kStep == YmmStep::kSymmetric ? shift[r0 + r] : 0);
        int32_t* row = c + (r0 + r) * kInt8GemmCols + half * 16;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(row), _mm256_add_epi32(acc[r][0], back));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + 8), _mm256_add_epi32(acc[r][1], back));
      }
    }
}

// AVX-VNNI: CPUID leaf 7, subleaf 1, EAX bit 4 (the AVX state is the AVX2 check's).
bool avx_vnni_usable() {
  static const bool usable = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) return false;
    return ((eax >> 4) & 1) != 0 && __builtin_cpu_supports("avx2");
  }();
  return usable;
}

// Tiles (cpu/amx.h) 0-3: the four 16 x 16 quarters of C; 4-5: the two 16-row halves of A's 64
// columns of K; 6-7: the two 16-column halves of B's 64 rows of K.
__attribute__((target("amx-tile,amx-int8"))) void tile_amx(const int8_t* a, int64_t k_padded, const uint8_t* b,
                                                            int32_t* c) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t kb = 0; kb < k_padded / 64; ++kb) {
    _tile_loadd(4, a + kb * 2048, 64);
    _tile_loadd(5, a + kb * 2048 + 1024, 64);
    _tile_loadd(6, b + kb * 16 * 128, 128);
    _tile_loadd(7, b + kb * 16 * 128 + 64, 128);
    _tile_dpbsud(0, 4, 6);
    _tile_dpbsud(1, 4, 7);
    _tile_dpbsud(2, 5, 6);
    _tile_dpbsud(3, 5, 7);
  }
  constexpr int stride = kInt8GemmCols * sizeof(int32_t);
  _tile_stored(0, c, stride);
  _tile_stored(1, c + 16, stride);
  _tile_stored(2, c + 16 * kInt8GemmCols, stride);
  _tile_stored(3, c + 16 * kInt8GemmCols + 16, stride);
}

// AMX needs the CPU's AMX-TILE and AMX-INT8, and Linux's permission to use the tile data.
bool amx_usable() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool tile = (edx >> 24) & 1, int8 = (edx >> 25) & 1;
  return tile && int8 && amx_tile_data_permitted();
}

}  // namespace

const char* int8_gemm_isa_name(Int8GemmIsa isa) {
  switch (isa) {
    case Int8GemmIsa::kAmx: return "amx";
    case Int8GemmIsa::kAvx512Vnni: return "avx512-vnni";
    case Int8GemmIsa::kAvxVnni: return "avx-vnni";
    case Int8GemmIsa::kAvx2: return "avx2";
    case Int8GemmIsa::kNone: break;
  }
  return "none";
}

Int8GemmIsa int8_gemm_best_isa() {
  static const Int8GemmIsa best = [] {
    __builtin_cpu_init();
    const bool vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                      __builtin_cpu_supports("avx2");
    if (vnni) return amx_usable() ? Int8GemmIsa::kAmx : Int8GemmIsa::kAvx512Vnni;
    // The packing and the callers' epilogues need AVX2 and FMA at least.
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return Int8GemmIsa::kNone;
    return avx_vnni_usable() ? Int8GemmIsa::kAvxVnni : Int8GemmIsa::kAvx2;
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

int int8_gemm_tile_rows(Int8GemmIsa isa) { return isa == Int8GemmIsa::kAmx ? 32 : 8; }

int64_t int8_gemm_round_k(Int8GemmIsa isa, int64_t k) {
  const int64_t step = isa == Int8GemmIsa::kAmx ? 64 : 4;
  return (k + step - 1) / step * step;
}

int64_t Int8PackedA::bytes_for(Int8GemmIsa isa, int64_t m, int64_t k) {
  const int64_t rows = int8_gemm_tile_rows(isa);
  return (m + rows - 1) / rows * int8_gemm_round_k(isa, k) * rows;
}

namespace {

// An m x k matrix's packing for `isa`, without its panels yet.
Int8PackedA panels_for(Int8GemmIsa isa, int64_t m, int64_t k) {
  Int8PackedA p;
  p.isa = isa;
  p.m = m;
  p.k = k;
  p.k_padded = int8_gemm_round_k(isa, k);
  p.rows = int8_gemm_tile_rows(isa);
  return p;
}

}  // namespace

Int8PackedA int8_adopt_a(Int8GemmIsa isa, Tensor storage, int64_t offset, int64_t m, int64_t k) {
  if (isa == Int8GemmIsa::kNone || m < 0 || k < 0 || offset < 0 ||
      offset + Int8PackedA::bytes_for(isa, m, k) > static_cast<int64_t>(storage.nbytes()))
    throw Error(ErrorKind::kInvalidArgument, "int8 panels of " + std::to_string(storage.nbytes()) + " bytes from " +
                                                 std::to_string(offset) + " for a " + std::to_string(m) + " x " +
                                                 std::to_string(k) + " matrix");
  Int8PackedA p = panels_for(isa, m, k);
  p.storage = std::move(storage);
  p.offset = offset;
  p.panels = static_cast<const int8_t*>(p.storage.raw()) + offset;
  // Every value of a row's panel (its padding is zeros) adds to the row's sum, whatever the order.
  p.shift.assign(static_cast<size_t>(p.panel_count() * p.rows), 0);
  p.above_int8_min = true;
  for (int64_t pi = 0; pi < p.panel_count(); ++pi) {
    const int8_t* panel = p.panel(pi);
    for (int64_t i = 0; i < p.k_padded * p.rows; ++i) {
      p.above_int8_min &= panel[i] != -128;
      // VNNI [k / 4][rows][4]: row (i / 4) % rows; AMX [k / 64][2][16][64]: row (i / 64) % 32.
      const int64_t r = isa == Int8GemmIsa::kAmx ? (i / 64) % 32 : (i / 4) % p.rows;
      p.shift[static_cast<size_t>(pi * p.rows + r)] += 128 * panel[i];
    }
  }
  return p;
}

Int8PackedA int8_pack_a(Int8GemmIsa isa, const int8_t* a, int64_t m, int64_t k, int64_t lda) {
  Int8PackedA p = panels_for(isa, m, k);
  const int64_t panels = p.panel_count();
  p.storage = Tensor(DType::kInt8, {std::max<int64_t>(1, panels * p.k_padded * p.rows)});  // zeros: the padding
  p.panels = p.storage.data<int8_t>();
  p.shift.assign(static_cast<size_t>(panels * p.rows), 0);
  p.above_int8_min = true;
  for (int64_t row = 0; row < m; ++row) {
    int8_t* panel = p.storage.data<int8_t>() + (row / p.rows) * p.k_padded * p.rows;
    const int64_t r = row % p.rows;
    int32_t sum = 0;
    for (int64_t i = 0; i < k; ++i) {
      const int8_t v = a[row * lda + i];
      panel[int8_panel_offset(isa, p.rows, r, i)] = v;
      sum += v;
      p.above_int8_min &= v != -128;
    }
    p.shift[static_cast<size_t>(row)] = 128 * sum;
  }
  return p;
}

void int8_pack_b_panel(const int8_t* b, int64_t ldb, int64_t k, int64_t k_padded, int64_t n0, int64_t cols,
                       uint8_t* dst) {
  alignas(64) int8_t tail[4][kInt8GemmCols];
  static const int8_t zeros[kInt8GemmCols] = {};
  for (int64_t q = 0; q < k_padded; q += 4) {
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

void int8_pack_b_panel_transposed(const int8_t* bt, int64_t ldbt, int64_t k, int64_t k_padded, int64_t n0,
                                  int64_t cols, uint8_t* dst) {
  const int64_t whole = k / 4;  // steps of K whose four bytes all lie inside the row
  for (int64_t j = 0; j < kInt8GemmCols; ++j) {
    uint8_t* column = dst + j * 4;
    if (j >= cols) {  // a column past the matrix: anything (the caller does not read it)
      for (int64_t q = 0; q < k_padded / 4; ++q) std::memset(column + q * 4 * kInt8GemmCols, 0x80, 4);
      continue;
    }
    const int8_t* row = bt + (n0 + j) * ldbt;
    for (int64_t q = 0; q < whole; ++q) {
      uint32_t word;
      std::memcpy(&word, row + q * 4, 4);
      word ^= 0x80808080u;  // each byte b + 128
      std::memcpy(column + q * 4 * kInt8GemmCols, &word, 4);
    }
    for (int64_t q = whole; q < k_padded / 4; ++q) {  // the partial step, and K's padding
      uint8_t* at = column + q * 4 * kInt8GemmCols;
      for (int64_t i = 0; i < 4; ++i) {
        const int64_t kk = q * 4 + i;
        at[i] = static_cast<uint8_t>((kk < k ? row[kk] : 0) ^ 0x80);
      }
    }
  }
}

void int8_tile(const Int8PackedA& a, int64_t a_panel, const uint8_t* b_panel, int32_t* c) {
  switch (a.isa) {
    case Int8GemmIsa::kAmx: tile_amx(a.panel(a_panel), a.k_padded, b_panel, c); return;
    case Int8GemmIsa::kAvx512Vnni: tile_vnni(a.panel(a_panel), a.k_padded, b_panel, c); return;
    case Int8GemmIsa::kAvxVnni:
      // Chosen only where one encoding runs: AVX-VNNI, or AVX-512 VNNI (a forced lower kernel).
      if (avx_vnni_usable()) tile_ymm<YmmStep::kVnniVex>(a.panel(a_panel), a.k_padded, b_panel, nullptr, c);
      else tile_ymm<YmmStep::kVnniEvex>(a.panel(a_panel), a.k_padded, b_panel, nullptr, c);
      return;
    case Int8GemmIsa::kAvx2:
      if (a.above_int8_min)
        tile_ymm<YmmStep::kSymmetric>(a.panel(a_panel), a.k_padded, b_panel, a.shift.data() + a_panel * a.rows, c);
      else tile_ymm<YmmStep::kSplit>(a.panel(a_panel), a.k_padded, b_panel, nullptr, c);
      return;
    case Int8GemmIsa::kNone: break;
  }
  throw Error(ErrorKind::kInternal, "int8 GEMM tile without a kernel");
}

}  // namespace kiln::cpu
