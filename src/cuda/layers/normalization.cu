// CUDA layers of LayerNormalization, RMSNormalization, InstanceNormalization and
// LpNormalization: float32 tensors, stored as float32 or float16, statistics computed in float32.
// kiln::QuantizingLayerNorm is LayerNormalization's layer writing the quantized copy too (int8 or
// E4M3, QuantizeLinear's arithmetic on the float32 value), the float output only where it is read.
//
// LayerNormalization and InstanceNormalization normalize rows of a row-major tensor (the
// trailing dims from `axis`, or each (n, c) plane): a warp per row up to 1024 elements, a
// 256-thread block per row beyond; the mean first, then the variance as the mean of squared
// deviations (as the CPU kernel, src/cpu/normalization.cc, computes them), then the output;
// RMSNormalization skips the mean (its variance is the mean square).
// Scale and B are read as float32 on the device (constants are uploaded), broadcast to the
// normalized dims through strides. LpNormalization works along one axis in any layout, like
// Softmax: a warp or block per contiguous line, a thread per strided one.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

constexpr int kBlock = 256;

// --- LayerNormalization / InstanceNormalization --------------------------------------------

// Where column c of a row finds its Scale or B element.
struct ParamMap {
  StridedShape shape;  // over the normalized dims, stride 0 where the parameter broadcasts
  int full = 1;        // the parameter has every normalized element: offset c
};

__device__ __forceinline__ int64_t param_offset(const ParamMap& m, int64_t c) {
  return m.full ? c : strided_offset(m.shape, c);
}

enum class QuantizedCopy : uint8_t { kNone, kInt8, kFloat8Saturating, kFloat8 };

struct RowNorm {
  int64_t rows = 0, cols = 0;
  float eps = 1e-5f;
  int64_t channels = 0;  // > 0: InstanceNormalization, Scale/B per row (row % channels)
  ParamMap scale, bias;
  bool has_bias = false;
  bool rms = false;  // RMSNormalization: no mean (0), the mean square for the variance
  // kiln::QuantizingLayerNorm's quantized copy Q: its type, QuantizeLinear's scale and zero point.
  QuantizedCopy quantized = QuantizedCopy::kNone;
  float q_scale = 1.f, q_zero = 0.f;
};

// QuantizeLinear's arithmetic (cuda/layers/quantize.cu), from the float32 value: int8 as
// saturate(round_half_even(v / scale) + zero point), NaN to 0; E4M3 as float8(v / scale + zero
// point), rounded to nearest even, saturating or not.
__device__ __forceinline__ uint8_t quantize_copy(float v, const RowNorm& p) {
  if (p.quantized == QuantizedCopy::kInt8) {
    float r = nearbyintf(v / p.q_scale) + p.q_zero;
    if (r != r) r = 0.f;
    return static_cast<uint8_t>(static_cast<int8_t>(fminf(fmaxf(r, -128.f), 127.f)));
  }
  return __nv_cvt_float_to_fp8(__fadd_rn(__fdiv_rn(v, p.q_scale), p.q_zero),
                               p.quantized == QuantizedCopy::kFloat8Saturating ? __NV_SATFINITE : __NV_NOSAT, __NV_E4M3);
}

// GROUP threads per row: mean, variance, then y = (x - mean) * inv * scale + bias. RMS skips the
// mean; it is a template parameter so that LayerNormalization's kernel has no branch of it
// (docs/design/gpu-engine.md, "Failures a kernel finds at run time", measures the difference).
// y or q may be null (kiln::QuantizingLayerNorm without its float output; every other layer
// without q).
template <class T, int GROUP, bool RMS>
__global__ void __launch_bounds__(kBlock) norm_rows_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                           T* __restrict__ mean_out, T* __restrict__ inv_out,
                                                           const float* __restrict__ scale,
                                                           const float* __restrict__ bias, uint8_t* __restrict__ q,
                                                           RowNorm p) {
  __shared__ float smem[kBlock / 32];
  constexpr int kGroups = kBlock / GROUP;
  const int lane = static_cast<int>(threadIdx.x) % GROUP, group = static_cast<int>(threadIdx.x) / GROUP;
  const float cols_f = static_cast<float>(p.cols);
  for (int64_t row = int64_t{blockIdx.x} * kGroups + group; row < p.rows; row += int64_t{gridDim.x} * kGroups) {
    const int64_t base = row * p.cols;
    float mean = 0.f;
    if constexpr (!RMS) {
      float sum = 0.f;
      for (int64_t c = lane; c < p.cols; c += GROUP) sum += load_float(x, base + c);
      mean = group_sum<GROUP>(sum, smem) / cols_f;
    }
    float sq = 0.f;
    for (int64_t c = lane; c < p.cols; c += GROUP) {
      const float d = load_float(x, base + c) - mean;
      sq += d * d;
    }
    const float var = group_sum<GROUP>(sq, smem) / cols_f;
    const float inv = 1.f / sqrtf(var + p.eps);
    if (lane == 0) {
      if (mean_out) store_float(mean_out, row, mean);
      if (inv_out) store_float(inv_out, row, inv);
    }
    auto emit = [&](int64_t c, float v) {
      if (y) store_float(y, base + c, v);
      if (q) q[base + c] = quantize_copy(v, p);
    };
    if (p.channels > 0) {
      const int64_t ch = row % p.channels;
      const float a = scale[ch] * inv, b = bias[ch];
      for (int64_t c = lane; c < p.cols; c += GROUP) emit(c, (load_float(x, base + c) - mean) * a + b);
    } else if (p.has_bias) {
      for (int64_t c = lane; c < p.cols; c += GROUP)
        emit(c, (load_float(x, base + c) - mean) * inv * scale[param_offset(p.scale, c)] + bias[param_offset(p.bias, c)]);
    } else {
      for (int64_t c = lane; c < p.cols; c += GROUP) emit(c, (load_float(x, base + c) - mean) * inv * scale[param_offset(p.scale, c)]);
    }
  }
}

template <class T>
std::unique_ptr<Layer> norm_rows_scalar_layer(const RowNorm& p);

// Rows of float16 whose length is a multiple of 8 and at most kVecRowMax, with Scale and B
// per element (or B absent): GROUP lanes per row (4 to 32: about four 16-byte chunks each), the
// row held in registers, so x is read once instead of three times and with 16-byte accesses.
// The statistics are the same as the scalar kernel's (the mean, then the mean of squared
// deviations, in float32), summed in another order. The scalar kernel reads 96-channel rows
// (ConvNeXt's first stage) at about 0.9 TB/s (docs/design/gpu-engine.md, "Normalization").
constexpr int kVecChunks = 4;                   // 16-byte chunks per lane at most
constexpr int64_t kVecRowMax = 32 * kVecChunks * 8;  // 1024 elements

template <int GROUP>
__device__ __forceinline__ float group_allsum(float v) {
#pragma unroll
  for (int d = GROUP / 2; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d, GROUP);
  return v;
}

template <int GROUP, bool RMS>
__global__ void __launch_bounds__(kBlock) norm_rows_vec_kernel(const __half* __restrict__ x, __half* __restrict__ y,
                                                               __half* __restrict__ mean_out,
                                                               __half* __restrict__ inv_out,
                                                               const float* __restrict__ scale,
                                                               const float* __restrict__ bias, uint8_t* __restrict__ q,
                                                               RowNorm p) {
  constexpr int kRows = kBlock / GROUP;
  const int lane = static_cast<int>(threadIdx.x) % GROUP, group = static_cast<int>(threadIdx.x) / GROUP;
  const int chunks = static_cast<int>(p.cols / 8);
  const float cols_f = static_cast<float>(p.cols);
  // Every thread of the block runs the same iterations (the shuffles need whole warps); a
  // group past the last row computes on zeros and stores nothing.
  for (int64_t first = int64_t{blockIdx.x} * kRows; first < p.rows; first += int64_t{gridDim.x} * kRows) {
    const int64_t row = first + group;
    const bool active = row < p.rows;
    const __half* xr = x + (active ? row : 0) * p.cols;
    float v[kVecChunks][8];
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kVecChunks; ++k) {
      const int c = lane + k * GROUP;
      if (active && c < chunks) {
        load_floats<8>(xr + c * 8, v[k]);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[k][j] = 0.f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) sum += v[k][j];
    }
    float mean = 0.f;
    if constexpr (!RMS) mean = group_allsum<GROUP>(sum) / cols_f;
    float sq = 0.f;
#pragma unroll
    for (int k = 0; k < kVecChunks; ++k) {
      if (lane + k * GROUP >= chunks) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float d = v[k][j] - mean;
        sq += d * d;
      }
    }
    const float inv = 1.f / sqrtf(group_allsum<GROUP>(sq) / cols_f + p.eps);
    if (!active) continue;
    if (lane == 0) {
      if (mean_out) store_float(mean_out, row, mean);
      if (inv_out) store_float(inv_out, row, inv);
    }
#pragma unroll
    for (int k = 0; k < kVecChunks; ++k) {
      const int c = lane + k * GROUP;
      if (c >= chunks) continue;
      float s[8], b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      load_floats<8>(scale + c * 8, s);
      if (bias) load_floats<8>(bias + c * 8, b);
      float out[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) out[j] = (v[k][j] - mean) * inv * s[j] + b[j];
      if (y) store_floats<8>(y + row * p.cols + c * 8, out);
      if (q) {
        uint8_t bytes[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) bytes[j] = quantize_copy(out[j], p);
        *reinterpret_cast<uint2*>(q + row * p.cols + c * 8) = *reinterpret_cast<const uint2*>(bytes);
      }
    }
  }
}

// Whether norm_rows_vec_kernel takes these rows (the pointers' alignment is checked at run time).
bool vec_rows_eligible(const RowNorm& p) {
  return p.channels == 0 && p.cols % 8 == 0 && p.cols <= kVecRowMax && p.scale.full && (!p.has_bias || p.bias.full);
}

// The lanes per row for rows of `cols` elements: about kVecChunks chunks each, 4 to 32.
int vec_group(int64_t cols) {
  const int64_t chunks = cols / 8;
  int group = 4;
  while (group < 32 && group * kVecChunks < chunks) group *= 2;
  return group;
}

template <bool RMS>
void launch_norm_rows_vec(int group, unsigned blocks, const __half* x, __half* y, __half* mean, __half* inv,
                          const float* scale, const float* bias, uint8_t* q, const RowNorm& p, cudaStream_t stream) {
  switch (group) {
    case 4: norm_rows_vec_kernel<4, RMS><<<blocks, kBlock, 0, stream>>>(x, y, mean, inv, scale, bias, q, p); break;
    case 8: norm_rows_vec_kernel<8, RMS><<<blocks, kBlock, 0, stream>>>(x, y, mean, inv, scale, bias, q, p); break;
    case 16: norm_rows_vec_kernel<16, RMS><<<blocks, kBlock, 0, stream>>>(x, y, mean, inv, scale, bias, q, p); break;
    default: norm_rows_vec_kernel<32, RMS><<<blocks, kBlock, 0, stream>>>(x, y, mean, inv, scale, bias, q, p); break;
  }
}

// The quantized copy of a kiln::QuantizingLayerNorm (its output 1), or null.
uint8_t* quantized_output(const LayerIO& io, const RowNorm& p) {
  return p.quantized == QuantizedCopy::kNone ? nullptr : static_cast<uint8_t*>(io.outputs[1]);
}

template <class T>
std::unique_ptr<Layer> norm_rows_layer(const RowNorm& p) {
  if constexpr (std::is_same_v<T, __half>) {
    if (vec_rows_eligible(p)) {
      const int group = vec_group(p.cols);
      const unsigned blocks = capped_blocks((p.rows + kBlock / group - 1) / (kBlock / group));
      // Pointers not 16-byte aligned (a view at an odd offset) take the scalar kernel.
      std::shared_ptr<const Layer> scalar = norm_rows_scalar_layer<__half>(p);
      return make_layer("kernel:norm-vec" + std::to_string(group), [p, group, blocks, scalar](const LayerIO& io,
                                                                                          cudaStream_t stream) {
        const __half* x = static_cast<const __half*>(io.inputs[0]);
        __half* y = static_cast<__half*>(io.outputs[0]);
        uint8_t* q = quantized_output(io, p);
        __half* mean = !q && io.outputs.size() > 1 ? static_cast<__half*>(io.outputs[1]) : nullptr;
        __half* inv = !q && io.outputs.size() > 2 ? static_cast<__half*>(io.outputs[2]) : nullptr;
        const float* scale = static_cast<const float*>(io.inputs[1]);
        const float* bias = io.inputs.size() > 2 ? static_cast<const float*>(io.inputs[2]) : nullptr;
        if (!aligned16(x) || !aligned16(y) || !aligned16(q) || !aligned16(scale) || (bias && !aligned16(bias))) {
          scalar->enqueue(io, stream);
          return;
        }
        if (p.rms) {
          launch_norm_rows_vec<true>(group, blocks, x, y, mean, inv, scale, bias, q, p, stream);
        } else {
          launch_norm_rows_vec<false>(group, blocks, x, y, mean, inv, scale, bias, q, p, stream);
        }
        KILN_CUDA_CHECK_LAUNCH();
      });
    }
  }
  return norm_rows_scalar_layer<T>(p);
}

template <class T>
std::unique_ptr<Layer> norm_rows_scalar_layer(const RowNorm& p) {
  const bool warp = p.cols <= 1024;
  const unsigned blocks = capped_blocks(warp ? (p.rows + kBlock / 32 - 1) / (kBlock / 32) : p.rows);
  return make_layer(warp ? "kernel:norm-warp" : "kernel:norm-block", [p, warp, blocks](const LayerIO& io, cudaStream_t stream) {
    const T* x = static_cast<const T*>(io.inputs[0]);
    T* y = static_cast<T*>(io.outputs[0]);
    uint8_t* q = quantized_output(io, p);
    T* mean = !q && io.outputs.size() > 1 ? static_cast<T*>(io.outputs[1]) : nullptr;
    T* inv = !q && io.outputs.size() > 2 ? static_cast<T*>(io.outputs[2]) : nullptr;
    const float* scale = static_cast<const float*>(io.inputs[1]);
    const float* bias = io.inputs.size() > 2 ? static_cast<const float*>(io.inputs[2]) : nullptr;
    if (p.rms) {
      if (warp) norm_rows_kernel<T, 32, true><<<blocks, kBlock, 0, stream>>>(x, y, mean, inv, scale, bias, q, p);
      else norm_rows_kernel<T, kBlock, true><<<blocks, kBlock, 0, stream>>>(x, y, mean, inv, scale, bias, q, p);
    } else {
      if (warp) norm_rows_kernel<T, 32, false><<<blocks, kBlock, 0, stream>>>(x, y, mean, inv, scale, bias, q, p);
      else norm_rows_kernel<T, kBlock, false><<<blocks, kBlock, 0, stream>>>(x, y, mean, inv, scale, bias, q, p);
    }
    KILN_CUDA_CHECK_LAUNCH();
  });
}

std::unique_ptr<Layer> norm_rows_layer_for(const ir::Node& node, DType storage, const RowNorm& p) {
  if (p.rows == 0 || p.cols == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  if (storage == DType::kFloat32) return norm_rows_layer<float>(p);
  if (storage == DType::kFloat16) return norm_rows_layer<__half>(p);
  throw node.error(ErrorKind::kUnsupported, "storage type " + to_string(storage) + " is not supported");
}

// The map of a Scale/B of `pshape` onto the normalized dims `target` (numpy broadcasting,
// aligned right); "" or why not.
std::string param_map(const std::vector<int64_t>& pshape, const std::vector<int64_t>& target, ParamMap& m) {
  if (pshape.size() > target.size()) return "a parameter has a higher rank than the normalized dims";
  const size_t lead = target.size() - pshape.size();
  std::vector<int64_t> pstrides(pshape.size(), 1);
  for (size_t i = pshape.size(); i-- > 1;) pstrides[i - 1] = pstrides[i] * pshape[i];
  std::vector<std::pair<int64_t, int64_t>> dims;
  bool full = true;
  for (size_t d = 0; d < target.size(); ++d) {
    if (d < lead) {
      dims.emplace_back(target[d], 0);
      full = full && target[d] == 1;
      continue;
    }
    const int64_t ps = pshape[d - lead];
    if (ps != target[d] && ps != 1) return "a parameter does not broadcast to the normalized dims";
    if (ps == target[d]) dims.emplace_back(target[d], pstrides[d - lead]);
    else {
      dims.emplace_back(target[d], 0);
      full = full && target[d] == 1;
    }
  }
  m.full = full ? 1 : 0;
  if (!merge_dims(dims, m.shape))
    return "more than " + std::to_string(kMaxKernelRank) + " dims remain after merging contiguous ones";
  return "";
}

// LayerNormalization: rows, cols and the parameter maps of a request; "" or why not.
std::string layer_norm_plan(const LayerRequest& r, RowNorm& p) {
  const std::vector<int64_t>& shape = r.input_shape(0);
  const int64_t rank = static_cast<int64_t>(shape.size());
  int64_t axis = r.node.attrs.get_int("axis", -1);
  if (axis < -rank || axis >= rank) return "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank);
  if (axis < 0) axis += rank;
  const std::vector<int64_t> normalized(shape.begin() + axis, shape.end());
  p.cols = shape_numel(normalized);
  p.rows = p.cols ? shape_numel(shape) / p.cols : 0;
  p.eps = r.node.attrs.get_float("epsilon", 1e-5f);
  if (!r.has_input(1)) return "Scale is missing";
  std::string why = param_map(r.input_shape(1), normalized, p.scale);
  if (!why.empty()) return why;
  p.has_bias = r.has_input(2);
  if (p.has_bias) why = param_map(r.input_shape(2), normalized, p.bias);
  return why;
}

// What LayerNormalization and kiln::QuantizingLayerNorm both ask: float32 X, Scale and B, and
// a row plan (layer_norm_plan's errors become the reason).
std::string layer_norm_inputs_check(const LayerRequest& r) {
  const DType d = r.input_dtypes[0];
  if (d != DType::kFloat32) return "input type " + to_string(d) + " is not supported (supported: float32)";
  for (size_t i = 1; i < 3; ++i)
    if (r.has_input(i) && r.input_dtypes[i] != DType::kFloat32) return "Scale and B must be float32";
  RowNorm p;
  try {
    return layer_norm_plan(r, p);
  } catch (const Error& e) {
    return e.what();
  }
}

std::string layer_norm_check(const LayerRequest& r) {
  for (size_t o = 1; o < r.output_dtypes.size(); ++o)
    if (r.output_dtypes[o] != DType::kFloat32 && r.output_dtypes[o] != DType::kUndefined)
      return "stash_type other than float32 is not supported";
  return layer_norm_inputs_check(r);
}

// X and the outputs row-major at the float storage; Scale and B as float32 on the device.
LayerFormats row_norm_formats(const LayerRequest& r) {
  LayerFormats f;
  f.inputs.resize(r.inputs.size());
  const DType storage = r.float_storage();
  f.inputs[0] = Format{storage, Layout::kLinear};
  for (size_t i = 1; i < r.inputs.size(); ++i)
    if (r.has_input(i)) f.inputs[i] = Format{DType::kFloat32, Layout::kLinear};
  for (size_t o = 0; o < r.output_dtypes.size(); ++o) f.outputs.push_back(Format{storage, Layout::kLinear});
  return f;
}

std::unique_ptr<Layer> layer_norm_create(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  RowNorm p;
  std::string why = layer_norm_plan(r, p);
  if (!why.empty()) throw r.node.error(ErrorKind::kUnsupported, why);
  return norm_rows_layer_for(r.node, f.inputs[0].dtype, p);
}

// kiln::QuantizingLayerNorm: LayerNormalization's check, and a constant scale and zero point of
// one value each for the quantized copy (int8 or float8e4m3fn).
std::string quantizing_layer_norm_check(const LayerRequest& r) {
  if (!r.is_constant(3) || r.constants[3]->numel() != 1 || !r.is_constant(4) || r.constants[4]->numel() != 1)
    return "y_scale and y_zero_point must be constants of one value";
  const DType q = r.output_dtypes[1];
  if (q != DType::kInt8 && q != DType::kFloat8E4M3FN) return "cannot quantize to " + to_string(q);
  if (r.constants[3]->dtype() != DType::kFloat32 || r.constants[4]->dtype() != q)
    return "y_scale must be float32 and y_zero_point of Q's type";
  return layer_norm_inputs_check(r);
}

LayerFormats quantizing_layer_norm_formats(const LayerRequest& r) {
  LayerFormats f;
  f.inputs.resize(r.inputs.size());  // y_scale and y_zero_point: read when the layer is built
  f.inputs[0] = Format{r.float_storage(), Layout::kLinear};
  for (size_t i = 1; i < 3; ++i)
    if (r.has_input(i)) f.inputs[i] = Format{DType::kFloat32, Layout::kLinear};
  f.outputs = {Format{r.float_storage(), Layout::kLinear}, Format{r.output_dtypes[1], Layout::kLinear}};
  return f;
}

std::unique_ptr<Layer> quantizing_layer_norm_create(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  RowNorm p;
  std::string why = layer_norm_plan(r, p);
  if (!why.empty()) throw r.node.error(ErrorKind::kUnsupported, why);
  p.q_scale = r.constants[3]->data<float>()[0];
  p.q_zero = static_cast<float>(r.constants[4]->value_as_double(0));
  p.quantized = r.output_dtypes[1] == DType::kInt8                ? QuantizedCopy::kInt8
                : r.node.attrs.get_int("saturate", 1) != 0 ? QuantizedCopy::kFloat8Saturating
                                                                  : QuantizedCopy::kFloat8;
  return norm_rows_layer_for(r.node, f.inputs[0].dtype, p);
}

std::unique_ptr<Layer> rms_norm_create(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  RowNorm p;
  std::string why = layer_norm_plan(r, p);
  if (!why.empty()) throw r.node.error(ErrorKind::kUnsupported, why);
  p.rms = true;
  return norm_rows_layer_for(r.node, f.inputs[0].dtype, p);
}

std::string instance_norm_check(const LayerRequest& r) {
  const DType d = r.input_dtypes[0];
  if (d != DType::kFloat32) return "input type " + to_string(d) + " is not supported (supported: float32)";
  for (size_t i = 1; i < 3; ++i)
    if (!r.has_input(i) || r.input_dtypes[i] != DType::kFloat32) return "scale and B must be float32";
  if (r.input_shape(0).size() < 3) return "the input must have rank 3 or more";
  return "";
}

std::unique_ptr<Layer> instance_norm_create(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  const std::vector<int64_t>& shape = r.input_shape(0);
  RowNorm p;
  p.channels = shape[1];
  p.rows = shape[0] * shape[1];
  p.cols = p.rows ? shape_numel(shape) / p.rows : 0;
  p.eps = r.node.attrs.get_float("epsilon", 1e-5f);
  p.has_bias = true;
  if (shape_numel(r.input_shape(1)) != p.channels || shape_numel(r.input_shape(2)) != p.channels)
    throw r.node.error(ErrorKind::kInvalidArgument, "scale and B must have C = " + std::to_string(p.channels) + " elements");
  return norm_rows_layer_for(r.node, f.inputs[0].dtype, p);
}

// --- LpNormalization -------------------------------------------------------------------------

struct LpGeom {
  StridedShape lines;
  int64_t count = 0, n = 1, stride = 1;
  bool l1 = false;
};

// GROUP threads per line of a contiguous axis.
template <class T, int GROUP>
__global__ void __launch_bounds__(kBlock) lp_group_kernel(const T* __restrict__ x, T* __restrict__ y, LpGeom g) {
  __shared__ float smem[kBlock / 32];
  constexpr int kGroups = kBlock / GROUP;
  const int lane = static_cast<int>(threadIdx.x) % GROUP, group = static_cast<int>(threadIdx.x) / GROUP;
  for (int64_t line = int64_t{blockIdx.x} * kGroups + group; line < g.count; line += int64_t{gridDim.x} * kGroups) {
    const int64_t base = strided_offset(g.lines, line);
    float acc = 0.f;
    for (int64_t c = lane; c < g.n; c += GROUP) {
      const float v = load_float(x, base + c);
      acc += g.l1 ? fabsf(v) : v * v;
    }
    acc = group_sum<GROUP>(acc, smem);
    const float norm = g.l1 ? acc : sqrtf(acc);
    const float inv = norm > 0.f ? 1.f / norm : 0.f;  // a zero vector stays zero, as on the CPU
    for (int64_t c = lane; c < g.n; c += GROUP) store_float(y, base + c, load_float(x, base + c) * inv);
  }
}

// One thread per line of a strided axis.
template <class T>
__global__ void __launch_bounds__(kBlock) lp_strided_kernel(const T* __restrict__ x, T* __restrict__ y, LpGeom g) {
  for (int64_t line = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; line < g.count;
       line += int64_t{gridDim.x} * blockDim.x) {
    const int64_t base = strided_offset(g.lines, line);
    float acc = 0.f;
    for (int64_t c = 0; c < g.n; ++c) {
      const float v = load_float(x, base + c * g.stride);
      acc += g.l1 ? fabsf(v) : v * v;
    }
    const float norm = g.l1 ? acc : sqrtf(acc);
    const float inv = norm > 0.f ? 1.f / norm : 0.f;
    for (int64_t c = 0; c < g.n; ++c) store_float(y, base + c * g.stride, load_float(x, base + c * g.stride) * inv);
  }
}

std::string lp_geom(const ir::Node& node, const TensorSpec& x, LpGeom& g) {
  const int64_t rank = x.rank();
  g.l1 = node.attrs.get_int("p", 2) == 1;
  if (rank == 0) {  // one element, a line of one (as the CPU computes it)
    g.count = 1;
    g.n = 1;
    return "";
  }
  int64_t axis = node.attrs.get_int("axis", -1);
  if (axis < -rank || axis >= rank) return "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank);
  if (axis < 0) axis += rank;
  const std::vector<int64_t> strides = x.logical_strides();
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (int64_t d = 0; d < rank; ++d)
    if (d != axis) dims.emplace_back(x.shape[static_cast<size_t>(d)], strides[static_cast<size_t>(d)]);
  if (!merge_dims(dims, g.lines))
    return "more than " + std::to_string(kMaxKernelRank) + " dims remain after merging contiguous ones";
  g.n = x.shape[static_cast<size_t>(axis)];
  g.stride = strides[static_cast<size_t>(axis)];
  g.count = g.n ? x.elements() / g.n : 0;
  return "";
}

std::string lp_check(const LayerRequest& r) {
  const DType d = r.input_dtypes[0];
  if (d != DType::kFloat32 && d != DType::kFloat16)
    return "input type " + to_string(d) + " is not supported (supported: float32, float16)";
  const int64_t p = r.node.attrs.get_int("p", 2);
  if (p != 1 && p != 2) return "p must be 1 or 2";
  LpGeom g;
  return lp_geom(r.node, *r.inputs[0], g);
}

LayerFormats lp_formats(const LayerRequest& r) {
  LayerFormats f = uniform_formats(r, true, true);
  if (r.is_constant(0)) f.inputs[0] = Format{r.storage_of(r.input_dtypes[0]), Layout::kLinear};
  return f;
}

template <class T>
std::unique_ptr<Layer> lp_layer(const LpGeom& g) {
  if ((g.stride == 1 || g.n == 1) && g.n > 8) {
    const bool warp = g.n <= 1024;
    const unsigned blocks = capped_blocks(warp ? (g.count + kBlock / 32 - 1) / (kBlock / 32) : g.count);
    return make_layer(warp ? "kernel:lpnorm-warp" : "kernel:lpnorm-block",
                      [g, warp, blocks](const LayerIO& io, cudaStream_t stream) {
      const T* x = static_cast<const T*>(io.inputs[0]);
      T* y = static_cast<T*>(io.outputs[0]);
      if (warp) lp_group_kernel<T, 32><<<blocks, kBlock, 0, stream>>>(x, y, g);
      else lp_group_kernel<T, kBlock><<<blocks, kBlock, 0, stream>>>(x, y, g);
      KILN_CUDA_CHECK_LAUNCH();
    });
  }
  const unsigned blocks = capped_blocks((g.count + kBlock - 1) / kBlock);
  return make_layer("kernel:lpnorm-strided", [g, blocks](const LayerIO& io, cudaStream_t stream) {
    lp_strided_kernel<T><<<blocks, kBlock, 0, stream>>>(static_cast<const T*>(io.inputs[0]),
                                                        static_cast<T*>(io.outputs[0]), g);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

std::unique_ptr<Layer> lp_create(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  const TensorSpec& x = *r.inputs[0];
  LpGeom g;
  std::string why = lp_geom(r.node, x, g);
  if (!why.empty()) throw r.node.error(ErrorKind::kUnsupported, why);
  if (g.count == 0 || g.n == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  switch (f.inputs[0].dtype) {
    case DType::kFloat32: return lp_layer<float>(g);
    case DType::kFloat16: return lp_layer<__half>(g);
    default: break;
  }
  throw r.node.error(ErrorKind::kUnsupported, "storage type " + to_string(f.inputs[0].dtype) + " is not supported");
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(normalization) {
  {
    LayerEntry e;
    e.op = "LayerNormalization";
    e.check = layer_norm_check;
    e.formats = row_norm_formats;
    e.create = layer_norm_create;
    e.dtypes = "float32, float16 storage (float32 statistics)";
    registry.add(std::move(e));
  }
  {
    LayerEntry e;
    e.op = "QuantizingLayerNorm";
    e.domain = "kiln";
    e.check = quantizing_layer_norm_check;
    e.formats = quantizing_layer_norm_formats;
    e.create = quantizing_layer_norm_create;
    e.dtypes = "float32, float16 storage (float32 statistics); Q int8 or float8e4m3fn";
    registry.add(std::move(e));
  }
  {
    LayerEntry e;
    e.op = "RMSNormalization";
    e.check = layer_norm_check;
    e.formats = row_norm_formats;
    e.create = rms_norm_create;
    e.dtypes = "float32, float16 storage (float32 statistics)";
    registry.add(std::move(e));
  }
  {
    LayerEntry e;
    e.op = "InstanceNormalization";
    e.check = instance_norm_check;
    e.formats = row_norm_formats;
    e.create = instance_norm_create;
    e.dtypes = "float32, float16 storage (float32 statistics)";
    registry.add(std::move(e));
  }
  {
    LayerEntry e;
    e.op = "LpNormalization";
    e.check = lp_check;
    e.formats = lp_formats;
    e.create = lp_create;
    e.dtypes = "float32, float16";
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cuda
