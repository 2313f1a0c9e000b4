#include "api/where_faster.h"

#include <algorithm>

namespace kiln::api {

std::map<std::string, double> median_layer_ms(const std::vector<std::vector<LayerTiming>>& runs) {
  std::map<std::string, std::vector<double>> samples;
  for (const auto& run : runs) {
    std::map<std::string, double> summed;  // a name may repeat within a run (a split layer)
    for (const LayerTiming& t : run) summed[t.name] += t.ms;
    for (const auto& [name, ms] : summed) samples[name].push_back(ms);
  }
  std::map<std::string, double> out;
  for (auto& [name, v] : samples) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    out[name] = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  }
  return out;
}

namespace {

double time_of(const std::map<std::string, double>& ms, const std::string& name) {
  auto it = ms.find(name);
  return it == ms.end() ? 0.0 : it->second;
}

// Reformats of the layer's input and output values, which the builder adds where formats differ.
double reformats_of(const ir::Node& n, const std::map<std::string, double>& ms) {
  double total = 0;
  for (const std::string& v : n.inputs)
    if (!v.empty()) total += time_of(ms, "reformat(" + v + ")");
  for (const std::string& v : n.outputs)
    if (!v.empty()) total += time_of(ms, "reformat(" + v + ")");
  return total;
}

}  // namespace

std::vector<QuantizedLayerCost> compare_quantized_layers(const ir::Graph& g, const std::map<std::string, double>& quantized_ms,
                                                         const std::map<std::string, double>& fp16_ms) {
  // The float name a QuantizeLinear output stands for, to find the fp16 engine's reformats.
  std::map<std::string, const ir::Node*> quantize_of;
  for (const ir::Node& n : g.nodes)
    if (n.op == "QuantizeLinear" && n.domain.empty() && !n.outputs.empty()) quantize_of[n.outputs[0]] = &n;
  std::vector<QuantizedLayerCost> costs;
  for (const ir::Node& n : g.nodes) {
    if (n.op != "QConv" || n.domain != "kiln") continue;
    auto half = fp16_ms.find(n.name);
    auto own = quantized_ms.find(n.name);
    if (half == fp16_ms.end() || own == quantized_ms.end()) continue;
    QuantizedLayerCost c;
    c.layer = n.name;
    c.quantized_ms = own->second;
    c.added_ms = reformats_of(n, quantized_ms);
    auto q = n.inputs.empty() ? quantize_of.end() : quantize_of.find(n.inputs[0]);
    ir::Node as_float = n;  // the layer as the fp16 engine has it: float input, not the quantized one
    if (q != quantize_of.end()) {
      int readers = 0;
      for (int r : g.consumers(q->first)) readers += g.nodes[static_cast<size_t>(r)].op == "QConv";
      c.added_ms += (time_of(quantized_ms, q->second->name) + reformats_of(*q->second, quantized_ms)) / std::max(readers, 1);
      as_float.inputs[0] = q->second->inputs[0];
    }
    c.fp16_ms = half->second + reformats_of(as_float, fp16_ms);
    costs.push_back(c);
  }
  return costs;
}

std::vector<std::string> quantized_layers_in_order(const ir::Graph& g) {
  std::vector<std::string> out;
  for (const ir::Node& n : g.nodes)
    if (n.op == "QConv" && n.domain == "kiln") out.push_back(n.name);
  return out;
}

std::vector<size_t> leading_region_lengths(const std::vector<std::string>& order, const std::set<std::string>& slower) {
  size_t before_first_slower = 0;
  while (before_first_slower < order.size() && !slower.count(order[before_first_slower])) ++before_first_slower;
  std::vector<size_t> lengths;
  for (size_t length : {size_t{1}, before_first_slower})
    if (length >= 1 && length < order.size() && std::find(lengths.begin(), lengths.end(), length) == lengths.end())
      lengths.push_back(length);
  return lengths;
}

}  // namespace kiln::api
