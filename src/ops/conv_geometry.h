// The geometry of Conv and ConvTranspose (and kiln::FusedConv): kernel size, strides,
// dilations, explicit pads after resolving auto_pad, and output sizes.
//
// One definition used by the op schemas (build time, where spatial dims may be unknown) and
// by the CPU kernels (run time, everything concrete), so both agree on every pad.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/op_schema.h"

namespace kiln::ir {

struct ConvGeometry {
  int spatial = 0;                 // number of spatial dims (1 for NCW, 2 for NCHW, ...)
  int64_t group = 1;
  std::vector<int64_t> kernel;     // per spatial dim
  std::vector<int64_t> strides;
  std::vector<int64_t> dilations;
  std::vector<int64_t> pad_begin;  // resolved (auto_pad applied); valid only where the
  std::vector<int64_t> pad_end;    // input size is known
  std::vector<int64_t> output_padding;  // ConvTranspose only
  std::vector<int64_t> output_shape;    // ConvTranspose only: explicit spatial output sizes
  std::string auto_pad;

  int64_t effective_kernel(int i) const { return (kernel[i] - 1) * dilations[i] + 1; }
};

// Reads the attributes of a Conv-like node for an input of `spatial` spatial dims whose
// weight has spatial kernel dims `weight_kernel` (-1 where unknown). Fails (kInvalidModel
// naming the node) on attribute lists of the wrong length or non-positive values.
// `in_sizes` are the input's spatial sizes (-1 where unknown); pads are resolved for the
// known ones. For ConvTranspose `transpose` is true.
ConvGeometry conv_geometry(const Node& node, int spatial, const std::vector<int64_t>& weight_kernel,
                           const std::vector<int64_t>& in_sizes, bool transpose);

// The output spatial size of dim i for an input size (-1 when the input size is unknown).
// Throws kInvalidModel naming the node when the output would be empty.
int64_t conv_output_size(const Node& node, const ConvGeometry& g, int i, int64_t in_size, bool transpose);

// Shape inference of Conv (transpose false) and ConvTranspose: inputs X, W, B; also used by
// kiln::FusedConv and (quantized: int8 X and W, float32 B and Y) kiln::QConv. Checks channels
// against W and group, and B's length.
void infer_conv(InferContext& ctx, bool transpose, bool quantized = false);
// 2 * multiply-adds of a Conv / ConvTranspose node.
int64_t conv_flops(const FlopsContext& ctx, bool transpose);

}  // namespace kiln::ir
