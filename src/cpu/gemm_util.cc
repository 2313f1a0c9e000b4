#include "cpu/gemm_util.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <strings.h>

#include "cpu/parallel.h"
#include "cpu/sgemm.h"
#include "cpu/vector_exp.h"

// Present in OpenBLAS builds with DYNAMIC_ARCH (Debian's); weak so other builds still link.
extern "C" __attribute__((weak)) void gotoblas_dynamic_init(void);
extern "C" __attribute__((weak)) void gotoblas_dynamic_quit(void);

namespace kiln::cpu {

namespace {

// OpenBLAS 0.3.21 picks its kernels from the CPU model number and falls back to "Prescott"
// (SSE3) for models it does not know, which is what virtual machines often report even on
// AVX-512 hardware: its sgemm then runs 5-10x slower. When that happens on a CPU that has
// AVX2/AVX-512, re-select the kernels the features allow. A user's OPENBLAS_CORETYPE wins.
void fix_openblas_core_choice() {
  if (std::getenv("OPENBLAS_CORETYPE") || !gotoblas_dynamic_init || !gotoblas_dynamic_quit) return;
  const char* core = openblas_get_corename();
  bool pre_avx2 = false;
  for (const char* old : {"prescott", "core2", "penryn", "dunnington", "nehalem", "sandybridge", "atom",
                          "katmai", "coppermine", "northwood", "banias", "unknown"})
    if (core && strcasecmp(core, old) == 0) pre_avx2 = true;
  if (!pre_avx2 || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return;
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  setenv("OPENBLAS_CORETYPE", avx512 ? "SkylakeX" : "Haswell", 0);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
}

}  // namespace

void use_single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] {
    fix_openblas_core_choice();
    openblas_set_num_threads(1);
  });
}


void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // BLAS rejects a zero-width operand; the product is zero
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.f ? 0.f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void parallel_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  int threads = thread_count();
  // Not worth waking threads for a small product.
  if (threads == 1 || m * n * std::max<int64_t>(k, 1) < (1 << 18)) {
    sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  bool by_columns = n >= 64 * threads || n >= m;
  // One share per thread, claimed by whichever thread is free (the pool's chunks of 1).
  const int64_t shares = threads;
  parallel_for_each(shares, true, [&](int64_t t) {
    if (by_columns) {
      int64_t chunk = ((n + shares - 1) / shares + 15) / 16 * 16;
      int64_t n0 = std::min(n, t * chunk), n1 = std::min(n, n0 + chunk);
      const float* bp = trans_b ? b + n0 * ldb : b + n0;
      sgemm(trans_a, trans_b, m, n1 - n0, k, alpha, a, lda, bp, ldb, beta, c + n0, ldc);
    } else {
      int64_t chunk = (m + shares - 1) / shares;
      int64_t m0 = std::min(m, t * chunk), m1 = std::min(m, m0 + chunk);
      const float* ap = trans_a ? a + m0 : a + m0 * lda;
      sgemm(trans_a, trans_b, m1 - m0, n, k, alpha, ap, lda, b, ldb, beta, c + m0 * ldc, ldc);
    }
  }, 1);
}

void transpose_8x8(const float* src, int64_t ld_src, float* dst, int64_t ld_dst) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ld_src);
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  _mm256_storeu_ps(dst + 0 * ld_dst, _mm256_permute2f128_ps(s0, s4, 0x20));
  _mm256_storeu_ps(dst + 1 * ld_dst, _mm256_permute2f128_ps(s1, s5, 0x20));
  _mm256_storeu_ps(dst + 2 * ld_dst, _mm256_permute2f128_ps(s2, s6, 0x20));
  _mm256_storeu_ps(dst + 3 * ld_dst, _mm256_permute2f128_ps(s3, s7, 0x20));
  _mm256_storeu_ps(dst + 4 * ld_dst, _mm256_permute2f128_ps(s0, s4, 0x31));
  _mm256_storeu_ps(dst + 5 * ld_dst, _mm256_permute2f128_ps(s1, s5, 0x31));
  _mm256_storeu_ps(dst + 6 * ld_dst, _mm256_permute2f128_ps(s2, s6, 0x31));
  _mm256_storeu_ps(dst + 7 * ld_dst, _mm256_permute2f128_ps(s3, s7, 0x31));
}

// dst[3 * j + r] = src[r * cols + j] for j in [c0, c1) (three rows interleaved: a 3-channel
// image's planes turned channels-last), 16 columns a step: for each 16 floats of the output, the
// rows' elements it holds gathered by two permutes.
__attribute__((target("avx512f"))) int64_t interleave_three_rows_avx512(const float* src, int64_t cols, int64_t c0,
                                                                      int64_t c1, float* dst) {
  __m512i from_ab[3], from_c[3];
  __mmask16 c_lanes[3];
  for (int part = 0; part < 3; ++part) {
    alignas(64) int32_t ab[16], c[16];
    uint32_t mask = 0;
    for (int p = 0; p < 16; ++p) {
      const int g = 16 * part + p, row = g % 3, j = g / 3;
      ab[p] = row == 1 ? 16 + j : j;
      c[p] = j;
      if (row == 2) mask |= 1u << p;
    }
    from_ab[part] = _mm512_load_si512(ab);
    from_c[part] = _mm512_load_si512(c);
    c_lanes[part] = static_cast<__mmask16>(mask);
  }
  int64_t j = c0;
  for (; j + 16 <= c1; j += 16) {
    const __m512 a = _mm512_loadu_ps(src + j), b = _mm512_loadu_ps(src + cols + j), c = _mm512_loadu_ps(src + 2 * cols + j);
    for (int part = 0; part < 3; ++part) {
      const __m512 v = _mm512_mask_permutexvar_ps(_mm512_permutex2var_ps(a, from_ab[part], b), c_lanes[part], from_c[part], c);
      _mm512_storeu_ps(dst + 3 * j + 16 * part, v);
    }
  }
  return j;
}

void transpose_floats(const float* src, int64_t rows, int64_t cols, float* dst) {
  // Tasks are strips of 32 rows (32 x 8 blocks stay in L1) by runs of 1024 columns, so a matrix
  // of few rows (a 3-channel image's planes turned channels-last) still spreads over the threads.
  constexpr int64_t kStrip = 32, kRun = 1024;
  const int64_t strips = (rows + kStrip - 1) / kStrip, runs = (cols + kRun - 1) / kRun;
  parallel_for_each(strips * runs, rows * cols > 65536, [&](int64_t task) {
    const int64_t r0 = task / runs * kStrip, r1 = std::min(rows, r0 + kStrip);
    const int64_t c0 = task % runs * kRun, c1 = std::min(cols, c0 + kRun);
    int64_t c = c0;
    if (rows == 3 && sgemm_isa() == SgemmIsa::kAvx512) c = interleave_three_rows_avx512(src, cols, c0, c1, dst);
    if (r1 - r0 >= 8)
      for (; c + 8 <= c1; c += 8) {
        int64_t r = r0;
        for (; r + 8 <= r1; r += 8) transpose_8x8(src + r * cols + c, cols, dst + c * rows + r, rows);
        for (; r < r1; ++r)
          for (int64_t j = c; j < c + 8; ++j) dst[j * rows + r] = src[r * cols + j];
      }
    for (; c < c1; ++c)
      for (int64_t r = r0; r < r1; ++r) dst[c * rows + r] = src[r * cols + c];
  });
}

void gelu_erf_in_place(float* y, int64_t n) {
  // erf(t) = t P(t^2) / Q(t^2) for |t| < 3.92, a weighted least-squares rational fit of kiln's
  // own (float32 relative error at most 3.3e-7 over [0, 3.92], the fit itself 6.4e-8), and
  // +-1 beyond, where float32's erf is 1. libm's erff takes one value at a time
  // (docs/design/cpu-gemm.md, "Transformers on the CPU").
  const __m256 p0 = _mm256_set1_ps(1.128379107e+00f), p1 = _mm256_set1_ps(1.871593148e-01f),
               p2 = _mm256_set1_ps(5.237551406e-02f), p3 = _mm256_set1_ps(3.641874064e-03f),
               p4 = _mm256_set1_ps(2.848289441e-04f), p5 = _mm256_set1_ps(2.111000185e-06f);
  const __m256 q1 = _mm256_set1_ps(4.991985857e-01f), q2 = _mm256_set1_ps(1.128181219e-01f),
               q3 = _mm256_set1_ps(1.471901871e-02f), q4 = _mm256_set1_ps(1.137620653e-03f),
               q5 = _mm256_set1_ps(3.871936497e-05f);
  const __m256 one = _mm256_set1_ps(1.f), half = _mm256_set1_ps(0.5f), limit = _mm256_set1_ps(3.92f);
  const __m256 sign = _mm256_set1_ps(-0.f), inv_sqrt2 = _mm256_set1_ps(0.7071067811865476f);
  auto gelu8 = [&](__m256 x) {
    const __m256 t = _mm256_mul_ps(x, inv_sqrt2);
    const __m256 a = _mm256_andnot_ps(sign, t);   // |t|
    const __m256 ac = _mm256_min_ps(a, limit);    // NaN becomes the limit; x carries the NaN below
    const __m256 a2 = _mm256_mul_ps(ac, ac);
    __m256 num = _mm256_fmadd_ps(p5, a2, p4);
    num = _mm256_fmadd_ps(num, a2, p3);
    num = _mm256_fmadd_ps(num, a2, p2);
    num = _mm256_fmadd_ps(num, a2, p1);
    num = _mm256_fmadd_ps(num, a2, p0);
    __m256 den = _mm256_fmadd_ps(q5, a2, q4);
    den = _mm256_fmadd_ps(den, a2, q3);
    den = _mm256_fmadd_ps(den, a2, q2);
    den = _mm256_fmadd_ps(den, a2, q1);
    den = _mm256_fmadd_ps(den, a2, one);
    __m256 e = _mm256_div_ps(_mm256_mul_ps(ac, num), den);
    e = _mm256_blendv_ps(e, one, _mm256_cmp_ps(a, limit, _CMP_GE_OQ));
    e = _mm256_or_ps(e, _mm256_and_ps(t, sign));  // erf is odd
    return _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, e));
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, gelu8(_mm256_loadu_ps(y + i)));
  if (i < n) {  // the tail through the same arithmetic, so every element gets the same formula
    alignas(32) float tail[8] = {};
    std::memcpy(tail, y + i, static_cast<size_t>(n - i) * sizeof(float));
    _mm256_store_ps(tail, gelu8(_mm256_load_ps(tail)));
    std::memcpy(y + i, tail, static_cast<size_t>(n - i) * sizeof(float));
  }
}

namespace {

// x / 6 as x * kSixthHigh + x * kSixthLow with one rounding (an FMA), the high part just under
// 1/6, the low part the rest rounded: HardSwish's x * clamp(x / 6 + 0.5, 0, 1) comes out the same
// as with a division for every one of the 2^32 floats (bench/probes/hardswish_sixth.cc; the quotients
// themselves differ only below 2^-121, where adding 0.5 hides them), and a division of 16 floats
// took 10 or more cycles, most of the time MobileNet-V3's activations took.
constexpr float kSixthHigh = 0x1.555554p-3f, kSixthLow = 0x1.555556p-27f;

template <ir::ActivationKind kKind>
__attribute__((target("avx512f"), always_inline)) inline __m512 act16(__m512 x, __m512 alpha, __m512 beta) {
  using K = ir::ActivationKind;
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.f);
  if constexpr (kKind == K::kSigmoid) {
    return sigmoid16(x);
  } else if constexpr (kKind == K::kSiLU) {
    return _mm512_mul_ps(x, sigmoid16(x));
  } else if constexpr (kKind == K::kHardSwish) {  // x * clamp(x / 6 + 0.5, 0, 1); max(NaN, 0) is 0, x carries the NaN
    const __m512 t = _mm512_add_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(kSixthHigh), _mm512_mul_ps(x, _mm512_set1_ps(kSixthLow))),
                                   _mm512_set1_ps(0.5f));
    return _mm512_mul_ps(x, _mm512_min_ps(_mm512_max_ps(t, zero), one));
  } else {  // HardSigmoid: clamp(alpha x + beta, 0, 1), NaN kept as ir::clamp does
    const __m512 t = _mm512_fmadd_ps(alpha, x, beta);
    const __m512 c = _mm512_min_ps(_mm512_max_ps(t, zero), one);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(t, t, _CMP_UNORD_Q), c, t);
  }
}

// activation_block on AVX-512, one kind: the loop holds no switch, the constants stay in
// registers over the block (called per 8 x 32 tile, a switch and the constants per row cost
// as much as the arithmetic). Row tails through the same arithmetic, masked.
template <ir::ActivationKind kKind>
__attribute__((target("avx512f"))) void activation16_block(const ir::Activation& act, float* y, int64_t ld,
                                                           int64_t rows, int64_t cols) {
  const __m512 alpha = _mm512_set1_ps(act.alpha), beta = _mm512_set1_ps(act.beta);
  const __mmask16 tail = static_cast<__mmask16>((1u << (cols % 16)) - 1);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * ld;
    int64_t i = 0;
    for (; i + 16 <= cols; i += 16) _mm512_storeu_ps(row + i, act16<kKind>(_mm512_loadu_ps(row + i), alpha, beta));
    if (i < cols) _mm512_mask_storeu_ps(row + i, tail, act16<kKind>(_mm512_maskz_loadu_ps(tail, row + i), alpha, beta));
  }
}

// activation_block's rows on AVX2, 8 at a time (a division for Sigmoid and SiLU); other kinds one
// value at a time. The tail through the same arithmetic, so every element gets the same formula.
void activation8_in_place(const ir::Activation& act, float* y, int64_t n) {
  using K = ir::ActivationKind;
  const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
  const __m256 sixth_high = _mm256_set1_ps(kSixthHigh), sixth_low = _mm256_set1_ps(kSixthLow);
  const __m256 half = _mm256_set1_ps(0.5f), alpha = _mm256_set1_ps(act.alpha), beta = _mm256_set1_ps(act.beta);
  const __m256 sign = _mm256_set1_ps(-0.f);
  auto act8 = [&](__m256 x) {
    switch (act.kind) {
      case K::kSigmoid:
        return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_xor_ps(x, sign))));
      case K::kSiLU:
        return _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_xor_ps(x, sign))));
      case K::kHardSwish: {  // x * clamp(x / 6 + 0.5, 0, 1); max(NaN, 0) is 0, but x carries the NaN
        const __m256 t = _mm256_add_ps(_mm256_fmadd_ps(x, sixth_high, _mm256_mul_ps(x, sixth_low)), half);
        return _mm256_mul_ps(x, _mm256_min_ps(_mm256_max_ps(t, zero), one));
      }
      case K::kHardSigmoid: {  // clamp(alpha x + beta, 0, 1), NaN kept as ir::clamp does
        const __m256 t = _mm256_fmadd_ps(alpha, x, beta);
        const __m256 c = _mm256_min_ps(_mm256_max_ps(t, zero), one);
        return _mm256_blendv_ps(c, t, _mm256_cmp_ps(t, t, _CMP_UNORD_Q));
      }
      default:
        return x;
    }
  };
  if (act.kind != K::kSigmoid && act.kind != K::kSiLU && act.kind != K::kHardSwish && act.kind != K::kHardSigmoid) {
    for (int64_t i = 0; i < n; ++i) y[i] = act.apply(y[i]);
    return;
  }
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, act8(_mm256_loadu_ps(y + i)));
  if (i < n) {
    alignas(32) float tail[8] = {};
    std::memcpy(tail, y + i, static_cast<size_t>(n - i) * sizeof(float));
    _mm256_store_ps(tail, act8(_mm256_load_ps(tail)));
    std::memcpy(y + i, tail, static_cast<size_t>(n - i) * sizeof(float));
  }
}

}  // namespace

void activation_block(const ir::Activation& act, float* y, int64_t ld, int64_t rows, int64_t cols) {
  using K = ir::ActivationKind;
  if (sgemm_isa() == SgemmIsa::kAvx512) {
    switch (act.kind) {
      case K::kSigmoid: return activation16_block<K::kSigmoid>(act, y, ld, rows, cols);
      case K::kSiLU: return activation16_block<K::kSiLU>(act, y, ld, rows, cols);
      case K::kHardSwish: return activation16_block<K::kHardSwish>(act, y, ld, rows, cols);
      case K::kHardSigmoid: return activation16_block<K::kHardSigmoid>(act, y, ld, rows, cols);
      default: break;
    }
  }
  for (int64_t r = 0; r < rows; ++r) activation8_in_place(act, y + r * ld, cols);
}

Epilogue::Epilogue(ir::Activation act) : act_(std::move(act)) {
  if (act_.none()) kind_ = Kind::kNone;
  else if (act_.kind == ir::ActivationKind::kRelu) kind_ = Kind::kRelu;
  else if (act_.kind == ir::ActivationKind::kClip) kind_ = Kind::kClip;
  else if (act_.kind == ir::ActivationKind::kLeakyRelu) kind_ = Kind::kLeakyRelu;
  else if (act_.kind == ir::ActivationKind::kGelu) kind_ = Kind::kGelu;
  else if (act_.kind == ir::ActivationKind::kSigmoid) kind_ = Kind::kSigmoid;
  else if (act_.kind == ir::ActivationKind::kSiLU) kind_ = Kind::kSiLU;
  else if (act_.kind == ir::ActivationKind::kHardSwish) kind_ = Kind::kHardSwish;
  else if (act_.kind == ir::ActivationKind::kHardSigmoid) kind_ = Kind::kHardSigmoid;
  else kind_ = Kind::kOther;
}

int Epilogue::clamp_mode(float& lo, float& hi) const {
  lo = act_.alpha;
  hi = act_.beta;
  switch (kind_) {
    case Kind::kNone: return 0;
    case Kind::kRelu: return 1;
    case Kind::kClip: return 2;
    default: return -1;
  }
}

void Epilogue::apply(float* y, int64_t ld, int64_t rows, int64_t cols, const float* row_bias, const float* col_bias,
                     const float* residual, int64_t ld_residual) const {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * ld;
    const float rb = row_bias ? row_bias[r] : 0.f;
    if (row_bias)
      for (int64_t c = 0; c < cols; ++c) row[c] += rb;
    if (col_bias)
      for (int64_t c = 0; c < cols; ++c) row[c] += col_bias[c];
    if (residual) {
      const float* z = residual + r * ld_residual;
      for (int64_t c = 0; c < cols; ++c) row[c] += z[c];
    }
    switch (kind_) {
      case Kind::kNone: break;
      case Kind::kRelu:
        for (int64_t c = 0; c < cols; ++c) row[c] = row[c] > 0.f ? row[c] : 0.f;
        break;
      case Kind::kClip: {
        const float lo = act_.alpha, hi = act_.beta;
        for (int64_t c = 0; c < cols; ++c) row[c] = std::min(std::max(row[c], lo), hi);
        break;
      }
      case Kind::kLeakyRelu: {
        const float a = act_.alpha;
        for (int64_t c = 0; c < cols; ++c) row[c] = row[c] >= 0.f ? row[c] : a * row[c];
        break;
      }
      case Kind::kGelu:
        gelu_erf_in_place(row, cols);
        break;
      case Kind::kSigmoid:
      case Kind::kSiLU:
      case Kind::kHardSwish:
      case Kind::kHardSigmoid:
        break;  // over the whole block, below
      case Kind::kOther:
        for (int64_t c = 0; c < cols; ++c) row[c] = act_.apply(row[c]);
        break;
    }
  }
  if (kind_ == Kind::kSigmoid || kind_ == Kind::kSiLU || kind_ == Kind::kHardSwish || kind_ == Kind::kHardSigmoid)
    activation_block(act_, y, ld, rows, cols);
}

}  // namespace kiln::cpu
