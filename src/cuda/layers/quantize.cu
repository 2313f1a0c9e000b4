// CUDA layers of QuantizeLinear and DequantizeLinear (see ops/quantize.h), and of
// DynamicQuantizeLinear (its own section below), with the CPU kernel's arithmetic: the quotient
// x / scale in float32, rounded half to even (nearbyintf), plus the zero point, saturated;
// dequantization (x - zero point) * scale. QuantizeLinear's and DequantizeLinear's scale and zero
// point must be constants here (uploaded once, per tensor or per channel). Per-channel data is
// float32 in linear layout (the builder reformats around the layer); with one scale for the
// whole tensor the layer is elementwise, so it reads and writes the float tensor as stored
// (float16 or float32, linear or NHWC): an INT8 build quantizes float16 NHWC activations in
// place of two transposes.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

#include "cuda/kernels/quantize_elements.cuh"
#include "cuda/runtime/check.h"
#include "cuda/runtime/engine.h"
#include "ops/quantize.h"

namespace kiln::cuda {

namespace {

template <class Q>
__global__ void dequantize_kernel(const Q* __restrict__ x, float* __restrict__ y, const float* __restrict__ scale,
                                  const int32_t* __restrict__ zero, int64_t n, int64_t channels, int64_t inner) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = channels == 1 ? 0 : (i / inner) % channels;
    y[i] = static_cast<float>(static_cast<int64_t>(x[i]) - zero[c]) * scale[c];
  }
}

// float8e4m3fn, as the CPU kernel: float8(x / scale + zero point), rounded to nearest even,
// saturated to +-448 unless saturate = 0 (then NaN, E4M3 having no infinity); and back.
template <class F>
__global__ void quantize_fp8_kernel(const F* __restrict__ x, __nv_fp8_storage_t* __restrict__ y, const float* __restrict__ scale,
                                    const float* __restrict__ zero, int64_t n, int64_t channels, int64_t inner, bool saturate) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = channels == 1 ? 0 : (i / inner) % channels;
    const float v = __fadd_rn(__fdiv_rn(static_cast<float>(x[i]), scale[c]), zero[c]);
    y[i] = __nv_cvt_float_to_fp8(v, saturate ? __NV_SATFINITE : __NV_NOSAT, __NV_E4M3);
  }
}

// Per-tensor float8e4m3fn, eight elements per thread like quantize8_kernel (the FP8 engine
// quantizes whole activations with it; one element per thread took 0.09 ms on ResNet-50's
// 128x64x56x56 pool output, about a third of the bandwidth).
template <class F>
__global__ void quantize8_fp8_kernel(const F* __restrict__ x, __nv_fp8_storage_t* __restrict__ y, const float* __restrict__ scale,
                                     const float* __restrict__ zero, int64_t groups, bool saturate) {
  const float s = scale[0], zp = zero[0];
  for (int64_t g = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; g < groups; g += int64_t{gridDim.x} * blockDim.x) {
    F v[8];
    load8(x, g, v);
    __nv_fp8_storage_t q[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      q[i] = __nv_cvt_float_to_fp8(__fadd_rn(__fdiv_rn(static_cast<float>(v[i]), s), zp), saturate ? __NV_SATFINITE : __NV_NOSAT,
                                   __NV_E4M3);
    reinterpret_cast<uint2*>(y)[g] = *reinterpret_cast<const uint2*>(q);
  }
}

__global__ void dequantize_fp8_kernel(const __nv_fp8_storage_t* __restrict__ x, float* __restrict__ y, const float* __restrict__ scale,
                                      const float* __restrict__ zero, int64_t n, int64_t channels, int64_t inner) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = channels == 1 ? 0 : (i / inner) % channels;
    const float v = __half2float(__half(__nv_cvt_fp8_to_halfraw(x[i], __NV_E4M3)));
    y[i] = (v - zero[c]) * scale[c];
  }
}

template <class Fn>
bool dispatch_quantized(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kInt8: fn(int8_t{}); return true;
    case DType::kUInt8: fn(uint8_t{}); return true;
    case DType::kInt16: fn(int16_t{}); return true;
    case DType::kUInt16: fn(uint16_t{}); return true;
    case DType::kInt32: fn(int32_t{}); return true;
    default: return false;
  }
}

std::string check_request(const LayerRequest& r, bool quantize) {
  if (!r.is_constant(1)) return "the scale must be a constant";
  if (r.has_input(2) && !r.is_constant(2)) return "the zero point must be a constant";
  if (r.node.attrs.get_int("block_size", 0) != 0) return "blocked quantization (block_size) is not supported";
  // The quantized types the kernels below have (the others run on the CPU engine when allowed).
  const DType qtype = quantize ? r.output_dtypes[0] : r.input_dtypes[0];
  const bool integer = dispatch_quantized(qtype, [](auto) {}) && !(quantize && qtype == DType::kInt32);
  if (!integer && qtype != DType::kFloat8E4M3FN)
    return std::string("cannot ") + (quantize ? "quantize to " : "dequantize ") + to_string(qtype);
  return "";
}

// One scale for the whole tensor: the layer is elementwise and keeps the stored format.
bool per_tensor(const LayerRequest& r) { return r.is_constant(1) && r.constants[1]->numel() == 1; }

LayerFormats formats(const LayerRequest& r, bool quantize) {
  LayerFormats f;
  f.inputs.resize(r.inputs.size());  // scale and zero point: not uploaded by the builder
  Layout layout = Layout::kLinear;
  DType real = DType::kFloat32;
  if (per_tensor(r) && r.has_input(0)) {
    layout = r.inputs[0]->format.layout;
    // Quantize reads float16 as stored; dequantize writes float32 (exact; a float16 reader
    // gets a reformat).
    if (quantize && r.inputs[0]->format.dtype == DType::kFloat16) real = DType::kFloat16;
  }
  f.inputs[0] = Format{quantize ? real : r.input_dtypes[0], layout};
  f.outputs = {Format{quantize ? r.output_dtypes[0] : real, layout}};
  return f;
}

std::unique_ptr<Layer> create(const LayerRequest& r, const LayerFormats& formats, BuildServices& services, bool quantize) {
  const bool half = quantize && formats.inputs[0].dtype == DType::kFloat16;
  const Tensor& scale = *r.constants[1];
  const Tensor* zp = r.is_constant(2) ? r.constants[2] : nullptr;
  const ir::QuantizeAxis axis = ir::quantize_axis(r.node, r.input_shape(0), scale.numel());
  std::vector<float> scales(static_cast<size_t>(axis.channels));
  std::vector<int32_t> zeros(static_cast<size_t>(axis.channels), 0);
  for (int64_t c = 0; c < axis.channels; ++c) {
    scales[static_cast<size_t>(c)] = scale.data<float>()[scale.numel() == 1 ? 0 : c];
    if (zp && zp->numel() > 0) zeros[static_cast<size_t>(c)] = static_cast<int32_t>(zp->value_as_int(zp->numel() == 1 ? 0 : c));
  }
  const float* d_scale = static_cast<const float*>(services.upload(scales.data(), scales.size() * sizeof(float)));
  const int32_t* d_zero = static_cast<const int32_t*>(services.upload(zeros.data(), zeros.size() * sizeof(int32_t)));
  const int64_t n = shape_numel(r.output_shapes[0]);
  const DType qtype = quantize ? r.output_dtypes[0] : r.input_dtypes[0];
  EnqueueFn fn;
  if (qtype == DType::kFloat8E4M3FN) {
    std::vector<float> zf(static_cast<size_t>(axis.channels), 0.f);
    for (int64_t c = 0; c < axis.channels; ++c)
      if (zp && zp->numel() > 0) zf[static_cast<size_t>(c)] = static_cast<float>(zp->value_as_double(zp->numel() == 1 ? 0 : c));
    const float* d_zf = static_cast<const float*>(services.upload(zf.data(), zf.size() * sizeof(float)));
    const bool saturate = r.node.attrs.get_int("saturate", 1) != 0;
    const bool by8 = axis.channels == 1 && n % 8 == 0;
    if (quantize)
      fn = [=](const LayerIO& io, cudaStream_t stream) {
        if (n <= 0) return;
        auto* y = static_cast<__nv_fp8_storage_t*>(io.outputs[0]);
        const bool aligned = reinterpret_cast<uintptr_t>(io.inputs[0]) % 32 == 0 &&
                             reinterpret_cast<uintptr_t>(io.outputs[0]) % 8 == 0;
        if (by8 && aligned) {
          const int64_t groups = n / 8;
          if (half)
            quantize8_fp8_kernel<__half><<<grid_for(groups), 256, 0, stream>>>(static_cast<const __half*>(io.inputs[0]), y, d_scale,
                                                                               d_zf, groups, saturate);
          else
            quantize8_fp8_kernel<float><<<grid_for(groups), 256, 0, stream>>>(static_cast<const float*>(io.inputs[0]), y, d_scale,
                                                                              d_zf, groups, saturate);
        } else if (half)
          quantize_fp8_kernel<__half><<<grid_for(n), 256, 0, stream>>>(static_cast<const __half*>(io.inputs[0]), y, d_scale, d_zf, n,
                                                                       axis.channels, axis.inner, saturate);
        else
          quantize_fp8_kernel<float><<<grid_for(n), 256, 0, stream>>>(static_cast<const float*>(io.inputs[0]), y, d_scale, d_zf, n,
                                                                      axis.channels, axis.inner, saturate);
        KILN_CUDA_CHECK_LAUNCH();
      };
    else
      fn = [=](const LayerIO& io, cudaStream_t stream) {
        if (n <= 0) return;
        dequantize_fp8_kernel<<<grid_for(n), 256, 0, stream>>>(static_cast<const __nv_fp8_storage_t*>(io.inputs[0]),
                                                               static_cast<float*>(io.outputs[0]), d_scale, d_zf, n, axis.channels,
                                                               axis.inner);
        KILN_CUDA_CHECK_LAUNCH();
      };
    return make_layer(std::string("kernel:") + (quantize ? "quantize " : "dequantize ") + to_string(qtype) +
                          (axis.channels > 1 ? " per-channel" : ""),
                      std::move(fn));
  }
  dispatch_quantized(qtype, [&](auto tag) {
    using Q = decltype(tag);
    if (quantize) {
      int64_t lo = 0, hi = 0;
      ir::quantized_range(qtype, lo, hi);
      const bool by8 = sizeof(Q) == 1 && axis.channels == 1 && n % 8 == 0;
      fn = [=](const LayerIO& io, cudaStream_t stream) {
        if (n <= 0) return;
        const bool aligned = reinterpret_cast<uintptr_t>(io.inputs[0]) % 32 == 0 &&
                             reinterpret_cast<uintptr_t>(io.outputs[0]) % 8 == 0;
        if (by8 && aligned) {
          const int64_t groups = n / 8;
          if (half)
            quantize8_kernel<__half, Q><<<grid_for(groups), 256, 0, stream>>>(
                static_cast<const __half*>(io.inputs[0]), static_cast<Q*>(io.outputs[0]), d_scale, d_zero, groups,
                static_cast<float>(lo), static_cast<float>(hi));
          else
            quantize8_kernel<float, Q><<<grid_for(groups), 256, 0, stream>>>(
                static_cast<const float*>(io.inputs[0]), static_cast<Q*>(io.outputs[0]), d_scale, d_zero, groups,
                static_cast<float>(lo), static_cast<float>(hi));
        } else if (half)
          quantize_kernel<__half, Q><<<grid_for(n), 256, 0, stream>>>(
              static_cast<const __half*>(io.inputs[0]), static_cast<Q*>(io.outputs[0]), d_scale, d_zero, n, axis.channels,
              axis.inner, static_cast<float>(lo), static_cast<float>(hi));
        else
          quantize_kernel<float, Q><<<grid_for(n), 256, 0, stream>>>(
              static_cast<const float*>(io.inputs[0]), static_cast<Q*>(io.outputs[0]), d_scale, d_zero, n, axis.channels,
              axis.inner, static_cast<float>(lo), static_cast<float>(hi));
        KILN_CUDA_CHECK_LAUNCH();
      };
    } else {
      fn = [=](const LayerIO& io, cudaStream_t stream) {
        if (n <= 0) return;
        dequantize_kernel<Q><<<grid_for(n), 256, 0, stream>>>(static_cast<const Q*>(io.inputs[0]),
                                                               static_cast<float*>(io.outputs[0]), d_scale, d_zero, n,
                                                               axis.channels, axis.inner);
        KILN_CUDA_CHECK_LAUNCH();
      };
    }
  });
  if (!fn || (quantize && qtype == DType::kInt32))
    throw r.node.error(ErrorKind::kUnsupported, "cannot " + std::string(quantize ? "quantize to " : "dequantize ") +
                                                    to_string(qtype));
  return make_layer(std::string("kernel:") + (quantize ? "quantize " : "dequantize ") + to_string(qtype) +
                        (axis.channels > 1 ? " per-channel" : ""),
                    std::move(fn));
}

// --- DynamicQuantizeLinear ---------------------------------------------------------------------

// The CPU kernel's arithmetic, in float32: the range [min(0, min x), max(0, max x)] (NaN left
// out, as std::min/std::max leave it), scale = range / 255 (1 / 255 for an empty range), zero
// point = round(clamp(-min / scale, 0, 255)), y = clamp(round(x / scale) + zero point, 0, 255)
// (NaN: 0). One block finds the range and writes the scale and zero point; then every element is
// quantized. Max and min are exact, so the order the threads meet the values does not matter.
constexpr int kRangeThreads = 1024;

__global__ void __launch_bounds__(kRangeThreads)
    dynamic_range_kernel(const float* __restrict__ x, int64_t n, float* __restrict__ scale_out, uint8_t* __restrict__ zero_out) {
  __shared__ float his[kRangeThreads], los[kRangeThreads];
  float hi = 0.f, lo = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = x[i];
    hi = hi < v ? v : hi;  // std::max(hi, v)
    lo = v < lo ? v : lo;  // std::min(lo, v)
  }
  his[threadIdx.x] = hi, los[threadIdx.x] = lo;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) {
      his[threadIdx.x] = fmaxf(his[threadIdx.x], his[threadIdx.x + half]);
      los[threadIdx.x] = fminf(los[threadIdx.x], los[threadIdx.x + half]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    hi = his[0], lo = los[0];
    const float scale = __fdiv_rn(hi == lo ? 1.f : hi - lo, 255.f);
    const float shifted = 0.f - __fdiv_rn(lo, scale);
    const float clamped = fminf(255.f, fmaxf(0.f, shifted));
    *scale_out = scale;
    *zero_out = static_cast<uint8_t>(rintf(clamped));
  }
}

__global__ void dynamic_quantize_kernel(const float* __restrict__ x, int64_t n, const float* __restrict__ scale,
                                        const uint8_t* __restrict__ zero, uint8_t* __restrict__ y) {
  const float s = *scale, z = static_cast<float>(*zero);
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float q = __fadd_rn(rintf(__fdiv_rn(x[i], s)), z);
    const float low = 0.f < q ? q : 0.f;                // std::max(0.f, q): NaN gives 0
    y[i] = static_cast<uint8_t>(low < 255.f ? low : 255.f);  // std::min(255.f, ...)
  }
}

std::string check_dynamic_quantize(const LayerRequest& r) {
  if (r.input_dtypes[0] != DType::kFloat32)
    return "input type " + to_string(r.input_dtypes[0]) + " is not supported (supported: float32)";
  return "";
}

LayerFormats dynamic_quantize_formats(const LayerRequest& r) {
  LayerFormats f;
  f.inputs = {Format{DType::kFloat32, Layout::kLinear}};
  for (size_t o = 0; o < r.output_dtypes.size(); ++o)
    f.outputs.push_back(r.output_dtypes[o] == DType::kUndefined ? Format{} : Format{r.output_dtypes[o], Layout::kLinear});
  return f;
}

std::unique_ptr<Layer> create_dynamic_quantize(const LayerRequest& r, const LayerFormats&, BuildServices&) {
  const int64_t n = shape_numel(r.input_shape(0));
  // The scale and zero point go to their outputs, or to the workspace where an output is omitted.
  const bool scale_given = r.node.outputs.size() > 1 && !r.node.outputs[1].empty();
  const bool zero_given = r.node.outputs.size() > 2 && !r.node.outputs[2].empty();
  return make_layer("kernel:dynamic-quantize", [n, scale_given, zero_given](const LayerIO& io, cudaStream_t stream) {
    auto* scratch = static_cast<unsigned char*>(io.workspace);
    auto* scale = scale_given ? static_cast<float*>(io.outputs[1]) : reinterpret_cast<float*>(scratch);
    auto* zero = zero_given ? static_cast<uint8_t*>(io.outputs[2]) : scratch + sizeof(float);
    const auto* x = static_cast<const float*>(io.inputs[0]);
    dynamic_range_kernel<<<1, kRangeThreads, 0, stream>>>(x, n, scale, zero);
    KILN_CUDA_CHECK_LAUNCH();
    if (n == 0) return;
    dynamic_quantize_kernel<<<grid_for(n), 256, 0, stream>>>(x, n, scale, zero, static_cast<uint8_t*>(io.outputs[0]));
    KILN_CUDA_CHECK_LAUNCH();
  }, 2 * sizeof(float));
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(quantize) {
  for (bool quantize : {true, false}) {
    LayerEntry e;
    e.op = quantize ? "QuantizeLinear" : "DequantizeLinear";
    e.check = [quantize](const LayerRequest& r) { return check_request(r, quantize); };
    e.formats = [quantize](const LayerRequest& r) { return formats(r, quantize); };
    e.create = [quantize](const LayerRequest& r, const LayerFormats& f, BuildServices& s) { return create(r, f, s, quantize); };
    e.dtypes = quantize ? "float32 -> int8, uint8, int16, uint16, float8e4m3fn (constant scale)"
                        : "int8, uint8, int16, uint16, int32, float8e4m3fn -> float32 (constant scale)";
    registry.add(std::move(e));
  }
  LayerEntry e;
  e.op = "DynamicQuantizeLinear";
  e.check = check_dynamic_quantize;
  e.formats = dynamic_quantize_formats;
  e.create = create_dynamic_quantize;
  e.dtypes = "float32 -> uint8";
  registry.add(std::move(e));
}

}  // namespace kiln::cuda
