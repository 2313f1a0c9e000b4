// kiln's own INT8 convolutions: GEMMs on the tensor cores (mma.sync m16n8k32, int8 products
// summed in int32) over int8 NHWC activations and int8 KRSC weights, with the whole
// kiln::QConv epilogue fused and computed exactly as the CPU reference computes it
// (src/cpu/quantized_conv.cc):
//   v = fma(float(acc), mult[n], bias[n]) + z * z_scale;   Y = act(v)  or  sat(rint(act(v) * (1 / y_scale)))
// so a layer that runs them gives the CPU engine's integers, bit for bit, for exact activations.
//
// Why our own: cuDNN's INT8 engines gain nothing over float16 on ResNet-50's 64-channel
// layers at 56x56, and a residual "+ Z" doubles the time of its 1x1 convolutions
// (docs/design/int8.md, "Which INT8 path: cuDNN's engines measured first"): cuDNN moves
// 1.1-1.35 TB/s there on a GPU that moves 4. Those 1x1 convolutions do little arithmetic per
// byte (a 64->256 one with a residual moves 2 bytes of output traffic per 64 multiply-adds), so
// the kernel for them streams: a persistent block keeps its weights in shared memory and loads
// the next tile of pixels (and residuals) while it computes and stores the current one. (ncu
// then finds it bound by instructions, about a dozen per output in the exact float epilogue:
// docs/design/int8.md, "kiln's INT8 kernels".) Three kernels, each timed against cuDNN's engines
// as more tactics of the QConv layer:
//   - kImplicitGemm: any filter size, stride, padding, dilation (a 3-stage pipeline over K),
//     optionally with K split over a cluster of 2-8 blocks (a layer of few tiles; offered
//     only with TacticOptions::int8_k_splits, as it lost in the engine: docs/design/int8.md, "Split K
//     over a cluster");
//   - kStream1x1: 1x1 convolutions (any stride) with 64, 128 or 256 input channels, no
//     activation or Relu;
//   - kSmallM: any convolution of few output tiles (batch 1's later layers), 256 bytes of K per
//     stage and optionally K split over a cluster of 2-8 blocks (offered by default).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/kernels/epilogue.h"

namespace kiln::cuda {

struct Int8ConvGeometry {
  int64_t batch = 0;
  int c = 0, h = 0, w = 0;     // input channels and size (NHWC)
  int k = 0, oh = 0, ow = 0;   // output channels and size (NHWC)
  int r = 1, s = 1;            // filter size
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1;
};

struct Int8ConvArgs {
  const int8_t* x = nullptr;  // [batch, h, w, c]
  const int8_t* w = nullptr;  // [k, r, s, c]
  const float* mult = nullptr;  // [k]: x_scale * w_scales[k]
  const float* bias = nullptr;  // [k] or null
  const void* z = nullptr;      // [batch, oh, ow, k] of z_type, or null
  float z_scale = 1.f;          // the residual's scale (1 for a float16 residual)
  void* y = nullptr;            // [batch, oh, ow, k] of y_type
  float y_scale = 0.f;          // > 0: int8 output quantized with it; 0: float16 output
  // Hopper: the small-M and stream kernels launch with programmatic dependent launch
  // (TacticOptions::programmatic_launch), so that they load their weights and epilogue operands
  // while the kernel before them finishes: at batch 1 it took ResNet-50's INT8 engine from 0.306
  // to 0.266 ms on an H100 (docs/design/int8.md, "Programmatic dependent launch").
  bool programmatic_launch = true;
};

enum class Int8ConvKernel : uint8_t { kImplicitGemm, kStream1x1, kSmallM };

struct Int8ConvTactic {
  Int8ConvKernel kernel = Int8ConvKernel::kImplicitGemm;
  int tile_n = 64;  // output channels per block: 64 or 128 (kSmallM: 64)
  int k_splits = 1;  // tile 64, not kStream1x1: blocks of a cluster sharing a tile's K (1, 2, 4, 8)

  std::string str() const;  // "implicit-gemm:64", "implicit-gemm:64/k4", "stream1x1:128", "small-m:64/k8"
  static bool parse(const std::string& text, Int8ConvTactic& tactic);
};

// The tactics that run this geometry with these storage types (y: int8 or float16; z: int8,
// float16, or kUndefined for none); empty when none does, and `why` says why not. The implicit
// GEMM split K is offered only `k_splits` ways and only when k_splits > 1
// (TacticOptions::int8_k_splits).
std::vector<Int8ConvTactic> int8_conv_tactics(const Int8ConvGeometry& g, DType y_type, DType z_type, const ir::Activation& act,
                                              int k_splits = 0, std::string* why = nullptr);

// Whether the current GPU has thread-block clusters and programmatic dependent launch (Hopper:
// compute capability 9.0 and up), which split K and kiln's PDL launches need; asked once per
// device. Built for an older GPU too, their device code compiles out there.
bool hopper_features();

// Launches one of those tactics. The first launch of each kernel raises its shared-memory
// limit, so make it outside CUDA graph capture (the layer's build does, by timing it).
void launch_int8_conv(const Int8ConvGeometry& g, DType y_type, DType z_type, const Int8ConvArgs& args,
                      const ir::Activation& act, const Int8ConvTactic& tactic, cudaStream_t stream);

}  // namespace kiln::cuda
