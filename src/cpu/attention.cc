// CPU kernel of ONNX's Attention (ops/attention_params.h has the semantics): float32 arithmetic
// for float32 and float16 tensors, one query row at a time (the logits and the weighted sums of
// 4 together), the (batch, head) pairs in parallel. It is the reference the GPU's fused attention is checked
// against, so it keeps the plain steps: the logits of a row (each a sum in double), the bias
// every mask adds, a softmax (its exponentials within 3 ulp of std::exp, its sum in double), the
// weighted sum of values by the softmax's numerators, divided by their sum after; each step runs
// 8 keys (or values) at a time.
// In an engine of bfloat16 products (KernelInit::bfloat16_products) on a CPU that has them, the
// two products of each (batch, head) run on bf16_rows_gemm instead (cpu/bf16_gemm.h): the scaled
// queries by the scaled keys, transposed and packed per head, for all of the head's rows at once;
// then the softmax's numerators by the values, packed per head. The masks, softmax and outputs are
// the same steps as above, in float32.
// GCC 12's AVX-512 intrinsics start some results from an "undefined" vector and trip
// -Wmaybe-uninitialized and -Wuninitialized when inlined here; the warnings are about the header.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cpu/aligned_vector.h"
#include "cpu/bf16_gemm.h"
#include "cpu/double_sums.h"
#include "cpu/kernel.h"
#include "cpu/parallel.h"
#include "cpu/vector_exp.h"
#include "ops/attention_params.h"

namespace kiln::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A [batch, heads, seq, size] view of a 3-D [batch, seq, heads * size] or 4-D tensor.
struct HeadView {
  const float* data = nullptr;
  bool three_d = false;
  int64_t heads = 0, seq = 0, size = 0;
  const float* at(int64_t b, int64_t h, int64_t s) const {
    return three_d ? data + ((b * seq + s) * heads + h) * size : data + ((b * heads + h) * seq + s) * size;
  }
};

// The additive bias of attn_mask at (b, h, i, j), broadcast right-aligned to [batch, heads, q,
// keys]; keys past the mask's last dimension are masked. Boolean masks: true attends.
struct MaskView {
  std::vector<float> values;  // as an additive bias
  std::vector<int64_t> shape;  // right-aligned to rank 4, 1s in front
  // The biases of keys [0, shape[3]) for query i of (b, h); nullptr without a mask.
  const float* row(int64_t b, int64_t h, int64_t i) const {
    if (values.empty()) return nullptr;
    const int64_t c[3] = {shape[0] == 1 ? 0 : b, shape[1] == 1 ? 0 : h, shape[2] == 1 ? 0 : i};
    return values.data() + ((c[0] * shape[1] + c[1]) * shape[2] + c[2]) * shape[3];
  }
};

void store(Tensor& out, int64_t index, float v) {
  switch (out.dtype()) {
    case DType::kFloat32: out.data<float>()[index] = v; break;
    default: static_cast<uint16_t*>(out.raw())[index] = float_to_half(v); break;
  }
}

// Writes a [batch, heads, seq, size] view into a 4-D output.
void store_heads(Tensor& out, const HeadView& v, int64_t batch) {
  int64_t o = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < v.heads; ++h)
      for (int64_t s = 0; s < v.seq; ++s) {
        const float* row = v.at(b, h, s);
        for (int64_t d = 0; d < v.size; ++d) store(out, o++, row[d]);
      }
}

// The query rows a task computes the logits of together: they share each load and conversion
// of the keys.
constexpr int64_t kDotRows = 4;

// dots[r * T + j] = sum over d of double(q[r * D + d]) * double(kt[d * T + j]) for the `rows`
// (at most kDotRows) query rows, added in the order of d (each product is exact in double, so
// fused or not, every path gives the same sums).
void row_dots_portable(const float* q, int64_t rows, const float* kt, int64_t D, int64_t T, double* dots) {
  std::fill(dots, dots + rows * T, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < D; ++d) {
      const double qd = q[r * D + d];
      const float* kd = kt + d * T;
      for (int64_t j = 0; j < T; ++j) dots[r * T + j] += qd * double(kd[j]);
    }
}

// The same with AVX-512: 32 keys of up to kDotRows rows at a time held in registers through
// the whole sum, each key vector loaded and widened once for all the rows.
template <int Rows>
__attribute__((target("avx512f"))) void rows_dots_avx512(const float* q, const float* kt, int64_t D, int64_t T,
                                                        double* dots) {
  int64_t j = 0;
  for (; j + 32 <= T; j += 32) {
    __m512d acc[Rows][4];
    for (int r = 0; r < Rows; ++r)
      for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_setzero_pd();
    for (int64_t d = 0; d < D; ++d) {
      const float* kd = kt + d * T + j;
      __m512d keys[4];
      for (int k = 0; k < 4; ++k) keys[k] = _mm512_cvtps_pd(_mm256_loadu_ps(kd + 8 * k));
      for (int r = 0; r < Rows; ++r) {
        const __m512d qd = _mm512_set1_pd(q[r * D + d]);
        for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_fmadd_pd(qd, keys[k], acc[r][k]);
      }
    }
    for (int r = 0; r < Rows; ++r)
      for (int k = 0; k < 4; ++k) _mm512_storeu_pd(dots + r * T + j + 8 * k, acc[r][k]);
  }
  for (; j < T; ++j)
    for (int r = 0; r < Rows; ++r) {
      double dot = 0.0;
      for (int64_t d = 0; d < D; ++d) dot += double(q[r * D + d]) * double(kt[d * T + j]);
      dots[r * T + j] = dot;
    }
}


bool has_avx512() {
  static const bool avx512 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return avx512;
}

// y[i] = float(double(x[i]) * factor): a row of Y divided by its softmax's sum.
__attribute__((target("avx512f"))) void scale_row_avx512(const float* x, int64_t n, double factor, float* y) {
  const __m512d f = _mm512_set1_pd(factor);
  for (int64_t i = 0; i < n; i += 8) {
    const __mmask16 lanes = static_cast<__mmask16>((1u << std::min<int64_t>(8, n - i)) - 1);
    const __m256 r = _mm512_cvtpd_ps(_mm512_mul_pd(load8_as_double(x, i, n), f));
    _mm512_mask_storeu_ps(y + i, lanes, _mm512_castps256_ps512(r));
  }
}

void scale_row(const float* x, int64_t n, double factor, float* y) {
  if (has_avx512()) return scale_row_avx512(x, n, factor, y);
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i] * factor);
}

void rows_dots(const float* q, int64_t rows, const float* kt, int64_t D, int64_t T, double* dots) {
  if (!has_avx512()) return row_dots_portable(q, rows, kt, D, T, dots);
  switch (rows) {
    case 1: return rows_dots_avx512<1>(q, kt, D, T, dots);
    case 2: return rows_dots_avx512<2>(q, kt, D, T, dots);
    case 3: return rows_dots_avx512<3>(q, kt, D, T, dots);
    default: return rows_dots_avx512<4>(q, kt, D, T, dots);
  }
}

// z[j] = x[j] + bias[j]; returns the largest z that is not NaN (-inf if none) and sets
// `any_allowed` when some bias is not -inf. 8 keys at a time.
float biased_logits(const float* x, const float* bias, int64_t T, float* z, bool& any_allowed) {
  const __m256 neg_inf = _mm256_set1_ps(kNegInf);
  __m256 largest = neg_inf, allowed = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= T; j += 8) {
    const __m256 bj = _mm256_loadu_ps(bias + j);
    const __m256 zj = _mm256_add_ps(_mm256_loadu_ps(x + j), bj);
    _mm256_storeu_ps(z + j, zj);
    largest = _mm256_max_ps(zj, largest);  // a NaN z leaves `largest` as it is
    allowed = _mm256_or_ps(allowed, _mm256_cmp_ps(bj, neg_inf, _CMP_NEQ_UQ));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, largest);
  float result = kNegInf;
  for (float v : lanes) result = std::max(result, v);
  any_allowed = _mm256_movemask_ps(allowed) != 0;
  for (; j < T; ++j) {
    z[j] = x[j] + bias[j];
    result = std::max(result, z[j]);
    any_allowed |= bias[j] != kNegInf;
  }
  return result;
}

// probs[j] = e^(z[j] - max_logit), or 0 for a key that may not be attended (z = -inf) and for
// every key of a row with none allowed, and `sum` their sum in double (two partial sums of 4);
// returns whether some z is NaN. 8 keys at a time.
bool softmax_numerators(const float* z, int64_t T, float max_logit, bool any_allowed, float* probs, double& sum) {
  sum = 0;
  if (!any_allowed) {
    std::fill(probs, probs + T, 0.f);
    for (int64_t j = 0; j < T; ++j)
      if (std::isnan(z[j])) return true;
    return false;
  }
  const __m256 neg_inf = _mm256_set1_ps(kNegInf), largest = _mm256_set1_ps(max_logit);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 nan = _mm256_setzero_ps();
  __m256d low = _mm256_setzero_pd(), high = _mm256_setzero_pd();
  for (int64_t j = 0; j < T; j += 8) {
    const __m256i inside = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(8, T - j))), lane);
    const __m256 zj = _mm256_maskload_ps(z + j, inside);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(zj, zj, _CMP_UNORD_Q));
    // Lanes past T load 0 and give e^-max, left out of the sum and not stored.
    const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(inside),
                                   _mm256_andnot_ps(_mm256_cmp_ps(zj, neg_inf, _CMP_EQ_OQ), exp8(_mm256_sub_ps(zj, largest))));
    low = _mm256_add_pd(low, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    high = _mm256_add_pd(high, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    if (j + 8 <= T) {
      _mm256_storeu_ps(probs + j, e);  // unmasked: a masked store is microcoded on AMD's Zen
    } else {
      _mm256_maskstore_ps(probs + j, inside, e);
    }
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(low, high));
  sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  return _mm256_movemask_ps(nan) != 0;
}

// y[d] for d in [d0, Dv) = sum over keys j, in order, of p[j] * V[b, kv, j, d], one fused
// multiply-add per term and keys of weight 0 left out; 64 columns at a time held in registers
// through the keys.
void weighted_sum(const float* p, int64_t T, const HeadView& V, int64_t b, int64_t kv, int64_t Dv, float* y,
                  int64_t d0 = 0) {
  for (; d0 + 64 <= Dv; d0 += 64) {
    __m256 acc[8];
    for (__m256& a : acc) a = _mm256_setzero_ps();
    for (int64_t j = 0; j < T; ++j) {
      if (p[j] == 0.f) continue;
      const __m256 pj = _mm256_set1_ps(p[j]);
      const float* v = V.at(b, kv, j) + d0;
      for (int k = 0; k < 8; ++k) acc[k] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 8 * k), acc[k]);
    }
    for (int k = 0; k < 8; ++k) _mm256_storeu_ps(y + d0 + 8 * k, acc[k]);
  }
  for (; d0 + 8 <= Dv; d0 += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < T; ++j)
      if (p[j] != 0.f) acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(V.at(b, kv, j) + d0), acc);
    _mm256_storeu_ps(y + d0, acc);
  }
  for (; d0 < Dv; ++d0) {
    float acc = 0.f;
    for (int64_t j = 0; j < T; ++j)
      if (p[j] != 0.f) acc = std::fma(p[j], V.at(b, kv, j)[d0], acc);
    y[d0] = acc;
  }
}

// weighted_sum for `Rows` query rows at once (p and y: Rows rows of T and Dv), the same terms in
// the same order for each row: with AVX-512, 64 columns of every row held in registers through
// the keys, each row of V loaded once for all the rows; the columns past the last 64 as
// weighted_sum does them.
template <int Rows>
__attribute__((target("avx512f"))) void weighted_sums_avx512(const float* p, int64_t T, const HeadView& V, int64_t b,
                                                            int64_t kv, int64_t Dv, float* y) {
  int64_t d0 = 0;
  for (; d0 + 64 <= Dv; d0 += 64) {
    __m512 acc[Rows][4];
    for (int r = 0; r < Rows; ++r)
      for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_setzero_ps();
    for (int64_t j = 0; j < T; ++j) {
      bool any = false;
      for (int r = 0; r < Rows; ++r) any |= p[r * T + j] != 0.f;
      if (!any) continue;
      const float* v = V.at(b, kv, j) + d0;
      __m512 values[4];
      for (int k = 0; k < 4; ++k) values[k] = _mm512_loadu_ps(v + 16 * k);
      for (int r = 0; r < Rows; ++r) {
        if (p[r * T + j] == 0.f) continue;
        const __m512 pj = _mm512_set1_ps(p[r * T + j]);
        for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_fmadd_ps(pj, values[k], acc[r][k]);
      }
    }
    for (int r = 0; r < Rows; ++r)
      for (int k = 0; k < 4; ++k) _mm512_storeu_ps(y + r * Dv + d0 + 16 * k, acc[r][k]);
  }
  if (d0 < Dv)
    for (int r = 0; r < Rows; ++r) weighted_sum(p + r * T, T, V, b, kv, Dv, y + r * Dv, d0);
}

void weighted_sums(const float* p, int64_t rows, int64_t T, const HeadView& V, int64_t b, int64_t kv, int64_t Dv, float* y) {
  if (!has_avx512()) {
    for (int64_t r = 0; r < rows; ++r) weighted_sum(p + r * T, T, V, b, kv, Dv, y + r * Dv);
    return;
  }
  switch (rows) {
    case 1: return weighted_sums_avx512<1>(p, T, V, b, kv, Dv, y);
    case 2: return weighted_sums_avx512<2>(p, T, V, b, kv, Dv, y);
    case 3: return weighted_sums_avx512<3>(p, T, V, b, kv, Dv, y);
    default: return weighted_sums_avx512<4>(p, T, V, b, kv, Dv, y);
  }
}

class AttentionKernel : public Kernel {
 public:
  explicit AttentionKernel(const ir::Node& node, bool bfloat16_products = false)
      : node_(node), bf16_isa_(bf16_products_isa(bfloat16_products)), bf16_(bf16_isa_ != Bf16GemmIsa::kNone) {}

  std::string tactic() const override { return bf16_tactic(bf16_isa_); }

  void run(const std::vector<const Tensor*>& in, std::vector<Tensor>& out) override {
    auto input = [&](size_t i) -> const Tensor* { return i < in.size() ? in[i] : nullptr; };
    const Tensor *past_key = input(4), *nonpad = input(6);
    std::string why;
    const ir::AttentionShape s = ir::attention_shape(node_, in[0]->shape(), in[1]->shape(), in[2]->shape(),
                                                     past_key ? past_key->shape() : std::vector<int64_t>{}, why);
    if (!why.empty()) throw node_.error(ErrorKind::kInvalidArgument, why);
    if (nonpad && (nonpad->rank() != 1 || nonpad->dim(0) != s.batch))
      throw node_.error(ErrorKind::kInvalidArgument, "nonpad_kv_seqlen must have one length per batch");
    const int64_t T = s.total_kv();

    // Float32 views (copies of float16 inputs); with a cache, keys and values are the past ones
    // followed by the new ones, copied together.
    const Tensor q32 = in[0]->to_float32(), k32 = in[1]->to_float32(), v32 = in[2]->to_float32();
    const HeadView new_k{k32.data<float>(), s.three_d, s.kv_heads, s.kv_seq, s.head_size};
    const HeadView new_v{v32.data<float>(), s.three_d, s.kv_heads, s.kv_seq, s.v_head_size};
    HeadView K = new_k, V = new_v;
    std::vector<float> keys, values;
    if (past_key || input(5)) {
      keys.resize(static_cast<size_t>(s.batch * s.kv_heads * T * s.head_size));
      values.resize(static_cast<size_t>(s.batch * s.kv_heads * T * s.v_head_size));
      concat_cache(keys, past_key, new_k, s, s.head_size);
      concat_cache(values, input(5), new_v, s, s.v_head_size);
      K = HeadView{keys.data(), false, s.kv_heads, T, s.head_size};
      V = HeadView{values.data(), false, s.kv_heads, T, s.v_head_size};
    }
    const HeadView Q{q32.data<float>(), s.three_d, s.q_heads, s.q_seq, s.head_size};

    MaskView mask;
    if (const Tensor* m = input(3)) {
      if (m->rank() < 1 || m->rank() > 4)
        throw node_.error(ErrorKind::kInvalidArgument, "attn_mask must have rank 1 to 4, not " + std::to_string(m->rank()));
      mask.shape.assign(static_cast<size_t>(4 - m->rank()), 1);
      mask.shape.insert(mask.shape.end(), m->shape().begin(), m->shape().end());
      const int64_t full[4] = {s.batch, s.q_heads, s.q_seq, T};
      for (int d = 0; d < 3; ++d)
        if (mask.shape[d] != 1 && mask.shape[d] != full[d])
          throw node_.error(ErrorKind::kInvalidArgument, "attn_mask of shape " + shape_to_string(m->shape()) +
                                                             " does not broadcast to [batch, heads, q, keys] = " +
                                                             shape_to_string({full[0], full[1], full[2], full[3]}));
      if (mask.shape[3] > T)
        throw node_.error(ErrorKind::kInvalidArgument, "attn_mask covers " + std::to_string(mask.shape[3]) +
                                                           " keys, there are " + std::to_string(T));
      const Tensor mf = m->to_float32();
      mask.values.assign(mf.data<float>(), mf.data<float>() + mf.numel());
      if (m->dtype() == DType::kBool)
        for (float& v : mask.values) v = v != 0.f ? 0.f : kNegInf;
    }
    const int64_t* lengths = nonpad ? nonpad->data<int64_t>() : nullptr;

    const float factor = ir::attention_qk_factor(node_, s.head_size);
    const float softcap = node_.attrs.get_float("softcap", 0.f);
    const int64_t mode = node_.attrs.get_int("qk_matmul_output_mode", 0);
    const ir::AttentionMasking masking(node_);
    const int64_t group = s.q_heads / s.kv_heads;
    const int64_t D = s.head_size, Dv = s.v_head_size;
    Tensor* y = &out[0];
    Tensor* qk_out = out.size() > 3 && out[3].defined() ? &out[3] : nullptr;
    // The scaled keys of each key/value head transposed, [D][T], so that a row's logits are
    // sums over d of q[d] * keys[d][:] (a loop over the keys that vectorizes). Each logit is
    // still its own double sum in the order of d, as a dot product per key would give.
    // The calling thread's buffer, kept between runs (the loops below reach it by pointer: a
    // worker naming a thread_local would get its own).
    thread_local AlignedVector<float> keys_t_buffer;
    keys_t_buffer.resize(std::max(keys_t_buffer.size(), static_cast<size_t>(s.batch * s.kv_heads * T * D)));
    float* const keys_t = keys_t_buffer.data();
    parallel_for_each(s.batch * s.kv_heads, true, [&](int64_t bh) {
      float* dst = keys_t + bh * T * D;
      for (int64_t j = 0; j < T; ++j) {
        const float* src = K.at(bh / s.kv_heads, bh % s.kv_heads, j);
        for (int64_t d = 0; d < D; ++d) dst[d * T + j] = src[d] * factor;
      }
    });
    // One task per (batch, query head): rows of its queries, each written by that task alone.
    parallel_for_each(s.batch * s.q_heads, true, [&](int64_t task) {
      const int64_t b = task / s.q_heads, h = task % s.q_heads, kv = h / group;
      const float* kt = keys_t + (b * s.kv_heads + kv) * T * D;
      // Bfloat16 products: every row's logits first, the numerators of every row kept for one
      // product by the values at the end.
      thread_local Bf16PackedColumns packed;
      thread_local AlignedVector<float> logits_all, probs_all, y_all, scales_all;
      if (bf16_) {
        logits_all.resize(static_cast<size_t>(s.q_seq * T));
        probs_all.resize(static_cast<size_t>(s.q_seq * T));
        scales_all.resize(static_cast<size_t>(s.q_seq));
        packed.pack(bf16_isa_, kt, D, T, T);
        std::vector<float> scaled(static_cast<size_t>(D));
        const Bf16RowSource queries = [&](int64_t first, int64_t count, uint16_t* dst) {
          for (int64_t i = first; i < first + count; ++i, dst += packed.depth_padded()) {
            const float* qi = Q.at(b, h, i);
            for (int64_t d = 0; d < D; ++d) scaled[static_cast<size_t>(d)] = qi[d] * factor;
            bf16_round_floats(scaled.data(), D, dst);
            std::fill(dst + D, dst + packed.depth_padded(), uint16_t{0});
          }
        };
        bf16_rows_gemm(packed, s.q_seq, queries, logits_all.data(), T, nullptr, nullptr, 0, nullptr, 1);
      }
      std::vector<float> q_rows(static_cast<size_t>(kDotRows * D)), logits(static_cast<size_t>(T)),
          bias(static_cast<size_t>(T)), z(static_cast<size_t>(T)), probs_rows(static_cast<size_t>(kDotRows * T)),
          raw(static_cast<size_t>(T)), y_rows(static_cast<size_t>(kDotRows * Dv));
      std::vector<double> dots(static_cast<size_t>(kDotRows * T));
      double row_scale[kDotRows];  // 1 / each row's sum of numerators (1 for a row of NaN or zeros)
      for (int64_t i = 0; i < s.q_seq; ++i) {
        // This row's place in its block of rows, whose logits and weighted sums are computed together.
        const int64_t r = i % kDotRows, rows = std::min(kDotRows, s.q_seq - (i - r));
        float* const probs = bf16_ ? probs_all.data() + i * T : probs_rows.data() + r * T;
        if (r == 0 && !bf16_) {
          for (int64_t k = 0; k < rows; ++k) {
            const float* qi = Q.at(b, h, i + k);
            for (int64_t d = 0; d < D; ++d) q_rows[k * D + d] = qi[d] * factor;
          }
          rows_dots(q_rows.data(), rows, kt, D, T, dots.data());
        }
        const ir::AttentionKeyRange allowed = masking.keys(s, lengths, b, i);
        if (bf16_) std::copy(logits_all.data() + i * T, logits_all.data() + (i + 1) * T, raw.begin());
        else
          for (int64_t j = 0; j < T; ++j) raw[j] = static_cast<float>(dots[r * T + j]);
        const float* x = raw.data();
        if (softcap > 0.f) {
          for (int64_t j = 0; j < T; ++j) logits[j] = softcap * std::tanh(raw[j] / softcap);
          x = logits.data();
        }
        // bias[j] = the mask's bias + (0 for keys in the allowed range, -inf outside).
        const float* mask_row = mask.row(b, h, i);
        const int64_t masked_from = mask_row ? std::min(T, mask.shape[3]) : T;
        if (mask_row) std::copy(mask_row, mask_row + masked_from, bias.begin());
        else std::fill(bias.begin(), bias.end(), 0.f);
        std::fill(bias.begin() + masked_from, bias.end(), kNegInf);
        const int64_t lo = std::clamp<int64_t>(allowed.first, 0, T), hi = std::clamp<int64_t>(allowed.last, lo, T);
        for (int64_t j = 0; j < lo; ++j) bias[j] += kNegInf;
        for (int64_t j = hi; j < T; ++j) bias[j] += kNegInf;
        bool any_allowed = false;
        const float max_logit = biased_logits(x, bias.data(), T, z.data(), any_allowed);
        // Softmax of logits + bias; a row no key may be attended from is all zeros. NaN and
        // infinite logits give NaN, as a softmax computes them (the maximum skips NaN).
        // The weighted sums below take the numerators, and each row of Y is divided by the sum
        // after: one product per value instead of one per key.
        double sum = 0;
        const bool nan = softmax_numerators(z.data(), T, max_logit, any_allowed, probs, sum);
        row_scale[r] = 1.0;
        if (nan) std::fill(probs, probs + T, std::numeric_limits<float>::quiet_NaN());
        else if (any_allowed) row_scale[r] = 1.0 / sum;
        if (bf16_) scales_all[static_cast<size_t>(i)] = static_cast<float>(row_scale[r]);
        if (qk_out) {
          const int64_t base = ((b * s.q_heads + h) * s.q_seq + i) * T;
          for (int64_t j = 0; j < T; ++j)
            store(*qk_out, base + j,
                  mode == 3 ? static_cast<float>(probs[j] * row_scale[r]) : mode == 2 ? z[j] : mode == 1 ? x[j] : raw[j]);
        }
        if (r + 1 < rows || bf16_) continue;
        // The block's last row: the weighted sums of all its rows.
        weighted_sums(probs_rows.data(), rows, T, V, b, kv, Dv, y_rows.data());
        for (int64_t k = 0; k < rows; ++k) store_row(y, s, b, h, i - r + k, y_rows.data() + k * Dv, row_scale[k]);
      }
      if (bf16_) {
        // V [T x Dv] of this head as the weights: rows of a 3-D V lie heads * Dv apart.
        const float* v0 = V.at(b, kv, 0);
        const int64_t ldv = V.three_d ? V.heads * Dv : Dv;
        packed.pack(bf16_isa_, v0, T, Dv, ldv);
        y_all.resize(static_cast<size_t>(s.q_seq * Dv));
        bf16_rows_gemm(packed, s.q_seq, probs_all.data(), T, y_all.data(), Dv, nullptr, nullptr, 0, nullptr, 1);
        for (int64_t i = 0; i < s.q_seq; ++i) store_row(y, s, b, h, i, y_all.data() + i * Dv, scales_all[static_cast<size_t>(i)]);
      }
    });
    if (out.size() > 1 && out[1].defined()) store_heads(out[1], K, s.batch);
    if (out.size() > 2 && out[2].defined()) store_heads(out[2], V, s.batch);
  }

 private:
  // Row i of head h's output: y_row [Dv] times `scale`, into Y's 3-D or 4-D layout.
  static void store_row(Tensor* y, const ir::AttentionShape& s, int64_t b, int64_t h, int64_t i, const float* y_row,
                        double scale) {
    const int64_t Dv = s.v_head_size;
    const int64_t y_base = s.three_d ? (b * s.q_seq + i) * s.q_heads * Dv + h * Dv : ((b * s.q_heads + h) * s.q_seq + i) * Dv;
    if (y->dtype() == DType::kFloat32) scale_row(y_row, Dv, scale, y->data<float>() + y_base);
    else
      for (int64_t d = 0; d < Dv; ++d) store(*y, y_base + d, static_cast<float>(y_row[d] * scale));
  }

  // dst [batch, kv_heads, past + new, size] = past (4-D, may be absent) followed by `added`.
  static void concat_cache(std::vector<float>& dst, const Tensor* past, const HeadView& added, const ir::AttentionShape& s,
                           int64_t size) {
    if (dst.empty()) return;  // an empty cache: no row to copy (memcpy of 0 bytes to null is undefined)
    const Tensor p32 = past ? past->to_float32() : Tensor();
    const int64_t T = s.total_kv();
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.kv_heads; ++h) {
        float* row = dst.data() + (b * s.kv_heads + h) * T * size;
        if (past)
          std::memcpy(row, p32.data<float>() + (b * s.kv_heads + h) * s.past_seq * size,
                      static_cast<size_t>(s.past_seq * size) * sizeof(float));
        for (int64_t t = 0; t < s.kv_seq; ++t)
          std::memcpy(row + (s.past_seq + t) * size, added.at(b, h, t), static_cast<size_t>(size) * sizeof(float));
      }
  }

  const ir::Node& node_;
  Bf16GemmIsa bf16_isa_;  // the two products on bf16_rows_gemm on this kernel, unless kNone
  bool bf16_;
};

float load(const Tensor& t, int64_t index) {
  return t.dtype() == DType::kFloat32 ? t.data<float>()[index]
                                      : half_to_float(static_cast<const uint16_t*>(t.raw())[index]);
}

// kiln::StridedAttention: the views gathered into 4-D Q, K and V, Attention's 4-D form on
// them, Y scattered through y_view into Z.
class StridedAttentionKernel : public Kernel {
 public:
  explicit StridedAttentionKernel(const ir::Node& node) : node_(node) {
    plain_.name = node.name;
    plain_.op = "Attention";
    for (const char* a : {"scale", "is_causal", "left_window_size", "right_window_size", "softcap"})
      if (node.attrs.has(a)) plain_.attrs.set(a, node.attrs.all().at(a));
  }

  void run(const std::vector<const Tensor*>& in, std::vector<Tensor>& out) override {
    std::string why;
    const ir::StridedAttentionGeometry g =
        ir::strided_attention_geometry(node_, in[0]->numel(), in[1]->numel(), in[2]->numel(), why);
    if (!why.empty()) throw node_.error(ErrorKind::kInvalidArgument, why);
    const ir::AttentionShape& s = g.shape;
    const Tensor q = gather(*in[0], g.q, s.q_heads, s.q_seq, s.head_size, s.batch);
    const Tensor k = gather(*in[1], g.k, s.kv_heads, s.kv_seq, s.head_size, s.batch);
    const Tensor v = gather(*in[2], g.v, s.kv_heads, s.kv_seq, s.v_head_size, s.batch);
    std::vector<const Tensor*> inputs = {&q, &k, &v};
    if (in.size() > 3 && in[3]) inputs.push_back(in[3]);
    // Written as int8 (y_scale and y_zero_point given): Y in float32 first.
    const bool quantized = out[0].dtype() == DType::kInt8;
    std::vector<Tensor> y(1);
    y[0] = Tensor(quantized ? DType::kFloat32 : out[0].dtype(), {s.batch, s.q_heads, s.q_seq, s.v_head_size});
    AttentionKernel(plain_).run(inputs, y);
    float y_scale = 1.f, zero_point = 0.f;
    if (quantized) {
      if (in.size() < 6 || !in[4] || !in[5] || in[4]->numel() != 1 || in[5]->numel() != 1)
        throw node_.error(ErrorKind::kInvalidArgument, "y_scale and y_zero_point must hold one value each");
      y_scale = in[4]->data<float>()[0];
      zero_point = static_cast<float>(in[5]->data<int8_t>()[0]);
    }
    int64_t e = 0;
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.q_heads; ++h)
        for (int64_t i = 0; i < s.q_seq; ++i) {
          const int64_t base = g.y.at(b, h, i);
          for (int64_t d = 0; d < s.v_head_size; ++d, ++e) {
            if (!quantized) {
              store(out[0], base + d, load(y[0], e));
              continue;
            }
            // QuantizeLinear's arithmetic (quantize.cc): the float32 quotient rounded half to
            // even, plus the zero point, saturated; NaN gives 0.
            float q = std::nearbyint(y[0].data<float>()[e] / y_scale) + zero_point;
            if (std::isnan(q)) q = 0.f;
            out[0].data<int8_t>()[base + d] = static_cast<int8_t>(std::min(127.f, std::max(-128.f, q)));
          }
        }
  }

 private:
  // The view [batch, heads, seq, size] of `src` as a float32 4-D tensor.
  static Tensor gather(const Tensor& src, const ir::HeadLayout& l, int64_t heads, int64_t seq, int64_t size,
                       int64_t batch) {
    Tensor t(DType::kFloat32, {batch, heads, seq, size});
    float* dst = t.data<float>();
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < seq; ++i) {
          const int64_t base = l.at(b, h, i);
          for (int64_t d = 0; d < size; ++d) *dst++ = load(src, base + d);
        }
    return t;
  }

  const ir::Node& node_;
  ir::Node plain_;  // the Attention node the views feed
};

}  // namespace

KILN_REGISTER_CPU_KERNELS(attention) {
  KernelEntry e;
  e.op = "Attention";
  e.check = [](const KernelInit& init) -> std::string {
    const DType t = init.dtype(0);
    // bfloat16 is left out: onnx's reference rounds every step (the scaled Q and K, the logits, the
    // softmax, the probabilities) to bfloat16, a whole bfloat16 unit away from float32 arithmetic.
    if (t != DType::kFloat32 && t != DType::kFloat16)
      return "input type " + to_string(t) + " is not supported (supported: float32, float16)";
    if (init.has_input(4) && init.input_types[4]->shape && init.input_types[4]->shape->size() != 4)
      return "past_key must be 4-D";
    return "";
  };
  e.dtypes = "float32, float16 (computed in float32)";
  e.create = [](const KernelInit& init) {
    return std::make_unique<AttentionKernel>(init.node, init.bfloat16_products);
  };
  KernelEntry strided = e;
  strided.op = "StridedAttention";
  strided.domain = "kiln";
  strided.check = [](const KernelInit& init) -> std::string {
    const DType t = init.dtype(0);
    if (t != DType::kFloat32 && t != DType::kFloat16)
      return "input type " + to_string(t) + " is not supported (supported: float32, float16)";
    return "";
  };
  strided.create = [](const KernelInit& init) { return std::make_unique<StridedAttentionKernel>(init.node); };
  registry.add(std::move(e));
  registry.add(std::move(strided));
}

}  // namespace kiln::cpu
