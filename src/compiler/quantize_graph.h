// The INT8 pass: turns the convolutions of an optimized graph into kiln::QConv nodes (see
// src/ops/quantized_conv.cc) using calibrated activation scales, the way TensorRT's implicit
// INT8 mode does:
//   - weights: symmetric int8 per output channel (scale = max|W[m]| / 127);
//   - activations: symmetric int8 per tensor, with the calibrated scale of the value;
//   - a conv's input is quantized by a QuantizeLinear node, unless it is already int8;
//   - a conv's output (and a residual Z) stays int8 between convs: a value is stored int8 when
//     a quantized conv writes it and every reader is a quantized conv (as X or Z), so chains
//     of convs (ResNet's blocks) never see float tensors; elsewhere the conv writes float32;
//   - a MaxPool between quantized convs runs on int8 (it commutes with quantization).
// Gemm and MatMul layers with constant weights are quantized as 1x1 convolutions
// (compiler/gemm_as_conv.h). A conv is quantized when it is 2-D, its weights are constant, group is 1, input and output
// channels are multiples of 16 (cuDNN's INT8 engines read 16-byte channel rows; an image
// stem of 1 to 4 input channels has a kernel of its own), its
// activation is one the format's epilogue has (INT8: every activation; FP8: cuDNN's pointwise
// ops), its input has a scale (a value a layout op writes, Reshape, Transpose and the like,
// takes the scale of the value it reads, and a node's output that of a value its
// same_values_as attribute names, where calibration saw those alone), and it is not pinned
// to float by name; grouped convolutions only for a target that has them (QuantizeTarget).
// Every other node is left as it is (float).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/quantize.h"
#include "compiler/qdq_import.h"

namespace kiln::compiler {

struct QuantizeGraphReport {
  int quantized = 0;         // convs that became kiln::QConv
  int matrix_products = 0;   // of those, Gemm / MatMul layers run as 1x1 convs (gemm_as_conv.h)
  int int8_values = 0;       // values stored int8 between quantized convs
  int int8_pools = 0;        // MaxPools between them that run on int8 tensors
  int quantize_nodes = 0;    // QuantizeLinear nodes added in front of them
  int model_weights = 0;     // convs that kept the model's own int8 weights (explicit QDQ)
  std::vector<std::string> kept_float;  // "node: why", for convs left in float
};

// The 8-bit format of the quantized convolutions: INT8, or FP8 E4M3 (Hopper's tensor cores
// multiply it; weights per output channel at max |w| / 448, activations at the calibrated
// threshold / 448; the same kiln::QConv with float8e4m3fn tensors).
enum class QuantizeFormat { kInt8, kFloat8E4M3 };

// What the target engine runs in INT8 beyond the common case.
struct QuantizeTarget {
  QuantizeFormat format = QuantizeFormat::kInt8;
  // Grouped and depthwise convolutions, with any channel counts: the CPU engine's integer
  // reference runs them.
  bool grouped_convolutions = false;
  // Depthwise convolutions (group = input = output channels) with channels a multiple of 16:
  // the GPU's INT8 depthwise kernel runs them (other grouped ones stay float there).
  bool depthwise_convolutions = false;
  // Other grouped convolutions with 4, 8, 16, 32 or 64 channels per group in and out (ResNeXt,
  // RegNet), channels a multiple of 16 and no residual: the GPU's INT8 grouped kernel
  // (cuda/kernels/int8_depthwise.h) runs them.
  bool gpu_grouped_convolutions = false;
  // Convolutions (group 1) of 1 to 4 input channels and at most 64 filter taps, the stems of
  // image models: their float input (the image) is quantized like any other. The CPU's integer
  // reference and the GPU's stem kernel (cuda/kernels/int8_stem.h) run them.
  bool few_input_channels = true;
};

// `scales`: value name -> scale (real = int8 * scale). `pinned_float`: node names to keep in
// float (mixed precision). `model_weights` (explicit quantization, qdq_import.h): weights whose
// int8 form the model gave; a conv whose weight is still exactly that tensor keeps the model's
// scales (and so its integers).
QuantizeGraphReport quantize_graph(ir::Graph& graph, const std::map<std::string, float>& scales,
                                   const std::set<std::string>& pinned_float = {},
                                   const std::map<std::string, QdqWeight>* model_weights = nullptr,
                                   const QuantizeTarget& target = {});

}  // namespace kiln::compiler
