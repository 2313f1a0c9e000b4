// CPU kernels of MatMulInteger and QLinearMatMul as ONNX's reference computes them: int32 sums of
// (a - a_zero) * (b - b_zero); QLinearMatMul then scales by a_scale * b_scale / y_scale (in the
// scales' type), adds y_zero, rounds half to even and saturates. Batch dims broadcast.
//
// A product by constant 2-D weights (ONNX Runtime's dynamic quantization writes every projection
// so, after a DynamicQuantizeLinear) runs on kiln's int8 GEMM (src/cpu/int8_gemm.h, AVX-512 VNNI
// or AMX): Y^T = B^T A^T with B^T packed once as the kernel's weights (uint8 weights shifted to
// int8) and A's rows packed as its input each run, the zero points applied after the sums as
// sum (a - za)(b - zb) = sum a b - za sum b - zb sum a + K za zb, in int64, then wrapped to int32
// as the reference wraps: the same integers. Other products run the reference loops.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "cpu/amx.h"
#include "cpu/int8_gemm.h"
#include "cpu/kernel.h"
#include "cpu/packed_weights.h"
#include "cpu/parallel.h"

namespace kiln::cpu {

namespace {

int64_t element_int(const Tensor& t, int64_t i) { return t.value_as_int(i); }

// The int32 products of A [..., M, K] and B [..., K, N] with batch broadcasting (1-D operands
// as MatMul takes them), each zero point per tensor or, for 2-D operands, per row of A / per
// column of B. `emit(out_index, sum)` receives every output element.
template <class Emit>
void integer_products(const ir::Node& node, const Tensor& a, const Tensor& b, const Tensor* a_zero, const Tensor* b_zero,
                      int64_t out_numel, Emit emit) {
  std::vector<int64_t> as = a.shape(), bs = b.shape();
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  if (bs[bs.size() - 2] != k) throw node.error(ErrorKind::kInvalidArgument, "inner dims differ");
  const size_t rank = std::max(as.size(), bs.size()) - 2;
  std::vector<int64_t> batch(rank, 1), a_stride(rank, 0), b_stride(rank, 0);
  int64_t sa = m * k, sb = k * n;
  for (size_t d = 0; d < rank; ++d) {
    const size_t r = rank - 1 - d;
    const int64_t da = d < as.size() - 2 ? as[as.size() - 3 - d] : 1;
    const int64_t db = d < bs.size() - 2 ? bs[bs.size() - 3 - d] : 1;
    if (da != db && da != 1 && db != 1) throw node.error(ErrorKind::kInvalidArgument, "batch dims do not broadcast");
    batch[r] = std::max(da, db);
    a_stride[r] = da == 1 ? 0 : sa;
    b_stride[r] = db == 1 ? 0 : sb;
    sa *= da;
    sb *= db;
  }
  auto zero_of = [&](const Tensor* z, int64_t per, int64_t i, const char* what) -> int64_t {
    if (!z || z->numel() == 0) return 0;
    if (z->numel() == 1) return element_int(*z, 0);
    if (z->numel() == per) return element_int(*z, i);
    throw node.error(ErrorKind::kUnsupported, std::string(what) + " must have one element or one per " +
                                                  (per == m ? "row of A" : "column of B"));
  };
  int64_t batches = 1;
  for (int64_t v : batch) batches *= v;
  if (batches * m * n != out_numel) throw node.error(ErrorKind::kInternal, "the output has the wrong size");
  std::vector<int64_t> index(rank, 0);
  for (int64_t bi = 0; bi < batches; ++bi) {
    int64_t ao = 0, bo = 0;
    for (size_t d = 0; d < rank; ++d) ao += index[d] * a_stride[d], bo += index[d] * b_stride[d];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const int64_t za = zero_of(a_zero, m, i, "a_zero_point"), zb = zero_of(b_zero, n, j, "b_zero_point");
        int64_t sum = 0;
        for (int64_t p = 0; p < k; ++p)
          sum += (element_int(a, ao + i * k + p) - za) * (element_int(b, bo + p * n + j) - zb);
        emit((bi * m + i) * n + j, static_cast<int32_t>(sum));
      }
    for (size_t d = rank; d-- > 0;) {
      if (++index[d] < batch[d]) break;
      index[d] = 0;
    }
  }
}

float as_half(float v) { return half_to_float(float_to_half(v)); }

// v modulo 2^32 as int32: int32's wrap-around, which the reference's int64 sums take when cast.
int32_t wrap32(int64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v))); }

// Constant weights B [K x N] in the int8 GEMM's layout, for products whose B and b_zero are
// constants (fast_weights says when).
struct PackedWeights {
  Int8PackedA packed;                 // B' = B as int8 (uint8 weights minus 128), transposed: [N x K]
  // Per column, modulo 2^32 and padded to a panel of rows: sum over k of B'[k, n], and b_zero in
  // B' terms (minus 128 for uint8 weights).
  std::vector<int32_t> column_sum, column_zero;
  int64_t k = 0, n = 0;
};

// The packed weights of B (input `b`) with zero point input `b_zero` (or none), when the int8
// GEMM runs on this CPU and both are constants of a shape it takes; else nothing.
// A loaded engine's panels of B' are taken as they are (their row sums are the column sums).
std::optional<PackedWeights> fast_weights(const KernelInit& init, size_t b, size_t b_zero) {
  const Tensor* w = init.constants.size() > b ? init.constants[b] : nullptr;
  const Int8GemmIsa isa = int8_gemm_isa();
  if (isa == Int8GemmIsa::kNone || !w || w->rank() != 2 || (w->dtype() != DType::kInt8 && w->dtype() != DType::kUInt8))
    return std::nullopt;
  const Tensor* z = init.has_input(b_zero) ? (init.constants.size() > b_zero ? init.constants[b_zero] : nullptr) : nullptr;
  if (init.has_input(b_zero) && (!z || z->dtype() != w->dtype())) return std::nullopt;  // a zero point computed at run time
  const int64_t K = w->dim(0), N = w->dim(1);
  if (K == 0 || N == 0 || K >= kInt8GemmMaxK || (z && z->numel() > 1 && z->numel() != N)) return std::nullopt;
  const bool unsigned_weights = w->dtype() == DType::kUInt8;
  PackedWeights p;
  p.k = K, p.n = N;
  const ir::PackedConstant* pack = init.packed_input(b);
  if (!(pack && adopt_packed_transposed(*pack, w->dtype(), w->shape(), isa, p.packed))) {
    const Tensor values = constant_values(*w, pack);
    std::vector<int8_t> transposed(static_cast<size_t>(N * K));
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n)
        transposed[static_cast<size_t>(n * K + k)] = static_cast<int8_t>(values.value_as_int(k * N + n) - (unsigned_weights ? 128 : 0));
    p.packed = int8_pack_a(isa, transposed.data(), N, K, K);
  }
  const size_t padded = static_cast<size_t>(p.packed.panel_count() * p.packed.rows);
  p.column_sum.assign(padded, 0);
  p.column_zero.assign(padded, 0);
  for (int64_t n = 0; n < N; ++n) {
    // shift = 128 * sum over k of B'[k, n], |sum| < 2^23: exact, as the int64 sum wrapped to int32.
    p.column_sum[static_cast<size_t>(n)] = p.packed.shift[static_cast<size_t>(n)] / 128;
    p.column_zero[static_cast<size_t>(n)] =
        wrap32((z && z->numel() ? z->value_as_int(z->numel() == 1 ? 0 : n) : 0) - (unsigned_weights ? 128 : 0));
  }
  return p;
}

// A kernel of a product by constant weights: its run, and the panels of B' it holds where every
// run takes the int8 GEMM (A of rank 2 or more: a 1-D A runs the reference loops, which read B).
class IntegerMatMulKernel final : public Kernel {
 public:
  IntegerMatMulKernel(RunFn run, const KernelInit& init, size_t b, const std::optional<PackedWeights>& fast)
      : run_(std::move(run)) {
    if (fast && init.input_types[0] && init.input_types[0]->rank() >= 2)
      pack_ = {{b, packed_constant_transposed(fast->packed, init.dtype(b) == DType::kUInt8)}};
  }
  void run(const std::vector<const Tensor*>& inputs, std::vector<Tensor>& outputs) override { run_(inputs, outputs); }
  std::vector<std::pair<size_t, ir::PackedConstant>> packed_constants() const override { return pack_; }

 private:
  RunFn run_;
  std::vector<std::pair<size_t, ir::PackedConstant>> pack_;
};

// correct_tile without AVX-512 (the AVX2 int8 GEMM's), 8 rows of A a step: the same integers.
__attribute__((target("avx2"))) void correct_tile_avx2(int32_t* tile, int64_t ns, const int32_t* row_zero,
                                                     const int32_t* row_term, const int32_t* column_sum,
                                                     const int32_t* column_zero) {
  constexpr int kSteps = kInt8GemmCols / 8;
  __m256i za[kSteps], term[kSteps];
  for (int i = 0; i < kSteps; ++i) {
    za[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row_zero + i * 8));
    term[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row_term + i * 8));
  }
  for (int64_t r = 0; r < ns; ++r) {
    const __m256i sw = _mm256_set1_epi32(column_sum[r]), zb = _mm256_set1_epi32(column_zero[r]);
    for (int i = 0; i < kSteps; ++i) {
      auto* at = reinterpret_cast<__m256i*>(tile + r * kInt8GemmCols + i * 8);
      const __m256i v = _mm256_loadu_si256(at);
      _mm256_storeu_si256(at, _mm256_sub_epi32(_mm256_sub_epi32(v, _mm256_mullo_epi32(sw, za[i])),
                                               _mm256_mullo_epi32(zb, term[i])));
    }
  }
}

// The zero points' terms of a tile: y = sum - Sw[n] Za[m] - Zb[n] (Su[m] - K Za[m]) modulo 2^32
// (int32's wrap-around, which the exact int64 value wrapped to int32 equals), 16 rows of A a
// step. tile[r * 32 + j] holds column n0 + r of row m0 + j; row_zero and row_term are Za and
// Su - K Za of rows m0.., as int32.
__attribute__((target("avx512f"))) void correct_tile(int32_t* tile, int64_t ns, const int32_t* row_zero,
                                                   const int32_t* row_term, const int32_t* column_sum,
                                                   const int32_t* column_zero) {
  const __m512i za0 = _mm512_loadu_si512(row_zero), za1 = _mm512_loadu_si512(row_zero + 16);
  const __m512i t0 = _mm512_loadu_si512(row_term), t1 = _mm512_loadu_si512(row_term + 16);
  for (int64_t r = 0; r < ns; ++r) {
    const __m512i sw = _mm512_set1_epi32(column_sum[r]), zb = _mm512_set1_epi32(column_zero[r]);
    int32_t* row = tile + r * kInt8GemmCols;
    __m512i v0 = _mm512_loadu_si512(row), v1 = _mm512_loadu_si512(row + 16);
    v0 = _mm512_sub_epi32(_mm512_sub_epi32(v0, _mm512_mullo_epi32(sw, za0)), _mm512_mullo_epi32(zb, t0));
    v1 = _mm512_sub_epi32(_mm512_sub_epi32(v1, _mm512_mullo_epi32(sw, za1)), _mm512_mullo_epi32(zb, t1));
    _mm512_storeu_si512(row, v0);
    _mm512_storeu_si512(row + 16, v1);
  }
}

// The products of A [..., M, K] (int8 or uint8) by the packed weights: emit(m0, n0, ms, ns, tile)
// for every tile of them, tile[r * 32 + j] the int32 sum of row m0 + j and column
// n0 + r, as integer_products gives it. a_zero: none, one, or one per row of A.
template <class Emit>
void packed_products(const ir::Node& node, const PackedWeights& w, const Tensor& a, const Tensor* a_zero, Emit emit) {
  const int64_t K = w.k, N = w.n;
  if (a.rank() < 1 || a.shape().back() != K) throw node.error(ErrorKind::kInvalidArgument, "inner dims differ");
  const int64_t rows = K ? a.numel() / K : 0, M = a.rank() >= 2 ? a.dim(a.rank() - 2) : 1;
  if (a_zero && a_zero->numel() > 1 && a_zero->numel() != M)
    throw node.error(ErrorKind::kUnsupported, "a_zero_point must have one element or one per row of A");
  // The bytes the GEMM packs as B: it adds 128 to int8 values; uint8 values are flipped first so
  // that it packs them as they are. `offset` is then what the packed value exceeds a by.
  const bool is_unsigned = a.dtype() == DType::kUInt8;
  const int64_t offset = is_unsigned ? 0 : 128;
  thread_local AlignedVector<int8_t> flipped;
  const auto* bytes = static_cast<const int8_t*>(a.raw());
  if (is_unsigned) {
    flipped.resize(std::max(flipped.size(), static_cast<size_t>(a.numel())));
    for (int64_t i = 0; i < a.numel(); ++i) flipped[static_cast<size_t>(i)] = static_cast<int8_t>(bytes[i] ^ 0x80);
    bytes = flipped.data();
  }
  const int64_t panels = (rows + kInt8GemmCols - 1) / kInt8GemmCols;
  // Per row, modulo 2^32 and padded to a panel (correct_tile): Za = a_zero + offset and
  // Su - K Za, Su the sum over k of the packed value (a + offset).
  std::vector<int32_t> row_zero(static_cast<size_t>(panels * kInt8GemmCols), 0), row_term(row_zero.size(), 0);
  const auto* raw = static_cast<const unsigned char*>(a.raw());
  const unsigned char flip = is_unsigned ? 0 : 0x80;  // a + 128 of an int8 byte is the byte with its sign bit flipped
  parallel_for_each(rows, rows * K > 65536, [&](int64_t r) {
    const unsigned char* row = raw + r * K;
    // Sums of 32 bytes a step: sad_epu8 against zero adds each 8 into a 64-bit lane.
    const __m256i flips = _mm256_set1_epi8(static_cast<char>(flip));
    __m256i lanes = _mm256_setzero_si256();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
      const __m256i v = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k)), flips);
      lanes = _mm256_add_epi64(lanes, _mm256_sad_epu8(v, _mm256_setzero_si256()));
    }
    alignas(32) int64_t parts[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(parts), lanes);
    int64_t sum = parts[0] + parts[1] + parts[2] + parts[3];
    for (; k < K; ++k) sum += row[k] ^ flip;
    const int64_t za = offset + (a_zero && a_zero->numel() ? a_zero->value_as_int(a_zero->numel() == 1 ? 0 : r % M) : 0);
    row_zero[static_cast<size_t>(r)] = wrap32(za);
    row_term[static_cast<size_t>(r)] = wrap32(sum - K * za);
  });
  const Int8PackedA& pa = w.packed;
  const int64_t panel_bytes = int8_b_panel_bytes(pa);
  thread_local AlignedVector<uint8_t> packed;
  packed.resize(std::max(packed.size(), static_cast<size_t>(panels * panel_bytes)));
  uint8_t* packed_data = packed.data();
  parallel_for(panels, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p)
      int8_pack_b_panel_transposed(bytes, K, K, pa.k_padded, p * kInt8GemmCols,
                                   std::min<int64_t>(kInt8GemmCols, rows - p * kInt8GemmCols), packed_data + p * panel_bytes);
  });
  const int64_t a_panels = pa.panel_count();
  parallel_for(panels * a_panels, [&](int64_t first, int64_t last) {
    alignas(64) int32_t tile[kInt8GemmMaxRows * kInt8GemmCols];
    AmxTileScope scope(pa.isa == Int8GemmIsa::kAmx);
    for (int64_t t = first; t < last; ++t) {
      const int64_t p = t / a_panels, ap = t % a_panels;
      int8_tile(pa, ap, packed_data + p * panel_bytes, tile);  // tile[r * 32 + j]: column n0 + r of row m0 + j
      const int64_t m0 = p * kInt8GemmCols, n0 = ap * pa.rows;
      const int64_t ms = std::min<int64_t>(kInt8GemmCols, rows - m0), ns = std::min<int64_t>(pa.rows, N - n0);
      if (int8_gemm_on_ymm(pa.isa))
        correct_tile_avx2(tile, ns, row_zero.data() + m0, row_term.data() + m0, w.column_sum.data() + n0, w.column_zero.data() + n0);
      else
        correct_tile(tile, ns, row_zero.data() + m0, row_term.data() + m0, w.column_sum.data() + n0, w.column_zero.data() + n0);
      emit(m0, n0, ms, ns, tile);
    }
  });
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(integer_matmul) {
  {
    KernelEntry e;
    e.op = "MatMulInteger";
    e.dtypes = "int8, uint8 (int32 output)";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      std::optional<PackedWeights> fast = fast_weights(init, 1, 3);
      RunFn run = [node, fast](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        int32_t* y = out[0].data<int32_t>();
        const Tensor* a_zero = in.size() > 2 ? in[2] : nullptr;
        if (fast && in[0]->rank() >= 2) {
          const int64_t N = fast->n;
          packed_products(*node, *fast, *in[0], a_zero, [&](int64_t m0, int64_t n0, int64_t ms, int64_t ns, const int32_t* tile) {
            for (int64_t j = 0; j < ms; ++j)
              for (int64_t r = 0; r < ns; ++r) y[(m0 + j) * N + n0 + r] = tile[r * kInt8GemmCols + j];
          });
          return;
        }
        integer_products(*node, *in[0], *in[1], a_zero, in.size() > 3 ? in[3] : nullptr, out[0].numel(),
                         [&](int64_t o, int32_t v) { y[o] = v; });
      };
      return std::make_unique<IntegerMatMulKernel>(std::move(run), init, 1, fast);
    };
    e.packed_inputs = {1};
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "QLinearMatMul";
    e.dtypes = "int8, uint8; scales float32, float16";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      std::optional<PackedWeights> fast = fast_weights(init, 3, 5);
      RunFn run = [node, fast](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        for (size_t i : {1, 2, 4, 5, 6, 7})
          if (in[i]->numel() != 1) throw node->error(ErrorKind::kUnsupported, "scales and zero points must be per tensor");
        // The factor in the scales' own type, as the reference computes it.
        double factor;
        if (in[1]->dtype() == DType::kFloat16)
          factor = as_half(as_half(static_cast<float>(in[1]->value_as_double(0)) * static_cast<float>(in[4]->value_as_double(0))) /
                           static_cast<float>(in[6]->value_as_double(0)));
        else
          factor = static_cast<float>(static_cast<float>(in[1]->value_as_double(0)) * static_cast<float>(in[4]->value_as_double(0))) /
                   static_cast<float>(in[6]->value_as_double(0));
        const double y_zero = static_cast<double>(in[7]->value_as_int(0));
        const bool is_signed = out[0].dtype() == DType::kInt8;
        const double lo = is_signed ? -128 : 0, hi = is_signed ? 127 : 255;
        void* y = out[0].raw();
        auto requantize = [&](int64_t o, int32_t v) {
          const double q = std::min(hi, std::max(lo, std::nearbyint(static_cast<double>(v) * factor + y_zero)));
          if (is_signed) static_cast<int8_t*>(y)[o] = static_cast<int8_t>(q);
          else static_cast<uint8_t*>(y)[o] = static_cast<uint8_t>(q);
        };
        if (fast && in[0]->rank() >= 2) {
          const int64_t N = fast->n;
          packed_products(*node, *fast, *in[0], in[2], [&](int64_t m0, int64_t n0, int64_t ms, int64_t ns, const int32_t* tile) {
            for (int64_t j = 0; j < ms; ++j)
              for (int64_t r = 0; r < ns; ++r) requantize((m0 + j) * N + n0 + r, tile[r * kInt8GemmCols + j]);
          });
        }
        else {
          integer_products(*node, *in[0], *in[3], in[2], in[5], out[0].numel(), requantize);
        }
      };
      return std::make_unique<IntegerMatMulKernel>(std::move(run), init, 3, fast);
    };
    e.packed_inputs = {3};
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
