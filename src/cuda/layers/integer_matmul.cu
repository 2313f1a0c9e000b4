// CUDA layers of MatMulInteger and QLinearMatMul (int8 or uint8 operands), the CPU kernels'
// arithmetic (src/cpu/integer_matmul.cc): int32 sums of (a - a_zero) * (b - b_zero), batch dims
// broadcast; QLinearMatMul then multiplies by a_scale * b_scale / y_scale (in the scales' type,
// float32 or float16), adds y_zero_point, rounds half to even and saturates, each step rounded on
// its own as on the CPU, so both engines give the same integers. Scales and zero points are read
// on the device: they may be constants or runtime inputs. One thread per output element: meant
// for the models ONNX Runtime's quantizer writes (QOperator format, dynamic quantization), which
// otherwise leave the GPU for every product; kiln's own INT8 path (QDQ models) is the fast one.
#include <cuda_fp16.h>

#include <string>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

constexpr int kMaxBatchRank = kMaxKernelRank - 2;

struct IntegerMatMulGeom {
  int batch_rank = 0;
  int64_t batch[kMaxBatchRank] = {}, a_stride[kMaxBatchRank] = {}, b_stride[kMaxBatchRank] = {};
  int64_t m = 0, k = 0, n = 0, outputs = 0;
  bool a_signed = false, b_signed = false;
  int64_t a_zero_count = 0, b_zero_count = 0;  // 0 (none), 1 (per tensor), m (per row of A), n (per column of B)
  // QLinearMatMul
  bool requantize = false, half_scales = false, y_signed = false;
};

__device__ __forceinline__ int32_t byte_at(const void* p, int64_t i, bool is_signed) {
  return is_signed ? static_cast<int32_t>(static_cast<const int8_t*>(p)[i]) : static_cast<int32_t>(static_cast<const uint8_t*>(p)[i]);
}

__device__ __forceinline__ float scale_at(const void* p, bool half) {
  return half ? __half2float(*static_cast<const __half*>(p)) : *static_cast<const float*>(p);
}

// Inputs as QLinearMatMul orders them (a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero);
// MatMulInteger's (a, b, a_zero, b_zero) come in the same slots, its scales null.
__global__ void integer_matmul_kernel(const void* __restrict__ a, const void* __restrict__ a_zero, const void* __restrict__ b,
                                      const void* __restrict__ b_zero, const void* __restrict__ a_scale,
                                      const void* __restrict__ b_scale, const void* __restrict__ y_scale,
                                      const void* __restrict__ y_zero, void* __restrict__ y, IntegerMatMulGeom g) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  double factor = 0, zero_y = 0, lo = 0, hi = 0;
  if (g.requantize) {
    const float as = scale_at(a_scale, g.half_scales), bs = scale_at(b_scale, g.half_scales), ys = scale_at(y_scale, g.half_scales);
    if (g.half_scales) {  // each result rounded to float16, as the reference computes in the scales' type
      const float product = __half2float(__float2half_rn(__fmul_rn(as, bs)));
      factor = __half2float(__float2half_rn(__fdiv_rn(product, ys)));
    } else {
      factor = __fdiv_rn(__fmul_rn(as, bs), ys);
    }
    zero_y = byte_at(y_zero, 0, g.y_signed);
    lo = g.y_signed ? -128 : 0, hi = g.y_signed ? 127 : 255;
  }
  for (int64_t o = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; o < g.outputs; o += step) {
    const int64_t j = o % g.n, i = (o / g.n) % g.m;
    int64_t rest = o / (g.n * g.m), ao = 0, bo = 0;
    for (int d = g.batch_rank - 1; d >= 0; --d) {
      const int64_t idx = rest % g.batch[d];
      rest /= g.batch[d];
      ao += idx * g.a_stride[d], bo += idx * g.b_stride[d];
    }
    const int32_t za = g.a_zero_count == 0 ? 0 : byte_at(a_zero, g.a_zero_count == 1 ? 0 : i, g.a_signed);
    const int32_t zb = g.b_zero_count == 0 ? 0 : byte_at(b_zero, g.b_zero_count == 1 ? 0 : j, g.b_signed);
    int64_t sum = 0;
    for (int64_t p = 0; p < g.k; ++p)
      sum += static_cast<int64_t>(byte_at(a, ao + i * g.k + p, g.a_signed) - za) * (byte_at(b, bo + p * g.n + j, g.b_signed) - zb);
    const int32_t v = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(sum)));
    if (!g.requantize) {
      static_cast<int32_t*>(y)[o] = v;
      continue;
    }
    const double q = fmin(hi, fmax(lo, rint(__dadd_rn(__dmul_rn(static_cast<double>(v), factor), zero_y))));
    if (g.y_signed) static_cast<int8_t*>(y)[o] = static_cast<int8_t>(q);
    else static_cast<uint8_t*>(y)[o] = static_cast<uint8_t>(q);
  }
}

bool is_byte_type(DType d) { return d == DType::kInt8 || d == DType::kUInt8; }

// Input slots per op: a, b, a_zero, b_zero, a_scale, b_scale, y_scale, y_zero (-1: none).
struct Slots {
  int a, b, a_zero, b_zero, a_scale, b_scale, y_scale, y_zero;
};
Slots slots_of(const std::string& op) {
  if (op == "QLinearMatMul") return {0, 3, 2, 5, 1, 4, 6, 7};
  return {0, 1, 2, 3, -1, -1, -1, -1};
}

// The geometry of this node's product, or why the GPU layer does not take it.
std::string integer_matmul_geometry(const LayerRequest& r, IntegerMatMulGeom& g) {
  const Slots s = slots_of(r.node.op);
  const bool q = r.node.op == "QLinearMatMul";
  if (!r.given(s.a) || !r.given(s.b)) return "A and B are required";
  const DType ta = r.input_dtypes[static_cast<size_t>(s.a)], tb = r.input_dtypes[static_cast<size_t>(s.b)];
  if (!is_byte_type(ta) || !is_byte_type(tb))
    return "input types " + to_string(ta) + ", " + to_string(tb) + " are not supported (supported: int8, uint8)";
  std::vector<int64_t> as = r.input_shape(static_cast<size_t>(s.a)), bs = r.input_shape(static_cast<size_t>(s.b));
  if (as.empty() || bs.empty()) return "A and B must have rank >= 1";
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  g = IntegerMatMulGeom{};
  g.m = as[as.size() - 2], g.k = as.back(), g.n = bs.back();
  if (bs[bs.size() - 2] != g.k) return "inner dims differ";
  const size_t rank = std::max(as.size(), bs.size()) - 2;
  if (rank > static_cast<size_t>(kMaxBatchRank)) return "more than " + std::to_string(kMaxBatchRank) + " batch dims";
  g.batch_rank = static_cast<int>(rank);
  int64_t sa = g.m * g.k, sb = g.k * g.n, batches = 1;
  for (size_t d = 0; d < rank; ++d) {
    const size_t at = rank - 1 - d;
    const int64_t da = d < as.size() - 2 ? as[as.size() - 3 - d] : 1, db = d < bs.size() - 2 ? bs[bs.size() - 3 - d] : 1;
    if (da != db && da != 1 && db != 1) return "batch dims do not broadcast";
    g.batch[at] = std::max(da, db);
    g.a_stride[at] = da == 1 ? 0 : sa;
    g.b_stride[at] = db == 1 ? 0 : sb;
    sa *= da, sb *= db, batches *= g.batch[at];
  }
  g.outputs = batches * g.m * g.n;
  g.a_signed = ta == DType::kInt8, g.b_signed = tb == DType::kInt8;
  auto zero_count = [&](int slot, DType type, int64_t per, int64_t& count) -> std::string {
    if (!r.given(slot)) return "";
    if (r.input_dtypes[static_cast<size_t>(slot)] != type) return "a zero point's type differs from its tensor's";
    count = shape_numel(r.input_shape(static_cast<size_t>(slot)));
    if (count == 0 || count == 1 || count == per) return "";
    return "a zero point must have one element or one per " + std::string(per == g.m ? "row of A" : "column of B");
  };
  if (std::string why = zero_count(s.a_zero, ta, g.m, g.a_zero_count); !why.empty()) return why;
  if (std::string why = zero_count(s.b_zero, tb, g.n, g.b_zero_count); !why.empty()) return why;
  if (q) {
    g.requantize = true;
    for (int slot : {s.a_scale, s.b_scale, s.y_scale, s.y_zero, s.a_zero, s.b_zero})
      if (!r.given(slot) || shape_numel(r.input_shape(static_cast<size_t>(slot))) != 1)
        return "scales and zero points must be given per tensor";
    const DType scale = r.input_dtypes[static_cast<size_t>(s.a_scale)];
    if ((scale != DType::kFloat32 && scale != DType::kFloat16) || r.input_dtypes[static_cast<size_t>(s.b_scale)] != scale ||
        r.input_dtypes[static_cast<size_t>(s.y_scale)] != scale)
      return "the scales must all be float32 or all float16";
    g.half_scales = scale == DType::kFloat16;
    const DType ty = r.input_dtypes[static_cast<size_t>(s.y_zero)];
    if (!is_byte_type(ty)) return "y_zero_point must be int8 or uint8";
    g.y_signed = ty == DType::kInt8;
  }
  return "";
}

std::string check_integer_matmul(const LayerRequest& r) {
  IntegerMatMulGeom g;
  return integer_matmul_geometry(r, g);
}

LayerFormats integer_matmul_formats(const LayerRequest& r) {
  LayerFormats f;
  for (size_t i = 0; i < r.inputs.size(); ++i)
    f.inputs.push_back(r.given(static_cast<int64_t>(i)) ? Format{r.input_dtypes[i], Layout::kLinear} : Format{});
  f.outputs.push_back(Format{r.output_dtypes[0], Layout::kLinear});
  return f;
}

std::unique_ptr<Layer> create_integer_matmul(const LayerRequest& r, const LayerFormats&, BuildServices&) {
  IntegerMatMulGeom g;
  if (std::string why = integer_matmul_geometry(r, g); !why.empty()) throw r.node.error(ErrorKind::kUnsupported, why);
  if (g.outputs == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  const Slots s = slots_of(r.node.op);
  return make_layer("kernel:integer-matmul", [g, s](const LayerIO& io, cudaStream_t stream) {
    auto in = [&](int slot) -> const void* {
      return slot >= 0 && static_cast<size_t>(slot) < io.inputs.size() ? io.inputs[static_cast<size_t>(slot)] : nullptr;
    };
    integer_matmul_kernel<<<grid_for(g.outputs, 128), 128, 0, stream>>>(in(s.a), in(s.a_zero), in(s.b), in(s.b_zero),
                                                                       in(s.a_scale), in(s.b_scale), in(s.y_scale),
                                                                       in(s.y_zero), io.outputs[0], g);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(integer_matmul) {
  for (const char* op : {"MatMulInteger", "QLinearMatMul"}) {
    LayerEntry e;
    e.op = op;
    e.check = check_integer_matmul;
    e.formats = integer_matmul_formats;
    e.create = create_integer_matmul;
    e.dtypes = std::string(op) == "QLinearMatMul" ? "int8, uint8; scales float32, float16 (per tensor)" : "int8, uint8 (int32 output)";
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cuda
