// kiln's INT8 depthwise convolution (group = input channels = output channels): int8 NHWC
// activations, int8 weights stored tap-major ([r * s][c], so one 16-byte load holds 16
// channels of one tap), int32 sums, and kiln::QConv's epilogue computed exactly as the CPU
// reference computes it (int8_epilogue.cuh), so its integers are the CPU engine's bit for bit.
//
// A depthwise convolution sums no channels, so no tensor-core product applies: each thread
// computes 16 channels of one output pixel with plain integer multiply-adds. It moves little
// data per output (r * s input bytes, mostly from L1/L2) and is bound by memory traffic:
// on an H100 at batch 128 MobileNet-v2's depthwise layers ran at 340-1540 GB/s
// (bench/probes/int8_depthwise_probe.cu, the kernel's first form, with the probe's numbers).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/kernels/int8_conv.h"

namespace kiln::cuda {

// Whether the depthwise kernel runs this geometry (c == k, channels a multiple of 16) with
// these storage types (y: int8 or float16; z: int8, float16 or kUndefined); `why` says why not.
bool int8_depthwise_supported(const Int8ConvGeometry& g, DType y_type, DType z_type, std::string* why = nullptr);

// args.w: the weights tap-major, [g.r * g.s][g.c] int8 (see depthwise_weights()).
void launch_int8_depthwise(const Int8ConvGeometry& g, DType y_type, DType z_type, const Int8ConvArgs& args,
                           const ir::Activation& act, cudaStream_t stream);

// QConv's depthwise weights [c, 1, r, s] rearranged tap-major, [r * s][c].
std::vector<int8_t> depthwise_weights(const int8_t* w, int c, int r, int s);

// Grouped convolutions of `width` input and output channels per group (4, 8, 16, 32 or 64; the
// groups of ResNeXt and RegNet), channels a multiple of 16, no residual: one thread computes 16
// output channels of a pixel with __dp4a products over its group's channels, and the same exact
// epilogue. Bound by instructions rather than memory (16 x width products per tap and thread);
// written to run such models in INT8 on the GPU at all, not yet tuned.
bool int8_grouped_supported(const Int8ConvGeometry& g, int width, DType y_type, DType z_type, std::string* why = nullptr);
// args.w: the weights as grouped_weights() lays them out.
void launch_int8_grouped(const Int8ConvGeometry& g, int width, DType y_type, const Int8ConvArgs& args, const ir::Activation& act,
                         cudaStream_t stream);
// QConv's grouped weights [k, width, r, s] -> [k / 16][r * s][16][width].
std::vector<int8_t> grouped_weights(const int8_t* w, int k, int width, int r, int s);

}  // namespace kiln::cuda
