#include "cpu/bf16_gemm.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "cpu/amx.h"
#include "cpu/gemm_util.h"
#include "cpu/parallel.h"

namespace kiln::cpu {

namespace {

std::atomic<int> forced_isa{-1};

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void round_avx512(const float* x, int64_t n,
                                                                                 uint16_t* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<const __m256i&>(v));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i));
    _mm256_mask_storeu_epi16(dst + i, m, reinterpret_cast<const __m256i&>(v));
  }
}

// One pair of W's rows (r1 null: zeros, K's padding) over `cols` <= 32 columns of a panel:
// each column's two values rounded and side by side, 64 values at dst.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void pack_pair(const float* r0, const float* r1,
                                                                              int64_t cols, uint16_t* dst) {
  for (int half = 0; half < 2; ++half) {
    const int64_t n = std::clamp<int64_t>(cols - 16 * half, 0, 16);
    const __mmask16 m = static_cast<__mmask16>(n >= 16 ? 0xffff : (1u << n) - 1);
    const __m256bh a = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, r0 + 16 * half));
    const __m256bh b = _mm512_cvtneps_pbh(r1 ? _mm512_maskz_loadu_ps(m, r1 + 16 * half) : _mm512_setzero_ps());
    const __m512i lo = _mm512_cvtepu16_epi32(reinterpret_cast<const __m256i&>(a));
    const __m512i hi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(reinterpret_cast<const __m256i&>(b)), 16);
    _mm512_storeu_si512(dst + 32 * half, _mm512_or_si512(lo, hi));
  }
}

// c [32 x 32] = A's 32 rows (lda values apart) @ one panel of W, eight rows at a time; only the
// first `height` rows of c are computed (rounded up to eight).
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void block_avx512(const uint16_t* a, int64_t lda,
                                                                         int64_t k_padded, const uint16_t* b,
                                                                         int64_t height, float* c) {
  constexpr int kRows = 8;
  for (int sub = 0; sub * kRows < height; ++sub) {
    const uint16_t* as = a + sub * kRows * lda;
    __m512 acc[kRows][2];
    for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t q = 0; q < k_padded / 2; ++q) {
      const __m512i b0 = _mm512_loadu_si512(b + q * 64);
      const __m512i b1 = _mm512_loadu_si512(b + q * 64 + 32);
      for (int r = 0; r < kRows; ++r) {
        int32_t pair;  // row r's two values of this step of K
        std::memcpy(&pair, as + r * lda + 2 * q, 4);
        const __m512i w = _mm512_set1_epi32(pair);
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], reinterpret_cast<const __m512bh&>(w),
                                     reinterpret_cast<const __m512bh&>(b0));
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], reinterpret_cast<const __m512bh&>(w),
                                     reinterpret_cast<const __m512bh&>(b1));
      }
    }
    for (int r = 0; r < kRows; ++r) {
      _mm512_storeu_ps(c + (sub * kRows + r) * kBf16GemmCols, acc[r][0]);
      _mm512_storeu_ps(c + (sub * kRows + r) * kBf16GemmCols + 16, acc[r][1]);
    }
  }
}

// The same block on AMX. Tiles (cpu/amx.h) 0-3: the four 16 x 16 quarters of c; 4-5: the two
// 16-row halves of A's 32 columns of K; 6-7: the two 16-column halves of W's 32 rows of K.
__attribute__((target("amx-tile,amx-bf16"))) void block_amx(const uint16_t* a, int64_t lda, int64_t k_padded,
                                                             const uint16_t* b, float* c) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int64_t a_stride = lda * static_cast<int64_t>(sizeof(uint16_t));
  constexpr int64_t b_stride = kBf16GemmCols * 2 * sizeof(uint16_t);
  for (int64_t kb = 0; kb < k_padded / kBf16GemmKStep; ++kb) {
    const uint16_t* ak = a + kb * kBf16GemmKStep;
    const uint16_t* bk = b + kb * kBf16GemmKStep * kBf16GemmCols;
    _tile_loadd(4, ak, a_stride);
    _tile_loadd(5, ak + 16 * lda, a_stride);
    _tile_loadd(6, bk, b_stride);
    _tile_loadd(7, bk + 32, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  constexpr int64_t c_stride = kBf16GemmCols * sizeof(float);
  _tile_stored(0, c, c_stride);
  _tile_stored(1, c + 16, c_stride);
  _tile_stored(2, c + 16 * kBf16GemmCols, c_stride);
  _tile_stored(3, c + 16 * kBf16GemmCols + 16, c_stride);
}

// y [rows x cols] = c + col_bias + residual, then Relu or Clip (clamp 1 or 2); cols <= 32.
__attribute__((target("avx512f"))) void store_block(const float* c, int64_t rows, int64_t cols, const float* col_bias,
                                                    const float* residual, int64_t ld_residual, int clamp, float lo,
                                                    float hi, float* y, int64_t ldy) {
  const __mmask16 m0 = static_cast<__mmask16>(cols >= 16 ? 0xffff : (1u << cols) - 1);
  const __mmask16 m1 = static_cast<__mmask16>(cols >= 32 ? 0xffff : cols > 16 ? (1u << (cols - 16)) - 1 : 0);
  const __m512 b0 = col_bias ? _mm512_maskz_loadu_ps(m0, col_bias) : _mm512_setzero_ps();
  const __m512 b1 = col_bias ? _mm512_maskz_loadu_ps(m1, col_bias + 16) : _mm512_setzero_ps();
  const __m512 vlo = _mm512_set1_ps(clamp == 1 ? 0.f : lo), vhi = _mm512_set1_ps(hi);
  for (int64_t r = 0; r < rows; ++r) {
    __m512 v0 = _mm512_add_ps(_mm512_loadu_ps(c + r * kBf16GemmCols), b0);
    __m512 v1 = _mm512_add_ps(_mm512_loadu_ps(c + r * kBf16GemmCols + 16), b1);
    if (residual) {
      v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, residual + r * ld_residual));
      v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, residual + r * ld_residual + 16));
    }
    if (clamp != 0) {  // max(NaN, lo) is lo, as Epilogue::apply's Relu (masked forms: GCC 12 warns of the others)
      v0 = _mm512_mask_max_ps(v0, 0xffff, v0, vlo);
      v1 = _mm512_mask_max_ps(v1, 0xffff, v1, vlo);
      if (clamp == 2) {
        v0 = _mm512_mask_min_ps(v0, 0xffff, v0, vhi);
        v1 = _mm512_mask_min_ps(v1, 0xffff, v1, vhi);
      }
    }
    _mm512_mask_storeu_ps(y + r * ldy, m0, v0);
    _mm512_mask_storeu_ps(y + r * ldy + 16, m1, v1);
  }
}

// Rounded rows of X: the calling thread's for X shared by a call's threads, each thread's own
// for the rows its tasks round; kept between calls.
AlignedVector<uint16_t>& thread_rows(int which) {
  thread_local AlignedVector<uint16_t> rows[2];
  return rows[which];
}

uint16_t* reserve(AlignedVector<uint16_t>& v, int64_t n) {
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
  return v.data();
}

}  // namespace

const char* bf16_gemm_isa_name(Bf16GemmIsa isa) {
  switch (isa) {
    case Bf16GemmIsa::kAmx: return "amx-bf16";
    case Bf16GemmIsa::kAvx512Bf16: return "avx512-bf16";
    case Bf16GemmIsa::kNone: break;
  }
  return "none";
}

std::string bf16_tactic(Bf16GemmIsa isa) {
  return isa == Bf16GemmIsa::kNone ? "" : std::string("bf16 ") + bf16_gemm_isa_name(isa);
}

Bf16GemmIsa bf16_gemm_best_isa() {
  static const Bf16GemmIsa best = [] {
    __builtin_cpu_init();
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    // CPUID leaf 7 subleaf 1, EAX bit 5: AVX512_BF16 (GCC 12's __builtin_cpu_supports knows it
    // as "avx512bf16" too, but not AMX).
    const bool bf16 = __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && ((eax >> 5) & 1);
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl");
    if (!bf16 || !avx512) return Bf16GemmIsa::kNone;  // the rounding and the epilogue need them
    const bool amx = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && ((edx >> 22) & 1) && ((edx >> 24) & 1);
    return amx && amx_tile_data_permitted() ? Bf16GemmIsa::kAmx : Bf16GemmIsa::kAvx512Bf16;
  }();
  return best;
}

Bf16GemmIsa bf16_gemm_isa() {
  const int f = forced_isa.load();
  const Bf16GemmIsa best = bf16_gemm_best_isa();
  if (f < 0) return best;
  return static_cast<Bf16GemmIsa>(std::min(f, static_cast<int>(best)));
}

void bf16_gemm_force_isa(Bf16GemmIsa isa) { forced_isa = static_cast<int>(isa); }
void bf16_gemm_reset_isa() { forced_isa = -1; }

void Bf16PackedColumns::pack(Bf16GemmIsa isa, const float* w, int64_t k, int64_t n, int64_t ldw) {
  isa_ = isa;
  k_ = k;
  n_ = n;
  k_padded_ = padded_depth(k);
  // Attention packs per call into the same object: its buffer is reused where nothing else holds it.
  const int64_t values = std::max<int64_t>(1, panel_count() * k_padded_ * kBf16GemmCols);
  if (!buf_.defined() || buf_.numel() < values || buf_.storage().use_count() > 1)
    buf_ = Tensor::uninitialized(DType::kUInt16, {values});
  uint16_t* out = buf_.data<uint16_t>();
  data_ = out;
  std::memset(out, 0, static_cast<size_t>(values) * sizeof(uint16_t));
  for (int64_t q = 0; q < panel_count(); ++q) {
    uint16_t* panel = out + q * k_padded_ * kBf16GemmCols;
    const int64_t c0 = q * kBf16GemmCols, cols = std::min<int64_t>(kBf16GemmCols, n - c0);
    for (int64_t i = 0; i < k; i += 2)
      pack_pair(w + i * ldw + c0, i + 1 < k ? w + (i + 1) * ldw + c0 : nullptr, cols, panel + i * kBf16GemmCols);
  }
}

void Bf16PackedColumns::adopt(Bf16GemmIsa isa, Tensor panels, int64_t k, int64_t n) {
  if (k < 0 || n < 0 || static_cast<int64_t>(panels.nbytes()) < bytes_for(k, n))
    throw Error(ErrorKind::kInvalidArgument, "bfloat16 panels of " + std::to_string(panels.nbytes()) + " bytes for a " +
                                                 std::to_string(k) + " x " + std::to_string(n) + " matrix, which needs " +
                                                 std::to_string(bytes_for(k, n)));
  isa_ = isa;
  k_ = k;
  n_ = n;
  k_padded_ = padded_depth(k);
  buf_ = std::move(panels);
  data_ = static_cast<const uint16_t*>(buf_.raw());
}

void bf16_round_floats(const float* src, int64_t n, uint16_t* dst) { round_avx512(src, n, dst); }

void bf16_rows_gemm(const Bf16PackedColumns& w, int64_t rows, const Bf16RowSource& x, float* y, int64_t ldy,
                    const float* col_bias, const float* residual, int64_t ld_residual, const Epilogue* act,
                    int threads) {
  const int64_t K = w.depth(), Kp = w.depth_padded(), N = w.cols();
  if (rows <= 0 || N <= 0) return;
  const Epilogue none;
  const Epilogue& ep = act ? *act : none;
  float lo = 0, hi = 0;
  int clamp = ep.clamp_mode(lo, hi);
  const bool act_after = clamp < 0;
  if (act_after) clamp = 0;
  if (rows * N * K < (int64_t{1} << 17)) threads = 1;  // not worth waking threads

  const int64_t row_blocks = (rows + kBf16GemmRows - 1) / kBf16GemmRows;
  const int64_t block_values = kBf16GemmRows * Kp;
  auto round_block = [&](int64_t blk, uint16_t* dst) {
    const int64_t r0 = blk * kBf16GemmRows, height = std::min<int64_t>(kBf16GemmRows, rows - r0);
    x(r0, height, dst);
    std::memset(dst + height * Kp, 0, static_cast<size_t>((kBf16GemmRows - height) * Kp) * sizeof(uint16_t));
  };
  // Tasks: runs of row blocks whose rounded X (up to 256 KB) stays in L2 while it meets a group
  // of W's panels; a panel (K x 32, 64 KB at K = 1024) stays in L1 or L2 while the run's blocks
  // meet it.
  const int64_t panels = w.panel_count();
  const int64_t run_blocks = std::max<int64_t>(1, (int64_t{256} << 10) / (block_values * 2));
  const int64_t runs = (row_blocks + run_blocks - 1) / run_blocks;
  const bool shared = row_blocks * block_values * 2 <= (int64_t{2} << 20);
  uint16_t* const xs = shared ? reserve(thread_rows(0), row_blocks * block_values) : nullptr;
  if (shared) parallel_for_each(row_blocks, threads > 1, [&](int64_t blk) { round_block(blk, xs + blk * block_values); });
  // Where each task rounds its own rows, it takes all of W's panels (rounding a run again for
  // each group of panels would cost about as much as the products at small N).
  const int64_t groups_wanted = shared ? std::max<int64_t>(1, 4 * std::max(1, threads) / runs) : 1;
  const int64_t group = std::max<int64_t>(1, panels / groups_wanted);
  const int64_t groups = (panels + group - 1) / group;
  // A few rows (a transformer's classifier, a batch-1 vector) waste most of AMX's 32-row blocks;
  // the AVX512-BF16 kernel computes only the rows there are, from the same panels.
  const bool amx = w.isa() == Bf16GemmIsa::kAmx && rows > 8;
  parallel_for_each(runs * groups, threads > 1, [&](int64_t task) {
    const int64_t run = task / groups, g = task % groups;
    const int64_t first = run * run_blocks, last = std::min(row_blocks, (run + 1) * run_blocks);
    // Block blk of the run at xr + (blk - base) * block_values.
    const uint16_t* xr = xs;
    const int64_t base = shared ? 0 : first;
    if (!shared) {
      uint16_t* own = reserve(thread_rows(1), (last - first) * block_values);
      for (int64_t blk = first; blk < last; ++blk) round_block(blk, own + (blk - first) * block_values);
      xr = own;
    }
    AmxTileScope tiles(amx);
    alignas(64) float c[kBf16GemmRows * kBf16GemmCols];
    for (int64_t q = g * group; q < std::min(panels, (g + 1) * group); ++q) {
      const int64_t c0 = q * kBf16GemmCols, cols = std::min<int64_t>(kBf16GemmCols, N - c0);
      for (int64_t blk = first; blk < last; ++blk) {
        const int64_t r0 = blk * kBf16GemmRows, height = std::min<int64_t>(kBf16GemmRows, rows - r0);
        const uint16_t* xb = xr + (blk - base) * block_values;
        if (amx) block_amx(xb, Kp, Kp, w.panel(q), c);
        else block_avx512(xb, Kp, Kp, w.panel(q), height, c);
        float* yb = y + r0 * ldy + c0;
        store_block(c, height, cols, col_bias ? col_bias + c0 : nullptr,
                    residual ? residual + r0 * ld_residual + c0 : nullptr, ld_residual, clamp, lo, hi, yb, ldy);
        if (act_after) ep.apply(yb, ldy, height, cols, nullptr, nullptr, nullptr, 0);
      }
    }
  });
}

void bf16_rows_gemm(const Bf16PackedColumns& w, int64_t rows, const float* x, int64_t ldx, float* y, int64_t ldy,
                    const float* col_bias, const float* residual, int64_t ld_residual, const Epilogue* act,
                    int threads) {
  const int64_t K = w.depth(), Kp = w.depth_padded();
  bf16_rows_gemm(
      w, rows,
      [&](int64_t first, int64_t count, uint16_t* dst) {
        for (int64_t r = 0; r < count; ++r, dst += Kp) {
          round_avx512(x + (first + r) * ldx, K, dst);
          std::memset(dst + K, 0, static_cast<size_t>(Kp - K) * sizeof(uint16_t));
        }
      },
      y, ldy, col_bias, residual, ld_residual, act, threads);
}

}  // namespace kiln::cpu
