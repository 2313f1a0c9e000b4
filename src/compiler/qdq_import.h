// Explicit quantization: an ONNX model with QuantizeLinear/DequantizeLinear pairs (ONNX
// Runtime's quantizer, PyTorch's quantization tools, `kiln quantize`) built with --int8 runs
// its quantized convolutions as INT8 layers, with the model's own scales, and needs no
// calibration. absorb_qdq() reads the scales out of the graph and leaves a float graph that
// kiln's passes and then the INT8 pass (quantize_graph.h) handle as a calibrated one:
//   - an activation pair x -> QuantizeLinear(s, 0) -> DequantizeLinear(s, 0) -> readers, int8,
//     one scale, zero point 0: the pair is removed (readers read x) and x gets scale s;
//   - a constant weight behind DequantizeLinear (int8, zero points 0, per tensor or per output
//     channel on axis 0): the node becomes the float constant it computes, and its scales are
//     kept so that the INT8 pass reuses the model's integers instead of rounding again (as long
//     as no pass changed the weights, e.g. by folding a BatchNormalization).
// Pairs of any other form (uint8 or a nonzero zero point: asymmetric; per-channel activations)
// stay as they are and run with the reference arithmetic in float.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "kiln/tensor.h"

namespace kiln::compiler {

struct QdqWeight {
  std::vector<float> scales;  // one per output channel (a per-tensor scale repeated)
  Tensor values;              // the float weights the DequantizeLinear computed
};

struct QdqScales {
  std::map<std::string, float> activations;   // value name -> scale
  std::map<std::string, QdqWeight> weights;   // float weight value name -> its quantization
  int pairs_left = 0;                         // Q/DQ nodes kept (not symmetric int8)
};

QdqScales absorb_qdq(ir::Graph& graph);

}  // namespace kiln::compiler
