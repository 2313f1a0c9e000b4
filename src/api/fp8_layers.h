// FP8 only where it is faster (`kiln build --fp8` on the GPU; TensorRT's --fp8 with fp16 also
// allowed): cuDNN's FP8 convolutions beat fp16 on some layers (ResNet-50's 1x1 convolutions at
// 28x28 and below) and lose on others (64-channel layers at 56x56; a residual in E4M3), and an
// FP8 layer also pays for quantizing its float input. The build times the engine with every
// eligible layer in FP8 and the fp16 engine layer by layer, keeps in fp16 each layer whose FP8
// form (with its share of the quantize and reformat layers added for it) is slower, repeats on
// the mixed engine, and then times the whole engines (all FP8, mixed, none) and keeps the
// fastest. This file holds the comparison; src/api/engine.cc builds and times.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "kiln/kiln.h"

namespace kiln::api {

// One FP8 convolution of the all-FP8 engine against the same layer in the fp16 engine.
struct Fp8LayerCost {
  std::string layer;      // the node name (the same in both engines)
  double fp8_ms = 0;      // its own time in the FP8 engine
  double added_ms = 0;    // its share of the QuantizeLinear layers feeding it and of reformats of its values
  double fp16_ms = 0;     // the layer, plus reformats of its values, in the fp16 engine
  bool keep_fp8() const { return fp8_ms + added_ms <= fp16_ms; }
};

// The median time of each layer (by name) over several profiled runs.
std::map<std::string, double> median_layer_ms(const std::vector<std::vector<LayerTiming>>& runs);

// Costs of every kiln::QConv of `fp8_graph` (the all-FP8 engine's graph) from per-layer times
// of that engine and of the fp16 engine (median_layer_ms; reformat layers are named
// "reformat(<value>)"). A QuantizeLinear read by k quantized convolutions counts 1/k to each.
// Layers the fp16 engine has no time for are left out (kept FP8).
std::vector<Fp8LayerCost> compare_fp8_layers(const ir::Graph& fp8_graph, const std::map<std::string, double>& fp8_ms,
                                             const std::map<std::string, double>& fp16_ms);

}  // namespace kiln::api
