// INT8 and FP8 only where they are faster (`kiln build --int8` and `--fp8` on the GPU;
// TensorRT's --int8/--fp8 with fp16 also allowed). A quantized convolution beats fp16 on some
// layers and loses on others (ResNet-50 at batch 1, where the fp16 engine ran faster on
// today's H100s; FP8 64-channel layers at 56x56), and it also pays for quantizing its
// float input and for reformats. The build times the engine with every eligible layer quantized
// and the fp16 engine layer by layer, keeps in fp16 each layer whose quantized form (with its
// share of the quantize and reformat layers added for it) is slower, repeats on the mixed engine,
// builds engines with one quantized region from the input on (leading_region_lengths), and then
// times the whole engines (all quantized, mixed, leading regions, none) and keeps the fastest.
// This file holds the comparison (tested alone in tests/unit/where_faster_test.cc) and the build
// that uses it, which times engines through the backend interface (backend::Timer).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "kiln/types.h"

namespace kiln::compiler {

// One quantized convolution (INT8 or FP8) of the all-quantized engine against the same layer in
// the fp16 engine.
struct QuantizedLayerCost {
  std::string layer;         // the node name (the same in both engines)
  double quantized_ms = 0;   // its own time in the quantized engine
  double added_ms = 0;       // its share of the QuantizeLinear layers feeding it and of reformats of its values
  double fp16_ms = 0;        // the layer, plus reformats of its values, in the fp16 engine
  bool keep_quantized() const { return quantized_ms + added_ms <= fp16_ms; }
};

// The median time of each layer (by name) over several profiled runs.
std::map<std::string, double> median_layer_ms(const std::vector<std::vector<LayerTiming>>& runs);

// Costs of every kiln::QConv of `quantized_graph` (the all-quantized engine's graph) from
// per-layer times of that engine and of the fp16 engine (median_layer_ms; reformat layers are
// named "reformat(<value>)"). A QuantizeLinear read by k quantized convolutions counts 1/k to
// each, and so does an attention writing int8 with what it costs over its fp16 form. Layers the fp16 engine has no time for are left out (kept quantized).
std::vector<QuantizedLayerCost> compare_quantized_layers(const ir::Graph& quantized_graph,
                                                         const std::map<std::string, double>& quantized_ms,
                                                         const std::map<std::string, double>& fp16_ms);

// The quantized convolutions (kiln::QConv) of `quantized_graph` in the graph's order.
std::vector<std::string> quantized_layers_in_order(const ir::Graph& quantized_graph);

// Lengths of the quantized regions at the start of the network that a where-faster build also
// times as whole engines: 1 (the first layer alone, a ResNet's stem) and the number of layers of
// `order` before the first one in `slower`; each only where it leaves layers on both sides, and
// none twice. Why: at batch 1 the quantized kernels win on the first layers (large images, few
// channels) and each quantized island pays for a quantize layer at its entry, while a region
// that starts at the input pays only the input's (its last layer writes fp16). Pinning layers
// one by one leaves islands.
std::vector<size_t> leading_region_lengths(const std::vector<std::string>& order, const std::set<std::string>& slower);

struct CompiledEngine;
// The build itself (compile() takes this route for --int8/--fp8 on the GPU unless
// BuildOptions::quantized_where_faster is off): the fastest engine, its kept_float naming the
// layers left in fp16 and why.
CompiledEngine build_quantized_where_faster(const std::string& model_bytes, const std::string& name,
                                            const std::string& base_dir, const BuildOptions& options);

}  // namespace kiln::compiler
